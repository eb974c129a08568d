package job

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/reason"
)

// Holds, as Slurm has them (scontrol hold, uhold, release; sbatch --hold): a held job
// waits PENDING with no request, so the scheduler does not see it, until it is released.
// A user's hold (reason JobHeldUser) is released by its user or an operator; an
// operator's (JobHeldAdmin) only by an operator. Released, the job is PENDING held back
// as a job with --dependency is (HoldDeferred): the controller writes its request once
// its dependencies and array cap allow, at once for most jobs.

// ErrFinished means the job has ended: nothing holds or releases it. Slurm's words,
// which scontrol prints: "Job has already finished".
var ErrFinished = errors.New("Job has already finished")

// ErrNotPending means a grant kept coming between a pending job's read and its hold
// (the job was starting, and did not show RUNNING in time). Slurm's words for a job
// that is not pending: "Job is no longer pending execution".
var ErrNotPending = errors.New("Job is no longer pending execution")

// ErrHeldByOperator means a user tried to release an operator's hold: Slurm refuses it
// as "Access/permission denied".
var ErrHeldByOperator = errors.New("Access/permission denied")

// HoldOp is what scontrol asks of a held job, in its verbs.
type HoldOp string

// The hold operations.
const (
	// OpHold is scontrol hold: an operator's hold by an operator (JobHeldAdmin), else
	// its user's (JobHeldUser).
	OpHold HoldOp = "hold"
	// OpUHold is scontrol uhold: its user's hold, whoever asks.
	OpUHold HoldOp = "uhold"
	// OpRelease is scontrol release.
	OpRelease HoldOp = "release"
	// OpRequeue and OpRequeueHold are scontrol requeue and requeuehold (Requeue).
	OpRequeue     HoldOp = "requeue"
	OpRequeueHold HoldOp = "requeuehold"
)

// DoHold does op on job id, or on every task of job array id, for an operator (admin) or
// not (OpRequeue and OpRequeueHold: Requeue): it returns how many jobs changed (a job held already, or released and not held,
// is none); a job that runs keeps its hold for its requeue (EvMarkHold). A task that ended is
// passed over; when every one has, or job id has, the error wraps ErrFinished. also's
// operations (an audit entry) go with the first change. Errors: ErrNotFound,
// ErrFinished, ErrNotPending, ErrHeldByOperator, store errors.
func DoHold(ctx context.Context, s store.Store, id string, op HoldOp, admin bool, also ...store.Op) (int, error) {
	if op == OpRequeue || op == OpRequeueHold {
		return Requeue(ctx, s, id, op == OpRequeueHold, admin, also...)
	}
	if err := checkID(id); err != nil {
		return 0, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		changed, err := holdOne(ctx, s, id, op, admin, also...)
		if changed {
			return 1, err
		}
		return 0, err
	}
	n, live := 0, false
	for _, t := range tasks {
		changed, err := holdOne(ctx, s, t.Spec.ID, op, admin, also...)
		switch {
		case errors.Is(err, ErrFinished):
			continue
		case err != nil:
			return n, err
		}
		live = true
		if changed {
			n++
			also = nil
		}
	}
	if !live {
		return 0, fmt.Errorf("job %s: %w", id, ErrFinished)
	}
	return n, nil
}

// holdStartTries and holdStartWait bound how long a hold waits for a job granted
// under it to show RUNNING: 50 × 100 ms.
const (
	holdStartTries = 50
	holdStartWait  = 100 * time.Millisecond
)

// holdOne does op on job id (DoHold).
func holdOne(ctx context.Context, s store.Store, id string, op HoldOp, admin bool, also ...store.Op) (bool, error) {
	if op == OpRelease {
		return releaseJob(ctx, s, id, admin, also...)
	}
	ev, want := EvHold, HoldUser
	if op == OpHold && admin {
		ev, want = EvHoldAdmin, HoldAdmin
	}
	for tries := 0; ; tries++ {
		j, err := Read(ctx, s, id)
		if err != nil {
			return false, err
		}
		st := j.State
		if st.Status.Final() {
			return false, fmt.Errorf("job %s: %w", id, ErrFinished)
		}
		running := st.holdWaits()
		switch h := st.Hold(); {
		case h == want || (running && st.Held == want):
			return false, nil
		case !admin && (h == HoldAdmin || (running && st.Held == HoldAdmin)):
			return false, fmt.Errorf("job %s: %w", id, ErrHeldByOperator)
		case running:
			// Slurm keeps a running job's hold for its requeue: so does gangrun. (A
			// change meanwhile makes the check-and-set fail: it is read again.)
			code := map[Hold]reason.Code{HoldUser: reason.JobHeldUser, HoldAdmin: reason.JobHeldAdmin}[want]
			if err := st.apply(Transition{Event: EvMarkHold, Code: code}); err != nil {
				return false, err
			}
			_, err := s.Txn(ctx, append([]store.Op{stateOp(id, st, j.Index)}, also...))
			if errors.Is(err, store.ErrStaleIndex) {
				continue
			}
			return err == nil, err
		}
		if err := st.apply(Transition{Event: ev}); err != nil {
			return false, fmt.Errorf("job %s: %w", id, ErrNotPending)
		}
		ops := []store.Op{stateOp(id, st, j.Index), {Verb: store.CheckNotExists, Key: allocator.GrantKey(id)},
			{Verb: store.Delete, Key: allocator.RequestKey(id)}}
		_, err = s.Txn(ctx, append(ops, also...))
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, store.ErrKeyExists) && tries < holdStartTries:
			// Granted meanwhile: once it shows RUNNING, its hold waits for a requeue.
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case <-time.After(holdStartWait):
			}
		case errors.Is(err, store.ErrKeyExists):
			return false, fmt.Errorf("job %s: %w", id, ErrNotPending)
		case !errors.Is(err, store.ErrStaleIndex):
			return false, err
		}
	}
}

// releaseJob releases held job id: it waits PENDING as a job with a --dependency does,
// until the controller writes its request. A job not held is no change (false).
func releaseJob(ctx context.Context, s store.Store, id string, admin bool, also ...store.Op) (bool, error) {
	var refused error
	_, changed, err := update(ctx, s, id, func(j *Job) bool {
		refused = nil
		switch h := j.State.Hold(); {
		case j.State.Status.Final():
			refused = ErrFinished
			return false
		case j.State.holdWaits():
			// A hold waiting for the job's requeue (EvMarkHold) goes.
			if j.State.Held == HoldAdmin && !admin {
				refused = ErrHeldByOperator
				return false
			}
			return j.State.Held != "" && j.State.apply(Transition{Event: EvUnmarkHold}) == nil
		case h == HoldAdmin && !admin:
			refused = ErrHeldByOperator
			return false
		case h != HoldUser && h != HoldAdmin:
			return false
		}
		return j.State.apply(Transition{Event: EvReleaseHold}) == nil
	}, also...)
	if err == nil && refused != nil {
		err = fmt.Errorf("job %s: %w", id, refused)
	}
	return changed, err
}

// stateOp is the check-and-set of job id's state st on index.
func stateOp(id string, st State, index uint64) store.Op {
	b, _ := schema.Marshal(schema.JobState, st)
	return store.Op{Verb: store.CAS, Key: stateKey(id), Value: b, Index: index}
}

// Requeue is scontrol requeue (hold false) or requeuehold (hold true) of job id, or of
// every task of job array id, for an operator (admin) or not: a running job's steps
// stop, and it waits PENDING to be placed again, from its newest checkpoint, as after a
// lost node (no node excluded); with hold, it then waits held (JobHeldUser, or
// JobHeldAdmin for an operator) until scontrol release. It returns how many jobs it
// requeued. A job not running is refused: pending (ErrPending), ended (ErrFinished:
// Slurm requeues an ended batch job, gangrun does not), or stopping; so is a batch job
// submitted with --no-requeue (ErrRequeueDisabled, as slurmctld). also's operations
// (an audit entry) go with the first change.
func Requeue(ctx context.Context, s store.Store, id string, hold, admin bool, also ...store.Op) (int, error) {
	if err := checkID(id); err != nil {
		return 0, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	ids := []string{id}
	if tasks, err := Tasks(ctx, s, id); err != nil {
		return 0, err
	} else if len(tasks) > 0 {
		ids = ids[:0]
		for _, t := range tasks {
			ids = append(ids, t.Spec.ID)
		}
	}
	n := 0
	var last error
	for _, tid := range ids {
		var refused error
		_, changed, err := update(ctx, s, tid, func(j *Job) bool {
			st := &j.State
			switch {
			case st.Status == Pending:
				refused = ErrPending
				return false
			case st.Status.Final():
				refused = ErrFinished
				return false
			case st.Status != Running:
				refused = ErrNotRunning
				return false
			case j.Spec.Batch != nil && j.Spec.Batch.NoRequeue:
				refused = ErrRequeueDisabled
				return false
			}
			words := "requeued (scontrol requeue)"
			if hold {
				code := reason.JobHeldUser
				if admin {
					code = reason.JobHeldAdmin
				}
				words = "requeued held (scontrol requeuehold)"
				if st.apply(Transition{Event: EvMarkHold, Code: code}) != nil {
					return false
				}
			}
			if st.apply(Transition{Event: EvRequeueAsked, Words: words}) != nil {
				return false
			}
			st.closeAttempts(time.Now().UTC(), "", words)
			st.Nodes, st.Spares, st.StepsEnded = nil, nil, nil
			return true
		}, also...)
		switch {
		case err != nil:
			return n, err
		case refused != nil:
			last = fmt.Errorf("job %s: %w", tid, refused)
		case changed:
			n++
			also = nil
		}
	}
	if n == 0 && last != nil {
		return 0, last
	}
	return n, nil
}

// ErrPending means scontrol requeue of a job that has not run yet. Slurm's words: "Job is
// pending execution".
var ErrPending = errors.New("Job is pending execution")

// ErrRequeueDisabled means scontrol requeue of a job submitted with --no-requeue:
// slurmctld refuses it (ESLURM_DISABLED), in words scontrol prints with "for job ID".
var ErrRequeueDisabled = errors.New("Requested operation is presently disabled")

// ErrNotRunning means scontrol requeue of a job that is stopping (COMPLETING, or
// PREEMPTED): nothing to requeue until it has.
var ErrNotRunning = errors.New("Job is not running: it is stopping")
