package topology

import (
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files, recorded inventories and sysfs fixture archives")

func inventoryPath(fixture string) string {
	return filepath.Join("testdata", "inventories", fixture+".json")
}

// TestSysfsFixturesMatchModels checks every fixture archive holds exactly the tree its
// model describes (and rewrites the archives with -update).
func TestSysfsFixturesMatchModels(t *testing.T) {
	for _, m := range allModels() {
		t.Run(m.fixture, func(t *testing.T) {
			dir := t.TempDir()
			if err := m.writeSysfs(dir); err != nil {
				t.Fatal(err)
			}
			want, err := tarTree(dir)
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				var buf bytes.Buffer
				zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
				zw.Write(want)
				zw.Close()
				if err := os.MkdirAll(filepath.Dir(sysfsArchive(m.fixture)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(sysfsArchive(m.fixture), buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := readArchive(sysfsArchive(m.fixture))
			if err != nil {
				t.Fatalf("%v (run go test ./topology -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the model %s (run go test ./topology -update)", sysfsArchive(m.fixture), m.fixture)
			}
		})
	}
}

func probeModel(t testing.TB, m *nodeModel) *Inventory {
	t.Helper()
	inv, err := NewProber(m.probeOptions(t, m.sysfsRoot(t))).Inventory(context.Background())
	if err != nil {
		t.Fatalf("probe %s: %v", m.fixture, err)
	}
	return inv
}

// TestProbeReproducesRecordings probes every model (mock NVML + sysfs fixture) and
// compares the JSON with the recorded inventory; -update rewrites the recording. The
// recording must also load and print back byte for byte.
func TestProbeReproducesRecordings(t *testing.T) {
	for _, m := range nodeModels() {
		t.Run(m.fixture, func(t *testing.T) {
			got, err := probeModel(t, m).JSON()
			if err != nil {
				t.Fatal(err)
			}
			path := inventoryPath(m.fixture)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./topology -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("probe of %s differs from %s (run go test ./topology -update and review the diff)", m.fixture, path)
			}
			loaded, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			again, err := loaded.JSON()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, want) {
				t.Errorf("LoadFile(%s).JSON() does not reproduce the file", path)
			}
		})
	}
}

// TestGPULinks checks the links the probe derived on each recorded machine against
// what the real machines show.
func TestGPULinks(t *testing.T) {
	sameSocket := func(per int) func(a, b int) string {
		return func(a, b int) string {
			if a/per == b/per {
				return "NODE"
			}
			return "SYS"
		}
	}
	tests := []struct {
		fixture string
		want    func(a, b int) string
	}{
		{"dgx-h100", func(a, b int) string { return "NV18" }},
		{"dgx-a100", func(a, b int) string { return "NV12" }},
		{"dgx-a100-mig", func(a, b int) string {
			if a == 0 || b == 0 { // MIG: no NVLink claimed
				if a/2 == b/2 {
					return "PIX"
				}
				return "SYS"
			}
			return "NV12"
		}},
		{"pcie-2socket", sameSocket(2)},
		{"dgx1", func(a, b int) string {
			if n, ok := dgx1Links[[2]int{min(a, b), max(a, b)}]; ok {
				return "NV" + string(rune('0'+n))
			}
			return "SYS"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.fixture, func(t *testing.T) {
			inv, err := LoadFile(inventoryPath(tc.fixture))
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.GPUs) != 8 && tc.fixture != "pcie-2socket" {
				t.Fatalf("%d GPUs, want 8", len(inv.GPUs))
			}
			for _, a := range inv.GPUs {
				for _, b := range inv.GPUs {
					l, err := inv.Link(a.Index, b.Index)
					if err != nil {
						t.Fatal(err)
					}
					want := "X"
					if a.Index != b.Index {
						want = tc.want(a.Index, b.Index)
					}
					if l.String() != want {
						t.Errorf("link %d-%d = %s, want %s", a.Index, b.Index, l, want)
					}
					back, _ := inv.Link(b.Index, a.Index)
					if back != l {
						t.Errorf("link %d-%d = %+v but %d-%d = %+v", a.Index, b.Index, l, b.Index, a.Index, back)
					}
				}
			}
		})
	}
}

// TestDGX1EachGPUHasSixNVLinks checks the cube-mesh from the GPUs' side.
func TestDGX1EachGPUHasSixNVLinks(t *testing.T) {
	inv, err := LoadFile(inventoryPath("dgx1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		total := 0
		for _, r := range g.NVLinks {
			if r.Type != NVLinkRemoteGPU {
				t.Errorf("gpu %d: remote %s has type %s, want gpu", g.Index, r.PCIBusID, r.Type)
			}
			total += r.Links
		}
		if total != 6 {
			t.Errorf("gpu %d has %d NVLinks, want 6", g.Index, total)
		}
	}
}

// TestPCILevelsAgreeWithNVML checks the level computed from the sysfs PCI paths equals
// the one NVML's common ancestor gave, for every GPU pair of every machine: the two
// come from independent descriptions of the machine.
func TestPCILevelsAgreeWithNVML(t *testing.T) {
	for _, m := range nodeModels() {
		if m.mockKind == "" {
			continue
		}
		t.Run(m.fixture, func(t *testing.T) {
			inv, err := LoadFile(inventoryPath(m.fixture))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range inv.GPULinks {
				a, _ := inv.GPU(l.A)
				b, _ := inv.GPU(l.B)
				if got := inv.pciLevel(a.PCIBusID, b.PCIBusID); got != l.Level {
					t.Errorf("gpus %d-%d: PCI paths give %s, NVML gave %s", l.A, l.B, got, l.Level)
				}
			}
		})
	}
}

// TestGPUNICAffinity checks each GPU's closest NICs and their level.
func TestGPUNICAffinity(t *testing.T) {
	tests := []struct {
		fixture string
		gpu     int
		nics    []string
		level   Level
	}{
		{"dgx-h100", 0, []string{"mlx5_0"}, LevelPIX},
		{"dgx-h100", 5, []string{"mlx5_5"}, LevelPIX},
		{"dgx-a100", 0, []string{"mlx5_0", "mlx5_1"}, LevelPXB},
		{"dgx-a100", 7, []string{"mlx5_6", "mlx5_7"}, LevelPXB},
		{"dgx1", 1, []string{"mlx5_0"}, LevelPIX},
		{"dgx1", 6, []string{"mlx5_3"}, LevelPIX},
		{"pcie-2socket", 0, []string{"mlx5_0"}, LevelNODE},
		{"pcie-2socket", 1, []string{"mlx5_0"}, LevelPHB},
		{"pcie-2socket", 3, []string{"mlx5_1"}, LevelPHB},
	}
	for _, tc := range tests {
		inv, err := LoadFile(inventoryPath(tc.fixture))
		if err != nil {
			t.Fatal(err)
		}
		g, _ := inv.GPU(tc.gpu)
		if !reflect.DeepEqual(g.NICs, tc.nics) {
			t.Errorf("%s gpu %d: nics %v, want %v", tc.fixture, tc.gpu, g.NICs, tc.nics)
		}
		for _, n := range tc.nics {
			if l, err := inv.GPUNICLevel(tc.gpu, n); err != nil || l != tc.level {
				t.Errorf("%s gpu %d - %s: level %v (%v), want %v", tc.fixture, tc.gpu, n, l, err, tc.level)
			}
		}
	}
}

// TestGPUOrderFollowsBusID checks NVML indices follow PCI bus id order on every
// recording, the order nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID use.
func TestGPUOrderFollowsBusID(t *testing.T) {
	for _, m := range nodeModels() {
		inv, err := LoadFile(inventoryPath(m.fixture))
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(inv.GPUs); i++ {
			if inv.GPUs[i-1].PCIBusID >= inv.GPUs[i].PCIBusID {
				t.Errorf("%s: gpu %d (%s) is not before gpu %d (%s)", m.fixture,
					inv.GPUs[i-1].Index, inv.GPUs[i-1].PCIBusID, inv.GPUs[i].Index, inv.GPUs[i].PCIBusID)
			}
		}
	}
}

// TestNoDriverNoRDMA: a machine without the NVIDIA library and without RDMA gives an
// inventory with no GPUs, no RDMA devices and a note for each.
func TestNoDriverNoRDMA(t *testing.T) {
	inv := probeModel(t, cpuOnly())
	if len(inv.GPUs) != 0 || len(inv.RDMADevices) != 0 {
		t.Fatalf("gpus %d, rdma %d; want none", len(inv.GPUs), len(inv.RDMADevices))
	}
	want := []string{
		"no GPUs: NVML library libnvidia-ml.so.1 not found (no NVIDIA driver installed)",
		"no RDMA devices: /sys/class/infiniband does not exist (no RDMA driver loaded)",
	}
	if !reflect.DeepEqual(inv.Notes, want) {
		t.Errorf("notes %q, want %q", inv.Notes, want)
	}
	if len(inv.NCCLEnv()) != 1 {
		t.Errorf("env %v: want only NCCL_SOCKET_IFNAME", inv.NCCLEnv())
	}
}

// TestProbeThisMachine probes the machine the test runs on with the real NVML binding:
// it must not fail, and either finds GPUs or says why not.
func TestProbeThisMachine(t *testing.T) {
	inv, err := NewProber(ProbeOptions{}).Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	noGPUNote := false
	for _, n := range inv.Notes {
		noGPUNote = noGPUNote || strings.HasPrefix(n, "no GPUs: ")
	}
	if len(inv.GPUs) == 0 && !noGPUNote {
		t.Errorf("no GPUs and no note saying why: %q", inv.Notes)
	}
	if inv.Node == "" || inv.CPU.Arch == "" || inv.CPU.LogicalCPUs == 0 {
		t.Errorf("node %q, arch %q, %d CPUs: want all set", inv.Node, inv.CPU.Arch, inv.CPU.LogicalCPUs)
	}
	if inv.MemoryMiB <= 0 {
		t.Errorf("memory %d MiB: want /proc/meminfo's MemTotal", inv.MemoryMiB)
	}
	if _, err := inv.JSON(); err != nil {
		t.Fatal(err)
	}
}

func TestProbeHonoursCancelledContext(t *testing.T) {
	m := dgxH100()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewProber(m.probeOptions(t, m.sysfsRoot(t))).Inventory(ctx); err == nil {
		t.Fatal("probe with a cancelled context succeeded")
	}
}

// TestRDMAEdgeCases covers the RDMA fixtures: a down port, HCA names that are prefixes
// of each other, and IPoIB interfaces whose port GUID is not the node GUID.
func TestRDMAEdgeCases(t *testing.T) {
	edges := map[string]*nodeModel{}
	for _, m := range edgeModels() {
		edges[m.fixture] = m
	}

	t.Run("ib-port-down", func(t *testing.T) {
		inv := probeModel(t, edges["ib-port-down"])
		d, _ := inv.RDMADevice("mlx5_5")
		if d.Ports[0].State != PortDown || d.Ports[0].PhysState != "Polling" {
			t.Errorf("mlx5_5 port: %+v, want DOWN/Polling", d.Ports[0])
		}
		want := "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_6:1,mlx5_7:1"
		if got := envValue(inv.NCCLEnv(), "NCCL_IB_HCA"); got != want {
			t.Errorf("NCCL_IB_HCA=%q, want %q", got, want)
		}
	})

	t.Run("hca-names", func(t *testing.T) {
		inv := probeModel(t, edges["hca-names"])
		hca := envValue(inv.NCCLEnv(), "NCCL_IB_HCA")
		if hca != "=mlx5_0:1,mlx5_1:1" {
			t.Fatalf("NCCL_IB_HCA=%q", hca)
		}
		list, err := ParseNCCLList(hca)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range inv.RDMADevices {
			want := d.Ports[0].State == PortActive
			if got := list.Selects(d.Name, 1); got != want {
				t.Errorf("NCCL would select %s: %v, want %v", d.Name, got, want)
			}
		}
		// Without "=", NCCL's prefix match would also take the down mlx5_10 and mlx5_11.
		loose, _ := ParseNCCLList(strings.TrimPrefix(hca, "="))
		if !loose.Selects("mlx5_11", 1) {
			t.Error("prefix list mlx5_1 should select mlx5_11 (the trap '=' avoids)")
		}
	})

	t.Run("ipoib-guid", func(t *testing.T) {
		inv := probeModel(t, edges["ipoib-guid"])
		d, _ := inv.RDMADevice("mlx5_0")
		for _, p := range d.Ports {
			if p.PortGUID == d.NodeGUID {
				t.Fatalf("fixture broken: port %d GUID equals the node GUID", p.Port)
			}
		}
		got := map[string]int{}
		for _, n := range inv.Netdevs {
			if n.RDMADevice != "" {
				got[n.Name] = n.RDMAPort
			}
		}
		if want := map[string]int{"ib0": 1, "ib1": 2}; !reflect.DeepEqual(got, want) {
			t.Errorf("netdev ports %v, want %v", got, want)
		}
		if d.Ports[0].Netdev != "ib0" || d.Ports[1].Netdev != "ib1" {
			t.Errorf("port netdevs %q, %q; want ib0, ib1", d.Ports[0].Netdev, d.Ports[1].Netdev)
		}
	})

	t.Run("roce-netdevs", func(t *testing.T) {
		inv, err := LoadFile(inventoryPath("pcie-2socket"))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ dev, netdev string }{{"mlx5_0", "ens3np0"}, {"mlx5_1", "ens7np0"}} {
			d, _ := inv.RDMADevice(tc.dev)
			if d.Ports[0].Netdev != tc.netdev || d.Ports[0].LinkLayer != LinkLayerEthernet {
				t.Errorf("%s port 1: netdev %q link layer %q; want %s, Ethernet", tc.dev, d.Ports[0].Netdev, d.Ports[0].LinkLayer, tc.netdev)
			}
		}
		virtual := map[string]bool{}
		for _, n := range inv.Netdevs {
			virtual[n.Name] = n.Virtual
		}
		for name, want := range map[string]bool{"lo": true, "docker0": true, "veth3f2a1b0": true, "virbr0": true, "eno1": false, "ens3np0": false} {
			if virtual[name] != want {
				t.Errorf("%s virtual=%v, want %v", name, virtual[name], want)
			}
		}
	})
}

func envValue(env []EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
