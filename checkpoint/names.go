package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// family is the naming pattern a candidate's name follows, e.g. "step" for step-N; a
// layout says which families it takes and which it owns. Each family is declared next
// to the rule that produces it: the step-directory families here, the others in their
// layout's file.
type family string

const (
	// famNone: not a candidate name (a path given to Verify).
	famNone family = ""
	// famStep: step-N, step_N, stepN (torchtitan's step-N, the generic layout).
	famStep family = "step"
	// famCheckpoint: checkpoint-N (Hugging Face Trainer, generic).
	famCheckpoint family = "checkpoint"
	// famGlobalStep: global_stepN, global_step_N (DeepSpeed's default tag, generic).
	famGlobalStep family = "global_step"
	// famIter: iter_N (Megatron-LM's iter_%07d, generic).
	famIter family = "iter"
)

// stepDirRe matches the step-directory families: the prefix (the family's name), then
// an optional - or _, then the number.
var stepDirRe = regexp.MustCompile(`^(step|checkpoint|global_step|iter)[-_]?([0-9]+)$`)

// stepDirCandidate returns the candidate for a step-directory name (step-N,
// checkpoint-N, global_stepN, iter_N, as stepDirRe spells them) whose family is one
// of fams, or nil.
func stepDirCandidate(name string, typ fs.FileMode, fams ...family) *candidate {
	prefixed := false
	for _, f := range fams {
		if strings.HasPrefix(name, string(f)) {
			prefixed = true
			break
		}
	}
	if !prefixed {
		return nil
	}
	m := stepDirRe.FindStringSubmatch(name)
	if m == nil {
		return nil
	}
	for _, f := range fams {
		if string(f) == m[1] {
			c := newCandidate(name, f, typ)
			c.setStep(m[2])
			return c
		}
	}
	return nil
}

// Candidate tiers: how a candidate without a step number orders against stepped ones.
const (
	// tierUnstepped: no step, not named as the latest (e.g. best.ckpt): oldest.
	tierUnstepped = 0
	// tierStepped: the name carries a step.
	tierStepped = 1
	// tierNamedLatest: no step, but the trainer names it as its newest (Lightning's
	// last.ckpt, rewritten at every save; Megatron's release or a custom DeepSpeed tag
	// that the pointer file names).
	tierNamedLatest = 2
)

// candidate is one directory entry that may be a checkpoint.
type candidate struct {
	name string
	fam  family
	// step is the number in the name, -1 when none.
	step int64
	// badStep is set when the name's number does not fit in an int64.
	badStep string
	// tier is one of the tier constants (an int8, so that a candidate fits in 64
	// bytes: a directory listing makes one per entry).
	tier int8
	// link is true when the entry is a symlink.
	link bool
	// typ is the entry's type bits from the directory listing.
	typ fs.FileMode
}

// newCandidate returns an unstepped candidate for the entry name of type typ.
func newCandidate(name string, fam family, typ fs.FileMode) *candidate {
	return &candidate{name: name, fam: fam, step: -1, tier: tierUnstepped, link: typ&fs.ModeSymlink != 0, typ: typ}
}

// setStep parses digits as the candidate's step.
func (c *candidate) setStep(digits string) {
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		c.badStep = fmt.Sprintf("step number %s does not fit in 64 bits", digits)
		return
	}
	c.step = n
	c.tier = tierStepped
}

// isFileCandidate reports whether c is a Verify path no name rule took that is not (or
// does not lead to) a directory: the *.ckpt layouts' rule judges such a file.
func (s *scan) isFileCandidate(c *candidate) bool {
	return c.fam == famNone && !isDirPath(s.path(c))
}

// isDirPath reports whether path is (or links to) a directory.
func isDirPath(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// validTag reports whether a pointer file's content can name a directory entry: one
// path element, no separators, not "." or "..". Anything else could escape the
// checkpoint directory and is garbage.
func validTag(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\\\x00\n\r")
}
