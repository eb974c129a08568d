package allocator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// registerSized registers nodes named names, each a recorded DGX H100 (8 GPUs) whose
// record says it has cpus CPUs and mem MiB of memory, up under one session.
func registerSized(t *testing.T, s store.Store, cpus int, mem int64, names ...string) {
	t.Helper()
	ctx := context.Background()
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "sized nodes", TTL: 5 * time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		inv := inventory(t, "dgx-h100", name)
		data, err := inv.JSON()
		if err != nil {
			t.Fatal(err)
		}
		rec := NodeRecord{Name: name, GPUs: len(inv.GPUs), Devices: inv.Allocatable(), CPUs: cpus, MemoryMiB: mem}
		if _, err := s.Txn(ctx, []store.Op{
			{Verb: store.Set, Key: inventoryPrefix + name, Value: data},
			{Verb: store.Set, Key: nodesPrefix + name, Value: mustJSON(rec)},
			{Verb: store.Lock, Key: alivePrefix + name, Session: sess},
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// resourceWorld is a scheduler on an in-memory store, with helpers to submit requests
// and read back where they went.
type resourceWorld struct {
	t       *testing.T
	s       store.Store
	ts      *testScheduler
	tickets map[string]*Ticket
}

func newResourceWorld(t *testing.T, cpus int, mem int64, names ...string) *resourceWorld {
	s := store.NewMemory()
	registerSized(t, s, cpus, mem, names...)
	return &resourceWorld{t: t, s: s, ts: newSchedulerFor(t, s), tickets: map[string]*Ticket{}}
}

func (w *resourceWorld) submit(r Request) {
	w.t.Helper()
	r.Holder = "t"
	tk, err := Submit(context.Background(), w.s, r)
	if err != nil {
		w.t.Fatal(err)
	}
	w.tickets[r.ID] = tk
	w.t.Cleanup(func() { _ = tk.Release(context.Background()) })
}

// grants passes once and returns the granted grants by id, checking the invariants.
func (w *resourceWorld) grants() map[string]Grant {
	w.t.Helper()
	w.ts.pass(w.t)
	c := checkInvariants(w.t, w.s)
	out := map[string]Grant{}
	for id, g := range c.Grants {
		if g.State == GrantGranted {
			out[id] = g
		}
	}
	return out
}

// TestCPUHeavyJobsDoNotShareANode: two requests of 6 CPUs each on one node of 8 CPUs
// (and 8 GPUs, plenty of them free): the second waits, its reason Resources and the
// node's CPUs in use, until the first is released. On two such nodes they go one to
// each.
func TestCPUHeavyJobsDoNotShareANode(t *testing.T) {
	w := newResourceWorld(t, 8, 0, "n1")
	w.submit(Request{ID: "a", Nodes: 1, GPUsPerNode: 1, CPUsPerNode: 6})
	w.submit(Request{ID: "b", Nodes: 1, GPUsPerNode: 1, CPUsPerNode: 6})
	g := w.grants()
	if _, ok := g["a"]; !ok || len(g) != 1 {
		t.Fatalf("granted %v: want a alone", g)
	}
	if gn := g["a"].Nodes[0]; gn.CPUs != 6 || len(gn.Devices) != 1 {
		t.Errorf("a holds %d CPUs and devices %v: want 6 CPUs, 1 device", gn.CPUs, gn.Devices)
	}
	why := w.ts.sc.status.Pending["b"]
	if !strings.HasPrefix(why, "Resources: needs 1 node with 1 free GPU;") || !strings.Contains(why, "1 "+reasonCPUsBusy) {
		t.Errorf("b waits %q: want Resources, and 1 node's CPUs in use", why)
	}
	if err := w.tickets["a"].Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if g := w.grants(); len(g) != 1 || g["b"].ID != "b" {
		t.Errorf("after a's release granted %v: want b", g)
	}

	w2 := newResourceWorld(t, 8, 0, "n1", "n2")
	w2.submit(Request{ID: "a", Nodes: 1, GPUsPerNode: 1, CPUsPerNode: 6})
	w2.submit(Request{ID: "b", Nodes: 1, GPUsPerNode: 1, CPUsPerNode: 6})
	g = w2.grants()
	if len(g) != 2 || g["a"].Nodes[0].Name == g["b"].Nodes[0].Name {
		t.Errorf("granted %v: want a and b on different nodes", g)
	}
}

// TestMemoryHeavyJobsDoNotShareANode: as TestCPUHeavyJobsDoNotShareANode, for 600M of
// a node's 1000M (the second request CPU-only); one of 400M, ahead of the second, fits beside the first.
func TestMemoryHeavyJobsDoNotShareANode(t *testing.T) {
	w := newResourceWorld(t, 0, 1000, "n1")
	w.submit(Request{ID: "a", Nodes: 1, GPUsPerNode: 1, MemPerNodeMiB: 600})
	w.submit(Request{ID: "b", Nodes: 1, CPUsPerNode: 1, MemPerNodeMiB: 600})
	w.submit(Request{ID: "c", Nodes: 1, GPUsPerNode: 1, MemPerNodeMiB: 400, Priority: 1})
	g := w.grants()
	if len(g) != 2 || g["a"].ID == "" || g["c"].ID == "" {
		t.Fatalf("granted %v: want a and c (600M + 400M of 1000M)", g)
	}
	if why := w.ts.sc.status.Pending["b"]; !strings.Contains(why, "needs 1 node with 1 free CPU, 600M of memory") || !strings.Contains(why, "1 "+reasonMemoryBusy) {
		t.Errorf("b waits %q: want its 600M and 1 node's memory in use", why)
	}
}

// TestCPUOnlyBesideGPUJob: a request of all 8 GPUs and 2 CPUs, and a CPU-only one of 4
// CPUs and 100M, share one node of 8 CPUs: the CPU-only grant holds no device, its
// CPUs and memory recorded; a second CPU-only request of 4 CPUs waits (2 left).
func TestCPUOnlyBesideGPUJob(t *testing.T) {
	w := newResourceWorld(t, 8, 1000, "n1")
	w.submit(Request{ID: "gpu", Nodes: 1, GPUsPerNode: 8, CPUsPerNode: 2})
	w.submit(Request{ID: "cpu", Nodes: 1, CPUsPerNode: 4, MemPerNodeMiB: 100})
	w.submit(Request{ID: "cpu2", Nodes: 1, CPUsPerNode: 4})
	g := w.grants()
	if len(g) != 2 || g["gpu"].ID == "" || g["cpu"].ID == "" {
		t.Fatalf("granted %v: want gpu and cpu", g)
	}
	if gn := g["cpu"].Nodes[0]; gn.Name != "n1" || len(gn.Devices) != 0 || gn.CPUs != 4 || gn.MemoryMiB != 100 {
		t.Errorf("cpu's grant %+v: want n1, no devices, 4 CPUs, 100M", gn)
	}
	if why := w.ts.sc.status.Pending["cpu2"]; !strings.HasPrefix(why, "Resources: needs 1 node with 4 free CPUs") || !strings.Contains(why, "1 "+reasonCPUsBusy) {
		t.Errorf("cpu2 waits %q: want Resources, and 1 node's CPUs in use", why)
	}
}

// TestCheckFeasibleRefusesCPUsAndMemory: more CPUs or memory per node than any node has
// is refused before anything is reserved (ErrTooManyCPUs, ErrTooMuchMemory, both
// ErrInfeasible); a node that does not know its memory takes any.
func TestCheckFeasibleRefusesCPUsAndMemory(t *testing.T) {
	n := func(name string, cpus int, mem int64) *NodeState {
		return &NodeState{Record: NodeRecord{Name: name, CPUs: cpus, MemoryMiB: mem}, Up: true, Held: map[string]string{}}
	}
	c := &Cluster{Nodes: map[string]*NodeState{"a": n("a", 8, 1000), "b": n("b", 16, 2000)}}
	for _, tc := range []struct {
		r    Request
		want error
		text string
	}{
		{Request{Nodes: 1, CPUsPerNode: 17}, ErrTooManyCPUs, "17 CPUs on each node: no node has more than 16"},
		{Request{Nodes: 1, CPUsPerNode: 1, MemPerNodeMiB: 2001}, ErrTooMuchMemory, "2001M on each node: no node has more than 2000M"},
		{Request{Nodes: 2, CPUsPerNode: 9}, ErrInfeasible, "--nodes 2: only 1 registered node could ever take 9 CPUs each with these constraints"},
		{Request{Nodes: 2, CPUsPerNode: 8, MemPerNodeMiB: 1000}, nil, ""},
	} {
		err := CheckFeasible(c, tc.r)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%+v refused: %v", tc.r, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%+v: got %v, want %v saying %q", tc.r, err, tc.want, tc.text)
		}
	}
	c.Nodes["c"] = n("c", 4, 0)
	if err := CheckFeasible(c, Request{Nodes: 1, CPUsPerNode: 1, MemPerNodeMiB: 1 << 30}); err != nil {
		t.Errorf("a node of unknown memory: refused %v", err)
	}
	if err := (Request{Nodes: 1}).Validate(); err == nil {
		t.Error("a request of no GPUs and no CPUs validated")
	}
}

// TestInvariantsSeeOvercommittedCPUs: two granted grants holding 6 of a node's 8 CPUs
// each break the invariant Overcommitted, naming the node and both grants.
func TestInvariantsSeeOvercommittedCPUs(t *testing.T) {
	node := store.Entry{Key: nodesPrefix + "n1", Value: mustJSON(NodeRecord{Name: "n1", CPUs: 8, MemoryMiB: 100})}
	grant := func(id string) store.Entry {
		return store.Entry{Key: grantsPrefix + id, Value: mustJSON(Grant{ID: id, State: GrantGranted, Session: "s",
			Nodes: []GrantNode{{Name: "n1", CPUs: 6, MemoryMiB: 10}}})}
	}
	_, vs := CheckInvariants([]store.Entry{node, grant("g1"), grant("g2")}, 1)
	if len(vs) != 1 || vs[0].Kind != Overcommitted {
		t.Fatalf("violations %v: want one overcommitted", vs)
	}
	if want := "node n1 overcommitted: grants g1, g2 hold 12 of 8 CPUs"; vs[0].String() != want {
		t.Errorf("%q, want %q", vs[0].String(), want)
	}
	if _, vs := CheckInvariants([]store.Entry{node, grant("g1")}, 1); len(vs) != 0 {
		t.Errorf("one grant of 6 of 8 CPUs: violations %v", vs)
	}
}

// TestNodeListCountsCPUOnlyGrants: `gangrun nodes` (NodeList) shows a node's CPUs and
// memory and what grants hold of them, a CPU-only grant among the node's grants.
func TestNodeListCountsCPUOnlyGrants(t *testing.T) {
	w := newResourceWorld(t, 8, 1000, "n1")
	w.submit(Request{ID: "cpu", Nodes: 1, CPUsPerNode: 3, MemPerNodeMiB: 100})
	w.submit(Request{ID: "gpu", Nodes: 1, GPUsPerNode: 1, CPUsPerNode: 1})
	if g := w.grants(); len(g) != 2 {
		t.Fatalf("granted %v: want both", g)
	}
	c, err := Snapshot(context.Background(), w.s)
	if err != nil {
		t.Fatal(err)
	}
	st := c.NodeList()[0]
	if st.CPUsTotal != 8 || st.CPUsUsed != 4 || st.MemoryMiB != 1000 || st.MemoryUsedMiB != 100 || st.GPUsUsed != 1 ||
		strings.Join(st.Grants, ",") != "cpu,gpu" {
		t.Errorf("node status %+v: want 4 of 8 CPUs, 100M of 1000M, 1 GPU used, grants cpu and gpu", st)
	}
}
