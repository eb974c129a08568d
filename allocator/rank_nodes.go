package allocator

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// NodeCandidate is a node that passed the allocator's feasibility checks (up, not
// drained, GPU model, partition, labels), as ChooseNodes sees it.
type NodeCandidate struct {
	// Name is the node's name, unique among the candidates.
	Name string
	// Switch is the leaf switch the node is cabled to (its "switch" label, a leaf of
	// Slurm's topology.conf); "" when unknown, and then the node counts as a switch of
	// its own. Leaves are told apart by (Spine, Switch).
	Switch string
	// Spine is the switch above Switch (the "spine" label: a spine, or a scalable unit
	// of a SuperPOD); "" when unknown, and then the leaf counts as a spine of its own.
	Spine string
	// FreeGPUs is how many of the node's allocatable GPUs no grant holds.
	FreeGPUs int
	// TotalGPUs is how many allocatable GPUs the node has, free or not.
	TotalGPUs int
}

// ChooseNodes chooses nodes for a gang of `nodes` nodes with gpusPerNode free GPUs each,
// from candidates that passed feasibility. The rule follows Slurm's topology/tree
// plugin (select/cons_tres, _eval_nodes_topo), then best-fit packing:
//
//  1. Only nodes with at least gpusPerNode free GPUs can take part.
//  2. Lowest switch first: if one leaf switch holds the whole gang, one leaf is used;
//     else if one spine does, one spine, using its fewest leaves; else the fewest
//     spines. Across several switches the largest are taken whole, and the rest of
//     the gang goes to the switch that holds it best (rule 3), like Slurm's best-fit
//     leaf choice.
//  3. Among choices with as few switches, best fit: the least leftover, the sum over
//     the chosen nodes of their free GPUs minus gpusPerNode. Nodes with fragments go
//     first, so whole free nodes and whole free switches stay free for large gangs.
//     Then the switch with fewer usable nodes, then names, so the choice is
//     deterministic and does not depend on the order of cands.
//
// The result is a new slice ordered by (Spine, Switch, Name), so consecutive node
// ranks share a switch. It takes O(n log n) for n candidates (see BenchmarkChooseNodes).
//
// A gang of no GPUs (gpusPerNode 0: CPU-only, resources.go) fits any candidate, and
// best fit then prefers the nodes with the fewest free GPUs, keeping free GPUs for the
// gangs that need them.
//
// Errors: nodes below 1, gpusPerNode below 0; a candidate with an empty or repeated name, or
// free GPUs below 0 or above its total; fewer than `nodes` candidates with gpusPerNode
// free GPUs (the error says how many have them, and whether any node is big enough).
func ChooseNodes(cands []NodeCandidate, nodes, gpusPerNode int) ([]NodeCandidate, error) {
	if nodes < 1 {
		return nil, fmt.Errorf("choose nodes: node count %d must be at least 1", nodes)
	}
	if gpusPerNode < 0 {
		return nil, fmt.Errorf("choose nodes: gpus per node %d must not be negative", gpusPerNode)
	}
	if err := checkCandidates(cands); err != nil {
		return nil, err
	}
	root := buildTree(cands, gpusPerNode)
	if root.count < nodes {
		return nil, infeasible(cands, root.count, nodes, gpusPerNode)
	}
	chosen := root.place(nodes, make([]int, 0, nodes))
	out := make([]NodeCandidate, len(chosen))
	for j, i := range chosen {
		out[j] = cands[i]
	}
	slices.SortFunc(out, func(a, b NodeCandidate) int {
		return cmp.Or(cmp.Compare(a.Spine, b.Spine), cmp.Compare(a.Switch, b.Switch), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

func checkCandidates(cands []NodeCandidate) error {
	seen := make(map[string]bool, len(cands))
	for _, c := range cands {
		switch {
		case c.Name == "":
			return errors.New("choose nodes: a candidate has no name")
		case seen[c.Name]:
			return fmt.Errorf("choose nodes: candidate %q appears twice", c.Name)
		case c.FreeGPUs < 0:
			return fmt.Errorf("choose nodes: candidate %q: free gpus %d is negative", c.Name, c.FreeGPUs)
		case c.FreeGPUs > c.TotalGPUs:
			return fmt.Errorf("choose nodes: candidate %q: free gpus %d above its total %d", c.Name, c.FreeGPUs, c.TotalGPUs)
		}
		seen[c.Name] = true
	}
	return nil
}

// infeasible explains why the gang does not fit.
func infeasible(cands []NodeCandidate, usable, nodes, gpusPerNode int) error {
	largest := 0
	for _, c := range cands {
		largest = max(largest, c.TotalGPUs)
	}
	switch {
	case len(cands) == 0:
		return fmt.Errorf("choose nodes: %d nodes × %d gpus wanted but no node is a candidate", nodes, gpusPerNode)
	case largest < gpusPerNode:
		return fmt.Errorf("choose nodes: %d gpus per node wanted but the largest of %d candidate nodes has %d gpus",
			gpusPerNode, len(cands), largest)
	}
	return fmt.Errorf("choose nodes: %d nodes with %d free gpus wanted but only %d of %d candidate nodes have them",
		nodes, gpusPerNode, usable, len(cands))
}

// groupKey names a switch: a spine, a leaf (spine and leaf), or a node whose leaf is
// unknown (node set). Keys are unique and ordered, which makes ties deterministic.
type groupKey struct {
	spine, leaf, node string
}

func (a groupKey) compare(b groupKey) int {
	return cmp.Or(cmp.Compare(a.spine, b.spine), cmp.Compare(a.leaf, b.leaf), cmp.Compare(a.node, b.node))
}

// group is a switch and the usable nodes below it: the root (the whole cluster), a
// spine, or a leaf. Only leaves hold nodes.
type group struct {
	key      groupKey
	parent   *group   // while building
	children []*group // by count descending, then leftover, then key; nil for a leaf
	nodes    []int    // leaf only: candidate indices, by leftover then name
	prefix   []int    // leaf only: prefix[i] is the leftover of nodes[:i]
	count    int      // usable nodes below
	leftover int      // their summed free GPUs beyond gpusPerNode
	leaves   int      // leaves below (1 for a leaf)
	kids     int      // while building: number of children
}

// buildTree groups the usable candidates into root → spines → leaves. Groups and
// their lists are carved out of a few slabs, since a cluster without labels has a
// leaf and a spine per node.
func buildTree(cands []NodeCandidate, gpusPerNode int) *group {
	left := func(i int) int { return cands[i].FreeGPUs - gpusPerNode }
	// Groups come from chunks that never grow (a full one is replaced by a new one),
	// so pointers into them stay valid.
	root := &group{}
	var slab []group
	newGroup := func(k groupKey, parent *group) *group {
		if len(slab) == cap(slab) {
			slab = make([]group, 0, min(256, 2*len(cands)))
		}
		slab = append(slab, group{key: k, parent: parent})
		parent.kids++
		return &slab[len(slab)-1]
	}
	leafByKey := map[groupKey]*group{}
	spineByName := map[string]*group{}
	leafOf := make([]*group, len(cands))
	var leaves, spines []*group
	usable := 0
	for i, c := range cands {
		if left(i) < 0 {
			continue
		}
		usable++
		lk := groupKey{spine: c.Spine, leaf: c.Switch}
		if c.Switch == "" {
			lk.node = c.Name // a switch of its own; names are unique
		}
		leaf := leafByKey[lk]
		if leaf == nil {
			spine := spineByName[c.Spine]
			if spine == nil || c.Spine == "" {
				sk := groupKey{spine: c.Spine}
				if c.Spine == "" {
					sk = lk // a leaf on an unknown spine is a spine of its own
				}
				spine = newGroup(sk, root)
				spines = append(spines, spine)
				if c.Spine != "" {
					spineByName[c.Spine] = spine
				}
			}
			leaf = newGroup(lk, spine)
			leaves = append(leaves, leaf)
			if c.Switch != "" {
				leafByKey[lk] = leaf
			}
		}
		leaf.count++
		leafOf[i] = leaf
	}

	// Carve each leaf's node list and prefix sums, and each group's child list, out
	// of one slab each; appends below fill them without reallocating.
	nodes := make([]int, usable)
	prefix := make([]int, usable+len(leaves))
	off := 0
	for j, leaf := range leaves {
		leaf.nodes = nodes[off : off : off+leaf.count]
		leaf.prefix = prefix[off+j : off+j+leaf.count+1]
		off += leaf.count
	}
	for i, leaf := range leafOf {
		if leaf != nil {
			leaf.nodes = append(leaf.nodes, i)
		}
	}
	kids := make([]*group, len(leaves)+len(spines))
	off = 0
	for _, g := range append(spines, root) {
		g.children = kids[off : off : off+g.kids]
		off += g.kids
	}
	for _, leaf := range leaves {
		slices.SortFunc(leaf.nodes, func(a, b int) int {
			return cmp.Or(cmp.Compare(left(a), left(b)), cmp.Compare(cands[a].Name, cands[b].Name))
		})
		for j, i := range leaf.nodes {
			leaf.prefix[j+1] = leaf.prefix[j] + left(i)
		}
		leaf.leftover, leaf.leaves = leaf.prefix[leaf.count], 1
		leaf.parent.children = append(leaf.parent.children, leaf)
	}
	for _, spine := range spines {
		spine.sortChildren()
		root.children = append(root.children, spine)
	}
	root.sortChildren()
	return root
}

// sortChildren sums the children's counts and orders them largest first.
func (g *group) sortChildren() {
	for _, c := range g.children {
		g.count += c.count
		g.leftover += c.leftover
		g.leaves += c.leaves
	}
	slices.SortFunc(g.children, func(a, b *group) int {
		return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.leftover, b.leftover), a.key.compare(b.key))
	})
}

// cost returns how many leaves and how much leftover placing need nodes (at most
// g.count) below g takes: in one child when one holds them all (the best such), else
// the largest children whole and the rest in the child that holds it best. place
// makes the same choices.
func (g *group) cost(need int) (leaves, leftover int) {
	if g.children == nil {
		return 1, g.prefix[need]
	}
	for i, c := range g.children {
		if c.count >= need {
			l, o := bestChild(g.children[i:], need).cost(need)
			return leaves + l, leftover + o
		}
		leaves += c.leaves
		leftover += c.leftover
		need -= c.count
	}
	return leaves, leftover // not reached: need <= g.count
}

// place appends the candidate indices of the nodes cost counts.
func (g *group) place(need int, out []int) []int {
	if g.children == nil {
		return append(out, g.nodes[:need]...)
	}
	for i, c := range g.children {
		if c.count >= need {
			return bestChild(g.children[i:], need).place(need, out)
		}
		out = c.place(c.count, out)
		need -= c.count
	}
	return out // not reached: need <= g.count
}

// bestChild is the child that places need nodes best: fewest leaves, then least
// leftover, then fewest usable nodes (keep big switches whole), then key. children
// are ordered by count descending and the first holds need; those that hold need are
// a prefix of them.
func bestChild(children []*group, need int) *group {
	var best *group
	var bestLeaves, bestLeft int
	for _, c := range children {
		if c.count < need {
			break
		}
		l, o := c.cost(need)
		if best == nil || cmp.Or(
			cmp.Compare(l, bestLeaves),
			cmp.Compare(o, bestLeft),
			cmp.Compare(c.count, best.count),
			c.key.compare(best.key)) < 0 {
			best, bestLeaves, bestLeft = c, l, o
		}
	}
	return best
}
