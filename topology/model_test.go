package topology

// Node models for the tests: each describes one machine once, and from it come both
// go-nvml's mock server (dgxh100/dgxa100 with the NVLink, topology, affinity, ECC,
// temperature and MIG functions filled in) and a fake sysfs tree. The trees live in
// testdata/sysfs/<fixture>.tar.gz (real sysfs names contain ':' and rely on symlinks,
// which Go module zips do not allow as plain files); `go test ./topology -update`
// rewrites them, and TestSysfsFixturesMatchModels checks they still match the models.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// nodeModel is one machine.
type nodeModel struct {
	fixture string // testdata/sysfs/<fixture>.tar.gz, testdata/inventories/<fixture>.json
	node    string
	cpu     cpuModel
	numa    []numaModel
	// mockKind picks the go-nvml mock server: "h100", "a100" or "" for no NVML at all.
	mockKind   string
	gpus       []gpuModel
	nvswitches []pciModel
	nics       []nicModel
	netdevs    []netdevModel
	// nvmlLevel is NVML's common ancestor for GPUs a < b, written from the real
	// machine's `nvidia-smi topo -m`, independently of the PCI paths.
	nvmlLevel func(a, b int) nvml.GpuTopologyLevel
}

type cpuModel struct {
	vendor, modelName string
	family, model     int
	sockets, threads  int // threads per socket
}

type numaModel struct {
	id, socket int
	cpus       string
}

// pciModel is a PCI function: its sysfs path below /sys/devices (host bridge first)
// and its identity.
type pciModel struct {
	path                                        string // "pci0000:15/0000:15:01.0/.../0000:1b:00.0"
	class, vendor, device, subVendor, subDevice string
	speed                                       string
	width                                       int
	numa                                        int
}

func (p pciModel) busID() string { return filepath.Base(p.path) }

type gpuModel struct {
	pci      pciModel
	config   gpus.Config
	uuid     string
	cpus     string // NVML CPU affinity
	nvlinks  []nvlinkModel
	tempC    uint32
	health   healthReadings
	migMode  int
	mig      []migModel
	noRemote bool // GetNvLinkRemoteDeviceType unsupported (older driver)
}

type nvlinkModel struct {
	remote string // bus id, sysfs form
	kind   nvml.IntNvLinkDeviceType
	links  int
}

type migModel struct {
	uuid, name string
	memMiB     uint64
	gi, ci     int
	slot       int
}

type nicModel struct {
	name, hcaType, fw, nodeGUID string
	pci                         pciModel
	ports                       []portModel
}

type portModel struct {
	active    bool
	rate      string
	linkLayer string
	portGUID  string // IB
	gids      []gidModel
}

type gidModel struct {
	gid, typ, ndev string
}

type netdevModel struct {
	name, typ, operstate, mac string
	arphrd, mtu, speed        int
	pci                       *pciModel // nil: virtual
	devPort, devID            int
	addrs                     []string
}

// fakeUUID makes a stable UUID-shaped string (version 4 layout) from seed.
func fakeUUID(seed string) string {
	h := sha256.Sum256([]byte(seed))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

func guidBytes(g string) []byte {
	var b []byte
	h := strings.ReplaceAll(g, ":", "")
	for i := 0; i+1 < len(h); i += 2 {
		var v byte
		fmt.Sscanf(h[i:i+2], "%02x", &v)
		b = append(b, v)
	}
	return b
}

func ipoibMAC(qpn uint32, portGUID string) string {
	parts := []string{fmt.Sprintf("%02x", byte(qpn>>24)), fmt.Sprintf("%02x", byte(qpn>>16)),
		fmt.Sprintf("%02x", byte(qpn>>8)), fmt.Sprintf("%02x", byte(qpn)),
		"fe", "80", "00", "00", "00", "00", "00", "00"}
	for _, b := range guidBytes(portGUID) {
		parts = append(parts, fmt.Sprintf("%02x", b))
	}
	return strings.Join(parts, ":")
}

// ibGIDs is an InfiniBand port's GID table: the link-local GID of the port GUID, then
// empty entries as the kernel shows them.
func ibGIDs(portGUID string) []gidModel {
	b := guidBytes(portGUID)
	gid := fmt.Sprintf("fe80:0000:0000:0000:%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7])
	empty := "0000:0000:0000:0000:0000:0000:0000:0000"
	return []gidModel{{gid, GIDTypeRoCEv1, ""}, {empty, "", ""}, {empty, "", ""}}
}

// roceGIDs is a RoCE port's GID table as mlx5 fills it for one IPv4 address:
// link-local v1 and v2, then the IPv4-mapped address v1 and v2 (index 3).
func roceGIDs(mac, ipv4, ndev string) []gidModel {
	m := guidBytes(strings.ReplaceAll(mac, ":", ""))
	eui := []byte{m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]}
	ll := fmt.Sprintf("fe80:0000:0000:0000:%02x%02x:%02x%02x:%02x%02x:%02x%02x", eui[0], eui[1], eui[2], eui[3], eui[4], eui[5], eui[6], eui[7])
	a := netip.MustParseAddr(ipv4).As4()
	mapped := fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", a[0], a[1], a[2], a[3])
	return []gidModel{{ll, GIDTypeRoCEv1, ndev}, {ll, GIDTypeRoCEv2, ndev}, {mapped, GIDTypeRoCEv1, ndev}, {mapped, GIDTypeRoCEv2, ndev},
		{"0000:0000:0000:0000:0000:0000:0000:0000", "", ""}}
}

// ---------------------------------------------------------------------------------
// The machines.

var h100Config = gpus.H100_SXM5_80GB

func a100Config() gpus.Config {
	c := gpus.A100_SXM4_40GB
	c.Name = "NVIDIA A100-SXM4-40GB" // the mock's name carries a "Mock" prefix
	return c
}

func v100Config() gpus.Config {
	return gpus.Config{
		Name: "Tesla V100-SXM2-32GB", Architecture: nvml.DEVICE_ARCH_VOLTA, Brand: nvml.BRAND_TESLA,
		MemoryMB: 32768, CudaMajor: 7, CudaMinor: 0, PciDeviceId: 0x1DB510DE,
	}
}

func a100PCIeConfig() gpus.Config {
	c := gpus.A100_PCIE_80GB
	c.Name = "NVIDIA A100 80GB PCIe"
	return c
}

// bridge makes a path element list into a pciModel for the last element.
func gpuPCI(path string, numa int, device string) pciModel {
	return pciModel{path: path, class: "0x030200", vendor: "0x10de", device: device, subVendor: "0x10de",
		subDevice: "0x16c1", speed: "32.0 GT/s PCIe", width: 16, numa: numa}
}

func nicPCI(path string, numa int, class, device, speed string) pciModel {
	return pciModel{path: path, class: class, vendor: "0x15b3", device: device, subVendor: "0x15b3",
		subDevice: "0x0023", speed: speed, width: 16, numa: numa}
}

func ibPort(rate, guid string, active bool) portModel {
	return portModel{active: active, rate: rate, linkLayer: LinkLayerInfiniBand, portGUID: guid, gids: ibGIDs(guid)}
}

func ibNetdev(name string, nic pciModel, portGUID string, qpn uint32, addr string) netdevModel {
	n := nic
	return netdevModel{name: name, typ: "infiniband", arphrd: 32, operstate: "up", mtu: 4092, mac: ipoibMAC(qpn, portGUID),
		pci: &n, addrs: []string{addr}}
}

func loNetdev() netdevModel {
	return netdevModel{name: "lo", arphrd: 772, operstate: "unknown", mtu: 65536, mac: "00:00:00:00:00:00",
		addrs: []string{"127.0.0.1/8", "::1/128"}}
}

func dockerNetdev() netdevModel {
	return netdevModel{name: "docker0", arphrd: 1, operstate: "down", mtu: 1500, mac: "02:42:5c:1e:7a:03",
		addrs: []string{"172.17.0.1/16"}}
}

func hexBus(b int) string { return fmt.Sprintf("%02x", b) }

// dgxH100 is an NVIDIA DGX H100: 2 × Xeon 8480C, 8 × H100 SXM5 on 4 NVSwitches (NV18
// between every pair), 8 ConnectX-7 NDR InfiniBand HCAs, each on its GPU's PCIe switch.
func dgxH100() *nodeModel {
	m := &nodeModel{
		fixture: "dgx-h100", node: "dgx-h100-01", mockKind: "h100",
		cpu:  cpuModel{vendor: "GenuineIntel", modelName: "Intel(R) Xeon(R) Platinum 8480C", family: 6, model: 143, sockets: 2, threads: 112},
		numa: []numaModel{{0, 0, "0-55,112-167"}, {1, 1, "56-111,168-223"}},
	}
	gpuBus := []int{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf}
	for i, gb := range gpuBus {
		numa := i / 4
		host := gb - 6
		root := fmt.Sprintf("pci0000:%s/0000:%s:01.0/0000:%s:00.0", hexBus(host), hexBus(host), hexBus(host+1))
		down := fmt.Sprintf("0000:%s", hexBus(host+2))
		gpu := gpuModel{
			pci:    gpuPCI(fmt.Sprintf("%s/%s:03.0/0000:%s:00.0", root, down, hexBus(gb)), numa, "0x2330"),
			config: h100Config, uuid: "GPU-" + fakeUUID(fmt.Sprintf("dgx-h100-01/gpu%d", i)),
			cpus: m.numa[numa].cpus, tempC: uint32(31 + i%4*2),
			health: healthReadings{slowdownC: 92, shutdownC: 95},
		}
		for s, links := range []int{5, 4, 4, 5} {
			gpu.nvlinks = append(gpu.nvlinks, nvlinkModel{remote: fmt.Sprintf("0000:%02x:00.0", 0x05+s), kind: nvml.NVLINK_DEVICE_TYPE_SWITCH, links: links})
		}
		m.gpus = append(m.gpus, gpu)

		guid := fmt.Sprintf("946d:ae03:00fa:%04x", 0x1c40+i*8)
		nic := nicPCI(fmt.Sprintf("%s/%s:00.0/0000:%s:00.0", root, down, hexBus(gb-3)), numa, "0x020700", "0x1021", "32.0 GT/s PCIe")
		m.nics = append(m.nics, nicModel{name: fmt.Sprintf("mlx5_%d", i), hcaType: "MT4129", fw: "28.39.1002", nodeGUID: guid,
			pci: nic, ports: []portModel{ibPort("400 Gb/sec (4X NDR)", guid, true)}})
		m.netdevs = append(m.netdevs, ibNetdev(fmt.Sprintf("ibp%ds0", gb-3), nic, guid, 0x1049, fmt.Sprintf("10.224.%d.21/16", i)))
	}
	for s := 0; s < 4; s++ {
		m.nvswitches = append(m.nvswitches, pciModel{
			path:  fmt.Sprintf("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:%02x.0/0000:%02x:00.0", s, 0x05+s),
			class: "0x068000", vendor: "0x10de", device: "0x22a3", subVendor: "0x10de", subDevice: "0x1796",
			speed: "16.0 GT/s PCIe", width: 2, numa: 0})
	}
	mgmt := pciModel{path: "pci0000:00/0000:00:1c.0/0000:0a:00.0", class: "0x020000", vendor: "0x8086", device: "0x1563",
		subVendor: "0x8086", subDevice: "0x35d4", speed: "8.0 GT/s PCIe", width: 8, numa: 0}
	m.netdevs = append(m.netdevs, loNetdev(), dockerNetdev(),
		netdevModel{name: "eno3", arphrd: 1, operstate: "up", mtu: 1500, mac: "7c:c2:55:3a:10:5e", speed: 10000, pci: &mgmt,
			addrs: []string{"10.33.1.21/24"}})
	m.nvmlLevel = func(a, b int) nvml.GpuTopologyLevel {
		if a/4 == b/4 {
			return nvml.TOPOLOGY_NODE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
	return m
}

// dgxA100 is an NVIDIA DGX A100: 2 × EPYC 7742 in NPS4 (8 NUMA nodes), 8 × A100 SXM4
// on 6 NVSwitches (NV12), 8 ConnectX-6 HDR HCAs; two GPUs and two HCAs per pair of
// second-level PCIe switches under one first-level switch.
func dgxA100() *nodeModel {
	m := &nodeModel{
		fixture: "dgx-a100", node: "dgx-a100-01", mockKind: "a100",
		cpu: cpuModel{vendor: "AuthenticAMD", modelName: "AMD EPYC 7742 64-Core Processor", family: 23, model: 49, sockets: 2, threads: 128},
	}
	for n := 0; n < 8; n++ {
		m.numa = append(m.numa, numaModel{n, n / 4, fmt.Sprintf("%d-%d,%d-%d", 16*n, 16*n+15, 128+16*n, 128+16*n+15)})
	}
	gpuBus := []int{0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd}
	nicBus := []int{0x0c, 0x12, 0x4b, 0x54, 0x8d, 0x94, 0xba, 0xcc}
	hosts := []int{0x00, 0x40, 0x80, 0xa0}
	numaOf := []int{3, 1, 7, 5}
	for pair := 0; pair < 4; pair++ {
		h := hosts[pair]
		numa := numaOf[pair]
		l1 := fmt.Sprintf("pci0000:%s/0000:%s:01.1/0000:%s:00.0", hexBus(h), hexBus(h), hexBus(h+1))
		gsw := fmt.Sprintf("%s/0000:%s:00.0/0000:%s:00.0", l1, hexBus(h+2), hexBus(h+3))
		nsw := fmt.Sprintf("%s/0000:%s:04.0/0000:%s:00.0", l1, hexBus(h+2), hexBus(h+8))
		for k := 0; k < 2; k++ {
			i := pair*2 + k
			gpu := gpuModel{
				pci:    gpuPCI(fmt.Sprintf("%s/0000:%s:%02x.0/0000:%s:00.0", gsw, hexBus(h+4), 8*k, hexBus(gpuBus[i])), numa, "0x20b0"),
				config: a100Config(), uuid: "GPU-" + fakeUUID(fmt.Sprintf("dgx-a100-01/gpu%d", i)),
				cpus: m.numa[numa].cpus, tempC: uint32(29 + i%3*3),
				health: healthReadings{slowdownC: 90, shutdownC: 92},
			}
			gpu.pci.speed = "16.0 GT/s PCIe"
			for s := 0; s < 6; s++ {
				gpu.nvlinks = append(gpu.nvlinks, nvlinkModel{remote: fmt.Sprintf("0000:%02x:00.0", 0xc4+s), kind: nvml.NVLINK_DEVICE_TYPE_SWITCH, links: 2})
			}
			m.gpus = append(m.gpus, gpu)

			guid := fmt.Sprintf("b83f:d203:00a1:%04x", 0xb2c0+i*4)
			nic := nicPCI(fmt.Sprintf("%s/0000:%s:%02x.0/0000:%s:00.0", nsw, hexBus(h+9), 8*k, hexBus(nicBus[i])), numa, "0x020700", "0x101b", "16.0 GT/s PCIe")
			m.nics = append(m.nics, nicModel{name: fmt.Sprintf("mlx5_%d", i), hcaType: "MT4123", fw: "20.35.1012", nodeGUID: guid,
				pci: nic, ports: []portModel{ibPort("200 Gb/sec (4X HDR)", guid, true)}})
			m.netdevs = append(m.netdevs, ibNetdev(fmt.Sprintf("ibp%ds0", nicBus[i]), nic, guid, 0x1089, fmt.Sprintf("10.225.%d.31/16", i)))
		}
	}
	for s := 0; s < 6; s++ {
		m.nvswitches = append(m.nvswitches, pciModel{
			path:  fmt.Sprintf("pci0000:c0/0000:c0:03.1/0000:c1:00.0/0000:c2:%02x.0/0000:%02x:00.0", s, 0xc4+s),
			class: "0x068000", vendor: "0x10de", device: "0x1af1", subVendor: "0x10de", subDevice: "0x1652",
			speed: "8.0 GT/s PCIe", width: 2, numa: 4})
	}
	mgmt := pciModel{path: "pci0000:e0/0000:e0:03.1/0000:e1:00.0", class: "0x020000", vendor: "0x8086", device: "0x1533",
		subVendor: "0x8086", subDevice: "0x0000", speed: "2.5 GT/s PCIe", width: 1, numa: 6}
	m.netdevs = append(m.netdevs, loNetdev(), dockerNetdev(),
		netdevModel{name: "enp225s0", arphrd: 1, operstate: "up", mtu: 1500, mac: "3c:ec:ef:1a:22:40", speed: 1000, pci: &mgmt,
			addrs: []string{"10.33.2.31/24"}})
	m.nvmlLevel = func(a, b int) nvml.GpuTopologyLevel {
		if a/2 == b/2 {
			return nvml.TOPOLOGY_SINGLE
		}
		return nvml.TOPOLOGY_SYSTEM // different NUMA nodes (NPS4)
	}
	return m
}

// dgxA100MIG is dgxA100 with MIG enabled on GPU 0 and two 3g.20gb instances created.
func dgxA100MIG() *nodeModel {
	m := dgxA100()
	m.fixture, m.node = "dgx-a100-mig", "dgx-a100-02"
	for i := range m.gpus {
		m.gpus[i].uuid = "GPU-" + fakeUUID(fmt.Sprintf("dgx-a100-02/gpu%d", i))
	}
	m.gpus[0].migMode = nvml.DEVICE_MIG_ENABLE
	m.gpus[0].mig = []migModel{
		{uuid: "MIG-" + fakeUUID("dgx-a100-02/gpu0/mig1"), name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", memMiB: 19968, gi: 1, ci: 0, slot: 0},
		{uuid: "MIG-" + fakeUUID("dgx-a100-02/gpu0/mig2"), name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", memMiB: 19968, gi: 2, ci: 0, slot: 1},
	}
	return m
}

// pcie2Socket is a 2-socket Ice Lake server with 4 PCIe A100s, two per socket, no
// NVLink, and two ConnectX-6 Dx RoCE NICs (one per socket), plus the interfaces a
// container host has: lo, docker0, a veth, virbr0.
func pcie2Socket() *nodeModel {
	m := &nodeModel{
		fixture: "pcie-2socket", node: "gpu-pcie-01", mockKind: "a100",
		cpu:  cpuModel{vendor: "GenuineIntel", modelName: "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", family: 6, model: 106, sockets: 2, threads: 64},
		numa: []numaModel{{0, 0, "0-31,64-95"}, {1, 1, "32-63,96-127"}},
	}
	places := []struct {
		host, bus, numa int
	}{{0x16, 0x17, 0}, {0x30, 0x31, 0}, {0x97, 0x98, 1}, {0xb0, 0xb1, 1}}
	for i, p := range places {
		gpu := gpuModel{
			pci:    gpuPCI(fmt.Sprintf("pci0000:%s/0000:%s:02.0/0000:%s:00.0", hexBus(p.host), hexBus(p.host), hexBus(p.bus)), p.numa, "0x20b5"),
			config: a100PCIeConfig(), uuid: "GPU-" + fakeUUID(fmt.Sprintf("gpu-pcie-01/gpu%d", i)),
			cpus: m.numa[p.numa].cpus, tempC: uint32(35 + i),
			health: healthReadings{slowdownC: 88, shutdownC: 92},
		}
		gpu.pci.speed = "16.0 GT/s PCIe"
		m.gpus = append(m.gpus, gpu)
	}
	for i, n := range []struct {
		host, bus, numa int
		ndev, mac, ip   string
	}{{0x30, 0x32, 0, "ens3np0", "b8:ce:f6:0a:51:20", "10.1.0.11"}, {0xb0, 0xb2, 1, "ens7np0", "b8:ce:f6:0a:52:c0", "10.1.1.11"}} {
		pci := nicPCI(fmt.Sprintf("pci0000:%s/0000:%s:04.0/0000:%s:00.0", hexBus(n.host), hexBus(n.host), hexBus(n.bus)), n.numa, "0x020000", "0x101d", "16.0 GT/s PCIe")
		m.nics = append(m.nics, nicModel{name: fmt.Sprintf("mlx5_%d", i), hcaType: "MT4125", fw: "22.36.1010",
			nodeGUID: fmt.Sprintf("b8ce:f603:000a:%02x%02x", 0x51+i, 0x20), pci: pci,
			ports: []portModel{{active: true, rate: "100 Gb/sec (4X EDR)", linkLayer: LinkLayerEthernet, gids: roceGIDs(n.mac, n.ip, n.ndev)}}})
		pc := pci
		m.netdevs = append(m.netdevs, netdevModel{name: n.ndev, arphrd: 1, operstate: "up", mtu: 9000, mac: n.mac, speed: 100000,
			pci: &pc, addrs: []string{n.ip + "/24"}})
	}
	mgmt := pciModel{path: "pci0000:00/0000:00:1c.0/0000:02:00.0", class: "0x020000", vendor: "0x8086", device: "0x1521",
		subVendor: "0x15d9", subDevice: "0x1521", speed: "5.0 GT/s PCIe", width: 4, numa: 0}
	m.netdevs = append(m.netdevs, loNetdev(), dockerNetdev(),
		netdevModel{name: "eno1", arphrd: 1, operstate: "up", mtu: 1500, mac: "3c:ec:ef:70:01:10", speed: 1000, pci: &mgmt, addrs: []string{"192.168.1.21/24"}},
		netdevModel{name: "veth3f2a1b0", arphrd: 1, operstate: "up", mtu: 1500, mac: "6e:3a:9c:41:f0:7d", addrs: nil},
		netdevModel{name: "virbr0", arphrd: 1, operstate: "down", mtu: 1500, mac: "52:54:00:8c:1e:99", addrs: []string{"192.168.122.1/24"}},
	)
	m.nvmlLevel = func(a, b int) nvml.GpuTopologyLevel {
		if a/2 == b/2 {
			return nvml.TOPOLOGY_NODE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
	return m
}

// dgx1Links is the DGX-1 (Volta) hybrid cube-mesh: NVLinks between GPU pairs, as in
// NVIDIA's DGX-1 system architecture white paper and `nvidia-smi topo -m` on a DGX-1V.
// Every GPU has 6 links; pairs not listed have none.
var dgx1Links = map[[2]int]int{
	{0, 1}: 1, {0, 2}: 1, {0, 3}: 2, {0, 4}: 2,
	{1, 2}: 2, {1, 3}: 1, {1, 5}: 2,
	{2, 3}: 2, {2, 6}: 1,
	{3, 7}: 1,
	{4, 5}: 1, {4, 6}: 1, {4, 7}: 2,
	{5, 6}: 2, {5, 7}: 1,
	{6, 7}: 2,
}

// dgx1 is an NVIDIA DGX-1 with V100: 2 × Xeon E5-2698 v4, 8 × V100 SXM2 in the hybrid
// cube-mesh, four PLX switches each holding two GPUs and one EDR HCA. Its driver does
// not report NVLink remote device types, so the remote GPU is found by bus id.
func dgx1() *nodeModel {
	m := &nodeModel{
		fixture: "dgx1", node: "dgx1-01", mockKind: "a100",
		cpu:  cpuModel{vendor: "GenuineIntel", modelName: "Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz", family: 6, model: 79, sockets: 2, threads: 40},
		numa: []numaModel{{0, 0, "0-19,40-59"}, {1, 1, "20-39,60-79"}},
	}
	gpuBus := []int{0x06, 0x07, 0x0a, 0x0b, 0x85, 0x86, 0x89, 0x8a}
	nicBus := []int{0x05, 0x0c, 0x84, 0x8b}
	for sw := 0; sw < 4; sw++ {
		host := 0x00
		if sw >= 2 {
			host = 0x80
		}
		numa := sw / 2
		up := []int{0x02, 0x08, 0x82, 0x87}[sw]
		base := fmt.Sprintf("pci0000:%s/0000:%s:%02x.0/0000:%s:00.0", hexBus(host), hexBus(host), 2+sw%2, hexBus(up))
		down := hexBus(up + 1)
		for k := 0; k < 2; k++ {
			i := sw*2 + k
			gpu := gpuModel{
				pci:    gpuPCI(fmt.Sprintf("%s/0000:%s:%02x.0/0000:%s:00.0", base, down, 8+8*k, hexBus(gpuBus[i])), numa, "0x1db5"),
				config: v100Config(), uuid: "GPU-" + fakeUUID(fmt.Sprintf("dgx1-01/gpu%d", i)),
				cpus: m.numa[numa].cpus, tempC: uint32(33 + i%4), noRemote: true,
				health: healthReadings{slowdownC: 87, shutdownC: 90},
			}
			gpu.pci.speed, gpu.pci.subDevice = "8.0 GT/s PCIe", "0x1212"
			m.gpus = append(m.gpus, gpu)
		}
		guid := fmt.Sprintf("248a:0703:0049:%04x", 0x5ad0+sw*2)
		nic := nicPCI(fmt.Sprintf("%s/0000:%s:04.0/0000:%s:00.0", base, down, hexBus(nicBus[sw])), numa, "0x020700", "0x1013", "8.0 GT/s PCIe")
		m.nics = append(m.nics, nicModel{name: fmt.Sprintf("mlx5_%d", sw), hcaType: "MT4115", fw: "12.28.2006", nodeGUID: guid,
			pci: nic, ports: []portModel{ibPort("100 Gb/sec (4X EDR)", guid, true)}})
		m.netdevs = append(m.netdevs, ibNetdev(fmt.Sprintf("ib%d", sw), nic, guid, 0x0409, fmt.Sprintf("10.226.%d.41/16", sw)))
	}
	for pair, n := range dgx1Links {
		a, b := pair[0], pair[1]
		m.gpus[a].nvlinks = append(m.gpus[a].nvlinks, nvlinkModel{remote: m.gpus[b].pci.busID(), links: n})
		m.gpus[b].nvlinks = append(m.gpus[b].nvlinks, nvlinkModel{remote: m.gpus[a].pci.busID(), links: n})
	}
	for i := range m.gpus {
		sort.Slice(m.gpus[i].nvlinks, func(x, y int) bool { return m.gpus[i].nvlinks[x].remote < m.gpus[i].nvlinks[y].remote })
	}
	mgmt := pciModel{path: "pci0000:00/0000:00:1c.4/0000:0e:00.0", class: "0x020000", vendor: "0x8086", device: "0x1528",
		subVendor: "0x8086", subDevice: "0x0001", speed: "5.0 GT/s PCIe", width: 8, numa: 0}
	m.netdevs = append(m.netdevs, loNetdev(), dockerNetdev(),
		netdevModel{name: "enp14s0f0", arphrd: 1, operstate: "up", mtu: 1500, mac: "0c:c4:7a:e3:5f:a2", speed: 10000, pci: &mgmt, addrs: []string{"10.33.3.41/24"}})
	m.nvmlLevel = func(a, b int) nvml.GpuTopologyLevel {
		switch {
		case a/2 == b/2:
			return nvml.TOPOLOGY_SINGLE
		case a/4 == b/4:
			return nvml.TOPOLOGY_HOSTBRIDGE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
	return m
}

// cpuOnly is a cloud VM: one socket, no NVIDIA driver, no RDMA.
func cpuOnly() *nodeModel {
	vnic := pciModel{path: "pci0000:00/0000:00:04.0", class: "0x020000", vendor: "0x1af4", device: "0x1000",
		subVendor: "0x1af4", subDevice: "0x0001", speed: "", width: 0, numa: -1}
	return &nodeModel{
		fixture: "cpu-only", node: "cpu-node-01",
		cpu:  cpuModel{vendor: "GenuineIntel", modelName: "Intel(R) Xeon(R) CPU @ 2.20GHz", family: 6, model: 85, sockets: 1, threads: 8},
		numa: []numaModel{{0, 0, "0-7"}},
		netdevs: []netdevModel{loNetdev(), dockerNetdev(),
			{name: "ens4", arphrd: 1, operstate: "up", mtu: 1460, mac: "42:01:0a:80:00:05", pci: &vnic, addrs: []string{"10.128.0.5/32"}}},
	}
}

// ibHost is a GPU-less host with InfiniBand HCAs named names, the ports of down
// (by name) DOWN.
func ibHost(fixture string, names []string, down map[string]bool) *nodeModel {
	m := &nodeModel{
		fixture: fixture, node: fixture + "-01",
		cpu:  cpuModel{vendor: "GenuineIntel", modelName: "Intel(R) Xeon(R) Platinum 8480C", family: 6, model: 143, sockets: 1, threads: 8},
		numa: []numaModel{{0, 0, "0-7"}},
	}
	for i, name := range names {
		guid := fmt.Sprintf("946d:ae03:00fb:%04x", 0x2000+i*8)
		pci := nicPCI(fmt.Sprintf("pci0000:%s/0000:%s:01.0/0000:%s:00.0", hexBus(0x10*i+0x10), hexBus(0x10*i+0x10), hexBus(0x10*i+0x11)), 0, "0x020700", "0x1021", "32.0 GT/s PCIe")
		port := ibPort("400 Gb/sec (4X NDR)", guid, !down[name])
		m.nics = append(m.nics, nicModel{name: name, hcaType: "MT4129", fw: "28.39.1002", nodeGUID: guid, pci: pci, ports: []portModel{port}})
	}
	m.netdevs = []netdevModel{loNetdev()}
	return m
}

// ipoibGUID is a host with one dual-port ConnectX-6 VPI HCA whose port GUIDs differ
// from its node GUID; its two IPoIB interfaces report dev_port 0 and tell their port
// apart only by dev_id and by the port GUID in their hardware address.
func ipoibGUID() *nodeModel {
	m := &nodeModel{
		fixture: "ipoib-guid", node: "ipoib-guid-01",
		cpu:  cpuModel{vendor: "AuthenticAMD", modelName: "AMD EPYC 7763 64-Core Processor", family: 25, model: 1, sockets: 1, threads: 8},
		numa: []numaModel{{0, 0, "0-7"}},
	}
	pci := nicPCI("pci0000:40/0000:40:01.1/0000:41:00.0", 0, "0x020700", "0x101b", "16.0 GT/s PCIe")
	p1, p2 := "b83f:d203:0099:7e41", "b83f:d203:0099:7e42"
	m.nics = []nicModel{{name: "mlx5_0", hcaType: "MT4123", fw: "20.35.1012", nodeGUID: "b83f:d203:0099:7e40", pci: pci,
		ports: []portModel{ibPort("200 Gb/sec (4X HDR)", p1, true), ibPort("200 Gb/sec (4X HDR)", p2, true)}}}
	ib0 := ibNetdev("ib0", pci, p1, 0x0149, "10.227.0.5/16")
	ib1 := ibNetdev("ib1", pci, p2, 0x014a, "10.228.0.5/16")
	ib1.devID = 1
	m.netdevs = []netdevModel{loNetdev(), ib0, ib1}
	return m
}

// nodeModels are the recorded nodes (testdata/inventories/<fixture>.json).
func nodeModels() []*nodeModel {
	return []*nodeModel{dgxH100(), dgxA100(), dgxA100MIG(), pcie2Socket(), dgx1(), cpuOnly()}
}

// edgeModels are sysfs-only fixtures for the RDMA and netdev rules.
func edgeModels() []*nodeModel {
	return []*nodeModel{
		ibHost("ib-port-down", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}, map[string]bool{"mlx5_5": true}),
		ibHost("hca-names", []string{"mlx5_0", "mlx5_1", "mlx5_10", "mlx5_11"}, map[string]bool{"mlx5_10": true, "mlx5_11": true}),
		ipoibGUID(),
	}
}

func allModels() []*nodeModel { return append(nodeModels(), edgeModels()...) }

// ---------------------------------------------------------------------------------
// The mock NVML server.

// nvml returns the model's NVML: a go-nvml mock server modelling it, or, for a node
// without GPUs, go-nvml's real binding pointed at a library that does not exist.
func (m *nodeModel) nvml(t testing.TB) nvml.Interface {
	if m.mockKind == "" {
		return nvml.New(nvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	}
	var srv *server.Server
	switch m.mockKind {
	case "h100":
		srv = dgxh100.New()
	default:
		var cfgs []gpus.Config
		for _, g := range m.gpus {
			cfgs = append(cfgs, g.config)
		}
		srv = dgxa100.NewWithGPUs(cfgs...)
	}
	devs := map[nvml.Device]int{}
	for i, d := range srv.Devices {
		devs[d] = i
	}
	for i, d := range srv.Devices {
		m.fillDevice(d.(*server.Device), i, devs)
	}
	return srv
}

func nvmlPciInfo(busID string, deviceID uint32) nvml.PciInfo {
	var p nvml.PciInfo
	var dom, bus, dev, fn uint32
	fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn)
	long := fmt.Sprintf("%08X:%02X:%02X.%X", dom, bus, dev, fn)
	short := fmt.Sprintf("%04X:%02X:%02X.%X", dom, bus, dev, fn)
	for i := 0; i < len(long); i++ {
		p.BusId[i] = int8(long[i])
	}
	for i := 0; i < len(short); i++ {
		p.BusIdLegacy[i] = int8(short[i])
	}
	p.Domain, p.Bus, p.Device, p.PciDeviceId = dom, bus, dev, deviceID
	return p
}

func (m *nodeModel) fillDevice(d *server.Device, i int, devs map[nvml.Device]int) {
	g := m.gpus[i]
	d.UUID, d.PciBusID = g.uuid, strings.ToUpper("0000"+g.pci.busID())
	d.MigMode = g.migMode
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return nvmlPciInfo(g.pci.busID(), g.config.PciDeviceId), nvml.SUCCESS
	}
	d.GetCpuAffinityFunc = func(words int) ([]uint, nvml.Return) {
		mask := make([]uint, words)
		for _, c := range parseCPUListLoose(g.cpus) {
			if c/64 < words {
				mask[c/64] |= 1 << uint(c%64)
			}
		}
		return mask, nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(kind nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
		if kind == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && counter == nvml.VOLATILE_ECC {
			return g.health.eccUncorrected, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		if g.config.Architecture >= nvml.DEVICE_ARCH_AMPERE {
			return 0, nvml.ERROR_NOT_SUPPORTED // row remapping replaced page retirement
		}
		if g.health.retiredPending {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		if g.config.Architecture < nvml.DEVICE_ARCH_AMPERE {
			return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
		}
		return g.health.remappedCorrected, g.health.remappedUncRows, g.health.remapPending, g.health.remapFailed, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
		if g.health.temperatureC > 0 {
			return g.health.temperatureC, nvml.SUCCESS
		}
		return g.tempC, nvml.SUCCESS
	}
	d.GetTemperatureThresholdFunc = func(th nvml.TemperatureThresholds) (uint32, nvml.Return) {
		switch th {
		case nvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
			return g.health.slowdownC, nvml.SUCCESS
		case nvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
			return g.health.shutdownC, nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}

	// NVLinks: the model's groups laid out on consecutive link numbers.
	type slot struct {
		remote string
		kind   nvml.IntNvLinkDeviceType
	}
	var slots []slot
	for _, l := range g.nvlinks {
		for k := 0; k < l.links; k++ {
			slots = append(slots, slot{l.remote, l.kind})
		}
	}
	maxLinks := map[int]int{7: 6, 8: 12, 9: 18}[g.config.CudaMajor]
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		if l >= maxLinks || len(g.nvlinks) == 0 {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if l < len(slots) {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		if l >= len(slots) {
			return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvmlPciInfo(slots[l].remote, 0), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if g.noRemote || l >= len(slots) {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_NOT_SUPPORTED
		}
		return slots[l].kind, nvml.SUCCESS
	}
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		j, ok := devs[other]
		if !ok {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		a, b := min(i, j), max(i, j)
		return m.nvmlLevel(a, b), nvml.SUCCESS
	}

	// MIG: the instances the model says were created, in their device slots.
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if g.migMode != nvml.DEVICE_MIG_ENABLE {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return 7, nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		for _, mg := range g.mig {
			if mg.slot == k {
				mg := mg
				return &mock.Device{
					GetUUIDFunc:              func() (string, nvml.Return) { return mg.uuid, nvml.SUCCESS },
					GetNameFunc:              func() (string, nvml.Return) { return mg.name, nvml.SUCCESS },
					GetMemoryInfoFunc:        func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: mg.memMiB << 20}, nvml.SUCCESS },
					GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return mg.gi, nvml.SUCCESS },
					GetComputeInstanceIdFunc: func() (int, nvml.Return) { return mg.ci, nvml.SUCCESS },
				}, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// ---------------------------------------------------------------------------------
// The sysfs tree.

type treeWriter struct {
	root string
	err  error
	made map[string]string // bus id → path, to catch a model using one id twice
}

func (w *treeWriter) file(p, content string) {
	if w.err != nil {
		return
	}
	full := filepath.Join(w.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		w.err = err
		return
	}
	w.err = os.WriteFile(full, []byte(content+"\n"), 0o644)
}

// link makes p a symlink to target (a path below the root), relative as sysfs's are.
func (w *treeWriter) link(p, target string) {
	if w.err != nil {
		return
	}
	full := filepath.Join(w.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		w.err = err
		return
	}
	rel, err := filepath.Rel(filepath.Dir(full), filepath.Join(w.root, target))
	if err != nil {
		w.err = err
		return
	}
	w.err = os.Symlink(rel, full)
}

// pci writes a PCI function and the bridges above it (once each).
func (w *treeWriter) pci(m *nodeModel, p pciModel) {
	comps := strings.Split(p.path, "/")
	for k := 1; k < len(comps); k++ {
		id := comps[k]
		prefix := strings.Join(comps[:k+1], "/")
		if old, ok := w.made[id]; ok {
			if old != prefix && w.err == nil {
				w.err = fmt.Errorf("model %s uses pci %s at %s and %s", m.fixture, id, old, prefix)
			}
			continue
		}
		w.made[id] = prefix
		dir := "sys/devices/" + strings.Join(comps[:k+1], "/")
		d := p
		if k < len(comps)-1 { // a bridge above the device
			d = pciModel{class: pciClassBridge, vendor: "0x1000", device: "0xc030", subVendor: "0x1000", subDevice: "0x100b",
				speed: "32.0 GT/s PCIe", width: 16, numa: p.numa}
			if k == 1 { // the root port
				d.vendor, d.device, d.subVendor, d.subDevice = "0x8086", "0x352a", "0x8086", "0x0000"
				if m.cpu.vendor == "AuthenticAMD" {
					d.vendor, d.device, d.subVendor, d.subDevice = "0x1022", "0x1483", "0x1022", "0x1453"
				}
			}
		}
		w.file(dir+"/class", d.class)
		w.file(dir+"/vendor", d.vendor)
		w.file(dir+"/device", d.device)
		w.file(dir+"/subsystem_vendor", d.subVendor)
		w.file(dir+"/subsystem_device", d.subDevice)
		if d.speed != "" {
			w.file(dir+"/max_link_speed", d.speed)
			w.file(dir+"/max_link_width", fmt.Sprint(d.width))
		}
		w.file(dir+"/numa_node", fmt.Sprint(d.numa))
		w.file(dir+"/local_cpulist", m.numaCPUs(d.numa))
		w.link("sys/bus/pci/devices/"+id, dir)
	}
}

func (m *nodeModel) numaCPUs(numa int) string {
	var all []int
	for _, n := range m.numa {
		if n.id == numa {
			return n.cpus
		}
		all = append(all, parseCPUListLoose(n.cpus)...)
	}
	return FormatCPUList(all)
}

// writeSysfs writes the model's sysfs tree (and /proc/cpuinfo) under root.
func (m *nodeModel) writeSysfs(root string) error {
	w := &treeWriter{root: root, made: map[string]string{}}
	// CPUs and NUMA nodes.
	total := m.cpu.sockets * m.cpu.threads
	var info strings.Builder
	for c := 0; c < total; c++ {
		socket := -1
		for _, n := range m.numa {
			for _, x := range parseCPUListLoose(n.cpus) {
				if x == c {
					socket = n.socket
				}
			}
		}
		fmt.Fprintf(&info, "processor\t: %d\nvendor_id\t: %s\ncpu family\t: %d\nmodel\t\t: %d\nmodel name\t: %s\nphysical id\t: %d\n\n",
			c, m.cpu.vendor, m.cpu.family, m.cpu.model, m.cpu.modelName, socket)
		w.file(fmt.Sprintf("sys/devices/system/cpu/cpu%d/topology/physical_package_id", c), fmt.Sprint(socket))
	}
	w.file("proc/cpuinfo", strings.TrimSuffix(info.String(), "\n"))
	w.file("sys/devices/system/cpu/online", fmt.Sprintf("0-%d", total-1))
	for _, n := range m.numa {
		w.file(fmt.Sprintf("sys/devices/system/node/node%d/cpulist", n.id), n.cpus)
	}
	// PCI devices.
	for _, g := range m.gpus {
		w.pci(m, g.pci)
	}
	for _, s := range m.nvswitches {
		w.pci(m, s)
	}
	// RDMA devices.
	if len(m.nics) > 0 {
		w.file("sys/class/infiniband_verbs/abi_version", "6")
	}
	for _, n := range m.nics {
		w.pci(m, n.pci)
		dev := "sys/devices/" + n.pci.path + "/infiniband/" + n.name
		w.file(dev+"/node_guid", n.nodeGUID)
		w.file(dev+"/fw_ver", n.fw)
		w.file(dev+"/hca_type", n.hcaType)
		w.file(dev+"/node_type", "1: CA")
		w.link(dev+"/device", "sys/devices/"+n.pci.path)
		w.link("sys/class/infiniband/"+n.name, dev)
		for k, p := range n.ports {
			pd := fmt.Sprintf("%s/ports/%d", dev, k+1)
			if p.active {
				w.file(pd+"/state", "4: ACTIVE")
				w.file(pd+"/phys_state", "5: LinkUp")
			} else {
				w.file(pd+"/state", "1: DOWN")
				w.file(pd+"/phys_state", "2: Polling")
			}
			w.file(pd+"/rate", p.rate)
			w.file(pd+"/link_layer", p.linkLayer)
			for gi, g := range p.gids {
				w.file(fmt.Sprintf("%s/gids/%d", pd, gi), g.gid)
				if g.typ != "" {
					w.file(fmt.Sprintf("%s/gid_attrs/types/%d", pd, gi), g.typ)
				}
				if g.ndev != "" {
					w.file(fmt.Sprintf("%s/gid_attrs/ndevs/%d", pd, gi), g.ndev)
				}
			}
		}
	}
	// Network interfaces.
	for _, n := range m.netdevs {
		dir := "sys/devices/virtual/net/" + n.name
		if n.pci != nil {
			w.pci(m, *n.pci)
			dir = "sys/devices/" + n.pci.path + "/net/" + n.name
			w.link(dir+"/device", "sys/devices/"+n.pci.path)
		}
		w.file(dir+"/type", fmt.Sprint(n.arphrd))
		w.file(dir+"/operstate", n.operstate)
		w.file(dir+"/mtu", fmt.Sprint(n.mtu))
		w.file(dir+"/address", n.mac)
		w.file(dir+"/dev_port", fmt.Sprint(n.devPort))
		w.file(dir+"/dev_id", fmt.Sprintf("0x%x", n.devID))
		if n.speed > 0 {
			w.file(dir+"/speed", fmt.Sprint(n.speed))
		}
		w.link("sys/class/net/"+n.name, dir)
	}
	return w.err
}

// addrs returns the model's interface addresses for ProbeOptions.InterfaceAddrs.
func (m *nodeModel) addrs() func(string) ([]netip.Prefix, error) {
	by := map[string][]netip.Prefix{}
	for _, n := range m.netdevs {
		for _, a := range n.addrs {
			by[n.name] = append(by[n.name], netip.MustParsePrefix(a))
		}
	}
	return func(name string) ([]netip.Prefix, error) { return by[name], nil }
}

// ---------------------------------------------------------------------------------
// Fixture archives.

func sysfsArchive(fixture string) string {
	return filepath.Join("testdata", "sysfs", fixture+".tar.gz")
}

// tarTree archives dir deterministically: sorted paths, zero times and owners.
func tarTree(dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Format: tar.FormatPAX}
		var body []byte
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil, err
			}
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
		case fi.IsDir():
			h.Typeflag, h.Mode, h.Name = tar.TypeDir, 0o755, h.Name+"/"
		default:
			body, err = os.ReadFile(p)
			if err != nil {
				return nil, err
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// untar extracts a tar stream into dir, refusing paths that leave it.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dir, h.Name)
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(os.PathSeparator)) {
			return fmt.Errorf("archive path %q leaves the tree", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				err = os.Symlink(h.Linkname, target)
			}
		case tar.TypeReg:
			var body []byte
			if body, err = io.ReadAll(tr); err == nil {
				if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
					err = os.WriteFile(target, body, 0o644)
				}
			}
		}
		if err != nil {
			return err
		}
	}
}

// readArchive returns the uncompressed tar stream of a fixture archive.
func readArchive(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return io.ReadAll(zr)
}

// sysfsRoot extracts the model's fixture archive into a fresh directory and returns it.
func (m *nodeModel) sysfsRoot(t testing.TB) string {
	t.Helper()
	data, err := readArchive(sysfsArchive(m.fixture))
	if err != nil {
		t.Fatalf("fixture %s: %v (run go test ./topology -update to create it)", m.fixture, err)
	}
	dir := t.TempDir()
	if err := untar(bytes.NewReader(data), dir); err != nil {
		t.Fatalf("fixture %s: %v", m.fixture, err)
	}
	return dir
}

// probeOptions returns the options that probe the model.
func (m *nodeModel) probeOptions(t testing.TB, root string) ProbeOptions {
	return ProbeOptions{SysfsRoot: root, Node: m.node, NVML: m.nvml(t), InterfaceAddrs: m.addrs()}
}
