package allocator

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/gangrun/gangrun/topology"
)

// ChooseDevices chooses k of a node's free devices (whole GPUs or MIG devices, as
// topology.Inventory.Allocatable lists them) for one gang member: the set whose
// SetScore is the highest. Among sets with the same score it returns the one with
// the lowest indices: ordering every device by (GPU index, MIG index), the set whose
// ordered list is lexicographically smallest. The result is in that order, a new
// slice; free is not modified and may be in any order.
//
// The search is exact (branch and bound over the GPUs, MIG devices of one GPU taken
// as interchangeable), so its score is never below go-gpuallocator's best-effort
// choice from the same devices, which maximises a partition of all free GPUs rather
// than the chosen set. On 8 and 16 GPUs it takes microseconds (see
// BenchmarkChooseDevices).
//
// Errors: a nil inventory; k < 1; k greater than the number of free devices; a free
// device that is not on the node (unknown GPU, a whole GPU whose MIG mode is on, a MIG
// UUID the GPU does not have); the same device twice.
func ChooseDevices(inv *topology.Inventory, free []topology.Device, k int) ([]topology.Device, error) {
	if inv == nil {
		return nil, errors.New("choose devices: no inventory")
	}
	if k < 1 {
		return nil, fmt.Errorf("choose devices on node %s: count %d must be at least 1", inv.Node, k)
	}
	if k > len(free) {
		return nil, fmt.Errorf("choose devices on node %s: %d wanted but only %d free", inv.Node, k, len(free))
	}
	devs, err := locate(inv, free)
	if err != nil {
		return nil, fmt.Errorf("choose devices: %w", err)
	}
	if k == 1 || k == len(devs) {
		// One device scores 0 wherever it is: the lowest. All of them: all of them.
		out := make([]topology.Device, k)
		for i := range out {
			out[i] = devs[i].dev
		}
		return out, nil
	}
	p := newProblem(inv, devs)
	counts, ok := p.solve(k)
	if !ok {
		return nil, fmt.Errorf("choose devices on node %s: internal error: the search found no set of %d", inv.Node, k)
	}
	out := make([]topology.Device, 0, k)
	for c, n := range counts {
		for _, d := range p.classes[c].devs[:n] {
			out = append(out, d.dev)
		}
	}
	return out, nil
}

// SetScore returns the interconnect score of a set of devices of one node: the sum of
// PairWeight over every unordered pair (0 for fewer than two devices). This is what
// ChooseDevices maximises and what go-gpuallocator's calculateGPUSetScore computes.
// Errors are ChooseDevices' for a device not on the node or listed twice.
func SetScore(inv *topology.Inventory, devices []topology.Device) (int, error) {
	if inv == nil {
		return 0, errors.New("set score: no inventory")
	}
	devs, err := locate(inv, devices)
	if err != nil {
		return 0, fmt.Errorf("set score: %w", err)
	}
	p := newProblem(inv, devs)
	score := 0
	for i, a := range p.classes {
		n := len(a.devs)
		score += n * (n - 1) / 2 * p.self[i]
		for j := i + 1; j < len(p.classes); j++ {
			score += n * len(p.classes[j].devs) * p.w[i][j]
		}
	}
	return score, nil
}

// placed is a device located on its node.
type placed struct {
	dev topology.Device
	gpu int // NVML index of the (parent) GPU
	mig int // MIG device index on the parent; -1 for a whole GPU
}

// locate finds every device on the node and orders them by (GPU, MIG index).
func locate(inv *topology.Inventory, devices []topology.Device) ([]placed, error) {
	out := make([]placed, 0, len(devices))
	for _, d := range devices {
		g, ok := inv.GPU(d.GPU)
		if !ok {
			return nil, fmt.Errorf("device %q: node %s has no gpu %d", d.ID, inv.Node, d.GPU)
		}
		p := placed{dev: d, gpu: g.Index, mig: -1}
		switch {
		case !g.MIGEnabled && d.ID == strconv.Itoa(g.Index):
		case !g.MIGEnabled:
			return nil, fmt.Errorf("device %q: not gpu %d of node %s (a whole gpu's id is its index)", d.ID, g.Index, inv.Node)
		default:
			p.mig = -2
			for _, m := range g.MIGDevices {
				if m.UUID == d.ID {
					p.mig = m.Index
					break
				}
			}
			if p.mig == -2 {
				return nil, fmt.Errorf("device %q: not a MIG device of gpu %d on node %s (its MIG mode is on)", d.ID, g.Index, inv.Node)
			}
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b placed) int {
		if a.gpu != b.gpu {
			return a.gpu - b.gpu
		}
		return a.mig - b.mig
	})
	for i := 1; i < len(out); i++ {
		if out[i].gpu == out[i-1].gpu && out[i].mig == out[i-1].mig {
			return nil, fmt.Errorf("device %q is listed twice", out[i].dev.ID)
		}
	}
	return out, nil
}

// class is a group of interchangeable devices: the free MIG devices of one GPU, or one
// whole GPU. Every member has the same links to everything outside the class.
type class struct {
	gpu  int
	devs []placed // in MIG index order
}

// neighbor is a class and the weight of one of its devices with a device of the
// class owning the list.
type neighbor struct {
	class, weight int
}

// problem is a weighted choice among classes: choose counts n_c <= len(devs_c) with
// sum k maximising sum_c C(n_c,2)*self[c] + sum_{c<d} n_c*n_d*w[c][d].
type problem struct {
	classes []class
	self    []int   // weight of two devices of one class (same board)
	w       [][]int // weight between devices of two classes
	// near lists, per class, the other classes (and itself, for classes of more than
	// one device) by decreasing weight: the bound reads the best ones first.
	near [][]neighbor
}

func newProblem(inv *topology.Inventory, devs []placed) *problem {
	p := &problem{}
	start := 0
	for i := range devs {
		if i+1 == len(devs) || devs[i+1].gpu != devs[i].gpu {
			p.classes = append(p.classes, class{gpu: devs[i].gpu, devs: devs[start : i+1]})
			start = i + 1
		}
	}
	n := len(p.classes)
	p.self = make([]int, n)
	p.w = make([][]int, n)
	cells := make([]int, n*n)
	known := make([]bool, n*n)
	for i := range p.classes {
		p.w[i] = cells[i*n : (i+1)*n]
		// Two devices of one GPU: Link(g, g) is LevelSelf without NVLink.
		p.self[i] = PairWeight(topology.Link{Level: topology.LevelSelf})
	}
	// One pass over the recorded links instead of a Link call (a scan of them) per
	// pair; the values are Link's: NVLinks dropped when either GPU has MIG on.
	classOf := func(gpu int) (int, bool) {
		return slices.BinarySearchFunc(p.classes, gpu, func(c class, g int) int { return c.gpu - g })
	}
	for _, gl := range inv.GPULinks {
		a, okA := classOf(gl.A)
		b, okB := classOf(gl.B)
		if !okA || !okB || a == b {
			continue
		}
		l := topology.Link{NVLinks: gl.NVLinks, Level: gl.Level}
		ga, _ := inv.GPU(gl.A)
		gb, _ := inv.GPU(gl.B)
		if ga.MIGEnabled || gb.MIGEnabled {
			l.NVLinks = 0
		}
		p.w[a][b], p.w[b][a] = PairWeight(l), PairWeight(l)
		known[a*n+b], known[b*n+a] = true, true
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			if !known[i*n+j] {
				// A pair the recording lacks: Link says what it is (SYS).
				l, _ := inv.Link(p.classes[i].gpu, p.classes[j].gpu)
				p.w[i][j], p.w[j][i] = PairWeight(l), PairWeight(l)
			}
		}
	}
	p.near = make([][]neighbor, n)
	all := make([]neighbor, 0, n*n)
	for i := range p.classes {
		from := len(all)
		for j := range p.classes {
			switch {
			case j != i:
				all = append(all, neighbor{j, p.w[i][j]})
			case len(p.classes[i].devs) > 1:
				all = append(all, neighbor{i, p.self[i]})
			}
		}
		list := all[from:len(all):len(all)]
		slices.SortStableFunc(list, func(a, b neighbor) int { return b.weight - a.weight })
		p.near[i] = list
	}
	return p
}

// search holds the branch-and-bound state. Scores are doubled throughout so the bound,
// which counts each pair once from each end, stays in integers.
type search struct {
	p      *problem
	counts []int // devices taken per class on the current path
	gain   []int // per class: weight of one of its devices to everything taken so far
	spare  []int // suffix sums of class sizes: devices available from class c on
	// best is the first counts found (in lexicographic order) reaching target.
	best   []int
	target int // doubled score a leaf must reach to be recorded
	found  bool
	units  []int // scratch for the bound
}

// solve returns the counts per class of the best k-set (lowest indices among equals).
// ok is false only if the search has a bug: the greedy set, or its canonical form
// (the lowest-indexed devices of each class), always reaches the first target.
func (p *problem) solve(k int) (counts []int, ok bool) {
	n := len(p.classes)
	s := &search{
		p:      p,
		counts: make([]int, n),
		gain:   make([]int, n),
		spare:  make([]int, n+1),
		best:   make([]int, n),
		units:  make([]int, 0, n),
	}
	for c := n - 1; c >= 0; c-- {
		s.spare[c] = s.spare[c+1] + len(p.classes[c].devs)
	}
	// A greedy set gives the first target: only sets at least as good are recorded.
	s.target = 2 * p.greedy(k)
	s.dfs(0, k, 0)
	return s.best, s.found
}

// dfs decides how many devices class c contributes, r devices still to take; score
// is the doubled score of what is taken. Larger counts are tried first, which
// visits sets in lexicographic order of their device lists, so the first set to
// reach a score is the one with the lowest indices.
func (s *search) dfs(c, r, score int) {
	if r == 0 {
		if score >= s.target {
			copy(s.best, s.counts)
			s.found = true
			s.target = score + 1
		}
		return
	}
	if s.spare[c] < r || score+s.bound(c, r) < s.target {
		return
	}
	p := s.p
	size := len(p.classes[c].devs)
	for take := min(size, r); take >= 0; take-- {
		add := take*(take-1)*p.self[c] + 2*take*s.gain[c]
		if take > 0 {
			for d := c + 1; d < len(p.classes); d++ {
				s.gain[d] += take * p.w[c][d]
			}
		}
		s.counts[c] = take
		s.dfs(c+1, r-take, score+add)
		if take > 0 {
			for d := c + 1; d < len(p.classes); d++ {
				s.gain[d] -= take * p.w[c][d]
			}
		}
	}
	s.counts[c] = 0
}

// bound returns an upper bound on the doubled score that r more devices from classes
// c.. can add. A taken device u adds its gain to what is already taken, plus half of
// its weights to the other r-1 new devices; doubled, that is at most
// 2*gain(u) + the r-1 best weights u has to devices still available. The bound is the
// sum of the r best such per-device values, each class offering as many as it has.
func (s *search) bound(c, r int) int {
	p := s.p
	s.units = s.units[:0]
	for d := c; d < len(p.classes); d++ {
		v := 2 * s.gain[d]
		left := r - 1
		for _, nb := range p.near[d] {
			if left == 0 {
				break
			}
			if nb.class < c {
				continue
			}
			avail := len(p.classes[nb.class].devs)
			if nb.class == d {
				avail--
			}
			t := min(avail, left)
			v += t * nb.weight
			left -= t
		}
		s.units = append(s.units, v, len(p.classes[d].devs))
	}
	// Take the r best values, with multiplicity: selection by repeated maximum is
	// enough for at most a few dozen classes.
	total := 0
	for r > 0 {
		bi := -1
		for i := 0; i < len(s.units); i += 2 {
			if s.units[i+1] > 0 && (bi < 0 || s.units[i] > s.units[bi]) {
				bi = i
			}
		}
		t := min(s.units[bi+1], r)
		total += t * s.units[bi]
		s.units[bi+1] = 0
		r -= t
	}
	return total
}

// greedy returns the score of a good k-set found quickly: from each class as a seed,
// add the device with the largest gain until k are taken; the best of these.
func (p *problem) greedy(k int) int {
	n := len(p.classes)
	counts := make([]int, n)
	gain := make([]int, n)
	best := -1
	for seed := range n {
		clear(counts)
		clear(gain)
		score := 0
		for taken := 0; taken < k; taken++ {
			pick := -1
			if taken == 0 {
				pick = seed
			} else {
				for d := range n {
					if counts[d] < len(p.classes[d].devs) && (pick < 0 || gain[d] > gain[pick]) {
						pick = d
					}
				}
			}
			score += gain[pick]
			counts[pick]++
			for d := range n {
				if d == pick {
					gain[d] += p.self[d]
				} else {
					gain[d] += p.w[pick][d]
				}
			}
		}
		best = max(best, score)
	}
	return best
}
