package allocator

import (
	"errors"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/topology"
)

// node is a registered node with gpus devices of model, labelled labels.
func node(name string, gpus int, model string, labels map[string]string) *NodeState {
	n := &NodeState{Record: NodeRecord{Name: name, Labels: labels, GPUs: gpus}, Up: true, Held: map[string]string{}}
	for i := range gpus {
		n.Record.Devices = append(n.Record.Devices, topology.Device{ID: string(rune('0' + i)), GPU: i, Model: model})
	}
	return n
}

func TestCheckers(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	down := node("down", 8, h100, nil)
	down.Up = false
	drained := node("drained", 8, h100, nil)
	drained.Drain = &Drain{Reason: "maintenance"}
	drainedDown := node("drained-down", 8, h100, nil)
	drainedDown.Up, drainedDown.Drain = false, &Drain{Reason: "maintenance"}
	for _, tc := range []struct {
		n    *NodeState
		r    Request
		want string
	}{
		{node("ok", 8, h100, map[string]string{"partition": "train", "rack": "r1"}),
			Request{Nodes: 1, GPUsPerNode: 8, GPUModel: "h100", Partition: "train", Labels: map[string]string{"rack": "r1"}}, ""},
		{down, Request{Nodes: 1, GPUsPerNode: 1}, "down"},
		{drained, Request{Nodes: 1, GPUsPerNode: 1}, "drained"},
		{drainedDown, Request{Nodes: 1, GPUsPerNode: 1}, "drained"}, // drained wins, as in State
		{node("p", 8, h100, map[string]string{"partition": "batch"}), Request{Nodes: 1, GPUsPerNode: 1, Partition: "train"}, "other partition"},
		{node("l", 8, h100, map[string]string{"rack": "r2"}), Request{Nodes: 1, GPUsPerNode: 1, Labels: map[string]string{"rack": "r1"}}, "labels"},
		{node("g", 4, h100, nil), Request{Nodes: 1, GPUsPerNode: 8}, "too few GPUs"},
		{node("m", 8, h100, nil), Request{Nodes: 1, GPUsPerNode: 1, GPUModel: "A100"}, "too few GPUs"},
		// The first check that fails gives the reason: state before fit.
		{down, Request{Nodes: 1, GPUsPerNode: 16, Partition: "x"}, "down"},
	} {
		if got := defaultPipeline().feasible(tc.r, tc.n); got != tc.want {
			t.Errorf("node %s, request %+v: reason %q, want %q", tc.n.Record.Name, tc.r, got, tc.want)
		}
	}
	kept := reservedFor(map[string]string{"n": "first"}, nil)
	if got := kept(Request{ID: "second"}, node("n", 8, h100, nil)); got != "reserved for a request ahead" {
		t.Errorf("a node kept for another request: %q", got)
	}
	if got := kept(Request{ID: "first"}, node("n", 8, h100, nil)); got != "" {
		t.Errorf("a node kept for the request itself: %q", got)
	}
}

func TestCheckFeasibleCountsNodesThatMayComeBack(t *testing.T) {
	// A down node and a drained one may come back: the pre-check counts them, through the
	// fit checkers alone.
	down := node("a", 4, "H100", nil)
	down.Up = false
	drained := node("b", 4, "H100", nil)
	drained.Drain = &Drain{Reason: "maintenance"}
	c := &Cluster{Nodes: map[string]*NodeState{"a": down, "b": drained, "c": node("c", 2, "H100", nil)}}
	if err := CheckFeasible(c, Request{Nodes: 2, GPUsPerNode: 4}); err != nil {
		t.Errorf("2 × 4 on a down and a drained 4-GPU node: %v", err)
	}
	err := CheckFeasible(c, Request{Nodes: 3, GPUsPerNode: 4})
	if want := "--nodes 3: only 2 registered nodes could ever take 4 GPUs each with these constraints"; err == nil || err.Error() != want {
		t.Errorf("3 × 4: %v, want %q", err, want)
	}
	if !errors.Is(err, ErrInfeasible) {
		t.Errorf("3 × 4: %v is not ErrInfeasible", err)
	}
	err = CheckFeasible(&Cluster{Nodes: map[string]*NodeState{}}, Request{Nodes: 1, GPUsPerNode: 1})
	if !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), "no nodes are registered") {
		t.Errorf("no nodes: %v", err)
	}
}

// TestCheckFeasibleTakesThePolicysPartitionNodes: a partition the policy defines by
// labels (Request.PartitionNodes) is feasible where nodes have those labels, with no
// node labelled partition=<name>; refused, naming the labels, where none has them.
func TestCheckFeasibleTakesThePolicysPartitionNodes(t *testing.T) {
	c := &Cluster{Nodes: map[string]*NodeState{"a": node("a", 4, "H100", map[string]string{"pool": "x"})}}
	if err := CheckFeasible(c, Request{Nodes: 1, GPUsPerNode: 2, Partition: "low", PartitionNodes: map[string]string{"pool": "x"}}); err != nil {
		t.Errorf("partition low on pool=x: %v", err)
	}
	err := CheckFeasible(c, Request{Nodes: 1, GPUsPerNode: 2, Partition: "low", PartitionNodes: map[string]string{"pool": "y", "rack": "r1"}})
	if want := "--partition low: no node has the partition's labels pool=y,rack=r1"; err == nil || err.Error() != want || !errors.Is(err, ErrInfeasible) {
		t.Errorf("partition low on pool=y: %v, want %q (ErrInfeasible)", err, want)
	}
}

// TestExclusionLapsesWhenTheAgentRestarts: a node a job lost while it looked healthy is
// excluded while the agent it was lost under lives on, and taken again once that agent
// has restarted (a new alive session); an exclusion without a session holds for good.
func TestExclusionLapsesWhenTheAgentRestarts(t *testing.T) {
	n := &NodeState{Record: NodeRecord{Name: "b"}, Up: true, AliveSession: "s1"}
	for _, c := range []struct {
		r    Request
		want string
	}{
		{Request{Exclude: []string{"b"}, ExcludeSession: map[string]string{"b": "s1"}}, reasonExcluded},
		{Request{Exclude: []string{"b"}, ExcludeSession: map[string]string{"b": "s0"}}, ""},
		{Request{Exclude: []string{"b"}}, reasonExcluded},
		{Request{Exclude: []string{"a"}, ExcludeSession: map[string]string{"a": "s1"}}, ""},
	} {
		if got := checkNotExcluded(c.r, n); got != c.want {
			t.Errorf("%+v on node b (agent session s1): %q, want %q", c.r, got, c.want)
		}
	}
	if shapeKey(Request{Exclude: []string{"b"}, ExcludeSession: map[string]string{"b": "s1"}}) == shapeKey(Request{Exclude: []string{"b"}, ExcludeSession: map[string]string{"b": "s0"}}) {
		t.Error("two requests excluding a node under different agent sessions share a shape")
	}
}

// TestPendingReasonSaysWhatClearsAnExclusion: a job waiting because it excludes a node
// it lost its step on says which node, and that restarting the gangrun agent there
// clears it; without a recorded agent session (for good) it names the node only.
func TestPendingReasonSaysWhatClearsAnExclusion(t *testing.T) {
	a, b, c := node("a", 4, "H100", nil), node("b", 4, "H100", nil), node("c", 4, "H100", nil)
	a.AliveSession, b.AliveSession, c.AliveSession = "sa", "sb", "sc"
	nodes := map[string]*NodeState{"a": a, "b": b, "c": c}
	free := map[string][]topology.Device{"a": a.Record.Devices, "b": b.Record.Devices, "c": c.Record.Devices}
	noInventory := func(*NodeState) (*topology.Inventory, error) { return nil, errors.New("not asked") }
	for _, tc := range []struct {
		r    Request
		want string
	}{
		{Request{Job: "1", Nodes: 3, GPUsPerNode: 4, Exclude: []string{"b"}, ExcludeSession: map[string]string{"b": "sb"}},
			"Resources: needs 3 nodes with 4 free GPUs; 2 of 2 eligible nodes have them now; 1 excluded (b lost this job's step; restarting the gangrun agent there clears it)"},
		{Request{Job: "1", Nodes: 2, GPUsPerNode: 4, Exclude: []string{"c", "b"}, ExcludeSession: map[string]string{"b": "sb", "c": "sc"}},
			"Resources: needs 2 nodes with 4 free GPUs; 1 of 1 eligible node has them now; 2 excluded (b, c lost this job's steps; restarting the gangrun agents there clears it)"},
		{Request{Job: "1", Nodes: 3, GPUsPerNode: 4, Exclude: []string{"b"}},
			"Resources: needs 3 nodes with 4 free GPUs; 2 of 2 eligible nodes have them now; 1 excluded (b lost this job's step)"},
	} {
		_, why := defaultPipeline().place(tc.r, nodes, free, nil, noInventory)
		if why != tc.want {
			t.Errorf("%+v: pending reason %q, want %q", tc.r, why, tc.want)
		}
	}
}
