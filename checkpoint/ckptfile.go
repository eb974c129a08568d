package checkpoint

import (
	"archive/zip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The *.ckpt files and directories Lightning's ModelCheckpoint writes, and NeMo's after
// it, are two layouts with one completion rule: this file holds what they share (the
// names, the torch.save file check, the directory check). lightning.go and nemo.go
// hold what differs.

// famCkpt: NAME.ckpt, a file (torch.save) or a directory (Lightning's DeepSpeed and
// FSDP strategies, NeMo's distributed checkpoints).
const famCkpt family = "ckpt"

// ckptExt is Lightning's ModelCheckpoint.FILE_EXTENSION.
const ckptExt = ".ckpt"

var (
	// stepEqRe finds Lightning's and NeMo's "step=N" in a file name
	// (ModelCheckpoint's default filename is "{epoch}-{step}" → "epoch=E-step=N").
	stepEqRe = regexp.MustCompile(`step=([0-9]+)`)
	// lightningLastRe matches Lightning's last checkpoint: CHECKPOINT_NAME_LAST
	// ("last"), with the version counter's "-vN" when the name was taken.
	lightningLastRe = regexp.MustCompile(`^last(-v[0-9]+)?$`)
)

// ckptCandidate returns the candidate for a NAME.ckpt entry of dir, or nil: its step
// is the name's "step=N"; a "last" name without one is the trainer's newest
// (tierNamedLatest), and when it is a symlink (Lightning's save_last="link") it takes
// the step its target's name carries, so that it orders with the checkpoint it stands
// for.
func ckptCandidate(dir, name string, typ fs.FileMode) *candidate {
	if !strings.HasSuffix(name, ckptExt) || len(name) == len(ckptExt) {
		return nil
	}
	c := newCandidate(name, famCkpt, typ)
	stem := strings.TrimSuffix(name, ckptExt)
	if m := stepEqRe.FindStringSubmatch(stem); m != nil {
		c.setStep(m[1])
	} else if isLastName(stem) {
		c.tier = tierNamedLatest
	}
	if c.link && c.tier == tierNamedLatest {
		if target, err := os.Readlink(filepath.Join(dir, name)); err == nil {
			if m := stepEqRe.FindStringSubmatch(filepath.Base(target)); m != nil {
				c.setStep(m[1])
			}
		}
	}
	return c
}

// isLastName reports whether a .ckpt stem is a "last" checkpoint: Lightning's
// last / last-vN, or NeMo's "{filename}-last".
func isLastName(stem string) bool {
	return lightningLastRe.MatchString(stem) || strings.HasSuffix(stem, "-last")
}

// isCkptEntry reports whether auto-detection judges c by the *.ckpt rule from its name
// alone: a NAME.ckpt entry, or a Verify path no name rule took that is not a
// directory.
func (s *scan) isCkptEntry(c *candidate) bool {
	return c.fam == famCkpt || s.isFileCandidate(c)
}

// judgeCkpt is the *.ckpt layouts' rule for c, reported as label: unfinished when
// NeMo's marker for it exists (NeMo saves through Lightning's ModelCheckpoint, so
// even with --format lightning a save NeMo marks unfinished is not resumed from), then
// checkCkpt.
func (s *scan) judgeCkpt(c *candidate, label Format) verdict {
	if marker := nemoMarkerName(c.name); s.hasReserved(marker) {
		return notDone(label, "NeMo's marker %s exists: the save did not finish", marker)
	}
	return checkCkpt(s.path(c), label)
}

// checkCkpt applies Lightning's and NeMo's rule to a *.ckpt candidate (or a NeMo 2
// checkpoint directory). label is the format reported.
//
// A file is complete when it is a readable zip archive holding a data.pkl entry —
// torch.save's format since torch 1.6 (torch/serialization.py, _save with
// _use_new_zipfile_serialization). Lightning writes it in place with one write of an
// in-memory buffer (lightning/fabric/utilities/cloud_io.py, _atomic_save), so a crash
// leaves a prefix without the zip's end records. The check reads the end records and
// the central directory, not every byte: it does not verify CRCs.
//
// A symlink (Lightning's save_last="link" makes last.ckpt one) is judged by its target;
// a broken or self-referencing link is incomplete.
//
// A directory (Lightning's DeepSpeed and FSDP strategies, NeMo's distributed
// checkpoints) is complete when it holds a non-empty `.metadata`
// (torch.distributed.checkpoint) and the file its writer saves last (Lightning's
// meta.pt, or dist_checkpointing's metadata.json: checkShardedCkptDir), or NeMo 2's
// weights/.metadata, or a DeepSpeed `latest` naming a complete tag inside it.
func checkCkpt(path string, label Format) verdict {
	lfi, err := os.Lstat(path)
	if err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	fi := lfi
	if lfi.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		fi, err = os.Stat(path)
		switch {
		case err != nil && isLoop(err):
			return notDone(label, "symlink loop (%s -> %s)", filepath.Base(path), target)
		case errors.Is(err, fs.ErrNotExist):
			return notDone(label, "broken symlink to %s", target)
		case err != nil:
			return notDone(label, "symlink to %s: %s", target, describeFSError(err))
		}
	}
	if fi.IsDir() {
		return checkCkptDir(path, label)
	}
	if !fi.Mode().IsRegular() {
		return notDone(label, "not a regular file or directory")
	}
	return checkTorchZip(path, fi.Size(), label)
}

// checkTorchZip checks that path (size bytes) is a zip archive written by torch.save.
func checkTorchZip(path string, size int64, label Format) verdict {
	if size == 0 {
		return notDone(label, "empty file (0 bytes)")
	}
	f, err := os.Open(path)
	if err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	defer f.Close()
	zr, err := zip.NewReader(f, size)
	if err != nil {
		return notDone(label, "not a readable zip archive (torch.save writes one; truncated?): %v", err)
	}
	for _, zf := range zr.File {
		if zf.Name == "data.pkl" || strings.HasSuffix(zf.Name, "/data.pkl") {
			return done(label)
		}
	}
	return notDone(label, "zip archive without data.pkl: not written by torch.save")
}

// lightningMeta is Lightning's _METADATA_FILENAME (lightning/fabric/utilities/load.py):
// the FSDP and ModelParallel strategies' sharded save writes the shards
// (_distributed_checkpoint_save, torch.distributed.checkpoint), then rank 0 writes
// meta.pt with torch.save (_atomic_save, in place).
const lightningMeta = "meta.pt"

// checkShardedCkptDir judges a *.ckpt directory holding `.metadata`: the shards are
// complete by torch.distributed.checkpoint's rule, and the save's own last file must be
// whole — Lightning's meta.pt (its _is_sharded_checkpoint takes a directory as a
// checkpoint only when meta.pt is a file, lightning/fabric/strategies/fsdp.py), or, for
// NeMo's distributed checkpoints written by Megatron's dist_checkpointing,
// metadata.json (checkMegatronDCP's rule).
func checkShardedCkptDir(dir string, label Format) verdict {
	v := checkDCP(dir, label)
	if !v.complete {
		return v
	}
	if _, err := os.Lstat(filepath.Join(dir, megatronDistConfig)); err == nil {
		if _, why := readDistConfig(filepath.Join(dir, megatronDistConfig)); why != "" {
			return notDone(label, "%s %s: dist_checkpointing writes it last, so the save did not finish", megatronDistConfig, why)
		}
		return done(label)
	}
	if _, err := os.Lstat(filepath.Join(dir, lightningMeta)); err != nil {
		return notDone(label, "sharded checkpoint without %s: Lightning writes it after every shard (its _is_sharded_checkpoint needs it), so the save did not finish", lightningMeta)
	}
	if v, ok := checkTorchSaveFile(dir, lightningMeta, label); !ok {
		return v
	}
	return done(label)
}

// checkCkptDir applies the directory part of checkCkpt.
func checkCkptDir(dir string, label Format) verdict {
	if _, err := os.Lstat(filepath.Join(dir, dcpMetadata)); err == nil {
		return checkShardedCkptDir(dir, label)
	}
	if _, err := os.Lstat(filepath.Join(dir, "weights", dcpMetadata)); err == nil {
		v := checkDCP(filepath.Join(dir, "weights"), label)
		if !v.complete {
			v.reason = "weights/" + v.reason
		}
		return v
	}
	if data, err := readSmall(filepath.Join(dir, deepSpeedPointer)); err == nil {
		tag := strings.TrimSpace(string(data))
		if !validTag(tag) {
			return notDone(label, "%s/%s holds %q, not a tag name", filepath.Base(dir), deepSpeedPointer, clip(tag))
		}
		v := checkDeepSpeed(filepath.Join(dir, tag))
		v.format = label
		if !v.complete {
			v.reason = tag + ": " + v.reason
		}
		return v
	}
	if _, err := os.ReadDir(dir); err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	return notDone(label, "checkpoint directory without %s, weights/%s or a DeepSpeed %s: the save did not finish",
		dcpMetadata, dcpMetadata, deepSpeedPointer)
}
