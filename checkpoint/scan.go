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

	"github.com/gangrun/gangrun/internal/userfile"
)

// scan is one look at a checkpoint directory: its candidates in newest-first order,
// the entries layouts reserve (pointer files, markers), the pointers read, and the
// rule verdicts computed so far.
type scan struct {
	dir  string
	opts Options
	// layouts is layouts(), once per scan; forced is the layout opts.Format names, nil
	// under auto-detection.
	layouts []layout
	forced  layout
	cands   []*candidate
	byName  map[string]*candidate
	// listed holds every entry's type from the listing, by name (dot names left out).
	listed map[string]fs.FileMode
	// reserved holds the entries some layout reserves (see layout.reserves), by name.
	reserved map[string]fs.FileMode
	// pointers holds the pointer files read, in layouts order.
	pointers []*pointer
	pins     pinSet
	notes    []string
	// verdicts caches each candidate's own rule verdict, by name.
	verdicts map[string]verdict
	// markers caches markerList.
	markers string
}

// emptyScan returns a scan of dir with nothing listed.
func emptyScan(dir string, opts Options) *scan {
	return &scan{
		dir: dir, opts: opts,
		layouts:  layouts(),
		forced:   layoutFor(opts.Format),
		byName:   map[string]*candidate{},
		listed:   map[string]fs.FileMode{},
		reserved: map[string]fs.FileMode{},
		verdicts: map[string]verdict{},
	}
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
		return &DirError{Path: dir, Problem: "is " + userfile.Kind(fi.Mode()) + ", not a directory"}
	}
	return nil
}

// readDir lists dir unsorted, or returns a *DirError saying why dir cannot be used.
func readDir(dir string) ([]fs.DirEntry, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	f, err := userfile.OpenDir(dir) // never blocks, should dir have become a FIFO since
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
	if err := checkFormat(opts.Format); err != nil {
		return nil, err
	}
	entries, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	s := emptyScan(dir, opts)
	s.listed = make(map[string]fs.FileMode, len(entries))
	takers := s.layouts
	if s.forced != nil {
		takers = []layout{s.forced}
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		s.listed[name] = e.Type()
		if s.isReserved(name) {
			s.reserved[name] = e.Type()
			continue
		}
		if c := parseCandidate(takers, dir, name, e.Type()); c != nil {
			s.add(c)
		}
	}
	s.readPointers()
	for _, l := range s.layouts {
		s.notes = append(s.notes, l.notes(s)...)
	}
	s.pins, s.notes = loadPins(dir, s.notes)
	s.order()
	for _, p := range s.pointers {
		s.resolve(p)
	}
	sort.Strings(s.notes)
	return s, nil
}

// isReserved reports whether some layout reserves the entry name.
func (s *scan) isReserved(name string) bool {
	for _, l := range s.layouts {
		if l.reserves(name) {
			return true
		}
	}
	return false
}

// hasReserved reports whether the listing holds the reserved entry name.
func (s *scan) hasReserved(name string) bool {
	_, ok := s.reserved[name]
	return ok
}

func (s *scan) add(c *candidate) {
	if s.byName[c.name] != nil {
		return
	}
	s.byName[c.name] = c
	s.cands = append(s.cands, c)
}

// path returns c's path: the checkpoint directory joined with its name.
func (s *scan) path(c *candidate) string { return filepath.Join(s.dir, c.name) }

// order sorts the candidates newest first: by tier (a "named latest" candidate without
// a step first, unstepped ones last), then by step, then — only among candidates that
// tie so far — by modification time, then real entries before symlinks, then by name.
// Modification times are read only for the candidates that need them, so ordering
// 10,000 stepped directories costs no stat call.
func (s *scan) order() {
	type key struct {
		tier int8
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

// own returns c's verdict under its layout's rule alone, without pointers.
func (s *scan) own(c *candidate) verdict {
	if v, ok := s.verdicts[c.name]; ok {
		return v
	}
	v := s.judge(c)
	s.verdicts[c.name] = v
	return v
}

// evaluate returns c as a Checkpoint with its final verdict: its own rule, then the
// pointer governing it. Size and time are not filled (see fill).
func (s *scan) evaluate(c *candidate) Checkpoint {
	v := s.own(c)
	if v.complete {
		if p, t := s.pointerOver(c); p != nil && t != c && newerKey(c, t) {
			v = notDone(v.format, "newer than %s, which %s names: %s only after every rank has saved, so this save did not finish",
				t.name, p.file, p.who)
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
	if err := checkFormat(opts.Format); err != nil {
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
		s = emptyScan(parent, opts)
	}
	c := s.byName[name]
	if c == nil {
		c = parseCandidate(s.layouts, parent, name, lfi.Mode().Type())
		if c == nil {
			c = newCandidate(name, famNone, lfi.Mode().Type())
		}
	}
	cp := s.evaluate(c)
	s.fill(&cp, c, true)
	cp.Path = clean
	return cp, nil
}
