package allocator

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// staleGrantView returns a store where node n1's agent holds GPU 3 for job grant 72, a
// snapshot of it, and then the store moved on: 72's GPU freed (its step took it over
// and gave it back) and locked again by the agent for job grant 75. The snapshot is the
// view a scheduler's or controller's watch may still hold.
func staleGrantView(t *testing.T) (store.Store, *Cluster) {
	t.Helper()
	ctx := context.Background()
	s := store.NewMemory()
	agent, err := s.CreateSession(ctx, store.SessionOptions{Name: "agent n1", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	grant := func(id string) store.Op {
		return store.Op{Verb: store.Set, Key: grantsPrefix + id, Value: mustJSON(Grant{ID: id, State: GrantGranted,
			Nodes: []GrantNode{{Name: "n1", GPUs: []int{3}, Devices: []string{"3"}, Session: agent}}})}
	}
	if _, err := s.Txn(ctx, []store.Op{
		{Verb: store.Set, Key: nodesPrefix + "n1", Value: mustJSON(NodeRecord{Name: "n1", Addr: "10.0.0.1"})},
		{Verb: store.Lock, Key: alivePrefix + "n1", Value: []byte("10.0.0.1"), Session: agent},
		grant("72"),
		{Verb: store.Lock, Key: gpuKey("n1", "3"), Value: []byte("72"), Session: agent},
	}); err != nil {
		t.Fatal(err)
	}
	c, err := Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Nodes["n1"].holds("3", "72") {
		t.Fatalf("the snapshot does not show 72 holding GPU 3: %+v", c.Nodes["n1"])
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: gpuKey("n1", "3")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{grant("75"), {Verb: store.Lock, Key: gpuKey("n1", "3"), Value: []byte("75"), Session: agent}}); err != nil {
		t.Fatal(err)
	}
	return s, c
}

// checkStillHeld fails unless GPU 3 of n1 is still held for grant 75.
func checkStillHeld(t *testing.T, s store.Store, who string) {
	t.Helper()
	e, err := s.Get(context.Background(), gpuKey("n1", "3"))
	if err != nil || e == nil || string(e.Value) != "75" || e.Session == "" {
		t.Errorf("%s took GPU 3 from grant 75, which holds it now: %+v %v", who, e, err)
	}
}

// TestReleaseOnAStaleViewLeavesAnotherJobsGPU: a job's release worked from a view in
// which its grant still held a GPU that has since been freed and granted to another job
// (every job's keys on a node are held by the node's one agent session, so the session
// check passed) and deleted the other job's key: its step then failed to take the GPU
// over, the node was taken for lost and excluded, and on a one-node cluster the job
// stayed PENDING for ever (benchmarks/submit_auth.sh, 200 jobs of /bin/true).
func TestReleaseOnAStaleViewLeavesAnotherJobsGPU(t *testing.T) {
	s, c := staleGrantView(t)
	if err := ReleaseJobIn(context.Background(), s, c, "72"); err == nil {
		t.Error("the release on the stale view succeeded; want it refused, to be tried on a fresh view")
	}
	checkStillHeld(t, s, "ReleaseJobIn")
	fresh, err := Snapshot(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := ReleaseJobIn(context.Background(), s, fresh, "72"); err != nil {
		t.Errorf("the release on a fresh view: %v", err)
	}
	checkStillHeld(t, s, "ReleaseJobIn on a fresh view")
	if e, _ := s.Get(context.Background(), grantsPrefix+"72"); e != nil {
		t.Errorf("grant 72 left after its release: %s", e.Value)
	}
}

// TestCleanupOnAStaleViewLeavesAnotherJobsGPU: the scheduler's clean-up of a grant
// whose request is gone deletes only the GPU keys still as its view showed them.
func TestCleanupOnAStaleViewLeavesAnotherJobsGPU(t *testing.T) {
	ctx := context.Background()
	s, c := staleGrantView(t)
	leader, err := s.CreateSession(ctx, store.SessionOptions{Name: "scheduler", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: schedulerKey, Value: []byte("n1"), Session: leader}}); err != nil {
		t.Fatal(err)
	}
	sc := NewScheduler(s, SchedulerConfig{Session: leader, Name: "n1"})
	_, _ = sc.cleanup(ctx, c) // refused or not, it must not take 75's GPU
	checkStillHeld(t, s, "the clean-up")
	// On a fresh view (grant 75 has a request, 72 none) the clean-up removes grant 72
	// and nothing of 75's.
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: requestsPrefix + "75", Value: mustJSON(Request{ID: "75", Job: "75", Nodes: 1, GPUsPerNode: 1, Holder: "job 75"})}}); err != nil {
		t.Fatal(err)
	}
	fresh, err := Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if expired, err := sc.cleanup(ctx, fresh); err != nil || len(expired) != 1 || expired[0] != "72" {
		t.Errorf("the clean-up on a fresh view: expired %v, %v; want [72]", expired, err)
	}
	checkStillHeld(t, s, "the clean-up on a fresh view")
	if e, _ := s.Get(ctx, grantsPrefix+"72"); e != nil {
		t.Errorf("grant 72 left after the clean-up: %s", e.Value)
	}
}
