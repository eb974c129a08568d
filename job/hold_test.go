package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/reason"
)

// TestHolds: a hold withdraws a pending job's request and a release lets it queue again
// (held back until the controller writes its request); an operator's hold is an
// operator's to release; a running job keeps its hold for its requeue; an ended job
// cannot be held; another user's job is audited in the hold's transaction.
func TestHolds(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	now := time.Now().UTC()
	pend := Job{Spec: Spec{ID: "1", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Submitted: now}, State: newState(EvSubmit, "")}
	putJob(t, s, pend)
	reqOps, err := allocator.JobRequestOps(request(pend.Spec, false, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, reqOps); err != nil {
		t.Fatal(err)
	}
	bob := Actor{User: "bob", Entry: func(action, target, owner, detail string) audit.Entry {
		return audit.Entry{User: "bob", Token: "none", Action: action, Target: target, Owner: owner, Detail: detail}
	}}
	root := Actor{User: "root", Admin: true}
	if n, err := bob.Hold(ctx, s, "1", OpHold); n != 1 || err != nil {
		t.Fatalf("bob's hold of alice's job: %d, %v", n, err)
	}
	j, _ := Read(ctx, s, "1")
	if e, _ := s.Get(ctx, allocator.RequestKey("1")); j.State.Phase() != heldUser || j.State.ReasonCode() != reason.JobHeldUser || e != nil {
		t.Errorf("held: %s %s, request %v; want %s JobHeldUser and no request", j.State.Phase(), j.State.ReasonCode(), e, heldUser)
	}
	entries, err := audit.List(ctx, s, now.Add(-time.Minute), "")
	if err != nil || len(entries) != 1 || entries[0].Action != audit.ActionHold || entries[0].Owner != "alice" || entries[0].Detail != "hold" {
		t.Errorf("audit: %+v, %v; want bob's hold of alice's job", entries, err)
	}
	if n, err := root.Hold(ctx, s, "1", OpHold); n != 1 || err != nil {
		t.Fatalf("root's hold: %d, %v", n, err)
	}
	if _, err := bob.Hold(ctx, s, "1", OpRelease); !errors.Is(err, ErrHeldByOperator) {
		t.Errorf("bob's release of an operator's hold: %v, want ErrHeldByOperator", err)
	}
	if _, err := bob.Hold(ctx, s, "1", OpUHold); !errors.Is(err, ErrHeldByOperator) {
		t.Errorf("bob's uhold of an operator's hold: %v, want ErrHeldByOperator", err)
	}
	if n, err := root.Hold(ctx, s, "1", OpRelease); n != 1 || err != nil {
		t.Fatalf("root's release: %d, %v", n, err)
	}
	if j, _ = Read(ctx, s, "1"); j.State.Phase() != deferred || j.State.Held != "" {
		t.Errorf("released: %s, held %q; want %s (the controller writes its request)", j.State.Phase(), j.State.Held, deferred)
	}
	if n, err := root.Hold(ctx, s, "1", OpRelease); n != 0 || err != nil {
		t.Errorf("a release of a job not held: %d, %v; want no change", n, err)
	}

	run := Job{Spec: Spec{ID: "2", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Submitted: now}, State: State{Status: Running, Nodes: []string{"a"}}}
	putJob(t, s, run)
	if n, err := root.Hold(ctx, s, "2", OpUHold); n != 1 || err != nil {
		t.Fatalf("uhold of a running job: %d, %v", n, err)
	}
	if j, _ = Read(ctx, s, "2"); j.State.Status != Running || j.State.Held != HoldUser {
		t.Errorf("running job held: %s, held %q; want RUNNING, user", j.State.Status, j.State.Held)
	}
	if _, err := root.Hold(ctx, s, "1", OpRequeue); !errors.Is(err, ErrPending) {
		t.Errorf("requeue of a pending job: %v, want ErrPending", err)
	}
	if n, err := root.Hold(ctx, s, "2", OpRequeue); n != 1 || err != nil {
		t.Fatalf("requeue of a running job: %d, %v", n, err)
	}
	if j, _ = Read(ctx, s, "2"); j.State.Phase() != requeue || len(j.State.Nodes) != 0 || j.State.Held != HoldUser {
		t.Errorf("requeued: %s, nodes %v, held %q; want %s, none, and the user's hold kept for after", j.State.Phase(), j.State.Nodes, j.State.Held, requeue)
	}
	done := Job{Spec: Spec{ID: "3", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Submitted: now}, State: State{Status: Completed}}
	putJob(t, s, done)
	for _, op := range []HoldOp{OpHold, OpRelease} {
		if _, err := root.Hold(ctx, s, "3", op); !errors.Is(err, ErrFinished) {
			t.Errorf("%s of an ended job: %v, want ErrFinished", op, err)
		}
	}
	if _, err := root.Hold(ctx, s, "99", OpHold); !errors.Is(err, ErrNotFound) {
		t.Errorf("hold of no job: %v, want ErrNotFound", err)
	}
}

// TestRequeueRefusedAndCounted: scontrol requeue of a batch job submitted with
// --no-requeue is refused as slurmctld refuses it (ErrRequeueDisabled), nothing
// changed; a requeue counts in Slurm's Restarts once the job is placed again, as
// SLURM_RESTART_COUNT does; a refused release of another's job is audited.
func TestRequeueRefusedAndCounted(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	now := time.Now().UTC()
	root := Actor{User: "root", Admin: true}
	noRequeue := Job{Spec: Spec{ID: "1", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Submitted: now, Batch: &Batch{NoRequeue: true}},
		State: State{Status: Running, Nodes: []string{"a"}, Placement: 1}}
	putJob(t, s, noRequeue)
	if _, err := root.Hold(ctx, s, "1", OpRequeue); !errors.Is(err, ErrRequeueDisabled) || err.Error() != "job 1: Requested operation is presently disabled" {
		t.Errorf("requeue of a --no-requeue job: %v, want ErrRequeueDisabled", err)
	}
	if j, _ := Read(ctx, s, "1"); j.State.Status != Running {
		t.Errorf("--no-requeue job after a refused requeue: %s, want RUNNING", j.State.Status)
	}
	cases := []struct {
		st   State
		want int
	}{
		{State{Placement: 1}, 0},
		{State{Placement: 2}, 1},                  // scontrol requeue, placed again
		{State{Placement: 2, NodeFailures: 1}, 1}, // a lost node, requeued
		{State{Placement: 1, NodeFailures: 1}, 1}, // a lost node, a spare took over
		{State{Placement: 3, Restarts: 2}, 4},
	}
	for _, c := range cases {
		if got := c.st.SlurmRestarts(); got != c.want {
			t.Errorf("SlurmRestarts of placement %d, node failures %d, restarts %d: %d, want %d", c.st.Placement, c.st.NodeFailures, c.st.Restarts, got, c.want)
		}
	}
	putJob(t, s, Job{Spec: Spec{ID: "2", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Submitted: now}, State: newState(EvSubmit, "")})
	if _, err := root.Hold(ctx, s, "2", OpHold); err != nil {
		t.Fatal(err)
	}
	bob := Actor{User: "bob", Entry: func(action, target, owner, detail string) audit.Entry {
		return audit.Entry{User: "bob", Token: "none", Action: action, Target: target, Owner: owner, Detail: detail}
	}}
	if _, err := bob.Hold(ctx, s, "2", OpRelease); !errors.Is(err, ErrHeldByOperator) {
		t.Fatalf("bob's release of an operator's hold: %v", err)
	}
	entries, err := audit.List(ctx, s, now.Add(-time.Minute), "")
	if err != nil || len(entries) != 1 || entries[0].User != "bob" || entries[0].Detail != "release: refused: Access/permission denied" {
		t.Errorf("audit: %+v, %v; want bob's refused release", entries, err)
	}
}
