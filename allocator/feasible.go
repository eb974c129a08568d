package allocator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/gangrun/gangrun/topology"
)

// Checker is one feasibility check of the placement pipeline, in the shape of Nomad's
// FeasibilityChecker (scheduler/feasible.go): it returns why node n cannot take request
// r, in the few words `gangrun queue` counts in a pending reason ("2 down"), or "" when
// n passes. A check looks at the node's record and state, never at which of its
// devices are in use (the node ranker weighs free devices), and does not modify n.
type Checker func(r Request, n *NodeState) (reason string)

// Why a node is out, one reason per checker. The wording is what `gangrun queue` shows
// ("Resources: ...; 2 down; 1 drained"), quoted by docs/placement.md and the tests.
const (
	reasonDown      = "down"
	reasonInval     = "inval (a newer gangrun's record)"
	reasonDrained   = "drained"
	reasonPartition = "other partition"
	reasonLabels    = "labels"
	reasonDevices   = "too few GPUs"
	reasonReserved  = "reserved for a request ahead"
	reasonExcluded  = "excluded"
)

// checkUp rules out a node whose agent is gone (its alive key is not held), and one
// whose record a newer gangrun wrote (NodeInval): what it has is unknown here.
func checkUp(_ Request, n *NodeState) string {
	switch n.State() {
	case NodeDown:
		return reasonDown
	case NodeInval:
		return reasonInval
	}
	return ""
}

// checkNotDrained rules out a node an administrator drained.
func checkNotDrained(_ Request, n *NodeState) string {
	if n.Drain != nil {
		return reasonDrained
	}
	return ""
}

// checkNotExcluded rules out a node the request excludes (a job placed again after it
// lost the node), while the agent it was lost under lives on (Request.ExcludeSession).
func checkNotExcluded(r Request, n *NodeState) string {
	for _, x := range r.Exclude {
		if x != n.Record.Name {
			continue
		}
		if was, ok := r.ExcludeSession[x]; ok && was != n.AliveSession {
			return "" // its agent has restarted since: the exclusion lapsed
		}
		return reasonExcluded
	}
	return ""
}

// checkPartition rules out a node outside r's partition: without the labels of
// r.PartitionNodes (the policy's), else without the label partition=<r.Partition>.
func checkPartition(r Request, n *NodeState) string {
	if r.PartitionNodes != nil {
		for k, v := range r.PartitionNodes {
			if n.Record.Labels[k] != v {
				return reasonPartition
			}
		}
		return ""
	}
	if r.Partition != "" && n.Record.Labels[LabelPartition] != r.Partition {
		return reasonPartition
	}
	return ""
}

// checkLabels rules out a node that lacks one of r's labels.
func checkLabels(r Request, n *NodeState) string {
	for k, v := range r.Labels {
		if n.Record.Labels[k] != v {
			return reasonLabels
		}
	}
	return ""
}

// checkDevices rules out a node with fewer than r.GPUsPerNode allocatable devices of
// r's model, free or not.
func checkDevices(r Request, n *NodeState) string {
	if len(matching(n.Record.Devices, r)) < r.GPUsPerNode {
		return reasonDevices
	}
	return ""
}

// reservedFor returns the check that rules out nodes kept for another request: kept maps
// a node to the request it is kept for (the scheduler's reservations of this pass).
// backfill, when set, lets r use a node kept for owner all the same (r ends before
// owner's reservation begins: Scheduler.backfills); nil lets no request.
func reservedFor(kept map[string]string, backfill func(r Request, owner string) bool) Checker {
	return func(r Request, n *NodeState) string {
		if owner, ok := kept[n.Record.Name]; ok && owner != r.ID && (backfill == nil || !backfill(r, owner)) {
			return reasonReserved
		}
		return ""
	}
}

// matching returns the devices of devs that r wants (Request.wants): all of them when r
// names neither a model nor a MIG profile.
func matching(devs []topology.Device, r Request) []topology.Device {
	if r.GPUModel == "" && r.MIGProfile == "" {
		return devs
	}
	var out []topology.Device
	for _, d := range devs {
		if r.wants(d) {
			out = append(out, d)
		}
	}
	return out
}

// ErrInfeasible marks a request that no registered node could ever satisfy: every
// refusal of CheckFeasible (and so of Submit, before anything is reserved) matches it
// with errors.Is, so a caller tells a bad request from a store that failed without
// reading the text.
var ErrInfeasible = errors.New("no registered node could ever satisfy the request")

// infeasibleError is a refusal of CheckFeasible: its text is the refusal's own (it
// names the bad flag and value), and it wraps both ErrInfeasible and the refusal.
type infeasibleError struct{ err error }

func (e *infeasibleError) Error() string   { return e.err.Error() }
func (e *infeasibleError) Unwrap() []error { return []error{ErrInfeasible, e.err} }

// refusal wraps err as a refusal of CheckFeasible.
func refusal(err error) error { return &infeasibleError{err} }

// CheckFeasible reports, before anything is reserved, a request that no registered node
// could ever satisfy: invalid counts (Request.Validate), an unknown partition or label,
// a GPU model no node has, more GPUs per node than any node has, more nodes than could
// ever match. Down and drained nodes count, since they may come back: a node counts
// when it passes the pipeline's fit checks (the scheduler's own, less those of the
// node's state). Every error wraps ErrInfeasible and names the bad value.
func CheckFeasible(c *Cluster, r Request) error {
	if err := r.Validate(); err != nil {
		return refusal(err)
	}
	if len(c.Nodes) == 0 {
		return refusal(errors.New("no nodes are registered (start `gangrun agent` on each node)"))
	}
	hasLabel := func(k, v string) bool {
		for _, n := range c.Nodes {
			if n.Record.Labels[k] == v {
				return true
			}
		}
		return false
	}
	switch {
	case r.PartitionNodes != nil:
		// The policy's partition: its nodes are those with its labels.
		if !slices.ContainsFunc(slices.Collect(maps.Values(c.Nodes)), func(n *NodeState) bool { return checkPartition(r, n) == "" }) {
			return refusal(fmt.Errorf("--partition %s: no node has the partition's labels %s", r.Partition, labelText(r.PartitionNodes)))
		}
	case r.Partition != "" && !hasLabel(LabelPartition, r.Partition):
		return refusal(fmt.Errorf("--partition %s: no node is in that partition", r.Partition))
	}
	keys := make([]string, 0, len(r.Labels))
	for k := range r.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !hasLabel(k, r.Labels[k]) {
			return refusal(fmt.Errorf("--labels %s=%s: no node has that label", k, r.Labels[k]))
		}
	}
	if err := feasibleChoice(c, r); err != nil {
		return refusal(err)
	}
	fit := defaultPipeline().fit
	most, eligible, modelSeen := 0, 0, r.GPUModel == "" && r.MIGProfile == ""
	for _, n := range c.Nodes {
		m := len(matching(n.Record.Devices, r))
		modelSeen = modelSeen || m > 0
		most = max(most, m)
		if firstReason(fit, r, n) == "" {
			eligible++
		}
	}
	if !modelSeen {
		if r.MIGProfile != "" {
			return refusal(fmt.Errorf("--gpus-per-node %s:%d: no node has %s MIG devices", r.MIGProfile, r.GPUsPerNode, r.MIGProfile))
		}
		return refusal(fmt.Errorf("GPU model %s (--gpus-per-node %s:%d, or --gpu-model): no node has such GPUs", r.GPUModel, r.GPUModel, r.GPUsPerNode))
	}
	if r.GPUsPerNode > most {
		if r.MIGProfile != "" {
			return refusal(fmt.Errorf("--gpus-per-node %s:%d: no node has more than %s", r.MIGProfile, r.GPUsPerNode, r.devices(most, "")))
		}
		return refusal(fmt.Errorf("--gpus-per-node %d: no node has more than %d allocatable GPUs", r.GPUsPerNode, most))
	}
	if err := resourceRefusal(c, r); err != nil {
		return refusal(err)
	}
	if r.Nodes > eligible {
		need := ""
		if r.Spares > 0 {
			need = fmt.Sprintf(" (the job and its spares need %d)", r.Nodes)
		}
		return refusal(fmt.Errorf("%s: only %s could ever take %s each with these constraints%s", r.nodesFlags(), plural(eligible, "registered node"), r.perNode(""), need))
	}
	return nil
}

// labelText writes labels as KEY=VALUE,..., sorted.
func labelText(labels map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

// firstReason runs checks on n in order and returns the first reason given, "" when n
// passes them all.
func firstReason(checks []Checker, r Request, n *NodeState) string {
	for _, check := range checks {
		if why := check(r, n); why != "" {
			return why
		}
	}
	return ""
}
