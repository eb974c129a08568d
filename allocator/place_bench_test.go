package allocator

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gangrun/gangrun/topology"
)

// BenchmarkChooseDevices times within-node placement on every GPU free, gangrun's
// ChooseDevices against go-gpuallocator's best-effort policy on the same links, and
// reports the chosen set's SetScore as the "score" metric. On 16 GPUs go-gpuallocator
// takes seconds per call for k from 2 to 7 (its search walks every partition of the
// free GPUs into sets of k) and is left out for k = 3, where one call takes about 20 s.
func BenchmarkChooseDevices(b *testing.B) {
	for _, node := range []struct {
		name string
		inv  *topology.Inventory
		ks   []int
	}{
		{"dgx1", loadInventory(b, "dgx1"), []int{1, 2, 3, 4, 5, 6, 7, 8}},
		{"dgx-h100", loadInventory(b, "dgx-h100"), []int{1, 2, 3, 4, 5, 6, 7, 8}},
		{"dgx2", dgx2Inventory(), []int{2, 3, 4, 5, 6, 7, 8, 16}},
		{"islands", twoIslandsInventory(b), []int{2, 3, 4, 5, 6, 7, 8, 16}},
		{"random16", random16Inventory(), []int{2, 3, 4, 5, 6, 7, 8, 16}},
	} {
		free := node.inv.Allocatable()
		devs := gpuallocatorDevices(b, node.inv)
		for _, k := range node.ks {
			b.Run(fmt.Sprintf("%s/k=%d/gangrun", node.name, k), func(b *testing.B) {
				var got []topology.Device
				for b.Loop() {
					var err error
					if got, err = ChooseDevices(node.inv, free, k); err != nil {
						b.Fatal(err)
					}
				}
				reportScore(b, node.inv, got)
			})
			if len(free) > 8 && k == 3 {
				continue
			}
			b.Run(fmt.Sprintf("%s/k=%d/go-gpuallocator", node.name, k), func(b *testing.B) {
				var got []topology.Device
				for b.Loop() {
					got = gpuallocatorChoose(b, node.inv, devs, free, k)
				}
				reportScore(b, node.inv, got)
			})
		}
	}
}

func reportScore(b *testing.B, inv *topology.Inventory, devs []topology.Device) {
	s, err := SetScore(inv, devs)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(s), "score")
}

// random16Inventory is 16 GPUs with random NVLink counts (0..3) and PCIe levels: no
// structure for the bound to exploit.
func random16Inventory() *topology.Inventory {
	rng := rand.New(rand.NewPCG(16, 16))
	links := map[[2]int]topology.Link{}
	for a := range 16 {
		for b := a + 1; b < 16; b++ {
			links[[2]int{a, b}] = topology.Link{NVLinks: rng.IntN(4), Level: topology.Level(1 + rng.IntN(5))}
		}
	}
	return synthInventory("random16", 16, func(a, b int) topology.Link { return links[[2]int{a, b}] }, nil)
}

// BenchmarkChooseNodes times node placement on 1,024 nodes of 8 GPUs: labelled (4
// spines × 8 leaves × 32 nodes) all free, labelled with random free counts, and
// without labels; gangs of 1, 64 and 512 nodes.
func BenchmarkChooseNodes(b *testing.B) {
	labelled := largeCluster()
	fragmented := largeCluster()
	rng := rand.New(rand.NewPCG(1024, 512))
	for i := range fragmented {
		if rng.IntN(2) == 0 {
			fragmented[i].FreeGPUs = rng.IntN(9)
		}
	}
	unlabelled := largeCluster()
	for i := range unlabelled {
		unlabelled[i].Spine, unlabelled[i].Switch = "", ""
	}
	for _, cl := range []struct {
		name  string
		cands []NodeCandidate
	}{{"labelled", labelled}, {"fragmented", fragmented}, {"unlabelled", unlabelled}} {
		for _, g := range [][2]int{{1, 8}, {64, 8}, {512, 4}, {512, 8}} {
			if cl.name == "fragmented" && g[0] == 512 && g[1] == 8 {
				continue // fewer than 512 nodes are whole there
			}
			b.Run(fmt.Sprintf("%s/1024-nodes/%dx%d", cl.name, g[0], g[1]), func(b *testing.B) {
				for b.Loop() {
					if _, err := ChooseNodes(cl.cands, g[0], g[1]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
