package allocator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// cand is shorthand for a candidate on a spine and leaf with free of total GPUs.
func cand(name, spine, sw string, free, total int) NodeCandidate {
	return NodeCandidate{Name: name, Spine: spine, Switch: sw, FreeGPUs: free, TotalGPUs: total}
}

// rack makes n nodes named prefix0.. on one leaf, each with free of 8 GPUs free.
func rack(prefix, spine, sw string, n, free int) []NodeCandidate {
	var out []NodeCandidate
	for i := range n {
		out = append(out, cand(fmt.Sprintf("%s%d", prefix, i), spine, sw, free, 8))
	}
	return out
}

func names(cs []NodeCandidate) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.Name
	}
	return strings.Join(s, ",")
}

func TestChooseNodes(t *testing.T) {
	tests := []struct {
		name        string
		cands       []NodeCandidate
		nodes, gpus int
		want        string
	}{
		{
			name:  "one node: best fit",
			cands: []NodeCandidate{cand("a", "", "", 8, 8), cand("b", "", "", 3, 8), cand("c", "", "", 2, 8), cand("d", "", "", 1, 8)},
			nodes: 1, gpus: 2,
			want: "c",
		},
		{
			name:  "no labels: the best fits, whole nodes left free",
			cands: []NodeCandidate{cand("a", "", "", 8, 8), cand("b", "", "", 4, 8), cand("c", "", "", 8, 8), cand("d", "", "", 6, 8), cand("e", "", "", 4, 8)},
			nodes: 3, gpus: 4,
			want: "b,d,e",
		},
		{
			name:  "ties go to names",
			cands: []NodeCandidate{cand("n3", "", "", 8, 8), cand("n1", "", "", 8, 8), cand("n2", "", "", 8, 8)},
			nodes: 2, gpus: 8,
			want: "n1,n2",
		},
		{
			// Leaf sw2's nodes fit better, but it has only 3: one switch beats packing.
			name:  "one switch before packing",
			cands: append(rack("a", "", "sw1", 4, 8), rack("b", "", "sw2", 3, 2)...),
			nodes: 4, gpus: 2,
			want: "a0,a1,a2,a3",
		},
		{
			name:  "among single switches, best fit",
			cands: append(rack("a", "", "sw1", 4, 8), rack("b", "", "sw2", 5, 2)...),
			nodes: 4, gpus: 2,
			want: "b0,b1,b2,b3",
		},
		{
			// Both leaves hold 2 nodes with no leftover: the smaller leaf is used.
			name:  "among equal fits, the smaller switch",
			cands: append(rack("a", "", "sw1", 6, 8), rack("b", "", "sw2", 2, 8)...),
			nodes: 2, gpus: 8,
			want: "b0,b1",
		},
		{
			// No leaf holds 7: the largest leaf whole (5), then the leaf that holds
			// the other 2 best: sw3 (2 nodes) rather than sw2 (3), kept whole.
			name:  "fewest leaves, the rest best fit",
			cands: slices.Concat(rack("a", "", "sw1", 5, 8), rack("b", "", "sw2", 3, 8), rack("c", "", "sw3", 2, 8)),
			nodes: 7, gpus: 8,
			want: "a0,a1,a2,a3,a4,c0,c1",
		},
		{
			// Spine s1 holds 6 in two leaves; spine s2 would need three.
			name: "one spine, fewest leaves",
			cands: slices.Concat(
				rack("a", "s1", "l1", 4, 8), rack("b", "s1", "l2", 4, 8),
				rack("c", "s2", "l3", 2, 1), rack("d", "s2", "l4", 2, 1), rack("e", "s2", "l5", 2, 1)),
			nodes: 6, gpus: 1,
			want: "a0,a1,a2,a3,b0,b1",
		},
		{
			// s2 holds 5 but needs two leaves; s1 holds them in one leaf, though its
			// nodes fit worse: the lowest-level switch wins.
			name: "a leaf anywhere before a spine",
			cands: slices.Concat(
				rack("a", "s1", "l1", 5, 8),
				rack("c", "s2", "l3", 3, 2), rack("d", "s2", "l4", 3, 2)),
			nodes: 5, gpus: 2,
			want: "a0,a1,a2,a3,a4",
		},
		{
			// No spine holds 10: s1 whole (6), then the 4 others from the spine that
			// holds them best (s3's one leaf rather than s2's two).
			name: "across spines",
			cands: slices.Concat(
				rack("a", "s1", "l1", 3, 8), rack("b", "s1", "l2", 3, 8),
				rack("c", "s2", "l3", 3, 8), rack("d", "s2", "l4", 2, 8),
				rack("e", "s3", "l5", 4, 8)),
			nodes: 10, gpus: 8,
			want: "a0,a1,a2,b0,b1,b2,e0,e1,e2,e3",
		},
		{
			name: "busy nodes do not count toward a switch",
			cands: slices.Concat(
				rack("a", "", "sw1", 4, 1), // 4 nodes, 1 GPU free each: unusable for 4
				rack("b", "", "sw2", 2, 4), rack("c", "", "sw3", 2, 8)),
			nodes: 2, gpus: 4,
			want: "b0,b1",
		},
		{
			name:  "unlabelled nodes are switches of their own",
			cands: slices.Concat([]NodeCandidate{cand("x", "", "", 8, 8), cand("y", "", "", 8, 8)}, rack("a", "", "sw1", 2, 8)),
			nodes: 2, gpus: 8,
			want: "a0,a1",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseNodes(tc.cands, tc.nodes, tc.gpus)
			if err != nil {
				t.Fatal(err)
			}
			if names(got) != tc.want {
				t.Errorf("ChooseNodes(%d × %d) = %s, want %s", tc.nodes, tc.gpus, names(got), tc.want)
			}
			// The same answer whatever the order of the candidates.
			rng := rand.New(rand.NewPCG(7, 7))
			for range 5 {
				shuffled := slices.Clone(tc.cands)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				again, err := ChooseNodes(shuffled, tc.nodes, tc.gpus)
				if err != nil {
					t.Fatal(err)
				}
				if names(again) != names(got) {
					t.Fatalf("shuffled candidates: %s, first %s", names(again), names(got))
				}
			}
		})
	}
}

func TestChooseNodesErrors(t *testing.T) {
	four := rack("n", "", "sw", 4, 8)
	tests := []struct {
		name        string
		cands       []NodeCandidate
		nodes, gpus int
		want        string
	}{
		{"zero nodes", four, 0, 1, "choose nodes: node count 0 must be at least 1"},
		{"negative gpus", four, 1, -2, "choose nodes: gpus per node -2 must not be negative"},
		{"no candidates", nil, 1, 1, "choose nodes: 1 nodes × 1 gpus wanted but no node is a candidate"},
		{"too few", four, 5, 8, "choose nodes: 5 nodes with 8 free gpus wanted but only 4 of 4 candidate nodes have them"},
		{"too few free", slices.Concat(rack("a", "", "", 2, 8), rack("b", "", "", 3, 2)), 3, 4,
			"choose nodes: 3 nodes with 4 free gpus wanted but only 2 of 5 candidate nodes have them"},
		{"no node big enough", four, 1, 16, "choose nodes: 16 gpus per node wanted but the largest of 4 candidate nodes has 8 gpus"},
		{"no name", []NodeCandidate{cand("", "", "", 1, 1)}, 1, 1, "choose nodes: a candidate has no name"},
		{"twice", []NodeCandidate{cand("a", "", "", 1, 1), cand("a", "", "", 1, 1)}, 1, 1, `choose nodes: candidate "a" appears twice`},
		{"negative free", []NodeCandidate{cand("a", "", "", -1, 1)}, 1, 1, `choose nodes: candidate "a": free gpus -1 is negative`},
		{"free above total", []NodeCandidate{cand("a", "", "", 9, 8)}, 1, 1, `choose nodes: candidate "a": free gpus 9 above its total 8`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseNodes(tc.cands, tc.nodes, tc.gpus)
			if err == nil {
				t.Fatalf("ChooseNodes = %s, want error %q", names(got), tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error %q, want %q", err, tc.want)
			}
		})
	}
}

// grant takes gpus GPUs from each chosen node in cands.
func grant(t *testing.T, cands []NodeCandidate, chosen []NodeCandidate, gpus int) {
	t.Helper()
	for _, c := range chosen {
		i := slices.IndexFunc(cands, func(x NodeCandidate) bool { return x.Name == c.Name })
		if cands[i].FreeGPUs < gpus {
			t.Fatalf("node %s chosen with %d free for %d", c.Name, cands[i].FreeGPUs, gpus)
		}
		cands[i].FreeGPUs -= gpus
	}
}

// TestChooseNodesFragmentation places a stream of small gangs, then a large one: best
// fit packs the small ones onto few nodes, so the large gang still finds whole nodes.
// Spreading the small gangs (worst fit, the most free node first) would leave none.
func TestChooseNodesFragmentation(t *testing.T) {
	tests := []struct {
		name  string
		small [][2]int // nodes × gpus per small gang, in order
		big   [2]int
	}{
		// 12 × (1 node × 2 GPUs) = 24 GPUs: 3 nodes packed, 5 left whole.
		{"pairs", slices.Repeat([][2]int{{1, 2}}, 12), [2]int{5, 8}},
		// Odd sizes: 3+3+2, 5+3, 6+2, 7+1 fill nodes; 4 nodes stay whole.
		{"mixed", [][2]int{{1, 3}, {1, 5}, {1, 6}, {1, 3}, {1, 7}, {1, 2}, {1, 1}, {1, 3}, {1, 2}}, [2]int{4, 8}},
		// Two-node gangs of 4 GPUs pair up on the same nodes.
		{"two-node gangs", slices.Repeat([][2]int{{2, 4}}, 4), [2]int{4, 8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cluster := rack("n", "", "", 8, 8)
			spread := slices.Clone(cluster)
			for _, g := range tc.small {
				chosen, err := ChooseNodes(cluster, g[0], g[1])
				if err != nil {
					t.Fatal(err)
				}
				grant(t, cluster, chosen, g[1])
				// Worst fit, for contrast: the nodes with the most free GPUs.
				byFree := slices.Clone(spread)
				slices.SortStableFunc(byFree, func(a, b NodeCandidate) int { return b.FreeGPUs - a.FreeGPUs })
				grant(t, spread, byFree[:g[0]], g[1])
			}
			if _, err := ChooseNodes(cluster, tc.big[0], tc.big[1]); err != nil {
				t.Errorf("after best-fit packing the %d × %d gang does not fit: %v (free: %v)", tc.big[0], tc.big[1], err, freeCounts(cluster))
			}
			if _, err := ChooseNodes(spread, tc.big[0], tc.big[1]); err == nil {
				t.Errorf("after worst-fit spreading the %d × %d gang still fits (free: %v): the scenario shows nothing", tc.big[0], tc.big[1], freeCounts(spread))
			}
		})
	}
}

func freeCounts(cs []NodeCandidate) []int {
	out := make([]int, len(cs))
	for i, c := range cs {
		out[i] = c.FreeGPUs
	}
	return out
}

// TestChooseNodesProperties checks, on random clusters, what the rule promises against
// counts computed here independently: the right number of distinct usable nodes; one
// leaf when any leaf holds the gang, with the least leftover among leaves; else one
// spine when any spine does, with as few leaves as the best spine needs; else as few
// spines as possible.
func TestChooseNodesProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for trial := range 500 {
		var cands []NodeCandidate
		spines := 1 + rng.IntN(4)
		for s := range spines {
			leaves := 1 + rng.IntN(4)
			for l := range leaves {
				spine, leaf := fmt.Sprintf("s%d", s), fmt.Sprintf("s%d-l%d", s, l)
				if rng.IntN(8) == 0 {
					spine = "" // a leaf on an unknown spine
				}
				for n := range rng.IntN(6) {
					sw := leaf
					if rng.IntN(10) == 0 {
						sw = "" // a node on an unknown leaf
					}
					free := rng.IntN(9)
					cands = append(cands, cand(fmt.Sprintf("%s-n%d", leaf, n), spine, sw, free, 8))
				}
			}
		}
		gpus := 1 + rng.IntN(8)
		nodes := 1 + rng.IntN(max(len(cands), 1))
		label := fmt.Sprintf("trial %d: %d × %d", trial, nodes, gpus)

		// Independent counts: usable nodes per leaf and per spine, with the same
		// meaning of unknown labels as the doc comment gives.
		leafOf := func(c NodeCandidate) string {
			if c.Switch == "" {
				return "node:" + c.Name
			}
			return c.Spine + "/" + c.Switch
		}
		spineOf := func(c NodeCandidate) string {
			if c.Spine == "" {
				return "leaf:" + leafOf(c)
			}
			return c.Spine
		}
		leafCount, spineCount := map[string]int{}, map[string]int{}
		leafLeft := map[string][]int{}
		leavesOfSpine := map[string]map[string]bool{}
		usable := 0
		for _, c := range cands {
			if c.FreeGPUs < gpus {
				continue
			}
			usable++
			leafCount[leafOf(c)]++
			spineCount[spineOf(c)]++
			leafLeft[leafOf(c)] = append(leafLeft[leafOf(c)], c.FreeGPUs-gpus)
			if leavesOfSpine[spineOf(c)] == nil {
				leavesOfSpine[spineOf(c)] = map[string]bool{}
			}
			leavesOfSpine[spineOf(c)][leafOf(c)] = true
		}
		got, err := ChooseNodes(cands, nodes, gpus)
		if usable < nodes {
			if err == nil {
				t.Fatalf("%s: only %d usable, chose %s", label, usable, names(got))
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if len(got) != nodes {
			t.Fatalf("%s: chose %d nodes", label, len(got))
		}
		usedLeaves, usedSpines := map[string]bool{}, map[string]bool{}
		seen := map[string]bool{}
		leftover := 0
		for _, c := range got {
			if seen[c.Name] || c.FreeGPUs < gpus {
				t.Fatalf("%s: %s chosen twice or with %d free", label, c.Name, c.FreeGPUs)
			}
			seen[c.Name] = true
			usedLeaves[leafOf(c)] = true
			usedSpines[spineOf(c)] = true
			leftover += c.FreeGPUs - gpus
		}
		// The fewest k whose k largest counts add up to nodes.
		fewest := func(counts []int) int {
			slices.Sort(counts)
			slices.Reverse(counts)
			sum := 0
			for k, c := range counts {
				if sum += c; sum >= nodes {
					return k + 1
				}
			}
			return len(counts) + 1
		}
		bestLeafLeft := -1
		for leaf, lefts := range leafLeft {
			if leafCount[leaf] >= nodes {
				slices.Sort(lefts)
				sum := 0
				for _, l := range lefts[:nodes] {
					sum += l
				}
				if bestLeafLeft < 0 || sum < bestLeafLeft {
					bestLeafLeft = sum
				}
			}
		}
		minSpineLeaves := 0
		for spine, n := range spineCount {
			if n < nodes {
				continue
			}
			var counts []int
			for leaf := range leavesOfSpine[spine] {
				counts = append(counts, leafCount[leaf])
			}
			if k := fewest(counts); minSpineLeaves == 0 || k < minSpineLeaves {
				minSpineLeaves = k
			}
		}
		switch {
		case bestLeafLeft >= 0:
			if len(usedLeaves) != 1 || leftover != bestLeafLeft {
				t.Fatalf("%s: a leaf holds the gang with leftover %d; chose %s over %d leaves, leftover %d",
					label, bestLeafLeft, names(got), len(usedLeaves), leftover)
			}
		case minSpineLeaves > 0:
			if len(usedSpines) != 1 || len(usedLeaves) != minSpineLeaves {
				t.Fatalf("%s: a spine holds the gang in %d leaves; chose %s over %d spines, %d leaves",
					label, minSpineLeaves, names(got), len(usedSpines), len(usedLeaves))
			}
		default:
			var counts []int
			for _, n := range spineCount {
				counts = append(counts, n)
			}
			if want := fewest(counts); len(usedSpines) != want {
				t.Fatalf("%s: %d spines suffice; chose %s over %d", label, want, names(got), len(usedSpines))
			}
		}
	}
}

// TestChooseNodesLargeCluster is the benchmark's cluster checked for what it chooses:
// 1,024 nodes, 4 spines × 8 leaves × 32 nodes, a 512-node gang takes two whole spines
// (16 leaves), and a 20-node gang one leaf.
func TestChooseNodesLargeCluster(t *testing.T) {
	cands := largeCluster()
	got, err := ChooseNodes(cands, 512, 8)
	if err != nil {
		t.Fatal(err)
	}
	leaves, spines := map[string]bool{}, map[string]bool{}
	for _, c := range got {
		leaves[c.Switch] = true
		spines[c.Spine] = true
	}
	if len(got) != 512 || len(leaves) != 16 || len(spines) != 2 {
		t.Errorf("512-node gang: %d nodes on %d leaves and %d spines, want 512, 16, 2", len(got), len(leaves), len(spines))
	}
	got, err = ChooseNodes(cands, 20, 4)
	if err != nil {
		t.Fatal(err)
	}
	leaves = map[string]bool{}
	for _, c := range got {
		leaves[c.Switch] = true
	}
	if len(got) != 20 || len(leaves) != 1 {
		t.Errorf("20-node gang: %d nodes on %d leaves, want 20 on 1", len(got), len(leaves))
	}
}

// largeCluster is 1,024 nodes of 8 GPUs: 4 spines × 8 leaves × 32 nodes, all free.
func largeCluster() []NodeCandidate {
	var cands []NodeCandidate
	for s := range 4 {
		for l := range 8 {
			for n := range 32 {
				cands = append(cands, cand(fmt.Sprintf("node%04d", (s*8+l)*32+n),
					fmt.Sprintf("spine%d", s), fmt.Sprintf("leaf%02d", s*8+l), 8, 8))
			}
		}
	}
	return cands
}
