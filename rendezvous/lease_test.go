package rendezvous

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// cutRenewals is a store whose session renewals, while cut is set, hang until their
// context ends: one node's link to Consul dropping packets, while the others' work.
type cutRenewals struct {
	store.Store
	mu  sync.Mutex
	cut bool
}

func (c *cutRenewals) set(v bool) {
	c.mu.Lock()
	c.cut = v
	c.mu.Unlock()
}

func (c *cutRenewals) RenewSession(ctx context.Context, id string) error {
	c.mu.Lock()
	cut := c.cut
	c.mu.Unlock()
	if cut {
		<-ctx.Done()
		return ctx.Err()
	}
	return c.Store.RenewSession(ctx, id)
}

// TestConsulRoundEndsWhenTheLeaseIsOver: a node whose renewals stop getting through
// sees its round end, lost, by the lease's stop time (6 s after its last renewal), with
// a kill time for its workers before Consul could expire its session (10 s); it then
// joins again with a new session, and the other node sees the change.
func TestConsulRoundEndsWhenTheLeaseIsOver(t *testing.T) {
	mem := store.NewMemory()
	b := &cutRenewals{Store: mem}
	mk := func(s store.Store) *Dynamic {
		c, err := NewDynamic(s, DynamicConfig{JobID: "lease", MinNodes: 2, MaxNodes: 2, MaxRestarts: 3, LastCall: 300 * time.Millisecond, Host: "h"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	nodes := []*testNode{{name: "n000", rdzv: mk(mem)}, {name: "n001", rdzv: mk(b)}}
	var mu sync.Mutex
	var kills []time.Time
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rounds := map[string]Round{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func(n *testNode) {
			defer wg.Done()
			req := n.request("10.0.0.1")
			if n.name == "n001" {
				req.OnLease = func(k time.Time) { mu.Lock(); kills = append(kills, k); mu.Unlock() }
			}
			r, err := n.rdzv.Join(ctx, req)
			if err != nil {
				t.Errorf("%s: %v", n.name, err)
				return
			}
			mu.Lock()
			rounds[n.name] = r
			mu.Unlock()
		}(n)
	}
	wg.Wait()
	if checkRound(t, rounds, 2, "") != 0 {
		t.Fatal("first round is not 0")
	}
	mu.Lock()
	if len(kills) == 0 {
		t.Error("OnLease was never called")
	}
	mu.Unlock()

	b.set(true)
	cutAt := time.Now()
	select {
	case <-rounds["n001"].Ended():
	case <-time.After(2 * SessionTTL):
		t.Fatal("n001's round did not end while its renewals hung")
	}
	end := rounds["n001"].End()
	if end.Kind != MembershipChanged || !end.Lost || !strings.Contains(end.Detail, "lost its lease") {
		t.Fatalf("n001's end = %+v, want a lost membership change naming the lease", end)
	}
	if took := time.Since(cutAt); took > store.LeaseStop(SessionTTL)+time.Second {
		t.Errorf("the round ended %s after the cut, want by the lease's stop time %s", took, store.LeaseStop(SessionTTL))
	}
	if end.KillBy.IsZero() || end.KillBy.After(cutAt.Add(store.LeaseKill(SessionTTL))) {
		t.Errorf("KillBy %v: want at most %s after the cut", end.KillBy, store.LeaseKill(SessionTTL))
	}
	// Nothing the lost node reports counts any more.
	if err := rounds["n001"].Fail(ctx, Failure{Node: "n001", Rank: 2, ExitCode: 137}); err == nil {
		t.Error("a node whose lease is over reported a failure")
	}
	// The expired lease's session is destroyed at once: n000 sees n001 leave.
	select {
	case <-rounds["n000"].Ended():
	case <-time.After(2 * SessionTTL):
		t.Fatal("n000 did not see n001 leave")
	}
	if e := rounds["n000"].End(); e.Kind != MembershipChanged {
		t.Errorf("n000's end = %+v, want a membership change", e)
	}
	b.set(false)
	again := joinAll(t, nodes, "")
	if round := checkRound(t, again, 2, ""); round <= 0 {
		t.Errorf("the gang re-formed at round %d, want a later one", round)
	}
}

// TestConsulRendezvousKeepsCountAcrossStateLoss: when the coordinator loses the job's
// state (a Consul server restarted without its data), the nodes, still running, form a
// new run whose rounds come after the ones they ran and whose restart count keeps the
// failures spent: attempt numbers never go back and the budget is not refilled.
func TestConsulRendezvousKeepsCountAcrossStateLoss(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		nodes := newNodes(t, s, "lossy", 2, 2, 2, nil)
		r0 := joinAll(t, nodes, "")
		checkRound(t, r0, 2, "")
		if err := r0["n000"].Fail(ctx, Failure{Node: "n000", Rank: 0, ExitCode: 1}); err != nil {
			t.Fatal(err)
		}
		<-r0["n001"].Ended()
		r1 := joinAll(t, nodes, "")
		if round := checkRound(t, r1, 2, ""); round != 1 {
			t.Fatalf("round after one failure: %d, want 1", round)
		}
		// The job's state vanishes.
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteTree, Key: "gangrun/jobs/lossy/"}}); err != nil {
			t.Fatal(err)
		}
		for name, r := range r1 {
			select {
			case <-r.Ended():
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the round did not end when the job's state vanished", name)
			}
			if e := r.End(); !e.Lost {
				t.Errorf("%s: end = %+v, want lost", name, e)
			}
		}
		r2 := joinAll(t, nodes, "")
		round := checkRound(t, r2, 2, "")
		if round <= 1 {
			t.Errorf("after the state loss the gang formed round %d, want after 1", round)
		}
		for name, r := range r2 {
			if rc := r.Assignment().RestartCount; rc != 1 {
				t.Errorf("%s: restart count %d after the state loss, want the 1 already spent", name, rc)
			}
		}
	})
}

func TestDynamicReportsClosedRounds(t *testing.T) {
	s := store.NewMemory()
	rec := &event.Recorder{}
	var nodes []*testNode
	for i := 0; i < 2; i++ {
		c, err := NewDynamic(s, DynamicConfig{JobID: "ev", MinNodes: 2, MaxNodes: 2, MaxRestarts: 1, LastCall: 100 * time.Millisecond, Host: "h", Events: rec})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		nodes = append(nodes, &testNode{name: []string{"n000", "n001"}[i], rdzv: c})
	}
	checkRound(t, joinAll(t, nodes, ""), 2, "")
	closed := rec.Of(event.RoundClosed)
	if len(closed) != 2 {
		t.Fatalf("%d RoundClosed events, want one per node: %+v", len(closed), closed)
	}
	for _, e := range closed {
		if e.Job != "ev" || e.Attempt != 0 || len(e.Nodes) != 2 {
			t.Errorf("event %+v: want job ev, attempt 0, both nodes", e)
		}
	}
}

// TestAddRestartsRaisesTheRunsBudget: a job that gives back a restart (a node failure
// cost its gang) lets every node of the run take one more failure; the run records it,
// and the nodes, following the run (job steps do), join whatever budget it holds.
func TestAddRestartsRaisesTheRunsBudget(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		var nodes []*testNode
		for i := 0; i < 2; i++ {
			c, err := NewDynamic(s, DynamicConfig{JobID: "refund", MinNodes: 2, MaxNodes: 2, MaxRestarts: 0, LastCall: 100 * time.Millisecond, Host: "h", FollowRun: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			nodes = append(nodes, &testNode{name: []string{"n000", "n001"}[i], rdzv: c})
		}
		r0 := joinAll(t, nodes, "")
		if ok, err := AddRestarts(ctx, s, "refund", 1); !ok || err != nil {
			t.Fatalf("AddRestarts = %v, %v", ok, err)
		}
		if err := r0["n000"].Fail(ctx, Failure{Node: "n000", Rank: 0, ExitCode: 1}); err != nil {
			t.Fatal(err)
		}
		<-r0["n001"].Ended()
		if e := r0["n001"].End(); e.Kind != Failed || e.OutOfRestarts {
			t.Fatalf("end %+v: with the budget raised to 1 the first failure must leave a restart", e)
		}
		info, ok, err := ReadRun(ctx, s, "refund")
		if err != nil || !ok || info.Failures != 1 || info.MaxRestarts != 1 || info.Finished || !info.LastFailed {
			t.Fatalf("ReadRun = %+v, %v, %v", info, ok, err)
		}
		r1 := joinAll(t, nodes, "")
		if err := r1["n001"].Fail(ctx, Failure{Node: "n001", Rank: 2, ExitCode: 3}); err != nil {
			t.Fatal(err)
		}
		<-r1["n000"].Ended()
		if e := r1["n000"].End(); e.Kind != Failed || !e.OutOfRestarts || e.Failure.ExitCode != 3 {
			t.Fatalf("end %+v: the second failure uses up the raised budget", e)
		}
		if ok, err := AddRestarts(ctx, s, "refund", 1); ok || err != nil {
			t.Errorf("AddRestarts on a finished run = %v, %v; want false", ok, err)
		}
	})
}
