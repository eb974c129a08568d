package allocator

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/store"
)

// brief is the part of an event the scheduler decides.
type brief struct {
	Kind  event.Kind
	Job   string
	Cause string
	Nodes []string
	GPUs  int
}

func briefs(events []event.Event) []brief {
	out := []brief{}
	for _, e := range events {
		if e.Kind == event.Passed {
			continue // every pass has one (TestSchedulerEvents checks it)
		}
		out = append(out, brief{e.Kind, e.Job, e.Cause, e.Nodes, e.GPUs})
	}
	return out
}

func TestSchedulerEvents(t *testing.T) {
	// One scheduler, driven pass by pass on the in-memory store: it reports the grants
	// it makes, a pending reason once until it changes, and the releases it sees.
	ctx := context.Background()
	s := store.NewMemory()
	registerNodes(t, s, 2, "dgx-h100") // node0000, node0001: 8 GPUs each
	rec := &event.Recorder{}
	sc := NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test", Events: rec})
	seen := 0
	pass := func(want ...brief) {
		t.Helper()
		c, err := Snapshot(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sc.Pass(ctx, c); err != nil {
			t.Fatal(err)
		}
		all := rec.Events()
		if n := len(all); n == 0 || all[n-1].Kind != event.Passed || all[n-1].Duration <= 0 {
			t.Fatalf("the pass did not end with its event.Passed and its duration: %+v", all)
		}
		got := briefs(all[seen:])
		seen = len(all)
		if !reflect.DeepEqual(got, append([]brief{}, want...)) {
			t.Fatalf("events of the pass:\n got %+v\nwant %+v", got, want)
		}
		for _, e := range all {
			if e.Time.IsZero() || e.Attempt != -1 {
				t.Errorf("event %+v: want its time, and attempt -1 (none)", e)
			}
		}
	}
	submit := func(r Request) *Ticket {
		t.Helper()
		tk, err := Submit(ctx, s, r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tk.Release(context.Background()) })
		return tk
	}
	both := []string{"node0000", "node0001"}

	a := submit(Request{ID: "a", Nodes: 2, GPUsPerNode: 8, Holder: "a"})
	pass(brief{event.Granted, "a", "", both, 16})

	submit(Request{ID: "b", Nodes: 1, GPUsPerNode: 4, Holder: "b"})
	waitB := "Resources: needs 1 node with 4 free GPUs; 0 of 2 eligible nodes have them now"
	pass(brief{event.Pending, "b", waitB, nil, 0})
	pass() // the same reason: nothing new

	if err := SetDrain(ctx, s, "node0001", "maintenance"); err != nil {
		t.Fatal(err)
	}
	pass(brief{event.Pending, "b", "Resources: needs 1 node with 4 free GPUs; 0 of 1 eligible node has them now; 1 drained", nil, 0})
	if err := SetDrain(ctx, s, "node0001", ""); err != nil {
		t.Fatal(err)
	}
	pass(brief{event.Pending, "b", waitB, nil, 0})

	// a's release frees both nodes: b is granted on one (best fit, then name).
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pass(brief{event.Released, "a", "released", both, 16}, brief{event.Granted, "b", "", []string{"node0000"}, 4})

	// A holder that dies: its session takes its keys away.
	c := submit(Request{ID: "c", Nodes: 1, GPUsPerNode: 2, Holder: "c"})
	pass(brief{event.Granted, "c", "", []string{"node0000"}, 2})
	c.die(ctx)
	pass(brief{event.Released, "c", "released", []string{"node0000"}, 2})

	// A grant whose request key went away (a release cut short): the scheduler removes
	// it itself.
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: requestsPrefix + "b"}}); err != nil {
		t.Fatal(err)
	}
	pass(brief{event.Released, "b", "expired", []string{"node0000"}, 4})
	if got := len(rec.Of(event.Granted)); got != 3 {
		t.Errorf("%d grants reported, want 3", got)
	}
}

func TestAgentPassesEventsToItsScheduler(t *testing.T) {
	s := store.NewMemory()
	rec := &event.Recorder{}
	a, err := NewAgent(s, AgentConfig{Node: "node00", Inventory: inventory(t, "dgx-h100", "node00"), Events: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	tc := &testCluster{t: t, s: s}
	tc.waitUp(1)
	_, g := submitAndWait(t, s, Request{Nodes: 1, GPUsPerNode: 2, Holder: "events"})
	waitFor(t, 10*time.Second, func() bool { return len(rec.Of(event.Granted)) == 1 }, "the grant reported")
	if e := rec.Of(event.Granted)[0]; e.Job != g.ID || e.GPUs != 2 || !reflect.DeepEqual(e.Nodes, []string{"node00"}) {
		t.Errorf("granted event %+v, want grant %s: node00, 2 GPUs", e, g.ID)
	}
}

// TestPassSkipsOnlyRequestsOfTheSameShape: within a pass, a request shaped like one that
// did not fit skips placement; requests that differ in what placement looks at (the
// nodes they exclude, here) are each placed. One node free of two: "a" excludes it and
// waits, "b", the same gang without the exclusion, is granted in the same pass.
func TestPassSkipsOnlyRequestsOfTheSameShape(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNodes(t, s, 2, "dgx-h100") // node0000, node0001: 8 GPUs each
	rec := &event.Recorder{}
	sc := NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test", Events: rec})
	var tickets []*Ticket
	for _, r := range []Request{
		{ID: "h", Nodes: 1, GPUsPerNode: 8, Holder: "h", Priority: 9}, // takes one whole node
		{ID: "a", Nodes: 1, GPUsPerNode: 8, Holder: "a", Priority: 5, Exclude: []string{"node0000", "node0001"}},
		{ID: "b", Nodes: 1, GPUsPerNode: 8, Holder: "b", Priority: 1},
	} {
		tk, err := Submit(ctx, s, r)
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
	}
	t.Cleanup(func() {
		for _, tk := range tickets {
			_ = tk.Release(context.Background())
		}
	})
	c, err := Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Pass(ctx, c); err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{}
	for _, e := range rec.Events() {
		if e.Kind == event.Granted {
			granted[e.Job] = true
		}
	}
	if !granted["h"] || granted["a"] || !granted["b"] {
		t.Errorf("granted %v in one pass, want h and b (a excludes every node)", granted)
	}
}
