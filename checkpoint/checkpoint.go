// Package checkpoint finds the newest really-complete training checkpoint in a
// directory, in the layouts the common trainers write, and keeps retention from
// deleting what a job resumes from.
//
// Trainers save non-atomically: a crash or a power loss mid-save leaves a newest
// directory that looks complete and is not. Each layout has one rule, taken from the
// trainer's own save code, for telling a finished save from an interrupted one; this
// package applies it (one file per layout, registered in layout.go) and never trusts a
// pointer file (DeepSpeed's `latest`, Megatron-LM's tracker) whose target is missing or
// incomplete.
//
// Entry points: Latest (the resume path, fast: it checks candidates newest first and
// stops at the first complete one), List and Inspect (every candidate, verified),
// Verify (one path), Pin (protect the checkpoint a job resumed from), Prune and
// Plan.Apply (retention).
package checkpoint

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Format names a checkpoint layout: which names are candidates and which rule says a
// candidate is complete. Each layout's constant (FormatGeneric, FormatHF, FormatDCP,
// FormatDeepSpeed, FormatMegatron, FormatNeMo, FormatLightning) is declared in the
// layout's own file, with the source of its rule; Formats lists them.
type Format string

// FormatAuto detects the layout of each candidate from its name, the pointer files
// next to it and its contents (layout.go, layouts).
const FormatAuto Format = ""

// Formats returns every forcible format, in auto-detection order (the order of
// layouts in layout.go).
func Formats() []Format {
	ls := layouts()
	out := make([]Format, len(ls))
	for i, l := range ls {
		out[i] = l.info().format
	}
	return out
}

// ParseFormat returns the Format named by s: one of Formats(), or "" / "auto" for
// FormatAuto. Any other value is an error naming it and listing the accepted ones.
func ParseFormat(s string) (Format, error) {
	if s == "" || s == "auto" {
		return FormatAuto, nil
	}
	if l := layoutFor(Format(s)); l != nil {
		return l.info().format, nil
	}
	return FormatAuto, fmt.Errorf("unknown checkpoint format %q (want one of %s)", s, formatList())
}

// Checkpoint is one candidate checkpoint: a directory (or, for Lightning and NeMo, a
// file) directly inside the checkpoint directory.
type Checkpoint struct {
	// Path is the checkpoint directory joined with the candidate's name.
	Path string `json:"path"`
	// Step is the training step (or iteration) the name carries; -1 when the layout has
	// none (Lightning's last.ckpt, Megatron's release, a custom DeepSpeed tag).
	Step int64 `json:"step"`
	// Format is the layout whose rule judged the candidate.
	Format Format `json:"format"`
	// Complete is true when the layout's completion rule holds and no pointer file
	// says the save is unfinished.
	Complete bool `json:"complete"`
	// Reason says why the candidate is not complete or not trusted; empty when complete.
	Reason string `json:"reason,omitempty"`
	// SizeBytes is the total size of the candidate's regular files, in bytes (for a
	// symlink, of its target). Latest fills it only for the checkpoint it returns.
	SizeBytes int64 `json:"size_bytes"`
	// ModTime is the candidate's modification time (its target's, for a symlink).
	ModTime time.Time `json:"mod_time"`
	// Pinned is true when a live pin (see Pin) holds the candidate.
	Pinned bool `json:"pinned,omitempty"`
	// Link is where the candidate points when it is a symlink (Lightning's last.ckpt
	// with save_last="link"), as written in the link.
	Link string `json:"link,omitempty"`
}

// Options tunes List, Inspect, Latest, Verify and Prune.
type Options struct {
	// Format forces one layout; FormatAuto (the zero value) detects it per candidate.
	Format Format
	// Exclude lists checkpoint paths Latest must never return (the supervisor's
	// fallback away from a checkpoint that crashes every load). Paths compare after
	// filepath.Abs. List, Inspect, Verify and Prune ignore it.
	Exclude []string
}

// Listing is every candidate of a directory, newest first, with the directory-level
// findings that belong to no single candidate.
type Listing struct {
	// Dir is the checkpoint directory as given.
	Dir string `json:"dir"`
	// Checkpoints holds every candidate, newest first (see ordering in scan.go).
	Checkpoints []Checkpoint `json:"checkpoints"`
	// Notes reports what was found and not trusted: a pointer file naming a missing or
	// incomplete checkpoint or holding garbage, a NeMo marker without its checkpoint,
	// stale or unreadable pins.
	Notes []string `json:"notes,omitempty"`
}

// ErrNoComplete is returned (wrapped in a *NoCompleteError) by Latest when no
// candidate is complete.
var ErrNoComplete = errors.New("no complete checkpoint")

// NoCompleteError is Latest's error when no candidate is complete; errors.Is(err,
// ErrNoComplete) holds. Its text names each rejected candidate and why.
type NoCompleteError struct {
	// Dir is the checkpoint directory searched.
	Dir string
	// Rejected holds every candidate, newest first, each with its Reason.
	Rejected []Checkpoint
	// Notes are the directory-level findings (see Listing.Notes).
	Notes []string
}

// maxReasonsInError bounds how many rejected candidates NoCompleteError.Error spells
// out; Rejected always holds all of them.
const maxReasonsInError = 20

// Error returns "no complete checkpoint in DIR: NAME: REASON; ..." on one line.
func (e *NoCompleteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s in %s", ErrNoComplete, e.Dir)
	if len(e.Rejected) == 0 {
		b.WriteString(": no candidates (looked for " + NamesLookedFor() + ")")
	}
	for i, c := range e.Rejected {
		if i == maxReasonsInError {
			fmt.Fprintf(&b, "; and %d more", len(e.Rejected)-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s: %s", sep, baseName(c.Path), c.Reason)
	}
	for _, n := range e.Notes {
		fmt.Fprintf(&b, "; note: %s", n)
	}
	return b.String()
}

// Is reports whether target is ErrNoComplete.
func (e *NoCompleteError) Is(target error) bool { return target == ErrNoComplete }

// DirError reports a checkpoint directory (or a path given to Verify or Pin) that
// cannot be used: missing, not a directory, a symlink loop, unreadable. It wraps the
// file-system error, so errors.Is(err, fs.ErrNotExist) holds for a directory that does
// not exist (a job's first start, before the trainer created it) and
// errors.Is(err, fs.ErrPermission) for an unreadable one.
type DirError struct {
	// Path is the path as given.
	Path string
	// Problem says what is wrong, e.g. "does not exist".
	Problem string
	// Err is the underlying error, when there is one.
	Err error

	// what names the path in the message: "checkpoint dir" (the default) or
	// "checkpoint".
	what string
}

// Error returns `checkpoint dir "PATH": PROBLEM` (`checkpoint "PATH": ...` for a path
// given to Verify or Pin).
func (e *DirError) Error() string {
	what := e.what
	if what == "" {
		what = "checkpoint dir"
	}
	return fmt.Sprintf("%s %q: %s", what, e.Path, e.Problem)
}

// Unwrap returns the underlying error.
func (e *DirError) Unwrap() error { return e.Err }
