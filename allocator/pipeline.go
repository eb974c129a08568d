// Placement: which nodes across the cluster, and which GPUs inside each node, a gang
// gets.
//
// Placement follows the shape of Nomad's scheduler (scheduler/feasible.go, rank.go): a
// short pipeline of small feasibility checkers (feasible.go), each saying why a node is
// out, then rankers that choose among the nodes left. It is the pure, deterministic part
// of the allocator: it reads a snapshot, free devices and inventories, returns a
// choice, and never writes anything (the commit, commit.go, does).
//
//   - Across nodes, the node ranker ChooseNodes (rank_nodes.go) applies Slurm's
//     topology/tree rule (the lowest-level switch that holds the whole gang, else the
//     fewest leaf switches), then best-fit packing so that whole free nodes stay free
//     for large gangs.
//   - Inside a node, the device ranker ChooseDevices (rank_devices.go) picks the k free
//     devices whose pairwise link weights (weights.go) add up to the most, the
//     objective of NVIDIA go-gpuallocator's best-effort policy
//     (gpuallocator/besteffort_policy.go), found exactly by branch and bound; SetScore
//     gives the same sum for any set.

package allocator

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gangrun/gangrun/topology"
)

// NodeRanker chooses the nodes of a gang of `nodes` nodes with gpusPerNode free devices
// each, among candidates that passed the checkers, and returns them in node-rank
// order; an error when the gang does not fit them now (the pending reason is then the
// checkers' count, not the error's text). It must not modify cands. ChooseNodes is the
// one the scheduler uses.
type NodeRanker func(cands []NodeCandidate, nodes, gpusPerNode int) ([]NodeCandidate, error)

// DeviceRanker chooses k of one node's free devices for one gang member, with the
// node's inventory for the links between them; an error when it cannot (fewer than k
// free, a device the inventory does not know). It must not modify free. ChooseDevices
// is the one the scheduler uses.
type DeviceRanker func(inv *topology.Inventory, free []topology.Device, k int) ([]topology.Device, error)

// pipeline is placement as the scheduler runs it: checkers filter the nodes, the node
// ranker chooses among those left, the device ranker chooses on each chosen node.
type pipeline struct {
	// state checks a node's state (up, not drained): a node they rule out may come
	// back, so the requester's pre-check (CheckFeasible) skips them.
	state []Checker
	// fit checks the node's record against the request (partition, labels, GPU model
	// and count): a node they rule out can never take the request as it is registered.
	fit []Checker
	// free checks that the node's CPUs and memory the request asks for are free now
	// (resources.go): like the free devices the node ranker weighs, what they rule out
	// comes back when a grant ends, so neither the pre-check nor the reservations
	// (reserve) run them; a request they hold back waits, reason Resources.
	free    []Checker
	nodes   NodeRanker
	devices DeviceRanker
	// backfill, when set, lets a request use nodes kept for another's reservation
	// (reservedFor); the scheduler sets it for each pass, nil keeps them from all.
	backfill func(r Request, owner string) bool
	// occupied, when set, are the grants on each node (occupants), which --exclusive
	// looks at (sharedWith); the scheduler sets it for each pass and adds the pass's
	// grants; nil: no node is shared with anything.
	occupied map[string][]occupant
}

// defaultPipeline returns the scheduler's pipeline: the one place the checkers and
// rankers are listed, in the order they run. A new checker is a Checker in a file of
// its own and one line in state or fit; a new placement policy is a NodeRanker or a
// DeviceRanker in a file of its own and the one line here that names it.
func defaultPipeline() pipeline {
	return pipeline{
		state:   []Checker{checkUp, checkNotDrained, checkNotExcluded},
		fit:     []Checker{checkPartition, checkLabels, checkDevices, checkFeatures, checkNodeList, checkExcNodes, checkCPUs, checkMemory},
		free:    []Checker{checkCPUsFree, checkMemoryFree},
		nodes:   ChooseNodes,
		devices: ChooseDevices,
	}
}

// feasible returns the first reason the state and then the fit checkers give against
// node n for r, "" when n passes them all.
func (p pipeline) feasible(r Request, n *NodeState) string {
	if why := firstReason(p.state, r, n); why != "" {
		return why
	}
	return firstReason(p.fit, r, n)
}

// place runs r through the pipeline on nodes (a snapshot's): each node through the
// checkers, then past the nodes kept for other requests (kept: node → request); the
// survivors to the node ranker with their free devices of r's model (free: node →
// devices no grant holds); each chosen node's free devices to the device ranker, with
// the node's inventory from inventory. It returns the grant's nodes, or nil and why r
// does not fit now: a pending reason that counts the checkers' reasons.
func (p pipeline) place(r Request, nodes map[string]*NodeState, free map[string][]topology.Device, kept map[string]string,
	inventory func(*NodeState) (*topology.Inventory, error)) ([]GrantNode, string) {
	reserved, shared := reservedFor(kept, p.backfill), sharedWith(p.occupied)
	var cands []NodeCandidate
	counts := map[string]int{}
	var excluded []string // the nodes checkNotExcluded ruled out
	for name, n := range nodes {
		why := p.feasible(r, n)
		if why == "" {
			why = reserved(r, n)
		}
		if why == "" {
			why = shared(r, n)
		}
		if why == "" {
			why = firstReason(p.free, r, n)
		}
		if why != "" {
			counts[why]++
			if why == reasonExcluded {
				excluded = append(excluded, name)
			}
			continue
		}
		f := len(matching(free[name], r))
		cands = append(cands, NodeCandidate{Name: name, Switch: n.Record.Labels[LabelSwitch],
			Spine: n.Record.Labels[LabelSpine], FreeGPUs: f, TotalGPUs: len(matching(n.Record.Devices, r))})
	}
	// A request for a range of nodes takes as many as fit, from MaxNodes down.
	var chosen []NodeCandidate
	var err error
	for k := max(r.MaxNodes, r.Nodes); k >= r.Nodes; k-- {
		if chosen, err = p.nodes(cands, k, r.GPUsPerNode); err == nil {
			break
		}
	}
	if err != nil {
		return nil, waitReason(r, cands, counts, excluded)
	}
	out := make([]GrantNode, 0, len(chosen))
	for _, cn := range chosen {
		n := nodes[cn.Name]
		inv, err := inventory(n)
		var devs []topology.Device
		if err == nil && r.GPUsPerNode > 0 {
			devs, err = p.devices(inv, matching(free[cn.Name], r), r.GPUsPerNode)
		}
		if err != nil {
			return nil, fmt.Sprintf("node %s: %v", cn.Name, err)
		}
		gn := GrantNode{Name: cn.Name, Addr: n.Record.Addr, CPUs: r.CPUsPerNode, MemoryMiB: r.MemPerNodeMiB}
		for _, d := range devs {
			gn.Devices = append(gn.Devices, d.ID)
			gn.GPUs = append(gn.GPUs, d.GPU)
		}
		out = append(out, gn)
	}
	return out, ""
}

// waitReason explains why r does not fit, in one line: what it needs, how many of the
// nodes the checkers left have that free now, then each checker's reason with the
// number of nodes it ruled out (excluded), in alphabetical order. The count of nodes
// the job excludes (excludedNodes) names them and what clears it: "1 excluded (gpu-b
// lost this job's step; restarting the gangrun agent there clears it)".
func waitReason(r Request, cands []NodeCandidate, excluded map[string]int, excludedNodes []string) string {
	ready := 0
	for _, c := range cands {
		if c.FreeGPUs >= r.GPUsPerNode {
			ready++
		}
	}
	s := fmt.Sprintf("Resources: needs %s with %s", plural(r.Nodes, "node"), r.perNode("free"))
	verb := "have"
	if len(cands) == 1 {
		verb = "has"
	}
	s += fmt.Sprintf("; %d of %s %s them now", ready, plural(len(cands), "eligible node"), verb)
	keys := make([]string, 0, len(excluded))
	for k := range excluded {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s += fmt.Sprintf("; %d %s", excluded[k], k)
		if k == reasonExcluded && len(excludedNodes) > 0 {
			s += excludedHint(r, excludedNodes)
		}
	}
	return s
}

// excludedHint names the nodes job request r excludes and what clears that: the
// exclusion lapses once the node's agent session is not the one the step was lost
// under (its agent restarted, or the node went down and came back), and holds for good
// where none was recorded (checkNotExcluded).
func excludedHint(r Request, nodes []string) string {
	sort.Strings(nodes)
	lapses := true
	for _, n := range nodes {
		if _, ok := r.ExcludeSession[n]; !ok {
			lapses = false
		}
	}
	names, steps, agents := strings.Join(nodes, ", "), "step", "agent"
	if len(nodes) > 1 {
		steps, agents = "steps", "agents"
	}
	if !lapses {
		return fmt.Sprintf(" (%s lost this job's %s)", names, steps)
	}
	return fmt.Sprintf(" (%s lost this job's %s; restarting the gangrun %s there clears it)", names, steps, agents)
}
