package allocator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/internal/store"
)

func TestNodeChoiceCheckers(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	ib := node("a", 8, h100, map[string]string{"ib": "hdr", "nvlink": ""})
	plain := node("b", 8, h100, map[string]string{"rack": "r1"})
	for _, tc := range []struct {
		n    *NodeState
		c    NodeChoice
		want string
	}{
		{ib, NodeChoice{Constraint: "ib"}, ""},
		{ib, NodeChoice{Constraint: "ib=hdr&nvlink"}, ""},
		{ib, NodeChoice{Constraint: "ib=ndr"}, reasonFeatures},
		{plain, NodeChoice{Constraint: "ib|rack=r1"}, ""},
		{plain, NodeChoice{Constraint: "ib&rack"}, reasonFeatures},
		// Left to right, as Slurm: (ib|rack)&nvlink.
		{plain, NodeChoice{Constraint: "ib|rack&nvlink"}, reasonFeatures},
		{ib, NodeChoice{Constraint: "ib|rack&nvlink"}, ""},
		{ib, NodeChoice{Constraint: " ib | rack "}, ""},
		// A constraint that does not parse meets no node, though a feature of it would.
		{ib, NodeChoice{Constraint: "ib|[rack]"}, reasonFeatures},
		{ib, NodeChoice{Constraint: "ib||nvlink"}, reasonFeatures},
		{ib, NodeChoice{Constraint: "ib|nv link"}, reasonFeatures},
		{ib, NodeChoice{NodeList: []string{"a", "c"}}, ""},
		{plain, NodeChoice{NodeList: []string{"a", "c"}}, reasonNodeList},
		{plain, NodeChoice{ExcNodes: []string{"b"}}, reasonExcNodes},
		{ib, NodeChoice{ExcNodes: []string{"b"}}, ""},
	} {
		r := Request{Nodes: 1, GPUsPerNode: 1, NodeChoice: tc.c}
		if got := defaultPipeline().feasible(r, tc.n); got != tc.want {
			t.Errorf("node %s, %+v: reason %q, want %q", tc.n.Record.Name, tc.c, got, tc.want)
		}
	}
}

func TestParseConstraintRefusesWhatGangrunCannotHonour(t *testing.T) {
	for s, want := range map[string]string{
		"[rack1|rack2]": `"[" is not supported`,
		"a*2":           `"*" is not supported`,
		"(a&b)|c":       `"(" is not supported`,
		"a,b":           `"," is not supported`,
		"a&&b":          "Invalid feature specification",
		"a|":            "Invalid feature specification",
		"a b":           "Invalid feature specification",
	} {
		_, err := ParseConstraint(s)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseConstraint(%q) = %v, want one line with %q", s, err, want)
		}
	}
	if terms, err := ParseConstraint("a&b|c"); err != nil || len(terms) != 3 || terms[2].op != '|' {
		t.Errorf("a&b|c: %v %v", terms, err)
	}
	for arg, want := range map[string]string{"": ExclusiveNode, "user": ExclusiveUser} {
		if got, err := ParseExclusive(arg); err != nil || got != want {
			t.Errorf("ParseExclusive(%q) = %q %v, want %q", arg, got, err, want)
		}
	}
	for _, arg := range []string{"mcs", "topo", "x\n"} {
		if _, err := ParseExclusive(arg); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseExclusive(%q) = %v, want a refusal in one line", arg, err)
		}
	}
	if err := (NodeChoice{NodeList: []string{"a"}, ExcNodes: []string{"a"}}).Validate(); err == nil {
		t.Error("a node both in --nodelist and --exclude: no error")
	}
	many := make([]string, maxChoiceNodes+1)
	for i := range many {
		many[i] = fmt.Sprintf("n%d", i)
	}
	if err := (NodeChoice{ExcNodes: many}).Validate(); err == nil || !strings.Contains(err.Error(), "--exclude: 1025 nodes") {
		t.Errorf("%d nodes to --exclude: %v", len(many), err)
	}
}

func TestCheckFeasibleRefusesNodeChoicesInSlurmsWords(t *testing.T) {
	c := &Cluster{Nodes: map[string]*NodeState{"a": node("a", 4, "H100", map[string]string{"ib": "hdr"}), "b": node("b", 4, "H100", nil)}}
	for _, tc := range []struct {
		c    NodeChoice
		want string
	}{
		{NodeChoice{Constraint: "nvlink"}, `Invalid feature specification: --constraint "nvlink": no node has those features`},
		{NodeChoice{NodeList: []string{"a", "z"}}, "Invalid node name specified: --nodelist z is not a registered node"},
		{NodeChoice{ExcNodes: []string{"z"}}, "Invalid node name specified: --exclude z is not a registered node"},
		// ib is on a alone, which --exclude rules out: no node is eligible.
		{NodeChoice{Constraint: "ib", ExcNodes: []string{"a"}}, "only 0 registered nodes could ever take"},
	} {
		err := CheckFeasible(c, Request{Nodes: 1, GPUsPerNode: 1, NodeChoice: tc.c})
		if err == nil || !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
	if err := CheckFeasible(c, Request{Nodes: 1, GPUsPerNode: 1, NodeChoice: NodeChoice{Constraint: "ib", NodeList: []string{"a"}}}); err != nil {
		t.Errorf("ib on a: %v", err)
	}
}

func TestGPUTypeMatchesSlurmsNames(t *testing.T) {
	for _, tc := range []struct {
		model, typ string
		want       bool
	}{
		{"NVIDIA H100 80GB HBM3", "h100", true},
		{"NVIDIA H100 80GB HBM3", "nvidia_h100_80gb_hbm3", true}, // Slurm's AutoDetect=nvml name
		{"NVIDIA H100 80GB HBM3", "H100_80GB", true},
		{"NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb", true},
		{"Tesla V100-SXM2-16GB", "tesla_v100", true},
		{"NVIDIA A100-SXM4-80GB", "h100", false},
		{"NVIDIA A100-SXM4-80GB", "a100_pcie", false},
	} {
		if got := gpuTypeMatches(tc.model, tc.typ); got != tc.want {
			t.Errorf("gpuTypeMatches(%q, %q) = %v, want %v", tc.model, tc.typ, got, tc.want)
		}
	}
}

// TestExclusiveTakesNodesWhole: on one 8-GPU node, an --exclusive request waits while
// another grant holds GPUs there (pending reason Resources, saying why), and, once
// granted, keeps every other request off the node though 6 GPUs are free;
// --exclusive=user shares with its own user's requests only.
func TestExclusiveTakesNodesWhole(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNodes(t, s, 1, "dgx-h100")
	ts := newSchedulerFor(t, s)
	tickets := map[string]*Ticket{}
	submit := func(id, user, excl string) {
		t.Helper()
		tk, err := Submit(ctx, s, Request{ID: id, Nodes: 1, GPUsPerNode: 2, Holder: "t", User: user, NodeChoice: NodeChoice{Exclusive: excl}})
		if err != nil {
			t.Fatal(err)
		}
		tickets[id] = tk
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
	release := func(id string) {
		t.Helper()
		if err := tickets[id].Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	submit("shared", "ann", "")
	ts.pass(t)
	submit("whole", "ann", ExclusiveNode)
	ts.pass(t)
	if g := granted(); !g["shared"] || g["whole"] {
		t.Fatalf("granted %v, want shared alone", g)
	}
	if why := ts.sc.status.Pending["whole"]; !strings.HasPrefix(why, "Resources") || !strings.Contains(why, "1 "+reasonShared) {
		t.Errorf("whole's pending reason %q, want Resources and %q", why, reasonShared)
	}
	release("shared")
	ts.pass(t)
	submit("after", "ann", "")
	ts.pass(t)
	if g := granted(); !g["whole"] || g["after"] {
		t.Fatalf("granted %v, want whole alone (after waits though 6 GPUs are free)", g)
	}
	release("whole")
	release("after")
	ts.pass(t)

	// --exclusive=user: ann's jobs share, bob's waits.
	submit("u1", "ann", ExclusiveUser)
	ts.pass(t)
	submit("u2", "ann", "")
	submit("b1", "bob", "")
	ts.pass(t)
	if g := granted(); !g["u1"] || !g["u2"] || g["b1"] {
		t.Errorf("granted %v, want u1 and u2 (ann), not b1 (bob)", g)
	}
}

// TestNodeListAndExcludePlace: --nodelist puts a request on its nodes, --exclude keeps
// it off them, across two nodes with GPUs free on both.
func TestNodeListAndExcludePlace(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNodes(t, s, 2, "dgx-h100")
	ts := newSchedulerFor(t, s)
	for id, c := range map[string]NodeChoice{
		"w": {NodeList: []string{"node0001"}},
		"x": {ExcNodes: []string{"node0001"}},
		"c": {Constraint: "switch=leaf00", ExcNodes: []string{"node0000"}},
	} {
		tk, err := Submit(ctx, s, Request{ID: id, Nodes: 1, GPUsPerNode: 1, Holder: "t", NodeChoice: c})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tk.Release(context.Background()) })
	}
	ts.pass(t)
	c, err := Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"w": "node0001", "x": "node0000", "c": "node0001"} {
		g, ok := c.Grants[id]
		if !ok || g.State != GrantGranted || len(g.Nodes) != 1 || g.Nodes[0].Name != want {
			t.Errorf("%s: grant %+v, want on %s", id, g, want)
		}
	}
}

func TestFeaturesAreTheLabelsConstraintsMatch(t *testing.T) {
	got := Features(map[string]string{"partition": "gpu", "switch": "leaf1", "spine": "s0", "nvlink": "", "ib": "hdr"})
	if got != "ib=hdr,nvlink" {
		t.Errorf("Features = %q, want ib=hdr,nvlink", got)
	}
	n := node("a", 1, "H100", map[string]string{"nvlink": "", "ib": "hdr"})
	for _, f := range strings.Split(got, ",") {
		if !hasFeature(n, f) {
			t.Errorf("feature %q as shown does not match the node", f)
		}
	}
}

// TestExclusiveWaitsForStepsOfEndedGrants: a GPU key still held for a grant that is gone
// (its step stopping) keeps an exclusive request off the node; a grant's own keys count
// once.
func TestExclusiveWaitsForStepsOfEndedGrants(t *testing.T) {
	a := node("a", 2, "H100", nil)
	a.Held = map[string]string{"0": "gone", "1": "live"}
	c := &Cluster{Nodes: map[string]*NodeState{"a": a}, Requests: map[string]PendingRequest{},
		Grants: map[string]Grant{"live": {ID: "live", State: GrantGranted, Nodes: []GrantNode{{Name: "a"}}}}}
	occ := occupants(c)
	if len(occ["a"]) != 2 {
		t.Fatalf("occupants %+v, want live and gone", occ["a"])
	}
	delete(c.Grants, "live")
	a.Held = map[string]string{"0": "gone"}
	shared := sharedWith(occupants(c))
	if got := shared(Request{ID: "x", NodeChoice: NodeChoice{Exclusive: ExclusiveNode}}, a); got != reasonShared {
		t.Errorf("exclusive beside a stopping step: %q, want %q", got, reasonShared)
	}
	if got := shared(Request{ID: "gone", NodeChoice: NodeChoice{Exclusive: ExclusiveNode}}, a); got != "" {
		t.Errorf("exclusive beside its own stopping step: %q, want none", got)
	}
	if got := shared(Request{ID: "y"}, a); got != "" {
		t.Errorf("a shared request beside a stopping step: %q, want none", got)
	}
}
