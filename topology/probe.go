package topology

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ProbeOptions configures NewProber (and the NVML library WatchHealth uses).
type ProbeOptions struct {
	// SysfsRoot is the directory /sys and /proc/cpuinfo are read under; "" means "/".
	// Tests point it at fixture trees.
	SysfsRoot string
	// Node is the node name to report; "" means the hostname.
	Node string
	// NVML is the NVML library to use; nil means go-nvml's binding of the system's
	// libnvidia-ml.so.1, loaded when probing (a machine without it reports no GPUs).
	// Tests pass go-nvml's mock servers.
	NVML nvml.Interface
	// InterfaceAddrs returns the IP addresses of a network interface. nil means the
	// running machine's addresses (package net) when SysfsRoot is "/" or "", and no
	// addresses under any other root (a fixture's interfaces are not this machine's).
	InterfaceAddrs func(name string) ([]netip.Prefix, error)
}

func (o ProbeOptions) nvmlLib() nvml.Interface {
	if o.NVML != nil {
		return o.NVML
	}
	return nvml.New()
}

func (o ProbeOptions) root() string {
	if o.SysfsRoot == "" {
		return "/"
	}
	return o.SysfsRoot
}

func (o ProbeOptions) addrs() func(string) ([]netip.Prefix, error) {
	if o.InterfaceAddrs != nil {
		return o.InterfaceAddrs
	}
	if filepath.Clean(o.root()) != "/" {
		return func(string) ([]netip.Prefix, error) { return nil, nil }
	}
	return systemInterfaceAddrs
}

// systemInterfaceAddrs reads an interface's addresses from the running kernel.
func systemInterfaceAddrs(name string) ([]netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// NewProber returns a Source that probes the running machine on every call: GPUs and
// NVLinks through NVML (opts.NVML), RDMA devices, network interfaces, PCI paths, CPUs
// and NUMA nodes through sysfs under opts.SysfsRoot, and the node name from opts.Node
// or the hostname. Without an NVIDIA driver or RDMA devices the inventory has no GPUs
// or no RDMA devices and a note saying why; only a cancelled context or an unreadable
// hostname is an error.
func NewProber(opts ProbeOptions) Source { return &prober{opts: opts} }

type prober struct{ opts ProbeOptions }

func (p *prober) Inventory(ctx context.Context) (*Inventory, error) {
	node := p.opts.Node
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("probe node: hostname: %w", err)
		}
		node = h
	}
	inv := &Inventory{SchemaVersion: SchemaVersion, Node: node}
	sys := sysfs{root: p.opts.root()}
	var notes []string

	inv.CPU, inv.NUMANodes = sys.cpus()
	inv.MemoryMiB = parseMemTotal(sys.read("proc/meminfo"))
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	gpus, err := probeNVML(p.opts.nvmlLib(), cpuMaskWords(inv.NUMANodes))
	if err != nil {
		notes = append(notes, "no GPUs: "+err.Error())
	}
	notes = append(notes, gpus.notes...)
	inv.Driver, inv.CUDADriver = gpus.driver, gpus.cuda
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	rdma, err := sys.rdmaDevices()
	if err != nil {
		notes = append(notes, "no RDMA devices: "+err.Error())
	}
	inv.RDMADevices = rdma
	var devPorts map[string]int
	inv.Netdevs, devPorts = sys.netdevs(p.opts.addrs())
	linkNetdevs(inv.RDMADevices, inv.Netdevs, devPorts)
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// The PCI tree above every device we know of.
	var busIDs []string
	for _, g := range gpus.gpus {
		busIDs = append(busIDs, g.gpu.PCIBusID)
		for _, r := range g.gpu.NVLinks {
			if r.Type == NVLinkRemoteNVSwitch {
				busIDs = append(busIDs, r.PCIBusID)
			}
		}
	}
	for _, d := range inv.RDMADevices {
		busIDs = append(busIDs, d.PCIBusID)
	}
	for _, n := range inv.Netdevs {
		busIDs = append(busIDs, n.PCIBusID)
	}
	inv.PCIDevices = sys.pciDevices(busIDs)
	tree := newPCITree(inv.PCIDevices)

	for _, g := range gpus.gpus {
		gpu := g.gpu
		if d, ok := tree[gpu.PCIBusID]; ok {
			gpu.NUMANode = d.NUMANode
		}
		if gpu.CPUAffinity == "" {
			gpu.CPUAffinity = sys.localCPUList(gpu.PCIBusID)
		}
		inv.GPUs = append(inv.GPUs, gpu)
	}
	inv.GPULinks = gpuLinks(gpus, tree)
	assignNICs(inv, tree)
	inv.Notes = notes
	inv.normalize()
	return inv, nil
}

// cpuMaskWords is how many 64-bit words NVML's CPU affinity mask needs for the node's
// CPUs (at least 16, i.e. 1024 CPUs, when the NUMA nodes are unknown).
func cpuMaskWords(nodes []NUMANode) int {
	maxCPU := -1
	for _, n := range nodes {
		for _, c := range parseCPUListLoose(n.CPUs) {
			if c > maxCPU {
				maxCPU = c
			}
		}
	}
	if maxCPU < 0 {
		return 16
	}
	return maxCPU/64 + 1
}

// gpuLinks computes every GPU pair's link: NVLinks from the two GPUs' NVLink remotes,
// the level from NVML's common ancestor when NVML gave one, else from the PCI tree.
func gpuLinks(res nvmlResult, tree pciTree) []GPULink {
	var links []GPULink
	for i := range res.gpus {
		for j := i + 1; j < len(res.gpus); j++ {
			a, b := res.gpus[i].gpu, res.gpus[j].gpu
			level, ok := res.levels[[2]int{a.Index, b.Index}]
			if !ok {
				level = tree.level(a.PCIBusID, b.PCIBusID, tree.numa(a.PCIBusID), tree.numa(b.PCIBusID))
			}
			n := nvlinksBetween(a, b)
			if a.MIGEnabled || b.MIGEnabled {
				n = 0
			}
			lo, hi := a.Index, b.Index
			if lo > hi {
				lo, hi = hi, lo
			}
			links = append(links, GPULink{A: lo, B: hi, NVLinks: n, Level: level})
		}
	}
	return links
}

// nvlinksBetween counts the NVLinks between two GPUs: links that end at the other GPU,
// plus, when both reach NVSwitches, the smaller of their link counts into the switch
// fabric (all NVSwitches of a node form one fabric, as NCCL assumes).
func nvlinksBetween(a, b GPU) int {
	direct, swA, swB := 0, 0, 0
	for _, r := range a.NVLinks {
		switch {
		case r.Type == NVLinkRemoteGPU && r.PCIBusID == b.PCIBusID:
			direct += r.Links
		case r.Type == NVLinkRemoteNVSwitch:
			swA += r.Links
		}
	}
	for _, r := range b.NVLinks {
		if r.Type == NVLinkRemoteNVSwitch {
			swB += r.Links
		}
	}
	return direct + min(swA, swB)
}

// assignNICs sets every GPU's NICs: the RDMA devices at the smallest PCIe level from it.
func assignNICs(inv *Inventory, tree pciTree) {
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		best := LevelSYS + 1
		var nics []string
		for _, d := range inv.RDMADevices {
			l := tree.level(g.PCIBusID, d.PCIBusID, g.NUMANode, d.NUMANode)
			switch {
			case l < best:
				best, nics = l, []string{d.Name}
			case l == best:
				nics = append(nics, d.Name)
			}
		}
		sort.Slice(nics, func(x, y int) bool { return naturalLess(nics[x], nics[y]) })
		g.NICs = nics
	}
}

// linkNetdevs ties network interfaces to RDMA ports: through the GID table's netdev
// attributes (RoCE), through the port GUID in an IPoIB hardware address, and failing
// both through the shared PCI function and dev_port (devPorts, by interface name). The
// port GUID, not the node GUID, is what an IPoIB address carries; they differ on
// multi-port HCAs and virtual functions.
func linkNetdevs(devs []RDMADevice, netdevs []Netdev, devPorts map[string]int) {
	type portRef struct {
		dev  string
		port *RDMAPort
	}
	byNetdev := map[string]portRef{}
	byGUID := map[string]portRef{}
	byPCI := map[string][]portRef{}
	for i := range devs {
		d := &devs[i]
		for k := range d.Ports {
			p := &d.Ports[k]
			ref := portRef{d.Name, p}
			for _, g := range p.GIDs {
				if g.Netdev != "" {
					if _, seen := byNetdev[g.Netdev]; !seen {
						byNetdev[g.Netdev] = ref
					}
				}
			}
			if p.PortGUID != "" {
				byGUID[p.PortGUID] = ref
			}
			if d.PCIBusID != "" {
				byPCI[d.PCIBusID] = append(byPCI[d.PCIBusID], ref)
			}
		}
	}
	for i := range netdevs {
		n := &netdevs[i]
		ref, ok := byNetdev[n.Name]
		if !ok && n.Type == "infiniband" {
			if guid, good := ipoibPortGUID(n.MAC); good {
				ref, ok = byGUID[guid]
			}
		}
		if !ok && n.PCIBusID != "" {
			refs := byPCI[n.PCIBusID]
			for _, r := range refs {
				if r.port.Port == devPorts[n.Name]+1 {
					ref, ok = r, true
				}
			}
		}
		if !ok {
			continue
		}
		n.RDMADevice, n.RDMAPort = ref.dev, ref.port.Port
		if ref.port.Netdev == "" {
			ref.port.Netdev = n.Name
		}
	}
}
