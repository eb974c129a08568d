package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// scan is one look at a checkpoint directory: its candidates in newest-first order,
// its pointer files and NeMo markers, and the rule verdicts computed so far.
type scan struct {
	dir    string
	opts   Options
	cands  []*candidate
	byName map[string]*candidate
	// markers holds the names of NeMo "-unfinished" markers in the directory.
	markers map[string]bool
	ds, mg  *pointer
	pins    pinSet
	notes   []string
	// verdicts caches each candidate's own rule verdict, by name.
	verdicts map[string]verdict
}

// checkDir returns a *DirError when dir is not a directory it can stat.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return dirError(dir, err)
	}
	if !fi.IsDir() {
		if fi.Mode().IsRegular() {
			return &DirError{Path: dir, Problem: "is a file, not a directory"}
		}
		return &DirError{Path: dir, Problem: "is not a directory"}
	}
	return nil
}

// readDir lists dir unsorted, or returns a *DirError saying why dir cannot be used.
func readDir(dir string) ([]fs.DirEntry, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, dirError(dir, err)
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, dirError(dir, err)
	}
	return entries, nil
}

// dirError turns a file-system error on a path given by the caller into a *DirError.
func dirError(path string, err error) *DirError {
	switch {
	case isLoop(err):
		return &DirError{Path: path, Problem: "symlink loop", Err: err}
	case isNotExist(err):
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return &DirError{Path: path, Problem: "broken symlink", Err: err}
		}
		return &DirError{Path: path, Problem: "does not exist", Err: err}
	case errors.Is(err, syscall.ENOTDIR):
		return &DirError{Path: path, Problem: "a component of the path is not a directory", Err: err}
	case errors.Is(err, fs.ErrPermission):
		return &DirError{Path: path, Problem: "unreadable: permission denied", Err: err}
	}
	return &DirError{Path: path, Problem: "unreadable: " + err.Error(), Err: err}
}

// newScan lists dir and builds its candidates, pointers, markers and pins, and orders
// the candidates newest first. It reads no candidate's contents except the pointer
// targets'.
func newScan(dir string, opts Options) (*scan, error) {
	if _, err := ParseFormat(string(opts.Format)); err != nil {
		return nil, err
	}
	entries, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	s := &scan{
		dir: dir, opts: opts,
		byName:   make(map[string]*candidate),
		markers:  map[string]bool{},
		verdicts: map[string]verdict{},
	}
	f := opts.Format
	var hasLatest, hasTracker bool
	var release fs.DirEntry
	types := make(map[string]fs.FileMode, len(entries))
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		types[name] = e.Type()
		switch {
		case strings.HasSuffix(name, nemoUnfinishedSuffix):
			s.markers[name] = true
			continue
		case name == deepSpeedPointer:
			hasLatest = true
			continue
		case name == megatronTracker:
			hasTracker = true
			continue
		case name == megatronRelease:
			release = e
			continue
		}
		if c := parseName(name, e.Type(), f); c != nil {
			s.linkStep(c)
			s.add(c)
		}
	}
	if hasLatest && (f == FormatAuto || f == FormatDeepSpeed) {
		s.ds = readDeepSpeedPointer(dir)
	}
	if hasTracker && (f == FormatAuto || f == FormatMegatron) {
		s.mg = readMegatronTracker(dir, s.iterNameFor)
	}
	if release != nil && (f == FormatMegatron || (f == FormatAuto && s.mg != nil)) {
		c := &candidate{name: megatronRelease, fam: famRelease, step: -1, tier: tierUnstepped,
			link: release.Type()&fs.ModeSymlink != 0, typ: release.Type()}
		if s.mg != nil && s.mg.target == megatronRelease {
			c.tier = tierNamedLatest
		}
		s.add(c)
	}
	if s.ds != nil && s.ds.target != "" && s.byName[s.ds.target] == nil {
		if typ, ok := types[s.ds.target]; ok && !strings.HasSuffix(s.ds.target, nemoUnfinishedSuffix) {
			s.add(&candidate{name: s.ds.target, fam: famTag, step: -1, tier: tierNamedLatest,
				link: typ&fs.ModeSymlink != 0, typ: typ})
		}
	}
	for marker := range s.markers {
		if !s.markerHasCheckpoint(marker) {
			s.notes = append(s.notes, fmt.Sprintf("NeMo marker %s has no checkpoint next to it", marker))
		}
	}
	s.pins, s.notes = loadPins(dir, s.notes)
	s.order()
	for _, p := range []*pointer{s.ds, s.mg} {
		if p != nil {
			s.resolve(p)
		}
	}
	sort.Strings(s.notes)
	return s, nil
}

// linkStep gives a *.ckpt symlink without a step of its own (Lightning's last.ckpt
// with save_last="link") the step its target's name carries, so that it orders with
// the checkpoint it stands for.
func (s *scan) linkStep(c *candidate) {
	if !c.link || c.fam != famCkpt || c.tier != tierNamedLatest {
		return
	}
	target, err := os.Readlink(filepath.Join(s.dir, c.name))
	if err != nil {
		return
	}
	if m := stepEqRe.FindStringSubmatch(filepath.Base(target)); m != nil {
		c.setStep(m[1])
	}
}

func (s *scan) add(c *candidate) {
	if s.byName[c.name] != nil {
		return
	}
	s.byName[c.name] = c
	s.cands = append(s.cands, c)
}

// iterNameFor returns the iter_ candidate holding iteration n, preferring Megatron's
// own iter_%07d spelling, or that spelling when none exists.
func (s *scan) iterNameFor(n int64) string {
	want := megatronIterName(n)
	if s.byName[want] != nil {
		return want
	}
	for _, c := range s.cands {
		if c.fam == famIter && c.step == n {
			return c.name
		}
	}
	return want
}

// markerHasCheckpoint reports whether some candidate's NeMo marker is marker.
func (s *scan) markerHasCheckpoint(marker string) bool {
	for _, c := range s.cands {
		if (c.fam == famCkpt || c.fam == famNeMoDir) && nemoMarkerName(c.name) == marker {
			return true
		}
	}
	stem := strings.TrimSuffix(marker, nemoUnfinishedSuffix)
	for _, name := range []string{stem, stem + ckptExt, stem + "-EMA" + ckptExt, stem + ".nemo"} {
		if _, err := os.Lstat(filepath.Join(s.dir, name)); err == nil {
			return true
		}
	}
	return false
}

// order sorts the candidates newest first: by tier (a "named latest" candidate without
// a step first, unstepped ones last), then by step, then — only among candidates that
// tie so far — by modification time, then real entries before symlinks, then by name.
// Modification times are read only for the candidates that need them, so ordering
// 10,000 stepped directories costs no stat call.
func (s *scan) order() {
	type key struct {
		tier int
		step int64
	}
	count := map[key]int{}
	for _, c := range s.cands {
		count[key{c.tier, c.step}]++
	}
	mod := map[*candidate]time.Time{}
	for _, c := range s.cands {
		if count[key{c.tier, c.step}] > 1 {
			mod[c] = modTime(filepath.Join(s.dir, c.name))
		}
	}
	sort.SliceStable(s.cands, func(i, j int) bool {
		a, b := s.cands[i], s.cands[j]
		if a.tier != b.tier {
			return a.tier > b.tier
		}
		if a.step != b.step {
			return a.step > b.step
		}
		if ma, mb := mod[a], mod[b]; !ma.Equal(mb) {
			return ma.After(mb)
		}
		if a.link != b.link {
			return !a.link
		}
		return a.name < b.name
	})
}

// modTime returns path's modification time, following a symlink when it resolves.
func modTime(path string) time.Time {
	if fi, err := os.Stat(path); err == nil {
		return fi.ModTime()
	}
	if fi, err := os.Lstat(path); err == nil {
		return fi.ModTime()
	}
	return time.Time{}
}

// resolve decides whether pointer p is trusted, and records a note when it is not.
func (s *scan) resolve(p *pointer) {
	if p.resolved {
		return
	}
	p.resolved = true
	switch t := s.byName[p.target]; {
	case p.problem != "":
		p.note = fmt.Sprintf("%s %s: not trusted", p.file, p.problem)
	case t == nil:
		p.note = fmt.Sprintf("%s names %s, which does not exist: not trusted", p.file, p.target)
	default:
		if v := s.own(t); !v.complete {
			p.note = fmt.Sprintf("%s names %s, which is incomplete (%s): not trusted", p.file, p.target, v.reason)
		} else {
			p.trusted = true
		}
	}
	if p.note != "" {
		s.notes = append(s.notes, p.note+"; every candidate is judged by its own files")
	}
}

// own returns c's verdict under its layout's rule alone, without pointers.
func (s *scan) own(c *candidate) verdict {
	if v, ok := s.verdicts[c.name]; ok {
		return v
	}
	v := s.judge(c)
	s.verdicts[c.name] = v
	return v
}

// judge applies the rule for c's layout.
func (s *scan) judge(c *candidate) verdict {
	path := filepath.Join(s.dir, c.name)
	if c.badStep != "" {
		return notDone(s.label(c), "%s", c.badStep)
	}
	if c.fam == famHFTemp && (s.opts.Format == FormatAuto || s.opts.Format == FormatHF) {
		return notDone(FormatHF, "staging directory: transformers renames tmp-checkpoint-N to checkpoint-N when the save ends")
	}
	switch s.opts.Format {
	case FormatGeneric:
		return checkGeneric(path)
	case FormatDCP:
		return checkDCP(path, FormatDCP)
	case FormatHF:
		return checkHF(path)
	case FormatDeepSpeed:
		return checkDeepSpeed(path)
	case FormatMegatron:
		return checkMegatron(path)
	case FormatLightning, FormatNeMo:
		return s.judgeCkpt(c, s.opts.Format)
	}
	if c.fam == famCkpt || c.fam == famNeMoDir || (c.fam == famNone && !isDirPath(path)) {
		return s.judgeCkpt(c, s.label(c))
	}
	dcpLabel := FormatDCP
	if s.mg != nil && (c.fam == famIter || c.fam == famRelease) {
		dcpLabel = FormatMegatron
	}
	return classifyDir(path, s.label(c), dcpLabel)
}

// judgeCkpt is the *.ckpt rule (Lightning's and NeMo's) for c, reported as label:
// unfinished when NeMo's marker for it exists (NeMo saves through Lightning's
// ModelCheckpoint, so even with --format lightning a save NeMo marks unfinished is not
// resumed from), then checkCkpt. Under auto-detection a marker makes label nemo.
func (s *scan) judgeCkpt(c *candidate, label Format) verdict {
	if marker := nemoMarkerName(c.name); s.markers[marker] {
		return notDone(label, "NeMo's marker %s exists: the save did not finish", marker)
	}
	return checkCkpt(filepath.Join(s.dir, c.name), label)
}

// label is the format reported for c when its rule cannot tell.
func (s *scan) label(c *candidate) Format {
	if s.opts.Format != FormatAuto {
		return s.opts.Format
	}
	switch {
	case c.fam == famCkpt || (c.fam == famNone && !isDirPath(filepath.Join(s.dir, c.name))):
		if len(s.markers) > 0 || strings.Contains(c.name, "--") {
			return FormatNeMo
		}
		return FormatLightning
	case s.ds != nil && (c.fam == famGlobalStep || c.fam == famTag):
		return FormatDeepSpeed
	case s.mg != nil && (c.fam == famIter || c.fam == famRelease):
		return FormatMegatron
	case c.fam == famStep || c.fam == famNone:
		return FormatGeneric
	}
	return guessFormat(c.fam)
}

// isDirPath reports whether path is (or links to) a directory.
func isDirPath(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// pointerOver returns the trusted pointer that governs c and its target, if any.
func (s *scan) pointerOver(c *candidate) (*pointer, *candidate) {
	if p := s.ds; p != nil && p.trusted {
		t := s.byName[p.target]
		if c.fam == t.fam || c.fam == famTag {
			return p, t
		}
	}
	if p := s.mg; p != nil && p.trusted && (c.fam == famIter || c.fam == famRelease) {
		return p, s.byName[p.target]
	}
	return nil, nil
}

// evaluate returns c as a Checkpoint with its final verdict: its own rule, then the
// pointer governing it. Size and time are not filled (see fill).
func (s *scan) evaluate(c *candidate) Checkpoint {
	v := s.own(c)
	if v.complete {
		if p, t := s.pointerOver(c); p != nil && t != c && newerKey(c, t) {
			who := "DeepSpeed writes latest"
			if p == s.mg {
				who = "Megatron-LM writes " + megatronTracker
			}
			v = notDone(v.format, "newer than %s, which %s names: %s only after every rank has saved, so this save did not finish",
				t.name, p.file, who)
		}
	}
	return Checkpoint{
		Path:     filepath.Join(s.dir, c.name),
		Step:     c.step,
		Format:   v.format,
		Complete: v.complete,
		Reason:   v.reason,
		Pinned:   s.pins.holds(c.name),
	}
}

// newerKey reports whether a orders strictly before b by tier and step.
func newerKey(a, b *candidate) bool {
	if a.tier != b.tier {
		return a.tier > b.tier
	}
	return a.step > b.step
}

// fill sets cp's modification time and link target and, when withSize, its size.
func (s *scan) fill(cp *Checkpoint, c *candidate, withSize bool) {
	path := filepath.Join(s.dir, c.name)
	cp.ModTime = modTime(path)
	if c.link {
		cp.Link, _ = os.Readlink(path)
	}
	if withSize {
		cp.SizeBytes = sizeOf(path)
	}
}

// sizeOf returns the total size in bytes of the regular files under path (path itself
// when it is a file), following path itself when it is a symlink but no link inside.
func sizeOf(path string) int64 {
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return 0
	}
	var total int64
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total
}

// excludedSet returns the set of absolute paths among paths.
func excludedSet(paths []string) map[string]bool {
	out := make(map[string]bool, len(paths))
	for _, p := range paths {
		if abs, err := filepath.Abs(p); err == nil {
			out[abs] = true
		}
	}
	return out
}

// Latest returns the newest complete checkpoint in dir: it orders the candidates
// newest first by name alone and checks them in that order, stopping at the first
// complete one that opts.Exclude does not name, so its cost grows with the number of
// incomplete candidates newer than the answer, not with the number of checkpoints.
// The Checkpoint returned has its size and time filled.
//
// Errors: a *DirError when dir is missing, not a directory, a symlink loop or
// unreadable; a *NoCompleteError (errors.Is(err, ErrNoComplete)) listing every
// rejected candidate and why when none is complete; an error for an unknown format.
func Latest(dir string, opts Options) (Checkpoint, error) {
	s, err := newScan(dir, opts)
	if err != nil {
		return Checkpoint{}, err
	}
	excl := excludedSet(opts.Exclude)
	var rejected []Checkpoint
	for _, c := range s.cands {
		cp := s.evaluate(c)
		if cp.Complete && len(excl) > 0 {
			if abs, err := filepath.Abs(cp.Path); err == nil && excl[abs] {
				cp.Reason = "excluded by the caller (Options.Exclude)"
				rejected = append(rejected, cp)
				continue
			}
		}
		if cp.Complete {
			s.fill(&cp, c, true)
			return cp, nil
		}
		rejected = append(rejected, cp)
	}
	return Checkpoint{}, &NoCompleteError{Dir: dir, Rejected: rejected, Notes: s.notes}
}

// List returns every candidate checkpoint in dir, newest first, each verified and with
// its size and time filled. Errors as Latest's, except that no complete checkpoint is
// not an error.
func List(dir string, opts Options) ([]Checkpoint, error) {
	l, err := Inspect(dir, opts)
	return l.Checkpoints, err
}

// Inspect is List with the directory-level notes (pointer files not trusted, orphan
// NeMo markers, stale or unreadable pins).
func Inspect(dir string, opts Options) (Listing, error) {
	s, err := newScan(dir, opts)
	if err != nil {
		return Listing{Dir: dir}, err
	}
	out := Listing{Dir: dir, Checkpoints: make([]Checkpoint, 0, len(s.cands)), Notes: s.notes}
	for _, c := range s.cands {
		cp := s.evaluate(c)
		s.fill(&cp, c, true)
		out.Checkpoints = append(out.Checkpoints, cp)
	}
	return out, nil
}

// Verify judges one path as a checkpoint, in the context of the directory holding it
// (its pointer files and NeMo markers), exactly as List would. A path whose name is no
// candidate name is judged by its contents (FormatAuto) or by the forced format's rule.
//
// Errors: a *DirError when path does not exist (a dangling symlink does exist: it is
// an incomplete checkpoint); an error for an unknown format.
func Verify(path string, opts Options) (Checkpoint, error) {
	if _, err := ParseFormat(string(opts.Format)); err != nil {
		return Checkpoint{}, err
	}
	clean := filepath.Clean(path)
	lfi, err := os.Lstat(clean)
	if err != nil {
		de := dirError(path, err)
		de.what = "checkpoint"
		return Checkpoint{}, de
	}
	abs, err := filepath.Abs(clean)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("verify %s: %w", path, err)
	}
	parent, name := filepath.Dir(abs), filepath.Base(abs)
	s, err := newScan(parent, opts)
	if err != nil {
		s = &scan{dir: parent, opts: opts, byName: map[string]*candidate{}, markers: map[string]bool{}, verdicts: map[string]verdict{}}
	}
	c := s.byName[name]
	if c == nil {
		c = parseName(name, lfi.Mode().Type(), FormatAuto)
		if c != nil {
			s.linkStep(c)
		} else {
			c = &candidate{name: name, fam: famNone, step: -1, link: lfi.Mode()&fs.ModeSymlink != 0, typ: lfi.Mode().Type()}
		}
	}
	cp := s.evaluate(c)
	s.fill(&cp, c, true)
	cp.Path = clean
	return cp, nil
}
