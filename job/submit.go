package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
)

// ErrInvalid marks a spec Submit refuses as the user's to fix: a bad value, or one no
// registered node could ever satisfy (an unknown partition, more GPUs per node than any
// node has). Nothing is queued then. The error's text is the reason alone.
var ErrInvalid = errors.New("invalid job")

// invalid is an error marked ErrInvalid whose text is err's.
type invalid struct{ err error }

func (e *invalid) Error() string   { return e.err.Error() }
func (e *invalid) Unwrap() []error { return []error{ErrInvalid, e.err} }

// request is the allocator request that places job spec: its nodes and spares, away
// from the exclude nodes. The first placement waits for the spares too (they are
// reserved with the job); a placement again (after the job lost nodes) takes them when
// they are free, and runs without.
func request(spec Spec, again bool, exclude []string) allocator.Request {
	least := spec.MinNodes + spec.SpareNodes
	if again {
		least = spec.MinNodes
	}
	return allocator.JobRequest(spec.ID, least, spec.MaxNodes+spec.SpareNodes, spec.GPUsPerNode,
		spec.Partition, "", nil, spec.Priority, exclude)
}

// Submit queues spec as a new job and returns its id: it checks the spec and that the
// cluster's registered nodes could run it (allocator.CheckFeasible), takes the next
// job id, and writes the spec (its Account DefaultAccount when none is given), the
// state (PENDING) and the job's request in one transaction, so a job is queued whole or
// not at all. Errors wrapping ErrInvalid are the user's; others mean the store could
// not be asked.
func Submit(ctx context.Context, s store.Store, spec Spec) (string, error) {
	if spec.Output == "" {
		spec.Output = DefaultOutput
	}
	if spec.Account == "" {
		spec.Account = DefaultAccount
	}
	if err := spec.Validate(); err != nil {
		return "", &invalid{err}
	}
	c, err := allocator.RegisteredNodes(ctx, s)
	if err != nil {
		return "", err
	}
	if err := allocator.CheckFeasible(c, request(spec, false, nil)); err != nil {
		if errors.Is(err, allocator.ErrInfeasible) {
			return "", &invalid{err}
		}
		return "", err
	}
	if spec.Submitted.IsZero() {
		spec.Submitted = time.Now().UTC()
	}
	for {
		id, seqOp, err := nextID(ctx, s)
		if err != nil {
			return "", err
		}
		spec.ID = id
		reqOps, err := allocator.JobRequestOps(request(spec, false, nil))
		if err != nil {
			return "", err
		}
		st := State{Status: Pending, Reason: "Priority"}
		specJSON, _ := json.Marshal(spec)
		stJSON, _ := json.Marshal(st)
		ops := append([]store.Op{seqOp,
			{Verb: store.CheckNotExists, Key: specKey(id)},
			{Verb: store.Set, Key: specKey(id), Value: specJSON},
			{Verb: store.Set, Key: stateKey(id), Value: stJSON},
		}, reqOps...)
		if err := store.CheckTxn(ops); err != nil {
			return "", &invalid{fmt.Errorf("the job's spec is too large to queue: %w", err)}
		}
		_, err = s.Txn(ctx, ops)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, store.ErrTxnRejected) {
			return "", fmt.Errorf("submit job %s: %w", id, err)
		}
		// Another submit took the id meanwhile: take the next one.
	}
}

// nextID returns the next job id and the operation that claims it (a check-and-set of
// the sequence key, in the submit's transaction).
func nextID(ctx context.Context, s store.Store) (string, store.Op, error) {
	e, err := s.Get(ctx, seqKey)
	if err != nil {
		return "", store.Op{}, err
	}
	n, idx := uint64(0), uint64(0)
	if e != nil {
		n, _ = strconv.ParseUint(string(e.Value), 10, 64)
		idx = e.ModifyIndex
	}
	id := strconv.FormatUint(n+1, 10)
	return id, store.Op{Verb: store.CAS, Key: seqKey, Value: []byte(id), Index: idx}, nil
}

// Cancel cancels job id, as scancel does: a pending job ends CANCELLED at once, its
// request goes and its accounting record is written with it; a granted or running one goes COMPLETING: every step stops its workers (SIGTERM, the grace, SIGKILL),
// gives its GPUs back and exits, and the job ends CANCELLED. A job that already ended
// is no error: Cancel reports false then.
func Cancel(ctx context.Context, s store.Store, id string) (bool, error) {
	for {
		j, err := Read(ctx, s, id)
		if err != nil {
			return false, err
		}
		st := j.State
		var extra []store.Op
		switch {
		case st.Status.Final(), st.Status == Completing:
			return false, nil
		case st.Status == Pending:
			// Not granted yet: the request goes with the cancel, in one transaction, and
			// only while there is no grant (a grant made meanwhile makes it a running
			// job's cancel, below).
			st.Status, st.Reason, st.Ended = Cancelled, "cancelled while pending", time.Now().UTC()
			extra = []store.Op{{Verb: store.CheckNotExists, Key: allocator.GrantKey(id)}, {Verb: store.Delete, Key: allocator.RequestKey(id)},
				recordOp(Job{Spec: j.Spec, State: st})}
		default:
			st.Status, st.End, st.Reason = Completing, Cancelled, "cancelled"
		}
		b, _ := json.Marshal(st)
		_, err = s.Txn(ctx, append([]store.Op{{Verb: store.CAS, Key: stateKey(id), Value: b, Index: j.Index}}, extra...))
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, store.ErrTxnRejected) {
			return false, err
		}
		if errors.Is(err, store.ErrKeyExists) {
			// Granted meanwhile: stop it as a running job.
			if _, changed, err := update(ctx, s, id, func(j *Job) bool {
				if j.State.Status.Final() || j.State.Status == Completing {
					return false
				}
				j.State.Status, j.State.End, j.State.Reason = Completing, Cancelled, "cancelled"
				return true
			}); err != nil || changed {
				return changed, err
			}
			return false, nil
		}
	}
}

// List returns every job, oldest first.
func List(ctx context.Context, s store.Store) ([]Job, error) {
	entries, _, err := s.List(ctx, jobsPrefix)
	if err != nil {
		return nil, err
	}
	byID := map[string][]store.Entry{}
	for _, e := range entries {
		rest := e.Key[len(jobsPrefix):]
		for i := 0; i < len(rest); i++ {
			if rest[i] == '/' {
				byID[rest[:i]] = append(byID[rest[:i]], e)
				break
			}
		}
	}
	var out []Job
	for id, es := range byID {
		j, err := decode(id, es)
		if err != nil {
			continue // a job being written or removed
		}
		out = append(out, *j)
	}
	sortJobs(out)
	return out, nil
}

// sortJobs sorts jobs oldest first (by their numeric ids).
func sortJobs(jobs []Job) {
	sort.Slice(jobs, func(a, b int) bool {
		na, _ := strconv.ParseUint(jobs[a].Spec.ID, 10, 64)
		nb, _ := strconv.ParseUint(jobs[b].Spec.ID, 10, 64)
		if na != nb {
			return na < nb
		}
		return jobs[a].Spec.ID < jobs[b].Spec.ID
	})
}

// Steps returns the nodes whose step of job id runs now (their step key is held).
func Steps(ctx context.Context, s store.Store, id string) (map[string]StepRecord, error) {
	entries, _, err := s.List(ctx, stepsPrefix(id))
	if err != nil {
		return nil, err
	}
	out := map[string]StepRecord{}
	for _, e := range entries {
		var r StepRecord
		if e.Session != "" && json.Unmarshal(e.Value, &r) == nil {
			out[e.Key[len(stepsPrefix(id)):]] = r
		}
	}
	return out, nil
}

// StepRecord is a step's key: who runs it.
type StepRecord struct {
	Node    string    `json:"node"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Placement is the job's placement the step runs (State.Placement).
	Placement int `json:"placement"`
}
