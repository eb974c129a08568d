package job

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/store"
)

// Signalling a running job without cancelling it (Slurm's `scancel --signal=SIG
// [--batch|--full] JOB`): the signal is written into the job's record
// (State.Signals), which every node's step follows, as a pre-emption's is; each step
// gives it to its processes on that node where the request's Target says. The job
// keeps running unless its processes die of it.

// Where a signal request goes (SignalRequest.Target), as scancel 22.05 sends it.
const (
	// SignalSteps is scancel's default: the job's srun steps' tasks, not the batch
	// shell (for a job of gangrun's own, not a batch job: its workers).
	SignalSteps = "steps"
	// SignalBatch is scancel --batch: the batch shell (its process group: the shell and
	// the children it started, not the srun steps' tasks).
	SignalBatch = "batch"
	// SignalFull is scancel --full: the batch shell and every step's tasks.
	SignalFull = "full"
)

// SignalRequest is one signal a user sent to a running job (State.Signals).
type SignalRequest struct {
	// Signal is the signal's number; Target where it goes (SignalSteps, SignalBatch,
	// SignalFull).
	Signal int    `json:"signal"`
	Target string `json:"target"`
	// At is when it was asked, By by whom.
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
}

// maxSignalsKept bounds the signal requests a job's record keeps (the newest).
const maxSignalsKept = 64

// SignalNumber is the signal scancel --signal names: a name with or without SIG
// ("USR2", "SIGTERM", any case) or a number from 1 to 64. An unknown one is an error
// in Slurm's words ("Unknown job signal: X").
func SignalNumber(v string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("Unknown job signal: %s", v)
		}
		return syscall.Signal(n), nil
	}
	if s, ok := signalNames[strings.TrimPrefix(strings.ToUpper(v), "SIG")]; ok {
		return s, nil
	}
	return 0, fmt.Errorf("Unknown job signal: %s", v)
}

// checkTarget refuses a target that is none of SignalSteps, SignalBatch, SignalFull.
func checkTarget(t string) error {
	if t != SignalSteps && t != SignalBatch && t != SignalFull {
		return &invalid{fmt.Errorf("unknown signal target %q", t)}
	}
	return nil
}

// SignalJob sends sig to running job id (every running task of job array id) where
// target says, for by (recorded with it), with also written in the same transaction
// (an audit entry). It returns how many jobs it signalled. Errors, in Slurm's words:
// ErrPending for a pending job ("Job is pending execution"), ErrFinished for one that
// ended, ErrNotRunning for one stopping, ErrNotFound; for an array, only when none of
// its tasks runs (then the first task's).
func SignalJob(ctx context.Context, s store.Store, id string, sig syscall.Signal, target, by string, also ...store.Op) (int, error) {
	if err := checkID(id); err != nil {
		return 0, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	if err := checkTarget(target); err != nil {
		return 0, err
	}
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		if err := signalOne(ctx, s, id, sig, target, by, also...); err != nil {
			return 0, err
		}
		return 1, nil
	}
	n, first := 0, error(nil)
	for _, t := range tasks {
		err := signalOne(ctx, s, t.Spec.ID, sig, target, by, also...)
		switch {
		case err == nil:
			n++
			also = nil // the audit entry once
		case first == nil:
			first = err
		}
	}
	if n == 0 {
		return 0, first
	}
	return n, nil
}

// signalOne records signal request sig to target in running job id's record.
func signalOne(ctx context.Context, s store.Store, id string, sig syscall.Signal, target, by string, also ...store.Op) error {
	var why error
	_, _, err := update(ctx, s, id, func(j *Job) bool {
		switch st := j.State.Status; {
		case st == Running:
		case st == Pending:
			why = ErrPending
			return false
		case st.Final():
			why = ErrFinished
			return false
		default:
			why = ErrNotRunning
			return false
		}
		j.State.Signals = append(j.State.Signals, SignalRequest{Signal: int(sig), Target: target, At: time.Now().UTC(), By: by})
		if n := len(j.State.Signals); n > maxSignalsKept {
			j.State.Signals = j.State.Signals[n-maxSignalsKept:]
		}
		return true
	}, also...)
	if err != nil {
		return err
	}
	return why
}

// targeted is a signal request as a batch step's wait gets it on its stop channel.
type targeted struct {
	sig    syscall.Signal
	target string
}

func (t targeted) String() string { return signalName(t.sig) + " to " + t.target }

// Signal makes targeted an os.Signal.
func (t targeted) Signal() {}

// signalled gives the step's processes the signal requests of running job j it has
// not given yet (those asked after st.signalledTo, or after the placement began): a
// batch job's step where each says, another's supervisor (its workers).
func (st *step) signalled(j *Job) {
	if j.State.Status != Running {
		return
	}
	last := st.signalledTo
	if last.IsZero() {
		last = j.State.PlacedAt
	}
	for _, r := range j.State.Signals {
		if !r.At.After(last) {
			continue
		}
		last = r.At
		sig := syscall.Signal(r.Signal)
		st.log.Info("signalling the job's processes (scancel --signal)", zap.String("signal", signalName(sig)), zap.String("target", r.Target), zap.String("by", r.By))
		if st.job.Spec.Batch != nil {
			st.stop <- targeted{sig: sig, target: r.Target}
		} else {
			st.stop <- sig
		}
	}
	st.signalledTo = last
}

// signalDetail is a signal request's audit detail: "USR2 to steps".
func signalDetail(sig syscall.Signal, target string) string {
	return signalName(sig) + " to " + target
}

// signalFor sends sig to job id (array id's running tasks) where target says, for
// who, when the job is who's or who is root, as a cancel; another user's job is
// audited.
func signalFor(ctx context.Context, s store.Store, p Prover, who asker, id string, sig syscall.Signal, target string) (Answer, error) {
	if checkID(id) != nil {
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil
	}
	if sig < 1 || sig > 64 || checkTarget(target) != nil {
		return Answer{Error: fmt.Sprintf("signal %d to %q: no such signal or target", sig, target), Invalid: true}, nil
	}
	owner, refused, err := ownerFor(ctx, s, who, id, "signal")
	if refused != nil || err != nil {
		return *refused, err
	}
	var also []store.Op
	if owner != who.user {
		also = append(also, audit.Op(sealEntry(ctx, p, audit.Entry{User: who.user, Token: "munge", Action: audit.ActionSignal,
			Target: "job " + id, Owner: owner, Detail: signalDetail(sig, target)})))
	}
	n, err := SignalJob(ctx, s, id, sig, target, who.user, also...)
	if err != nil {
		return jobAnswer(id, err)
	}
	return Answer{Signalled: n}, nil
}

// Signal sends sig to running job id (array id's running tasks) where target says
// (SignalSteps, SignalBatch, SignalFull) through as's box: the job must be as's user's,
// unless as is root. It returns how many jobs it reached. Errors: *NotYoursError
// (ErrNotYours), ErrNotFound, ErrPending, ErrFinished, ErrNotRunning, ErrNoAnswer.
func (as Asker) Signal(ctx context.Context, s store.Store, id string, sig syscall.Signal, target string) (int, error) {
	ans, err := ask(ctx, s, as, Request{Kind: requestSignal, Job: id, Signal: int(sig), Target: target})
	if err != nil {
		return 0, err
	}
	if err := ans.jobErr(id, as.User); err != nil {
		return 0, err
	}
	return ans.Signalled, nil
}

// Signal sends sig to running job id (array id's running tasks) where target says, for
// a (SignalJob); another user's job is audited. Errors as SignalJob's.
func (a Actor) Signal(ctx context.Context, s store.Store, id string, sig syscall.Signal, target string) (int, error) {
	owner, _ := ownerOf(ctx, s, id)
	if owner == "" {
		return 0, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	return SignalJob(ctx, s, id, sig, target, a.User, a.auditOp(audit.ActionSignal, "job "+id, owner, signalDetail(sig, target))...)
}
