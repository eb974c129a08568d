package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Pair is two nodes of a pairwise sweep, by index into its node list, A < B.
type Pair struct {
	A, B int
}

// Rounds schedules every pair of n nodes as rounds of disjoint pairs, so that each round
// can run all its pairs at once: the circle method of a round-robin tournament (node 0
// stays put, the others rotate one place per round). For even n there are n−1 rounds
// of n/2 pairs; for odd n, n rounds of (n−1)/2 pairs, one node sitting each round out.
// Every pair appears exactly once. n < 2 gives no rounds.
func Rounds(n int) [][]Pair {
	if n < 2 {
		return nil
	}
	m := n
	if m%2 == 1 {
		m++ // a phantom node m-1: whoever meets it sits the round out
	}
	// ring holds the positions 1..m-1 that rotate around fixed node 0.
	ring := make([]int, m-1)
	for i := range ring {
		ring[i] = i + 1
	}
	rounds := make([][]Pair, 0, m-1)
	for r := 0; r < m-1; r++ {
		var round []Pair
		add := func(a, b int) {
			if a >= n || b >= n {
				return // the phantom
			}
			if a > b {
				a, b = b, a
			}
			round = append(round, Pair{a, b})
		}
		add(0, ring[0])
		for i := 1; i < m/2; i++ {
			add(ring[i], ring[m-1-i])
		}
		slices.SortFunc(round, func(x, y Pair) int { return x.A - y.A })
		rounds = append(rounds, round)
		// Rotate: the last position moves to the front.
		last := ring[len(ring)-1]
		copy(ring[1:], ring[:len(ring)-1])
		ring[0] = last
	}
	return rounds
}

// Node is one node of a pairwise sweep.
type Node struct {
	// Name is the node's name (--node-name).
	Name string `json:"name"`
	// NICs lists its RDMA devices (topology inventory rdma_devices, "mlx5_0"), used to
	// name the likely culprit; empty when it has none or they are unknown.
	NICs []string `json:"nics,omitempty"`
}

// PairResult is the benchmark of one pair of nodes.
type PairResult struct {
	Pair Pair
	// Result is the pair's benchmark across both nodes.
	Result Result
	// Err says why the pair produced no result; its figure then counts as 0 GB/s.
	Err error
}

// RoundRunner runs one round of disjoint pairs, all at once, and returns one
// PairResult per pair of round (in any order). A pair that fails is reported in its
// PairResult.Err; an error return stops the sweep. The multi-node runner (Consul or
// Slurm rendezvous) implements it; tests use simulated nodes.
type RoundRunner func(ctx context.Context, round []Pair) ([]PairResult, error)

// Fabric is the outcome of a pairwise sweep.
type Fabric struct {
	// Nodes are the swept nodes; Pair indices point into it.
	Nodes []Node
	// Pairs holds every pair's result in schedule order.
	Pairs []PairResult
	// Rounds is the number of rounds the sweep ran.
	Rounds int
}

// Sweep benchmarks every pair of nodes, round by round (Rounds), through run. onRound,
// when non-nil, is called before each round with its 1-based number, the number of
// rounds and its pairs (for a progress line). It needs at least 2 nodes with distinct
// names, and fails when run fails or returns a pair it was not given or misses one.
func Sweep(ctx context.Context, nodes []Node, run RoundRunner, onRound func(round, rounds int, pairs []Pair)) (*Fabric, error) {
	if len(nodes) < 2 {
		return nil, fmt.Errorf("pairwise sweep: %d nodes: need at least 2", len(nodes))
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if n.Name == "" || seen[n.Name] {
			return nil, fmt.Errorf("pairwise sweep: node name %q empty or given twice", n.Name)
		}
		seen[n.Name] = true
	}
	rounds := Rounds(len(nodes))
	f := &Fabric{Nodes: nodes, Rounds: len(rounds)}
	for i, round := range rounds {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("pairwise sweep: %w", err)
		}
		if onRound != nil {
			onRound(i+1, len(rounds), round)
		}
		got, err := run(ctx, round)
		if err != nil {
			return nil, fmt.Errorf("pairwise sweep, round %d of %d: %w", i+1, len(rounds), err)
		}
		byPair := map[Pair]PairResult{}
		for _, pr := range got {
			p := pr.Pair
			if p.A > p.B {
				p.A, p.B = p.B, p.A
				pr.Pair = p
			}
			if !slices.Contains(round, p) {
				return nil, fmt.Errorf("pairwise sweep, round %d: result for pair %s not in the round", i+1, f.pairName(p))
			}
			if _, dup := byPair[p]; dup {
				return nil, fmt.Errorf("pairwise sweep, round %d: two results for pair %s", i+1, f.pairName(p))
			}
			byPair[p] = pr
		}
		for _, p := range round {
			pr, ok := byPair[p]
			if !ok {
				return nil, fmt.Errorf("pairwise sweep, round %d: no result for pair %s", i+1, f.pairName(p))
			}
			f.Pairs = append(f.Pairs, pr)
		}
	}
	return f, nil
}

func (f *Fabric) pairName(p Pair) string {
	name := func(i int) string {
		if i >= 0 && i < len(f.Nodes) {
			return f.Nodes[i].Name
		}
		return fmt.Sprintf("#%d", i)
	}
	return name(p.A) + "–" + name(p.B)
}

// Figure is the busbw a pair is judged by, in GB/s: the peak busbw of its largest
// message size (Result.PeakBusBW); 0 when the pair failed or has no rows.
func (pr PairResult) Figure() float64 {
	if pr.Err != nil {
		return 0
	}
	v, _ := pr.Result.PeakBusBW()
	return v
}

// Matrix returns the node × node busbw matrix in GB/s, symmetric, NaN on the diagonal
// and for pairs not measured.
func (f *Fabric) Matrix() [][]float64 {
	m := make([][]float64, len(f.Nodes))
	for i := range m {
		m[i] = make([]float64, len(f.Nodes))
		for j := range m[i] {
			m[i][j] = math.NaN()
		}
	}
	for _, pr := range f.Pairs {
		v := pr.Figure()
		m[pr.Pair.A][pr.Pair.B], m[pr.Pair.B][pr.Pair.A] = v, v
	}
	return m
}

// DefaultSlowThreshold is --slow-threshold: a node or pair more than this fraction
// below the fabric's median is slow.
const DefaultSlowThreshold = 0.2

// Finding is one slow part of the fabric and its likely culprit.
type Finding struct {
	// Kind is "node" (most of the node's pairs are slow) or "link" (one pair is slow
	// while both its nodes are fine with the others).
	Kind string `json:"kind"`
	// Nodes names the node, or the two nodes of the link.
	Nodes []string `json:"nodes"`
	// BusBW is the node's median pair figure, or the link's figure, in GB/s.
	BusBW float64 `json:"busbw_gbps"`
	// Below is how far BusBW is below the fabric median, as a fraction (0.5: half).
	Below float64 `json:"below_median"`
	// SlowPairs and Pairs count the node's slow pairs and all its pairs (node only).
	SlowPairs int `json:"slow_pairs,omitempty"`
	Pairs     int `json:"pairs,omitempty"`
	// NICs lists the RDMA NICs on the path, from the nodes' inventories.
	NICs []string `json:"nics,omitempty"`
	// Culprit says in words what is likely at fault.
	Culprit string `json:"culprit"`
}

// Diagnosis is what Diagnose concludes.
type Diagnosis struct {
	// Median is the reference figure in GB/s: the median over nodes of each node's
	// median pair figure (robust to one bad node dragging half the pairs down).
	Median float64 `json:"median_gbps"`
	// Threshold is the slow threshold used (0.2: 20% below Median).
	Threshold float64 `json:"slow_threshold"`
	// Slow lists the slow nodes, then the slow links not explained by a slow node.
	Slow []Finding `json:"slow"`
	// Note explains when nothing could be compared (two nodes give a single pair).
	Note string `json:"note,omitempty"`
}

// Diagnose finds the slow nodes and links of f. A pair is slow when its figure is more
// than threshold (a fraction, 0 < threshold < 1) below the reference median (see
// Diagnosis.Median); a failed pair always is. A node is the likely culprit when more
// than half of its pairs are slow (so a node whose every pair is slow is flagged, and a
// single slow pair is not blamed on either end); a slow pair with neither node flagged
// is a slow link: the cable, switch port or NIC on that path. With two nodes there is a
// single pair and nothing to compare it with, which Note says.
func Diagnose(f *Fabric, threshold float64) (Diagnosis, error) {
	if !(threshold > 0 && threshold < 1) {
		return Diagnosis{}, fmt.Errorf("--slow-threshold %g: want a fraction between 0 and 1 (0.2 is 20%%)", threshold)
	}
	n := len(f.Nodes)
	d := Diagnosis{Threshold: threshold, Slow: []Finding{}}
	if n < 2 || len(f.Pairs) == 0 {
		return d, errors.New("diagnose: no pairs measured")
	}
	perNode := make([][]float64, n)
	for _, pr := range f.Pairs {
		v := pr.Figure()
		perNode[pr.Pair.A] = append(perNode[pr.Pair.A], v)
		perNode[pr.Pair.B] = append(perNode[pr.Pair.B], v)
	}
	scores := make([]float64, 0, n)
	for _, vs := range perNode {
		if len(vs) > 0 {
			scores = append(scores, median(vs))
		}
	}
	d.Median = median(scores)
	if n == 2 {
		d.Note = "two nodes make a single pair: nothing to compare it with; compare its busbw with the expected figures"
		return d, nil
	}
	limit := (1 - threshold) * d.Median
	slow := func(pr PairResult) bool { return pr.Err != nil || pr.Figure() < limit }
	below := func(v float64) float64 {
		if d.Median <= 0 {
			return 0
		}
		return 1 - v/d.Median
	}
	flagged := make([]bool, n)
	for i := range f.Nodes {
		total, bad := 0, 0
		for _, pr := range f.Pairs {
			if pr.Pair.A == i || pr.Pair.B == i {
				total++
				if slow(pr) {
					bad++
				}
			}
		}
		if total == 0 || 2*bad <= total {
			continue
		}
		flagged[i] = true
		score := median(perNode[i])
		d.Slow = append(d.Slow, Finding{
			Kind: "node", Nodes: []string{f.Nodes[i].Name}, BusBW: score, Below: below(score),
			SlowPairs: bad, Pairs: total, NICs: f.Nodes[i].NICs,
			Culprit: nodeCulprit(f.Nodes[i], bad, total),
		})
	}
	for _, pr := range f.Pairs {
		if !slow(pr) || flagged[pr.Pair.A] || flagged[pr.Pair.B] {
			continue
		}
		a, b := f.Nodes[pr.Pair.A], f.Nodes[pr.Pair.B]
		v := pr.Figure()
		d.Slow = append(d.Slow, Finding{
			Kind: "link", Nodes: []string{a.Name, b.Name}, BusBW: v, Below: below(v),
			NICs: append(append([]string(nil), a.NICs...), b.NICs...), Culprit: linkCulprit(a, b, pr.Err),
		})
	}
	return d, nil
}

func nodeCulprit(n Node, bad, total int) string {
	s := fmt.Sprintf("node %s: %d of its %d pairs are slow", n.Name, bad, total)
	switch len(n.NICs) {
	case 0:
		return s + "; its inventory lists no RDMA NIC: check its network interface, PCIe link and GPUs"
	case 1:
		return s + "; likely its NIC " + n.NICs[0] + " (link rate, PCIe width, errors) or the node itself"
	}
	return s + "; likely one of its NICs " + strings.Join(n.NICs, ", ") + " or the node itself"
}

func linkCulprit(a, b Node, err error) string {
	s := fmt.Sprintf("link %s–%s: slow while both nodes are fine with the others", a.Name, b.Name)
	if err != nil {
		s = fmt.Sprintf("link %s–%s: failed (%v) while both nodes work with the others", a.Name, b.Name, err)
	}
	nics := func(n Node) string {
		if len(n.NICs) == 0 {
			return n.Name + " (no RDMA NIC listed)"
		}
		return n.Name + " " + strings.Join(n.NICs, "/")
	}
	return s + "; likely the cable, switch port or route between " + nics(a) + " and " + nics(b)
}

// median returns the median of vs (the mean of the middle two for an even count);
// NaN for none. vs is not modified.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}
