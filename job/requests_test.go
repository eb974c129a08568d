package job

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/reason"
	"github.com/gangrun/gangrun/topology"
)

// TestUsersRequests: on the in-memory store with a real elected agent serving users'
// requests, a submit from bob's box is bob's job whatever its spec says (its id, array
// task and submission time the cluster's), and is queued; one raising --priority is
// refused; a cancel from bob's box of alice's job is refused naming alice, and does
// nothing; alice's own cancel is done; an unknown job is ErrNotFound; every answered
// request is gone from the boxes.
func TestUsersRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := store.NewMemory()
	serveRequests(ctx, t, s)

	// What the cluster decides is bob's spec's to say neither: a forged id, array task
	// and submission time (which the age factor counts from) are replaced.
	forged := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	spec := Spec{ID: "1", User: "alice", Command: []string{"true"}, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, WorkDir: "/tmp",
		Submitted: forged, Array: &ArrayTask{JobID: "1", TaskID: 7, Count: 8}}
	before := time.Now().Add(-time.Minute)
	id, _, err := SubmitAs(ctx, s, "bob", spec, nil, time.Minute)
	if err != nil {
		t.Fatalf("bob's submit: %v", err)
	}
	j, err := Read(ctx, s, id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Spec.User != "bob" || j.State.Status != Pending {
		t.Errorf("bob's job: user %q, %s; want bob's, PENDING", j.Spec.User, j.State.Status)
	}
	if j.Spec.Submitted.Before(before) || j.Spec.Array != nil {
		t.Errorf("bob's job keeps his forged fields: submitted %s, array %+v", j.Spec.Submitted, j.Spec.Array)
	}
	spec.Priority = 100
	if _, _, err := SubmitAs(ctx, s, "bob", spec, nil, time.Minute); !errors.Is(err, ErrInvalid) || err.Error() != "--priority=100: Access/permission denied (only an operator may set a job's priority)" {
		t.Errorf("a user's submit with --priority 100: %v, want it refused", err)
	}
	if _, _, err := SubmitAs(ctx, s, "bob", Spec{User: "bob", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1}, nil, time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("a submit with no command: %v, want ErrInvalid", err)
	}

	putJob(t, s, Job{Spec: Spec{ID: "77", User: "alice", GPUsPerNode: 1}, State: State{Status: Pending}})
	_, _, err = CancelAs(ctx, s, "bob", "77", time.Minute)
	var ny *NotYoursError
	if !errors.As(err, &ny) || ny.Owner != "alice" || err.Error() != "permission denied: job 77 belongs to alice (your token is bob's)" {
		t.Errorf("bob cancels alice's job: %v", err)
	}
	if j, _ := Read(ctx, s, "77"); j.State.Status != Pending {
		t.Errorf("alice's job after bob's cancel: %s, want PENDING", j.State.Status)
	}
	if n, _, err := CancelAs(ctx, s, "alice", "77", time.Minute); err != nil || n != 1 {
		t.Errorf("alice cancels her job: %d %v", n, err)
	}
	if j, _ := Read(ctx, s, "77"); j.State.Status != Cancelled {
		t.Errorf("alice's job after her cancel: %s, want CANCELLED", j.State.Status)
	}
	if _, _, err := CancelAs(ctx, s, "alice", "404", time.Minute); !errors.Is(err, ErrNotFound) {
		t.Errorf("cancel of no job: %v, want ErrNotFound", err)
	}
	// Updates through the boxes: alice's own is done, bob's of her job refused; both
	// are audited, as is bob's refused cancel above.
	putJob(t, s, Job{Spec: Spec{ID: "78", User: "alice", Command: []string{"true"}, WorkDir: "/tmp", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, TimeLimit: time.Hour},
		State: newState(EvSubmit, "")})
	half := 30 * time.Minute
	if n, err := (Asker{User: "alice", Wait: time.Minute}).Update(ctx, s, "78", Update{TimeLimit: &half}); n != 1 || err != nil {
		t.Errorf("alice's update of her job: %d, %v", n, err)
	}
	if j, _ := Read(ctx, s, "78"); j.Spec.TimeLimit != half {
		t.Errorf("alice's job after her update: --time %s, want 30m", j.Spec.TimeLimit)
	}
	if _, err := (Asker{User: "alice", Wait: time.Minute}).Update(ctx, s, "78", Update{TimeLimit: ptr(2 * time.Hour)}); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("alice raises her time limit: %v, want ErrAccessDenied", err)
	}
	if _, err := (Asker{User: "bob", Wait: time.Minute}).Update(ctx, s, "78", Update{Name: ptr("x")}); !errors.Is(err, ErrNotYours) {
		t.Errorf("bob's update of alice's job: %v, want ErrNotYours", err)
	}
	// An operator's hold is the operator's to release: alice's release through her box
	// is refused in slurmctld's words, and the job stays held.
	putJob(t, s, Job{Spec: Spec{ID: "79", User: "alice", GPUsPerNode: 1, Submitted: time.Now()}, State: newState(EvSubmit, "")})
	if n, err := DoHold(ctx, s, "79", OpHold, true); n != 1 || err != nil {
		t.Fatalf("the operator's hold: %d, %v", n, err)
	}
	if _, err := (Asker{User: "alice", Wait: time.Minute}).Hold(ctx, s, "79", OpRelease); !errors.Is(err, ErrHeldByOperator) || err.Error() != "job 79: Access/permission denied" {
		t.Errorf("alice's release of an operator's hold: %v, want job 79: ErrHeldByOperator", err)
	}
	if j, err := Read(ctx, s, "79"); err != nil || j.State.Reason != string(reason.JobHeldAdmin) {
		t.Errorf("job 79 after alice's refused release: %+v, %v; want held (JobHeldAdmin)", j.State, err)
	}
	entries, err := audit.List(ctx, s, before, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.User+" "+e.Action+" "+e.Target+" "+e.Detail)
	}
	want := []string{"bob cancel job 77 refused: the job is alice's (your token is bob's)", "alice update job 78 TimeLimit=00:30:00",
		"alice update job 78 TimeLimit=02:00:00: refused: job 78: Access/permission denied",
		"bob update job 78 JobName=x: refused: the job is alice's (your token is bob's)",
		"alice hold job 79 release: refused: Access/permission denied"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if left, _, _ := s.List(ctx, acl.UsersPrefix); len(left) != 0 {
		t.Errorf("requests left in the boxes: %v", left)
	}
}

// TestRequestWithdrawnWhenNoAgentAnswers: with no elected agent, a user's submit gives
// up after its wait with ErrNoAnswer and takes its request back: nothing is queued
// later.
func TestRequestWithdrawnWhenNoAgentAnswers(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	spec := Spec{Command: []string{"true"}, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1}
	if _, _, err := SubmitAs(ctx, s, "alice", spec, nil, 200*time.Millisecond); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("submit with no agent: %v, want ErrNoAnswer", err)
	}
	if left, _, _ := s.List(ctx, acl.UsersPrefix); len(left) != 0 {
		t.Errorf("the request was not withdrawn: %v", left)
	}
}

// serveRequests runs a real agent on s, node n1 (a DGX H100), elected and serving
// users' request boxes (ServeRequests, no MUNGE), until the test ends.
func serveRequests(ctx context.Context, t *testing.T, s store.Store) {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv.Node = "n1"
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: "n1", Addr: "127.0.0.1", Inventory: inv,
		Leader: []func(context.Context, store.Store, string) error{ServeRequests(nil, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(actx) }()
	t.Cleanup(func() { stop(); <-done })
}

// TestStaleRequestQueuesNothing: a request changed after the elected agent read it (the
// asker withdrew or rewrote it) is not carried out from the old read: the submit's
// transaction, which holds the answer's check-and-set, is refused whole, serve gives up
// at once (it does not try the next job id for ever) and no job is queued.
func TestStaleRequestQueuesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := store.NewMemory()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv.Node = "n1"
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: "n1", Addr: "127.0.0.1", Inventory: inv, NoScheduler: true})
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(actx) }()
	defer func() { stop(); <-done }()
	for {
		c, err := allocator.RegisteredNodes(ctx, s)
		if err == nil && len(c.Nodes) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the node never registered")
		}
		time.Sleep(10 * time.Millisecond)
	}

	key := requestKey("alice", requestSubmit)
	text, _ := json.Marshal(Request{Kind: requestSubmit, Spec: &Spec{Command: []string{"true"}, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, WorkDir: "/tmp"}})
	b, _ := json.Marshal(boxed{Request: text})
	write := func() {
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: b}}); err != nil {
			t.Fatal(err)
		}
	}
	write()
	first, err := s.Get(ctx, key)
	if err != nil || first == nil {
		t.Fatalf("the request: %v", err)
	}
	write() // written again: the first read is stale
	if e, _ := s.Get(ctx, key); e == nil || e.ModifyIndex == first.ModifyIndex {
		t.Fatalf("the request's index did not move: %+v", e)
	}
	pass := store.Op{Verb: store.CheckNotExists, Key: "gangrun/test/no-such-key"} // a fence that holds
	if err := (&server{s: s, fence: pass, log: zap.NewNop()}).serve(ctx, *first); err != nil {
		t.Fatalf("serve of a stale read: %v", err)
	}
	if jobs, _ := List(ctx, s); len(jobs) != 0 {
		t.Errorf("a stale read queued %d job(s)", len(jobs))
	}
}

// TestStoppedRequestIsWithdrawn: a user's submit stopped while it waits for an answer
// (gangrun submit killed by SIGTERM: its context cancelled) takes its request back and
// says so: nothing is left in the box to be carried out later.
func TestStoppedRequestIsWithdrawn(t *testing.T) {
	s := store.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	spec := Spec{Command: []string{"true"}, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1}
	_, _, err := SubmitAs(ctx, s, "alice", spec, nil, time.Minute)
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "the request was withdrawn; nothing was done") {
		t.Errorf("a stopped submit: %v, want it to say the request was withdrawn", err)
	}
	if left, _, _ := s.List(context.Background(), acl.UsersPrefix); len(left) != 0 {
		t.Errorf("requests left in the box: %v", left)
	}
}

// TestRequestServedOnceFromAStaleView: the elected agent's watch of the boxes lags its
// own writes, so a pass may read again, unanswered, a request it has just carried out.
// It is not served again: before, the second read refused the request's credential as
// a replay and wrote that refusal into the audit log, for a cancel that had been done
// (TestACLCluster beside two CPU hogs).
func TestRequestServedOnceFromAStaleView(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	munged := mungetest.Start(t)
	prover, err := identity.Open(munged.Socket)
	if err != nil {
		t.Fatal(err)
	}
	s := store.NewMemory()
	key := requestKey("root", requestCancel)
	text, _ := json.Marshal(Request{Kind: requestCancel, Job: "42"})
	cred, err := prover.Seal(ctx, requestContent(key, text))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := schema.Marshal(schema.RequestBox, boxed{Request: text, Credential: cred})
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: b}}); err != nil {
		t.Fatal(err)
	}
	stale, err := s.Get(ctx, key)
	if err != nil || stale == nil {
		t.Fatalf("the request: %v", err)
	}
	pass := store.Op{Verb: store.CheckNotExists, Key: "gangrun/test/no-such-key"} // a fence that holds
	sv := &server{s: s, fence: pass, prover: prover, log: zap.NewNop()}
	for i := range 2 {
		if err := sv.serve(ctx, *stale); err != nil {
			t.Fatalf("serve %d: %v", i, err)
		}
	}
	e, err := s.Get(ctx, key)
	if err != nil || e == nil {
		t.Fatalf("the request after serving: %v", err)
	}
	var got boxed
	if err := schema.Unmarshal(schema.RequestBox, e.Value, &got); err != nil || got.Answer == nil {
		t.Fatalf("the request was not answered: %v %+v", err, got)
	}
	entries, err := audit.List(ctx, s, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range entries {
		if a.Action == audit.ActionRefuse {
			t.Errorf("a refusal in the audit log for a request carried out: %+v", a)
		}
	}
	// Another server (the next elected agent) reading the request unanswered still
	// refuses its credential: the replay check is the store's, not this memory.
	if err := (&server{s: s, fence: pass, prover: prover, log: zap.NewNop()}).serve(ctx, *stale); err != nil {
		t.Fatal(err)
	}
	if entries, _ := audit.List(ctx, s, time.Time{}, ""); len(entries) != 1 || entries[0].Action != audit.ActionRefuse {
		t.Errorf("audit after another server's replay: %+v, want one refusal", entries)
	}
}
