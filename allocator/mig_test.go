package allocator

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

func TestParseGPUs(t *testing.T) {
	for _, c := range []struct {
		in             string
		count          int
		profile, model string
		err            string
	}{
		{in: "8", count: 8},
		{in: "h100:8", count: 8, model: "h100"},
		{in: "A100-SXM4-80GB:4", count: 4, model: "A100-SXM4-80GB"},
		{in: "3g.40gb:2", count: 2, profile: "3g.40gb"},
		{in: "1G.10GB+ME:1", count: 1, profile: "1g.10gb+me"},
		{in: "0", err: `--gpus-per-node "0": want [TYPE:]COUNT`},
		{in: "h100:", err: `--gpus-per-node "h100:": want [TYPE:]COUNT`},
		{in: ":2", err: `--gpus-per-node ":2": empty type before ':'`},
		{in: "two", err: `--gpus-per-node "two": want [TYPE:]COUNT`},
		{in: "h100:-1", err: `--gpus-per-node "h100:-1": want [TYPE:]COUNT`},
		{in: "h1\x1b00:2", err: `--gpus-per-node`},
	} {
		n, profile, model, err := ParseGPUs(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\x1b") {
				t.Errorf("ParseGPUs(%q) = %v, want an error containing %q (and no raw control character)", c.in, err, c.err)
			}
			continue
		}
		if err != nil || n != c.count || profile != c.profile || model != c.model {
			t.Errorf("ParseGPUs(%q) = %d %q %q %v, want %d %q %q", c.in, n, profile, model, err, c.count, c.profile, c.model)
		}
	}
}

// TestMIGProfileRequests: on the recorded DGX A100 whose GPU 0 runs MIG (two 3g.20gb
// devices) a request for 3g.20gb devices gets exactly those, a plain request any device,
// and a profile the node lacks, or more of one than it has, is refused before it is
// queued, naming the value.
func TestMIGProfileRequests(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNodes(t, s, 1, "dgx-a100-mig")
	nodes, err := RegisteredNodes(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var migs []string
	for _, d := range nodes.Nodes["node0000"].Record.Devices {
		if d.MIGProfile == "3g.20gb" {
			migs = append(migs, d.ID)
		}
	}
	if len(migs) != 2 {
		t.Fatalf("the node record lists %d 3g.20gb devices, want the inventory's 2: %+v", len(migs), nodes.Nodes["node0000"].Record.Devices)
	}
	for _, c := range []struct {
		req  Request
		want string // a refusal's text; "" when it fits
	}{
		{req: Request{ID: "m3", Nodes: 1, GPUsPerNode: 3, MIGProfile: "3g.20gb"}, want: "--gpus-per-node 3g.20gb:3: no node has more than 2 3g.20gb MIG devices"},
		{req: Request{ID: "m1", Nodes: 1, GPUsPerNode: 1, MIGProfile: "1g.10gb"}, want: "--gpus-per-node 1g.10gb:1: no node has 1g.10gb MIG devices"},
		{req: Request{ID: "ok", Nodes: 1, GPUsPerNode: 2, MIGProfile: "3g.20gb"}},
		// A model asks for whole GPUs: the node has 7 A100s outside MIG, not 8.
		{req: Request{ID: "a100x8", Nodes: 1, GPUsPerNode: 8, GPUModel: "a100"}, want: "--gpus-per-node 8: no node has more than 7 allocatable GPUs"},
		{req: Request{ID: "a100x7", Nodes: 1, GPUsPerNode: 7, GPUModel: "a100"}},
	} {
		err := CheckFeasible(nodes, c.req)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.req.ID, err)
		case c.want != "" && (err == nil || !errors.Is(err, ErrInfeasible) || err.Error() != c.want):
			t.Errorf("%s: %v, want the refusal %q", c.req.ID, err, c.want)
		}
	}

	rec := newSchedulerFor(t, s)
	mig, err := Submit(ctx, s, Request{ID: "mig", Nodes: 1, GPUsPerNode: 2, MIGProfile: "3g.20gb", Holder: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mig.Release(context.Background()) })
	whole, err := Submit(ctx, s, Request{ID: "whole", Nodes: 1, GPUsPerNode: 7, Holder: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = whole.Release(context.Background()) })
	rec.pass(t)
	c, err := Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	g := c.Grants["mig"]
	if g.State != GrantGranted || len(g.Nodes) != 1 || !slices.Equal(slices.Sorted(slices.Values(g.Nodes[0].Devices)), slices.Sorted(slices.Values(migs))) {
		t.Errorf("the 3g.20gb request's grant: %+v, want the two MIG devices %v", g, migs)
	}
	w := c.Grants["whole"]
	if w.State != GrantGranted || w.DeviceCount() != 7 || slices.ContainsFunc(w.Nodes[0].Devices, func(id string) bool { return slices.Contains(migs, id) }) {
		t.Errorf("the plain request's grant: %+v, want the 7 whole GPUs left", w)
	}
	// Nothing of the profile is left: a second MIG request waits, saying what for.
	again, err := Submit(ctx, s, Request{ID: "again", Nodes: 1, GPUsPerNode: 1, MIGProfile: "3g.20gb", Holder: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Release(context.Background()) })
	rec.pass(t)
	if why := rec.sc.status.Pending["again"]; !strings.Contains(why, "needs 1 node with 1 free 3g.20gb MIG device;") {
		t.Errorf("the second MIG request's pending reason: %q", why)
	}
}

// testScheduler runs a scheduler's passes on fresh snapshots of its store.
type testScheduler struct {
	s  store.Store
	sc *Scheduler
}

func newSchedulerFor(t *testing.T, s store.Store) *testScheduler {
	return &testScheduler{s: s, sc: NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test"})}
}

func (ts *testScheduler) pass(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Snapshot(ctx, ts.s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.sc.Pass(ctx, c); err != nil {
		t.Fatal(err)
	}
}
