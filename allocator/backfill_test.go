package allocator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestBackfillByTimeLimit: Slurm's backfill by time limit. Two 8-GPU nodes: A (2 GPUs,
// --time 1h) and B (8 GPUs, 1h) run; C (2 nodes × 8) waits and keeps both nodes, whose
// GPUs are all free an hour after A's and B's grants. Of the 2-GPU requests behind C,
// the ones with a 30-minute limit start on the 6 GPUs A left free (they end before C
// can begin); one with a 2-hour limit, and one without a limit, wait though GPUs are
// free, kept for C; once A's and B's limits are unknown (an alloc without --time holds
// GPUs there), nothing backfills.
func TestBackfillByTimeLimit(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	s := store.NewMemory()
	registerNodes(t, s, 2, "dgx-h100")
	ts := newSchedulerFor(t, s)
	ts.sc.now = func() time.Time { return t0 }
	submit := func(id string, nodes, gpus, priority int, limit time.Duration) {
		t.Helper()
		tk, err := Submit(ctx, s, Request{ID: id, Nodes: nodes, GPUsPerNode: gpus, Priority: priority, TimeLimit: limit, Holder: "t"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tk.Release(context.Background()) })
	}
	granted := func() map[string]bool {
		t.Helper()
		c, err := Snapshot(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for id, g := range c.Grants {
			out[id] = g.State == GrantGranted
		}
		return out
	}
	submit("a", 1, 2, 10, time.Hour)
	submit("b", 1, 8, 9, time.Hour)
	ts.pass(t)
	if g := granted(); !g["a"] || !g["b"] {
		t.Fatalf("a and b not granted: %v", g)
	}
	submit("c", 2, 8, 8, time.Hour)
	submit("d", 1, 2, 1, 30*time.Minute)
	submit("e", 1, 2, 1, 2*time.Hour)
	submit("f", 1, 2, 1, 0)
	submit("g", 1, 2, 1, 30*time.Minute)
	ts.pass(t)
	g := granted()
	for id, want := range map[string]bool{"c": false, "d": true, "e": false, "f": false, "g": true} {
		if g[id] != want {
			t.Errorf("%s granted %v, want %v (all: %v)", id, g[id], want, g)
		}
	}
	for _, id := range []string{"e", "f"} {
		if why := ts.sc.status.Pending[id]; !strings.Contains(why, reasonReserved) {
			t.Errorf("%s's pending reason %q does not say the free GPUs are kept", id, why)
		}
	}
	if len(ts.sc.status.Reserved["c"]) != 2 {
		t.Errorf("c keeps %v, want both nodes", ts.sc.status.Reserved["c"])
	}

	// A holder without a time limit: the reservation has no expected start, and a
	// request that would have backfilled before waits.
	submit("h", 1, 2, 20, 0)
	submit("i", 1, 2, 1, 10*time.Minute)
	ts.pass(t)
	g = granted()
	if !g["h"] || g["i"] {
		t.Errorf("h (no limit, ahead of c) granted %v, i (10m, behind c) granted %v; want h only", g["h"], g["i"])
	}
}
