package allocator

import (
	"context"
	"slices"
	"strings"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/topology"
)

// Pre-emption's question to placement: would a pending request be granted, were some
// grants released? The job controller asks it (job/preempt.go) while it chooses victims
// (policy.SelectVictims); the scheduler's pass and its commit are untouched: once the
// victims' steps have given their GPUs back, the scheduler's next pass grants the
// request as any other.

// FitCheck answers, for one pending request on one cluster snapshot, whether it would
// be placed were the grants of some jobs released. It runs the scheduler's own
// placement pipeline (checkers and rankers) on the snapshot's free devices plus the
// released grants' devices, past the nodes the scheduler keeps for other requests'
// reservations (it would not grant the request there: pre-empting for it would be in
// vain). Not safe for concurrent use.
type FitCheck struct {
	ctx  context.Context
	c    *Cluster
	r    Request
	kept map[string]string // node → the request it is reserved for
	pipe pipeline
	invs *inventories
}

// NewFitCheck returns the check of request id of snapshot c, with the partition's nodes
// as policy p defines them (nil: no policy) and the scheduler's reservations (its
// published SchedulerStatus.Reserved: request → nodes; nil: none); false when c has no
// such live request. Inventories are read from s as placement needs them.
func NewFitCheck(ctx context.Context, s store.Store, c *Cluster, p *policy.Policy, reserved map[string][]string, id string) (*FitCheck, bool) {
	pr, ok := c.Requests[id]
	if !ok || !pr.Alive {
		return nil, false
	}
	r := pr.Request
	if p != nil {
		if sel, ok := p.PartitionNodes(r.Partition); ok {
			r.PartitionNodes = sel
		}
	}
	kept := map[string]string{}
	for req, nodes := range reserved {
		for _, n := range nodes {
			kept[n] = req
		}
	}
	return &FitCheck{ctx: ctx, c: c, r: r, kept: kept, pipe: defaultPipeline(), invs: newInventories(s)}, true
}

// Fits reports whether the request would be placed on the snapshot were the grants of
// the jobs in release released (nil: as it is).
func (f *FitCheck) Fits(release []string) bool {
	free := map[string][]topology.Device{}
	for name, n := range f.c.Nodes {
		if n.State() != NodeUp {
			continue
		}
		for _, d := range n.Record.Devices {
			holder, held := n.Held[d.ID]
			if !held || slices.Contains(release, holder) {
				free[name] = append(free[name], d)
			}
		}
	}
	nodes, _ := f.pipe.place(f.r, f.c.Nodes, free, f.kept, func(n *NodeState) (*topology.Inventory, error) { return f.invs.get(f.ctx, n) })
	return nodes != nil
}

// WaitsForResources reports whether the scheduler's pending reason says the request did
// not fit the free GPUs (Slurm's Resources), rather than a limit holding it back, a
// race, or no look yet: only such a request may pre-empt.
func WaitsForResources(reason string) bool { return strings.HasPrefix(reason, "Resources") }
