package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// FormatComposer is MosaicML Composer's CheckpointSaver layout: ep{E}-ba{B}-rank0.pt
// files (monolithic), ep{E}-ba{B} directories (FSDP sharded state dicts) and the
// latest-rank0.pt symlink naming the newest (composer/callbacks/checkpoint_saver.py,
// composer/utils/checkpoint.py).
const FormatComposer Format = "composer"

const (
	// famComposerFile: ep{E}-ba{B}-rank0.pt, CheckpointSaver's default filename
	// 'ep{epoch}-ba{batch}-rank{rank}.pt' as rank 0 writes it.
	famComposerFile family = "composer-file"
	// famComposerDir: ep{E}-ba{B}, FSDPConfig.sharded_ckpt_prefix_dir's default, the
	// directory of a sharded save's __{rank}_0.distcp files.
	famComposerDir family = "composer-dir"
)

// composerPointer is CheckpointSaver's default latest_filename 'latest-rank{rank}.pt'
// for rank 0: a symlink it points at the checkpoint just saved.
const composerPointer = "latest-rank0.pt"

var (
	composerFileRe = regexp.MustCompile(`^ep([0-9]+)-ba([0-9]+)-rank0\.pt$`)
	composerDirRe  = regexp.MustCompile(`^ep([0-9]+)-ba([0-9]+)$`)
	// composerOwnRe matches the names the layout keeps out of the candidates: the
	// latest-rank{R}.pt links, and ep-ba files of ranks other than 0 (a monolithic save
	// is rank 0's file alone).
	composerOwnRe = regexp.MustCompile(`^(?:latest-rank[0-9]+\.pt|ep[0-9]+-ba[0-9]+-rank(?:[1-9][0-9]*|0[0-9]+)\.pt)$`)
)

// composerLayout is Composer's layout. Steps are batches (the "ba" number). Under
// auto-detection it owns both names: a file is judged as torch.save's (checkTorchZip),
// a directory by the dcp rule when it holds `.metadata` (judgeDCP). latest-rank0.pt is
// a pointer (pointer.go): _save_checkpoint links it after the barrier that follows every
// rank's save, so a checkpoint newer than its target is an unfinished save.
type composerLayout struct{}

func (composerLayout) info() layoutInfo {
	return layoutInfo{format: FormatComposer, names: "Composer's epE-baB[-rank0.pt] with " + composerPointer}
}

func (composerLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	if m := composerFileRe.FindStringSubmatch(name); m != nil {
		c := newCandidate(name, famComposerFile, typ)
		c.setStep(m[2])
		return c
	}
	if m := composerDirRe.FindStringSubmatch(name); m != nil && (typ.IsDir() || typ&fs.ModeSymlink != 0) {
		c := newCandidate(name, famComposerDir, typ)
		c.setStep(m[2])
		return c
	}
	return nil
}

func (composerLayout) reserves(name string) bool { return composerOwnRe.MatchString(name) }

// judge: a file is a whole torch.save archive; a directory complete by the dcp rule.
func (composerLayout) judge(s *scan, c *candidate) verdict {
	path := s.path(c)
	fi, err := os.Stat(path)
	if err != nil {
		return notDone(FormatComposer, "%s", describeFSError(err))
	}
	if fi.IsDir() {
		return checkDCP(path, FormatComposer)
	}
	if !fi.Mode().IsRegular() {
		return notDone(FormatComposer, "not a regular file or directory")
	}
	return checkTorchZip(path, fi.Size(), FormatComposer)
}

func (composerLayout) claim(_ *scan, c *candidate) nameClaim {
	switch c.fam {
	case famComposerFile:
		return mineAlone
	case famComposerDir:
		return mine
	}
	return notMine
}

func (composerLayout) detect(*scan, *candidate, string, []fs.DirEntry) (verdict, bool) {
	return verdict{}, false
}

func (composerLayout) notes(*scan) []string { return nil }

// judgeDCP: an ep{E}-ba{B} directory holding `.metadata` is Composer's sharded save.
func (composerLayout) judgeDCP(_ *scan, c *candidate, dir string, _ []fs.DirEntry) (verdict, bool) {
	if c.fam != famComposerDir {
		return verdict{}, false
	}
	return checkDCP(dir, FormatComposer), true
}

// readPointer reads DIR/latest-rank0.pt when the listing holds it: Composer makes it a
// symlink (os.symlink of the checkpoint's path relative to DIR). A link to anything but
// an entry of DIR, or a regular file (Composer's autoresume downloads a remote
// checkpoint under that name), names no candidate.
func (composerLayout) readPointer(s *scan) *pointer {
	if !s.hasReserved(composerPointer) {
		return nil
	}
	p := &pointer{file: composerPointer, who: "Composer links " + composerPointer}
	target, err := os.Readlink(filepath.Join(s.dir, composerPointer))
	switch {
	case err != nil:
		p.problem = "is not a symlink"
	case filepath.Dir(filepath.Clean(target)) != "." || !validTag(filepath.Base(target)):
		p.problem = fmt.Sprintf("links to %q, not an entry of the directory", clip(target))
	default:
		p.target = filepath.Base(target)
	}
	return p
}

// adopt adds nothing: the link names an ep-ba entry, a candidate already.
func (composerLayout) adopt(*scan, *pointer) {}

// governs: a trusted latest-rank0.pt governs every Composer candidate.
func (composerLayout) governs(c, _ *candidate) bool {
	return c.fam == famComposerFile || c.fam == famComposerDir
}
