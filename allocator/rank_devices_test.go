package allocator

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/gangrun/gangrun/topology"
)

// loadInventory reads one of topology's recorded inventories.
func loadInventory(t testing.TB, name string) *topology.Inventory {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// synthInventory builds a node of n GPUs whose pairs are joined as link says. mig maps
// a GPU index to the number of MIG devices it has (MIG mode on).
func synthInventory(node string, n int, link func(a, b int) topology.Link, mig map[int]int) *topology.Inventory {
	inv := &topology.Inventory{SchemaVersion: topology.SchemaVersion, Node: node}
	for i := range n {
		g := topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Name: "Synthetic GPU"}
		if m, ok := mig[i]; ok {
			g.MIGEnabled = true
			for j := range m {
				g.MIGDevices = append(g.MIGDevices, topology.MIGDevice{
					Index: j, UUID: fmt.Sprintf("MIG-%s-%d-%d", node, i, j), Profile: "1g.10gb",
				})
			}
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			l := link(a, b)
			inv.GPULinks = append(inv.GPULinks, topology.GPULink{A: a, B: b, NVLinks: l.NVLinks, Level: l.Level})
		}
	}
	return inv
}

// dgx2Inventory is a DGX-2-like node: 16 V100s on an NVSwitch fabric, 6 NVLinks each;
// on PCIe, pairs share a switch (PIX), quads a switch tree (PXB), eight a CPU (NODE).
func dgx2Inventory() *topology.Inventory {
	return synthInventory("dgx2", 16, func(a, b int) topology.Link {
		l := topology.Link{NVLinks: 6, Level: topology.LevelSYS}
		switch {
		case a/2 == b/2:
			l.Level = topology.LevelPIX
		case a/4 == b/4:
			l.Level = topology.LevelPXB
		case a/8 == b/8:
			l.Level = topology.LevelNODE
		}
		return l
	}, nil)
}

// twoIslandsInventory is two DGX-1 hybrid cube-meshes (the recorded dgx1 links) in one
// node, joined by PCIe across CPUs only.
func twoIslandsInventory(t testing.TB) *topology.Inventory {
	dgx1 := loadInventory(t, "dgx1")
	return synthInventory("islands", 16, func(a, b int) topology.Link {
		if a/8 != b/8 {
			return topology.Link{Level: topology.LevelSYS}
		}
		l, err := dgx1.Link(a%8, b%8)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}, nil)
}

func ids(devs []topology.Device) string {
	s := make([]string, len(devs))
	for i, d := range devs {
		s[i] = d.ID
	}
	return strings.Join(s, ",")
}

// devicesByID picks the node's allocatable devices with the given IDs.
func devicesByID(t testing.TB, inv *topology.Inventory, want ...string) []topology.Device {
	t.Helper()
	var out []topology.Device
	for _, id := range want {
		i := slices.IndexFunc(inv.Allocatable(), func(d topology.Device) bool { return d.ID == id })
		if i < 0 {
			t.Fatalf("node %s has no allocatable device %q", inv.Node, id)
		}
		out = append(out, inv.Allocatable()[i])
	}
	return out
}

func TestPairWeight(t *testing.T) {
	tests := []struct {
		link topology.Link
		want int
	}{
		{topology.Link{NVLinks: 18, Level: topology.LevelNODE}, 1820},
		{topology.Link{NVLinks: 2, Level: topology.LevelPIX}, 250},
		{topology.Link{NVLinks: 1, Level: topology.LevelSYS}, 110},
		{topology.Link{Level: topology.LevelSelf}, 60},
		{topology.Link{Level: topology.LevelPIX}, 50},
		{topology.Link{Level: topology.LevelPXB}, 40},
		{topology.Link{Level: topology.LevelPHB}, 30},
		{topology.Link{Level: topology.LevelNODE}, 20},
		{topology.Link{Level: topology.LevelSYS}, 10},
		{topology.Link{Level: topology.Level(42)}, 0},
	}
	for _, tc := range tests {
		if got := PairWeight(tc.link); got != tc.want {
			t.Errorf("PairWeight(%v %v) = %d, want %d", tc.link, tc.link.Level, got, tc.want)
		}
	}
}

func TestSetScore(t *testing.T) {
	dgx1 := loadInventory(t, "dgx1")
	h100 := loadInventory(t, "dgx-h100")
	mig := loadInventory(t, "dgx-a100-mig")
	migIDs := []string{}
	for _, d := range mig.Allocatable() {
		if d.MIGProfile != "" {
			migIDs = append(migIDs, d.ID)
		}
	}
	if len(migIDs) < 2 {
		t.Fatalf("dgx-a100-mig has %d MIG devices, the test needs 2", len(migIDs))
	}
	tests := []struct {
		name string
		inv  *topology.Inventory
		ids  []string
		want int
	}{
		{"empty", dgx1, nil, 0},
		{"one gpu", dgx1, []string{"5"}, 0},
		// NV1+PIX, NV1+PHB, NV2+PHB, NV2+PHB, NV1+PHB, NV2+PIX.
		{"dgx1 quad", dgx1, []string{"0", "1", "2", "3"}, 150 + 130 + 230 + 230 + 130 + 250},
		{"dgx1 order does not matter", dgx1, []string{"3", "1", "0", "2"}, 1120},
		{"dgx1 across the mesh", dgx1, []string{"0", "5"}, 10},
		{"h100 same socket", h100, []string{"0", "1"}, 1820},
		{"h100 across sockets", h100, []string{"0", "4"}, 1810},
		{"two MIG devices of one gpu", mig, migIDs[:2], WeightSameBoard},
		{"MIG device and a whole gpu", mig, []string{migIDs[0], "1"}, WeightPIX},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SetScore(tc.inv, devicesByID(t, tc.inv, tc.ids...))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("SetScore(%v) = %d, want %d", tc.ids, got, tc.want)
			}
		})
	}
}

// TestPairScoresFollowLink checks the weight matrix ChooseDevices builds from the
// recorded links against PairWeight(Inventory.Link) for every pair of devices.
func TestPairScoresFollowLink(t *testing.T) {
	var invs []*topology.Inventory
	for _, name := range []string{"dgx1", "dgx-h100", "dgx-a100", "dgx-a100-mig", "pcie-2socket", "cpu-only"} {
		invs = append(invs, loadInventory(t, name))
	}
	gappy := loadInventory(t, "dgx1")
	gappy.Node = "dgx1-without-some-links"
	gappy.GPULinks = slices.DeleteFunc(gappy.GPULinks, func(l topology.GPULink) bool { return l.A == 0 || l.B == 7 })
	invs = append(invs, gappy, dgx2Inventory())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		invs = append(invs, randomInventory(rng, "rand"+strconv.Itoa(i)))
	}
	for _, inv := range invs {
		all := inv.Allocatable()
		for i, a := range all {
			for _, b := range all[i+1:] {
				l, err := inv.Link(a.GPU, b.GPU)
				if err != nil {
					t.Fatal(err)
				}
				got, err := SetScore(inv, []topology.Device{b, a})
				if err != nil {
					t.Fatal(err)
				}
				if want := PairWeight(l); got != want {
					t.Errorf("%s: SetScore(%s, %s) = %d, want PairWeight(%v) = %d", inv.Node, a.ID, b.ID, got, l, want)
				}
			}
		}
	}
}

func TestChooseDevicesKnownChoices(t *testing.T) {
	dgx1 := loadInventory(t, "dgx1")
	h100 := loadInventory(t, "dgx-h100")
	pcie := loadInventory(t, "pcie-2socket")
	a100 := loadInventory(t, "dgx-a100")
	mig := loadInventory(t, "dgx-a100-mig")
	var migIDs []string
	for _, d := range mig.Allocatable() {
		if d.MIGProfile != "" {
			migIDs = append(migIDs, d.ID)
		}
	}
	tests := []struct {
		name string
		inv  *topology.Inventory
		free []string // nil: every allocatable device
		k    int
		want []string
	}{
		{"dgx1 one gpu: lowest index", dgx1, nil, 1, []string{"0"}},
		// NV2 over one PCIe switch (PIX) is the best pair; 2-3 comes before 6-7.
		{"dgx1 pair: NV2 and PIX", dgx1, nil, 2, []string{"2", "3"}},
		{"dgx1 triangle", dgx1, nil, 3, []string{"0", "2", "3"}},
		{"dgx1 fully connected quad", dgx1, nil, 4, []string{"0", "1", "2", "3"}},
		{"dgx1 other quad when the first is busy", dgx1, []string{"1", "3", "4", "5", "6", "7"}, 4, []string{"4", "5", "6", "7"}},
		{"dgx1 pair from a broken quad", dgx1, []string{"0", "1", "5", "6", "7"}, 2, []string{"6", "7"}},
		{"dgx1 all", dgx1, nil, 8, []string{"0", "1", "2", "3", "4", "5", "6", "7"}},
		{"h100 quad on one socket", h100, nil, 4, []string{"0", "1", "2", "3"}},
		{"h100 second pair packs next to the first", h100, []string{"2", "3", "4", "5", "6", "7"}, 2, []string{"2", "3"}},
		{"h100 quad on the free socket", h100, []string{"0", "4", "5", "6", "7"}, 4, []string{"4", "5", "6", "7"}},
		{"h100 five", h100, nil, 5, []string{"0", "1", "2", "3", "4"}},
		{"pcie pair on one socket", pcie, []string{"0", "2", "3"}, 2, []string{"2", "3"}},
		{"pcie three", pcie, nil, 3, []string{"0", "1", "2"}},
		{"a100 NVSwitch pair", a100, []string{"7", "2", "5"}, 2, []string{"2", "5"}},
		{"mig: NVLink pair beats MIG devices", mig, nil, 2, []string{"2", "3"}},
		{"mig: two MIG devices of one gpu", mig, append(slices.Clone(migIDs), "1"), 2, migIDs[:2]},
		{"mig: MIG devices alone", mig, migIDs, 1, migIDs[:1]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			free := tc.inv.Allocatable()
			if tc.free != nil {
				free = devicesByID(t, tc.inv, tc.free...)
			}
			got, err := ChooseDevices(tc.inv, free, tc.k)
			if err != nil {
				t.Fatal(err)
			}
			if ids(got) != strings.Join(tc.want, ",") {
				t.Errorf("ChooseDevices(k=%d) = %s, want %s", tc.k, ids(got), strings.Join(tc.want, ","))
			}
		})
	}
	// The DGX-1 quad is fully connected by NVLink: every pair has at least one.
	quad, err := ChooseDevices(dgx1, dgx1.Allocatable(), 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range quad {
		for _, b := range quad[i+1:] {
			if l, _ := dgx1.Link(a.GPU, b.GPU); l.NVLinks == 0 {
				t.Errorf("dgx1 quad %s: gpus %d and %d have no NVLink", ids(quad), a.GPU, b.GPU)
			}
		}
	}
}

func TestChooseDevicesErrors(t *testing.T) {
	dgx1 := loadInventory(t, "dgx1")
	mig := loadInventory(t, "dgx-a100-mig")
	all := dgx1.Allocatable()
	tests := []struct {
		name string
		inv  *topology.Inventory
		free []topology.Device
		k    int
		want string
	}{
		{"no inventory", nil, all, 1, "choose devices: no inventory"},
		{"zero", dgx1, all, 0, "choose devices on node dgx1-01: count 0 must be at least 1"},
		{"negative", dgx1, all, -3, "count -3 must be at least 1"},
		{"more than free", dgx1, all[:3], 4, "4 wanted but only 3 free"},
		{"unknown gpu", dgx1, []topology.Device{{ID: "9", GPU: 9}}, 1, `choose devices: device "9": node dgx1-01 has no gpu 9`},
		{"id not the gpu", dgx1, []topology.Device{{ID: "GPU-x", GPU: 2}}, 1, `choose devices: device "GPU-x": not gpu 2 of node dgx1-01`},
		{"whole gpu in MIG mode", mig, []topology.Device{{ID: "0", GPU: 0}}, 1, `choose devices: device "0": not a MIG device of gpu 0`},
		{"twice", dgx1, []topology.Device{all[1], all[2], all[1]}, 2, `choose devices: device "1" is listed twice`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseDevices(tc.inv, tc.free, tc.k)
			if err == nil {
				t.Fatalf("ChooseDevices = %s, want error %q", ids(got), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.want)
			}
		})
	}
	if _, err := SetScore(dgx1, []topology.Device{{ID: "9", GPU: 9}}); err == nil {
		t.Error("SetScore of an unknown device: no error")
	}
	if _, err := SetScore(nil, all); err == nil {
		t.Error("SetScore without an inventory: no error")
	}
}

// bruteForce returns the best k-set by trying every one, in lexicographic order of the
// devices sorted by (GPU, MIG index): the first with the highest score.
func bruteForce(t *testing.T, inv *topology.Inventory, free []topology.Device, k int) ([]topology.Device, int) {
	t.Helper()
	sorted := slices.Clone(free)
	pos := map[string]int{}
	for i, a := range inv.Allocatable() {
		pos[a.ID] = i // Allocatable is in (GPU, MIG index) order
	}
	slices.SortFunc(sorted, func(a, b topology.Device) int { return pos[a.ID] - pos[b.ID] })
	var best []topology.Device
	bestScore := -1
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	for {
		set := make([]topology.Device, k)
		for i, j := range idx {
			set[i] = sorted[j]
		}
		s, err := SetScore(inv, set)
		if err != nil {
			t.Fatal(err)
		}
		if s > bestScore {
			best, bestScore = set, s
		}
		// Next combination in lexicographic order.
		i := k - 1
		for i >= 0 && idx[i] == len(sorted)-k+i {
			i--
		}
		if i < 0 {
			return best, bestScore
		}
		idx[i]++
		for j := i + 1; j < k; j++ {
			idx[j] = idx[j-1] + 1
		}
	}
}

// randomInventory is a node of 1..10 GPUs with random NVLink counts and PCIe levels,
// and random GPUs in MIG mode with 1..4 MIG devices. Few distinct weights make many
// ties, which exercises the tie-break.
func randomInventory(rng *rand.Rand, name string) *topology.Inventory {
	n := 1 + rng.IntN(10)
	links := map[[2]int]topology.Link{}
	for a := range n {
		for b := a + 1; b < n; b++ {
			l := topology.Link{Level: topology.Level(1 + rng.IntN(5))}
			if rng.IntN(3) == 0 {
				l.NVLinks = 1 + rng.IntN(3)
			}
			links[[2]int{a, b}] = l
		}
	}
	mig := map[int]int{}
	for i := range n {
		if rng.IntN(4) == 0 {
			mig[i] = 1 + rng.IntN(4)
		}
	}
	return synthInventory(name, n, func(a, b int) topology.Link { return links[[2]int{a, b}] }, mig)
}

func TestChooseDevicesMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for trial := range 300 {
		inv := randomInventory(rng, "rand"+strconv.Itoa(trial))
		all := inv.Allocatable()
		if len(all) == 0 {
			continue
		}
		// A random free subset, shuffled: ChooseDevices must not depend on the order.
		free := slices.Clone(all)
		rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		free = free[:1+rng.IntN(min(len(free), 12))] // brute force stays quick
		for k := 1; k <= len(free); k++ {
			got, err := ChooseDevices(inv, free, k)
			if err != nil {
				t.Fatal(err)
			}
			want, wantScore := bruteForce(t, inv, free, k)
			gotScore, err := SetScore(inv, got)
			if err != nil {
				t.Fatal(err)
			}
			if ids(got) != ids(want) {
				t.Fatalf("%s, free %s, k=%d: chose %s (score %d), brute force %s (score %d)",
					inv.Node, ids(free), k, ids(got), gotScore, ids(want), wantScore)
			}
		}
	}
}

// gpuallocatorDevices builds go-gpuallocator's device list from an inventory: for
// every ordered pair, the P2P link type of the PCIe level and, when the pair has
// NVLinks, the link type for their count. These are the link lists its NewDevices
// builds from NVML (gpuallocator/device.go), with the inventory's NVLink counts, which
// also count links through an NVSwitch fabric (go-gpuallocator itself would see none
// there: its GetNVLink has "TODO: Handle NVSwitch semantics").
func gpuallocatorDevices(t testing.TB, inv *topology.Inventory) map[int]*gpuallocator.Device {
	t.Helper()
	devs := map[int]*gpuallocator.Device{}
	for _, g := range inv.GPUs {
		devs[g.Index] = &gpuallocator.Device{Index: g.Index, Links: map[int][]gpuallocator.P2PLink{}}
	}
	for _, a := range inv.GPUs {
		for _, b := range inv.GPUs {
			if a.Index == b.Index {
				continue
			}
			l, err := inv.Link(a.Index, b.Index)
			if err != nil {
				t.Fatal(err)
			}
			// internal/links.P2PLinkType values: CrossCPU 1, SameCPU 2, HostBridge 3,
			// MultiSwitch 4, SingleSwitch 5, SameBoard 6, then 7 + n-1 for n NVLinks
			// (up to 18).
			p2p := map[topology.Level]uint{
				topology.LevelSYS: 1, topology.LevelNODE: 2, topology.LevelPHB: 3,
				topology.LevelPXB: 4, topology.LevelPIX: 5,
			}[l.Level]
			links := []gpuallocator.P2PLink{{GPU: devs[b.Index]}}
			setLinkType(&links[0].Type, p2p)
			if l.NVLinks > 0 {
				nv := gpuallocator.P2PLink{GPU: devs[b.Index]}
				setLinkType(&nv.Type, 6+uint(min(l.NVLinks, 18)))
				links = append(links, nv)
			}
			devs[a.Index].Links[b.Index] = links
		}
	}
	return devs
}

// setLinkType stores v in a P2PLink.Type, whose type lives in go-gpuallocator's
// internal package and cannot be named here; inference names it.
func setLinkType[T ~uint](dst *T, v uint) { *dst = T(v) }

// gpuallocatorChoose runs go-gpuallocator's best-effort policy on the free whole GPUs
// and returns its choice as our devices.
func gpuallocatorChoose(t testing.TB, inv *topology.Inventory, devs map[int]*gpuallocator.Device, free []topology.Device, k int) []topology.Device {
	t.Helper()
	avail := make([]*gpuallocator.Device, 0, len(free))
	for _, d := range free {
		avail = append(avail, devs[d.GPU])
	}
	got := gpuallocator.NewBestEffortPolicy().Allocate(avail, nil, k)
	out := make([]topology.Device, 0, len(got))
	for _, g := range got {
		out = append(out, devicesByID(t, inv, strconv.Itoa(g.Index))...)
	}
	return out
}

func TestChooseDevicesVersusGoGPUAllocator(t *testing.T) {
	type freeSet struct {
		name string
		ids  []string // nil: all
	}
	tests := []struct {
		inv   string
		frees []freeSet
	}{
		{"dgx1", []freeSet{{"all free", nil}, {"2 busy", []string{"0", "2", "3", "4", "6", "7"}}, {"4 scattered", []string{"0", "2", "5", "7"}}}},
		{"dgx-h100", []freeSet{{"all free", nil}, {"3 busy", []string{"0", "3", "5", "6", "7"}}}},
		{"pcie-2socket", []freeSet{{"all free", nil}, {"1 busy", []string{"0", "2", "3"}}}},
		{"dgx2", []freeSet{{"all free", nil}}},
		{"islands", []freeSet{{"all free", nil}, {"6 busy", []string{"0", "2", "3", "5", "6", "8", "9", "13", "14", "15"}}}},
	}
	for _, tc := range tests {
		var inv *topology.Inventory
		switch tc.inv {
		case "dgx2":
			inv = dgx2Inventory()
		case "islands":
			inv = twoIslandsInventory(t)
		default:
			inv = loadInventory(t, tc.inv)
		}
		devs := gpuallocatorDevices(t, inv)
		for _, fs := range tc.frees {
			free := inv.Allocatable()
			if fs.ids != nil {
				free = devicesByID(t, inv, fs.ids...)
			}
			for k := 1; k <= len(free); k++ {
				if len(free) > 12 && k != 1 && k != 8 && k != len(free) {
					// go-gpuallocator takes seconds to minutes on 16 GPUs for these
					// sizes; BenchmarkChooseDevices compares 2 and 4 there.
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/k=%d", tc.inv, fs.name, k), func(t *testing.T) {
					ours, err := ChooseDevices(inv, free, k)
					if err != nil {
						t.Fatal(err)
					}
					theirs := gpuallocatorChoose(t, inv, devs, free, k)
					if len(theirs) != k {
						t.Fatalf("go-gpuallocator chose %d devices, want %d", len(theirs), k)
					}
					so, _ := SetScore(inv, ours)
					st, err := SetScore(inv, theirs)
					if err != nil {
						t.Fatal(err)
					}
					if so < st {
						t.Errorf("ours %s scores %d, below go-gpuallocator's %s at %d", ids(ours), so, ids(theirs), st)
					}
					if so > st {
						t.Logf("ours %s scores %d, go-gpuallocator's %s %d", ids(ours), so, ids(theirs), st)
					}
				})
			}
		}
	}
}
