package runner

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gangrun/gangrun/launcher"
)

// The errors of Run and RunPairwise, by what the command does with them: a
// *UsageError is the user's to fix and nothing was started (gangrun exits 2); a
// *NotFoundError names a program missing from PATH (127); a *GangError is a gang that
// failed, already reported by Supervise (its Result's exit code); a
// *proc.SignalError (internal/proc) is a sweep stopped by a signal (128+N); ErrStopped
// is a sweep stopped before it started, by a signal the caller already reports; a
// *WrongElementsError or *PairsFailedError comes with results to print first; any
// other error is a failure (1).

// ErrStopped is returned by RunPairwise when Config.HandOver reports that a
// terminating signal stopped the command before the sweep started.
var ErrStopped = errors.New("stopped by a signal before the benchmark started")

// UsageError is a configuration, or a node, that cannot run the benchmark: a bad flag,
// a gang that cannot be prepared, nccl without GPUs, an interpreter without torch.
// Nothing was started.
type UsageError struct{ Err error }

// Error returns the one-line reason, naming the flag to fix.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the reason.
func (e *UsageError) Unwrap() error { return e.Err }

// NotFoundError is a program the benchmark needs that is not on PATH: the interpreter
// (--python) or an nccl-tests binary.
type NotFoundError struct {
	// Program is the name looked for on PATH.
	Program string
	msg     string
}

// Error says what is missing and how to get it.
func (e *NotFoundError) Error() string { return e.msg }

// GangError is a benchmark gang that did not succeed. Supervise has reported why; the
// command exits with Result.ExitCode.
type GangError struct {
	Result launcher.Result
}

// Error describes the failure: the root-cause worker, the error that ended the run, or
// the exit code.
func (e *GangError) Error() string {
	switch {
	case e.Result.Failure != nil:
		return e.Result.Failure.String()
	case e.Result.Err != nil:
		return e.Result.Err.Error()
	}
	return fmt.Sprintf("the benchmark's gang exited with code %d", e.Result.ExitCode)
}

// Unwrap returns the error that ended the run, nil when a worker was to blame.
func (e *GangError) Unwrap() error { return e.Result.Err }

// WrongElementsError comes with Run's results when some timed halves had wrong
// elements (the #wrong column): print the results, then fail, as nccl-tests does.
type WrongElementsError struct {
	// Halves is the number of timed halves (rows) with wrong elements.
	Halves int
}

// Error says how many halves were wrong.
func (e *WrongElementsError) Error() string {
	return fmt.Sprintf("%d timed halves had wrong elements (see the #wrong column)", e.Halves)
}

// PairsFailedError comes with RunPairwise's sweep when some pairs failed: print the
// sweep, then fail.
type PairsFailedError struct {
	// Failed describes each failed pair, "a–b: why" (bench.Fabric.FailedPairs).
	Failed []string
	// Pairs is the number of pairs the node read: every pair on node rank 0, its own
	// on the others.
	Pairs int
}

// Error lists the failed pairs: "2 of 3 pairs failed: a–c: …; b–c: …".
func (e *PairsFailedError) Error() string {
	return fmt.Sprintf("%d of %d pairs failed: %s", len(e.Failed), e.Pairs, strings.Join(e.Failed, "; "))
}
