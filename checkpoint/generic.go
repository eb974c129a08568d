package checkpoint

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// FormatGeneric is step-N / checkpoint-N / global_stepN / iter_N directories holding
// a `.complete` marker, written last by the trainer (gangrun's example trainer does
// this).
const FormatGeneric Format = "generic"

// genericMarker is the generic layout's completion marker, written last.
const genericMarker = ".complete"

// genericLayout is gangrun's own convention, for any trainer: a step directory under
// any of the names the trainers below use, complete when the trainer wrote
// `.complete` into it as its last act. Under auto-detection it owns step-N names (and
// a Verify path that is a directory), and a `.complete` marker decides before any
// other layout's: the trainer says the save is done.
type genericLayout struct{}

func (genericLayout) info() layoutInfo {
	return layoutInfo{
		format: FormatGeneric,
		names:  "step-N, checkpoint-N, checkpoint_N, global_stepN and iter_N directories",
		marker: genericMarker,
	}
}

func (genericLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famStep, famCheckpoint, famGlobalStep, famIter)
}

func (genericLayout) reserves(string) bool { return false }

// judge: the directory holds a `.complete` marker.
func (genericLayout) judge(s *scan, c *candidate) verdict {
	dir := s.path(c)
	if _, err := os.Stat(dir); err != nil {
		return notDone(FormatGeneric, "%s", describeFSError(err))
	}
	if _, err := os.Lstat(filepath.Join(dir, genericMarker)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return notDone(FormatGeneric, "no %s marker: the save did not finish", genericMarker)
		}
		return notDone(FormatGeneric, "%s: %s", genericMarker, describeFSError(err))
	}
	return done(FormatGeneric)
}

func (genericLayout) claim(s *scan, c *candidate) nameClaim {
	if c.fam == famStep || (c.fam == famNone && isDirPath(s.path(c))) {
		return mine
	}
	return notMine
}

// detect: a `.complete` marker is the trainer's word that the save is done.
func (genericLayout) detect(_ *scan, _ *candidate, _ string, entries []fs.DirEntry) (verdict, bool) {
	if hasEntry(entries, genericMarker) {
		return done(FormatGeneric), true
	}
	return verdict{}, false
}

func (genericLayout) notes(*scan) []string { return nil }
