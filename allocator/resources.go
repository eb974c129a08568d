package allocator

import (
	"errors"
	"fmt"
)

// CPUs and memory as scheduled resources, as Slurm's select/cons_tres counts them
// (CR_CPU_Memory): a node has NodeRecord.CPUs logical CPUs and NodeRecord.MemoryMiB
// MiB of memory; a request asks each of its nodes for Request.CPUsPerNode CPUs and
// Request.MemPerNodeMiB MiB; a grant records what it holds on each node
// (GrantNode.CPUs, GrantNode.MemoryMiB), and the grants on a node, granted or being
// committed, never hold more than it has (NodeState.UsedCPUs, UsedMemMiB; checked by
// CheckInvariants as Overcommitted).
//
// A node whose record does not know its CPUs or memory (0: an agent older than the
// fields, or an inventory recorded without them, such as one read from nvidia-smi) is
// not checked for that resource: unknown is not a limit. A request that asks for no
// memory (no --mem, --mem-per-cpu nor --mem-per-gpu) holds none: Slurm, without
// DefMemPerCPU, would give it the node's whole memory instead (docs/slurm.md).

// Why a node is out for CPUs or memory: the fit checkers' (never enough) and the free
// checkers' (not enough free now, Slurm's pending reason Resources).
const (
	reasonCPUs       = "too few CPUs"
	reasonMemory     = "too little memory"
	reasonCPUsBusy   = "CPUs in use"
	reasonMemoryBusy = "memory in use"
)

// ErrTooManyCPUs and ErrTooMuchMemory mark CheckFeasible's refusal of a request whose
// CPUs or memory per node no node has (with ErrInfeasible): Slurm refuses such a job at
// submit, "Requested node configuration is not available", the memory also with
// "Memory specification can not be satisfied"; the slurm package prints those words.
var (
	ErrTooManyCPUs   = errors.New("more CPUs than any node has")
	ErrTooMuchMemory = errors.New("more memory than any node has")
)

// checkCPUs rules out a node with fewer CPUs than r asks for on each node, used or not.
func checkCPUs(r Request, n *NodeState) string {
	if n.Record.CPUs > 0 && r.CPUsPerNode > n.Record.CPUs {
		return reasonCPUs
	}
	return ""
}

// checkMemory rules out a node with less memory than r asks for on each node.
func checkMemory(r Request, n *NodeState) string {
	if n.Record.MemoryMiB > 0 && r.MemPerNodeMiB > n.Record.MemoryMiB {
		return reasonMemory
	}
	return ""
}

// checkCPUsFree rules out a node whose grants leave fewer free CPUs than r asks for.
func checkCPUsFree(r Request, n *NodeState) string {
	if n.Record.CPUs > 0 && r.CPUsPerNode > n.Record.CPUs-n.UsedCPUs {
		return reasonCPUsBusy
	}
	return ""
}

// checkMemoryFree rules out a node whose grants leave less free memory than r asks for.
func checkMemoryFree(r Request, n *NodeState) string {
	if n.Record.MemoryMiB > 0 && r.MemPerNodeMiB > n.Record.MemoryMiB-n.UsedMemMiB {
		return reasonMemoryBusy
	}
	return ""
}

// hold counts grant node gn's CPUs and memory as used on n.
func (n *NodeState) hold(gn GrantNode) {
	n.UsedCPUs += gn.CPUs
	n.UsedMemMiB += gn.MemoryMiB
}

// countUsage sets each node's UsedCPUs and UsedMemMiB from c's grants that hold
// something (granted, or pending: being committed).
func (c *Cluster) countUsage() {
	for _, n := range c.Nodes {
		n.UsedCPUs, n.UsedMemMiB = 0, 0
	}
	for _, g := range c.Grants {
		if g.State == GrantRefused {
			continue
		}
		for _, gn := range g.Nodes {
			if n, ok := c.Nodes[gn.Name]; ok {
				n.hold(gn)
			}
		}
	}
}

// cpuOnlyGrants maps each node to the grants (not refused) that hold none of its
// devices there, only CPUs or memory.
func (c *Cluster) cpuOnlyGrants() map[string][]string {
	out := map[string][]string{}
	for id, g := range c.Grants {
		if g.State == GrantRefused {
			continue
		}
		for _, gn := range g.Nodes {
			if len(gn.Devices) == 0 && (gn.CPUs > 0 || gn.MemoryMiB > 0) {
				out[gn.Name] = append(out[gn.Name], id)
			}
		}
	}
	return out
}

// resourceRefusal returns CheckFeasible's refusal of r when no node could ever hold its
// CPUs or memory (each node's, used or not; nodes that do not know theirs hold
// anything), nil when one could. The error wraps ErrTooManyCPUs or ErrTooMuchMemory.
func resourceRefusal(c *Cluster, r Request) error {
	mostCPUs, mostMem, cpusKnown, memKnown := 0, int64(0), true, true
	for _, n := range c.Nodes {
		if n.Record.CPUs == 0 {
			cpusKnown = false
		}
		if n.Record.MemoryMiB == 0 {
			memKnown = false
		}
		mostCPUs, mostMem = max(mostCPUs, n.Record.CPUs), max(mostMem, n.Record.MemoryMiB)
	}
	if cpusKnown && r.CPUsPerNode > mostCPUs {
		return fmt.Errorf("%w: %d CPUs on each node: no node has more than %d", ErrTooManyCPUs, r.CPUsPerNode, mostCPUs)
	}
	if memKnown && r.MemPerNodeMiB > mostMem {
		return fmt.Errorf("%w: %dM on each node: no node has more than %dM", ErrTooMuchMemory, r.MemPerNodeMiB, mostMem)
	}
	return nil
}

// perNode writes what r asks of each node, with adj before the noun, for messages: its
// GPUs, "2 free GPUs (H100)", as before CPUs were counted; for a CPU-only request its
// CPUs and memory, "4 free CPUs, 1024M of memory". (Which of them holds a request back
// the checkers' counts say: "1 CPUs in use".)
func (r Request) perNode(adj string) string {
	if r.GPUsPerNode > 0 || r.CPUsPerNode == 0 {
		return r.devices(r.GPUsPerNode, adj)
	}
	noun := "CPU"
	if adj != "" {
		noun = adj + " " + noun
	}
	s := plural(r.CPUsPerNode, noun)
	if r.MemPerNodeMiB > 0 {
		s += fmt.Sprintf(", %dM of memory", r.MemPerNodeMiB)
	}
	return s
}
