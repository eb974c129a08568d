package allocator

import (
	"path/filepath"
	"testing"

	"github.com/gangrun/gangrun/topology"
)

// loadNvidiaSMI reads one of topology's collected nvidia-smi topo -m recordings.
func loadNvidiaSMI(t *testing.T, name string) *topology.Inventory {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "nvidia-smi", name))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestChooseDevicesOnNvidiaSMIRecordings places GPUs on nodes known only from what
// nvidia-smi topo -m printed there: on a DGX-1 (NVIDIA/nccl-tests#37: the hybrid cube
// mesh, NV1 and NV2 links, no NVLink between some pairs) 4 GPUs form a fully
// NVLink-connected quad and 2 GPUs a doubly linked pair; on an 8× L40S PCIe node
// (NVIDIA/nccl-tests#273) 4 GPUs stay within one NUMA node (NODE), never across (SYS).
func TestChooseDevicesOnNvidiaSMIRecordings(t *testing.T) {
	dgx1 := loadNvidiaSMI(t, "dgx1-v100-tabs-cpu-affinity-only.txt")
	quad, err := ChooseDevices(dgx1, dgx1.Allocatable(), 4)
	if err != nil {
		t.Fatal(err)
	}
	for i := range quad {
		for j := i + 1; j < len(quad); j++ {
			l, _ := dgx1.Link(quad[i].GPU, quad[j].GPU)
			if l.NVLinks == 0 {
				t.Errorf("DGX-1 quad %v: GPU%d-GPU%d has no NVLink (%v)", ids(quad), quad[i].GPU, quad[j].GPU, l)
			}
		}
	}
	pair, err := ChooseDevices(dgx1, dgx1.Allocatable(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := dgx1.Link(pair[0].GPU, pair[1].GPU); l.NVLinks != 2 {
		t.Errorf("DGX-1 pair %v: %v, want an NV2 pair", ids(pair), l)
	}

	l40s := loadNvidiaSMI(t, "l40s-8gpu-1nic-spaces.txt")
	four, err := ChooseDevices(l40s, l40s.Allocatable(), 4)
	if err != nil {
		t.Fatal(err)
	}
	numa := l40s.GPUs[four[0].GPU].NUMANode
	for _, d := range four {
		if l40s.GPUs[d.GPU].NUMANode != numa {
			t.Errorf("L40S: %v spans NUMA nodes", ids(four))
		}
	}
}
