package checkpoint

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// layout is one trainer's checkpoint layout: the directory entries it takes as
// candidates and their step, the rule that says whether a candidate is complete (or
// why not), and how auto-detection recognises a candidate as its own. A layout is a
// stateless value; what it learns about one directory (its pointer file, its markers)
// lives in the scan. A layout whose trainer writes a pointer file naming its newest
// checkpoint also implements pointerLayout (pointer.go).
//
// Adding a layout is one new file holding its type (copy generic.go) and one line in
// layouts.
type layout interface {
	// info returns the layout's name and the phrases messages use about it.
	info() layoutInfo
	// candidate returns the candidate the entry name (of type typ, directly inside dir)
	// is under this layout, with its step, or nil when the layout does not take the
	// name. It reads nothing but, for a symlink whose name carries no step, the link.
	candidate(dir, name string, typ fs.FileMode) *candidate
	// reserves reports whether name is one of the layout's own bookkeeping entries (a
	// pointer file, an unfinished-save marker, a name it takes only on its own terms):
	// never a candidate by its name, whatever the format.
	reserves(name string) bool
	// judge applies the layout's completion rule to c, as when --format forces the
	// layout; the verdict carries the layout's format.
	judge(s *scan, c *candidate) verdict
	// claim says what c's name means to this layout under auto-detection (see
	// nameClaim).
	claim(s *scan, c *candidate) nameClaim
	// detect applies the layout's rule, under auto-detection, to directory candidate c
	// when its listing (entries, of dir) holds the layout's own marker; ok is false
	// when it does not.
	detect(s *scan, c *candidate, dir string, entries []fs.DirEntry) (v verdict, ok bool)
	// notes returns what the layout found in the directory and does not trust, for
	// Listing.Notes (a NeMo marker with no checkpoint); nil when nothing.
	notes(s *scan) []string
}

// layoutInfo names a layout and says, for messages, what it looks for.
type layoutInfo struct {
	// format is the layout's name: what --format takes and Checkpoint.Format reports.
	format Format
	// names describes the entries the layout looks for in a checkpoint directory, for
	// the "no candidates" message; "" when another layout's phrase covers them.
	names string
	// marker describes what auto-detection looks for inside a directory, for the "no
	// completion marker" reason; "" when the layout is not detected by contents.
	marker string
}

// nameClaim is what a candidate's name tells a layout under auto-detection.
type nameClaim int

const (
	// notMine: the name is not this layout's own spelling (it may still take it, as dcp
	// takes every generic name).
	notMine nameClaim = iota
	// mine: the name is this layout's own spelling; the first layout (in layouts order)
	// to claim a candidate is its owner, whose format an undecided candidate reports.
	// The directory's contents still decide which rule applies.
	mine
	// mineAlone: as mine, and the owner's rule judges the candidate without looking
	// for another layout's marker inside it (a *.ckpt entry, transformers' staging
	// directory).
	mineAlone
)

// layouts returns every layout, in auto-detection order: a candidate's owner is the
// first layout that claims its name, and a directory candidate is judged by the first
// layout whose marker its listing holds — `.complete` (the trainer says it is done)
// before trainer_state.json before `.metadata` before OLMo-core's .metadata.json or
// model_and_optim/ before model.safetensors.index.json (torchtitan's HF export) before
// accelerate's random_states_*.pkl before DeepSpeed's rank files before Megatron-LM's
// rank directories before Levanter's metadata.json; NeMo claims a *.ckpt entry before
// Lightning does when the directory holds NeMo's markers or the name its "--".
// Formats lists the layouts in this order. A new layout is one line here.
func layouts() []layout {
	return []layout{
		genericLayout{},
		hfLayout{},
		dcpLayout{},
		olmoCoreLayout{},
		torchtitanLayout{},
		accelerateLayout{},
		deepSpeedLayout{},
		megatronLayout{},
		levanterLayout{},
		composerLayout{},
		nemoLayout{},
		lightningLayout{},
	}
}

// layoutFor returns the layout named f, or nil (for FormatAuto or an unknown name).
func layoutFor(f Format) layout {
	for _, l := range layouts() {
		if l.info().format == f {
			return l
		}
	}
	return nil
}

// NamesLookedFor says, for help and error text, which entries of a checkpoint
// directory the layouts look for: every layout's phrase, in layouts order, as
// "step-N, checkpoint-N, global_stepN and iter_N directories, DeepSpeed's latest,
// Megatron's latest_checkpointed_iteration.txt and *.ckpt".
func NamesLookedFor() string {
	var parts []string
	for _, l := range layouts() {
		if n := l.info().names; n != "" {
			parts = append(parts, n)
		}
	}
	return joinAnd(parts)
}

// joinAnd joins parts as "a, b and c".
func joinAnd(parts []string) string {
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// parseCandidate returns the candidate name is under the first of ls that takes it,
// or nil.
func parseCandidate(ls []layout, dir, name string, typ fs.FileMode) *candidate {
	for _, l := range ls {
		if c := l.candidate(dir, name, typ); c != nil {
			return c
		}
	}
	return nil
}

// judge returns c's verdict under its layout's rule alone, without pointers: the
// forced layout's rule, or auto-detection's choice.
func (s *scan) judge(c *candidate) verdict {
	if s.forced != nil {
		if c.badStep != "" {
			return notDone(s.forced.info().format, "%s", c.badStep)
		}
		return s.forced.judge(s, c)
	}
	return s.autoJudge(c)
}

// autoJudge is auto-detection: c's owner is the first layout that claims its name; a
// step number that does not fit is the owner's verdict; an owner claiming the name
// alone judges it; otherwise the directory is listed once and the first layout whose
// marker it holds judges it. A directory holding no layout's marker is incomplete,
// reported as its owner's.
func (s *scan) autoJudge(c *candidate) verdict {
	owner, claim := s.owner(c)
	format := owner.info().format
	if c.badStep != "" {
		return notDone(format, "%s", c.badStep)
	}
	if claim == mineAlone {
		return owner.judge(s, c)
	}
	path := filepath.Join(s.dir, c.name)
	entries, err := os.ReadDir(path)
	if err != nil {
		return notDone(format, "%s", describeFSError(err))
	}
	for _, l := range s.layouts {
		if v, ok := l.detect(s, c, path, entries); ok {
			return v
		}
	}
	if len(entries) == 0 {
		return notDone(format, "empty directory: the save did not start or did not finish")
	}
	return notDone(format, "no completion marker: none of %s", s.markerList())
}

// markerList is "M (F), ..." for every layout with a marker, in layouts order: what
// auto-detection looks for inside a directory. It is built once per scan.
func (s *scan) markerList() string {
	if s.markers == "" {
		var parts []string
		for _, l := range s.layouts {
			if in := l.info(); in.marker != "" {
				parts = append(parts, in.marker+" ("+string(in.format)+")")
			}
		}
		s.markers = strings.Join(parts, ", ")
	}
	return s.markers
}

// owner returns the first layout that claims c's name, and its claim. Every name a
// layout takes is some layout's own; a name none claims would be reported as the
// first layout's.
func (s *scan) owner(c *candidate) (layout, nameClaim) {
	for _, l := range s.layouts {
		if cl := l.claim(s, c); cl != notMine {
			return l, cl
		}
	}
	return s.layouts[0], notMine
}

// hasEntry reports whether a directory listing holds an entry named name.
func hasEntry(entries []fs.DirEntry, name string) bool {
	for _, e := range entries {
		if e.Name() == name {
			return true
		}
	}
	return false
}

// checkFormat returns an error naming f when it is not a format ParseFormat accepts.
func checkFormat(f Format) error {
	_, err := ParseFormat(string(f))
	return err
}

// formatList is "auto, " followed by every layout's format, for messages.
func formatList() string {
	names := []string{"auto"}
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}
