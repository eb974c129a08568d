package topology

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestPlanRanksGolden checks, for the recorded inventories, what every local rank gets
// (its device, CPU set, memory's NUMA nodes, OMP_NUM_THREADS and NCCL settings) against
// testdata/rankplan/<inventory>.golden (go test -run TestPlanRanksGolden -update).
func TestPlanRanksGolden(t *testing.T) {
	for _, name := range []string{"dgx-h100", "dgx-a100", "dgx-a100-mig", "pcie-2socket", "dgx1", "cpu-only"} {
		t.Run(name, func(t *testing.T) {
			inv, err := LoadFile(filepath.Join("testdata", "inventories", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			devices := inv.Allocatable()
			nproc := len(devices)
			if nproc == 0 {
				nproc = 2
			}
			topo := ""
			if inv.FlatPCIe() {
				topo = "/tmp/gangrun/nccl-topo.xml"
			}
			plans, notes := inv.PlanRanks(PlanOptions{Devices: devices, NProc: nproc, SocketIfname: "eth0", TopoFile: topo})
			var b bytes.Buffer
			fmt.Fprintf(&b, "# %s: %d ranks, flat PCIe %v\n", name, nproc, inv.FlatPCIe())
			for _, n := range notes {
				fmt.Fprintf(&b, "# note: %s\n", n)
			}
			for _, p := range plans {
				fmt.Fprintf(&b, "[local rank %d]\n", p.LocalRank)
				if p.Device != nil {
					fmt.Fprintf(&b, "# device %s (GPU %d)\n", p.Device.ID, p.Device.GPU)
				}
				if p.Mems != nil {
					fmt.Fprintf(&b, "# memory from NUMA node %v (%s)\n", p.Mems, p.MemBind)
				}
				for _, l := range p.FormatRankEnv(HasMIG(devices)) {
					fmt.Fprintln(&b, l)
				}
			}
			golden := filepath.Join("testdata", "rankplan", name+".golden")
			if *update {
				if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != string(want) {
				t.Errorf("plan differs from %s (rerun with -update and review the diff):\n%s", golden, got)
			}
		})
	}
}

// TestPlanRanksFlatVM: a VM's flat PCIe tree (every GPU on one host bridge, no switch)
// is detected; a physical DGX is not.
func TestPlanRanksFlatVM(t *testing.T) {
	inv, err := LoadFile(filepath.Join("testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	if inv.FlatPCIe() {
		t.Fatal("dgx-h100 reported flat")
	}
	var devs []PCIDevice
	for _, g := range inv.GPUs {
		devs = append(devs, PCIDevice{BusID: g.PCIBusID, Parent: "pci0000:00", NUMANode: g.NUMANode})
	}
	inv.PCIDevices = devs
	if !inv.FlatPCIe() {
		t.Fatal("VM-like tree not reported flat")
	}
	dir := t.TempDir()
	p1, err := inv.WriteNCCLTopoFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := inv.WriteNCCLTopoFile(dir)
	if err != nil || p1 != p2 {
		t.Fatalf("second write: %q %v, want %q", p2, err, p1)
	}
	if b, err := os.ReadFile(p1); err != nil || !strings.Contains(string(b), "<system") {
		t.Fatalf("topology file %s: %v %.80q", p1, err, b)
	}
	// A directory others may write (as a /tmp/gangrun-UID someone else made would be)
	// is refused: they could put their own file under the expected name.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.WriteNCCLTopoFile(dir); err == nil || !strings.Contains(err.Error(), "is not a directory of this user's that only it may write") {
		t.Errorf("a directory anyone may write: %v, want it refused", err)
	}
}

func TestSplitCPUs(t *testing.T) {
	h := func(s string) []int { c, _ := ParseCPUList(s); return c }
	for _, tc := range []struct {
		cpus string
		k    int
		want []string
	}{
		{"0-55,112-167", 4, []string{"0-13,112-125", "14-27,126-139", "28-41,140-153", "42-55,154-167"}},
		{"0-15,128-143", 2, []string{"0-7,128-135", "8-15,136-143"}},
		{"0,2,4,6", 2, []string{"0,2", "4,6"}},
		{"0-1", 3, []string{"0", "1", "0"}},
		{"0-7", 3, []string{"0-1", "2-4", "5-7"}},
	} {
		var got []string
		for j := 0; j < tc.k; j++ {
			got = append(got, FormatCPUList(splitCPUs(h(tc.cpus), j, tc.k)))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("split %s in %d: %v, want %v", tc.cpus, tc.k, got, tc.want)
		}
	}
}

func TestParseCPUBindAndNCCLTopo(t *testing.T) {
	if _, err := ParseCPUBind("nume"); err == nil || !strings.Contains(err.Error(), `"nume"`) {
		t.Errorf("ParseCPUBind(nume): %v", err)
	}
	if _, err := ParseNCCLTopo("yes"); err == nil || !strings.Contains(err.Error(), `"yes"`) {
		t.Errorf("ParseNCCLTopo(yes): %v", err)
	}
	if b, _ := ParseCPUBind(""); b != CPUBindNUMA {
		t.Errorf("default bind %q", b)
	}
}

func TestInterfaceForLoopback(t *testing.T) {
	name, err := InterfaceFor("127.0.0.1")
	if err != nil || name != "lo" {
		t.Errorf("InterfaceFor(127.0.0.1) = %q, %v; want lo", name, err)
	}
}

// BenchmarkPlanRanks8 is the topology side of the added launch cost: eight ranks'
// CPU sets and NCCL settings on the recorded DGX H100.
func BenchmarkPlanRanks8(b *testing.B) {
	inv, err := LoadFile(filepath.Join("testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		b.Fatal(err)
	}
	devices := inv.Allocatable()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		inv.PlanRanks(PlanOptions{Devices: devices, NProc: 8, SocketIfname: "eth0"})
	}
}
