package topology

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// NCCLTopoXMLVersion is the version attribute of <system> that NCCL requires
// (NCCL_TOPO_XML_VERSION in src/graph/xml.h).
const NCCLTopoXMLVersion = 1

// PCI classes NCCL's topology file uses for NVLink targets (src/graph/xml.h).
const (
	pciClassNVSwitch = "0x068000"
	pciClassIBMNPU   = "0x068001"
	pciClassBridge   = "0x060400"
)

// WriteNCCLTopoXML writes the node as an NCCL topology file, the format NCCL reads from
// NCCL_TOPO_FILE and writes to NCCL_TOPO_DUMP_FILE (parser in src/graph/xml.cc,
// consumer in src/graph/topo.cc):
//
//	<system version="1" name=NODE>
//	  <cpu numaid affinity arch vendor familyid modelid>     one per NUMA node in use
//	    <pci busid class vendor device subsystem_vendor subsystem_device link_speed link_width>
//	                                                       PCIe switches, nearest the CPU first,
//	                                                       folded as NCCL folds them
//	      <pci ...>                                        the GPU or NIC function
//	        <gpu dev sm rank gdr>                          dev = rank = NVML index
//	          <nvlink target count tclass/>                per remote device (not for MIG GPUs)
//	        <nic><net name dev speed port guid gdr/></nic> one net per ACTIVE port, dev in
//	                                                       NCCL_IB_HCA order, speed in Mb/s
//
// Every <cpu> carries arch and vendor, which NCCL requires (and familyid/modelid, which
// it requires for Intel and AMD). arch uses NCCL's names (x86_64, arm64, ppc64), the
// affinity is a sysfs cpumap (comma-separated 32-bit hex words). gdr="1" assumes the
// GPUs and HCAs support GPUDirect RDMA; NCCL still checks the peer-memory driver before
// using it. Plain (non-RDMA) interfaces are not written: NCCL adds its socket devices
// itself. The output uses spaces only and no XML declaration, which NCCL's parser does
// not accept.
func (inv *Inventory) WriteNCCLTopoXML(w io.Writer) error {
	if err := inv.checkNCCLTopo(); err != nil {
		return err
	}
	b := newNCCLTopoBuilder(inv)
	b.addGPUs()
	b.addNICs()
	if len(b.root.subs) == 0 && len(inv.NUMANodes) > 0 {
		b.cpuFor(inv.NUMANodes[0].ID)
	}
	b.root.sort()

	bw := bufio.NewWriter(w)
	b.root.write(bw, 0)
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write NCCL topology of %s: %w", inv.Node, err)
	}
	return nil
}

// checkNCCLTopo refuses an inventory without the CPU or the GPUs' bus ids (nvidia-smi
// topo -m's recording): it cannot say where anything sits, and NCCL would read a wrong
// file as the truth.
func (inv *Inventory) checkNCCLTopo() error {
	if inv.CPU.Arch == "" {
		return fmt.Errorf("NCCL topology file of %s: the CPU architecture is not recorded (an nvidia-smi recording lacks it)", inv.Node)
	}
	for _, g := range inv.GPUs {
		if g.PCIBusID == "" {
			return fmt.Errorf("NCCL topology file of %s: GPU%d's PCI bus id is not recorded (nvidia-smi topo -m lacks it; -q -x has it)", inv.Node, g.Index)
		}
	}
	return nil
}

// ncclTopoBuilder builds the XML tree of WriteNCCLTopoXML: the <system> root, and the
// <cpu> and <pci> nodes made so far, by NUMA node and by bus id.
type ncclTopoBuilder struct {
	inv  *Inventory
	tree pciTree
	root *xmlNode
	cpus map[int]*xmlNode
	pcis map[string]*xmlNode
}

// newNCCLTopoBuilder returns a builder with an empty <system> root for inv.
func newNCCLTopoBuilder(inv *Inventory) *ncclTopoBuilder {
	root := &xmlNode{name: "system"}
	root.attr("version", strconv.Itoa(NCCLTopoXMLVersion))
	root.attr("name", inv.Node)
	return &ncclTopoBuilder{inv: inv, tree: newPCITree(inv.PCIDevices), root: root,
		cpus: map[int]*xmlNode{}, pcis: map[string]*xmlNode{}}
}

// cpuFor returns the <cpu> node of a NUMA node, made under the root the first time.
func (b *ncclTopoBuilder) cpuFor(numa int) *xmlNode {
	if c, ok := b.cpus[numa]; ok {
		return c
	}
	inv := b.inv
	c := &xmlNode{name: "cpu", key: fmt.Sprintf("%08d", numa+1)}
	c.attr("numaid", strconv.Itoa(numa))
	if mask := inv.numaCPUMask(numa); mask != "" {
		c.attr("affinity", mask)
	}
	c.attr("arch", ncclArch(inv.CPU.Arch))
	c.attr("vendor", inv.CPU.Vendor)
	if inv.CPU.Arch == "x86_64" {
		c.attr("familyid", strconv.Itoa(inv.CPU.FamilyID))
		c.attr("modelid", strconv.Itoa(inv.CPU.ModelID))
	}
	b.cpus[numa] = c
	b.root.subs = append(b.root.subs, c)
	return c
}

// pciNode returns the <pci> node of busID, made the first time (not yet placed) from
// the PCI tree's device, or with class when the tree lacks it or its class.
func (b *ncclTopoBuilder) pciNode(busID string, class string) *xmlNode {
	if n, ok := b.pcis[busID]; ok {
		return n
	}
	n := &xmlNode{name: "pci", key: busID}
	d, known := b.tree[busID]
	if !known {
		d = PCIDevice{BusID: busID, Class: class, NUMANode: -1}
	}
	if d.Class == "" {
		d.Class = class
	}
	n.attr("busid", busID)
	n.attr("class", d.Class)
	for _, kv := range [][2]string{{"vendor", d.Vendor}, {"device", d.Device},
		{"subsystem_vendor", d.SubsystemVendor}, {"subsystem_device", d.SubsystemDevice}} {
		if kv[1] != "" {
			n.attr(kv[0], kv[1])
		}
	}
	n.attr("link_speed", d.LinkSpeed)
	n.attr("link_width", strconv.Itoa(d.LinkWidth))
	b.pcis[busID] = n
	return n
}

// place puts a device's pci node under its switches and CPU and returns it.
func (b *ncclTopoBuilder) place(busID, class string, numa int) *xmlNode {
	if n, ok := b.pcis[busID]; ok {
		return n
	}
	chain, _, _ := b.tree.ancestors(busID)
	sw := switches(chain)
	parent := b.cpuFor(numa)
	for k := len(sw) - 1; k >= 0; k-- {
		n, existed := b.pcis[sw[k]]
		if !existed {
			n = b.pciNode(sw[k], pciClassBridge)
			parent.subs = append(parent.subs, n)
		}
		parent = n
	}
	n := b.pciNode(busID, class)
	parent.subs = append(parent.subs, n)
	return n
}

// addGPUs places each GPU's <pci> node with its <gpu> under it.
func (b *ncclTopoBuilder) addGPUs() {
	classOf := map[string]string{}
	for _, g := range b.inv.GPUs {
		if d, ok := b.tree[g.PCIBusID]; ok {
			classOf[g.PCIBusID] = d.Class
		}
	}
	for _, g := range b.inv.GPUs {
		n := b.place(g.PCIBusID, "0x030200", g.NUMANode)
		n.subs = append(n.subs, gpuXMLNode(g, classOf))
	}
}

// gpuXMLNode is g's <gpu> node with an <nvlink> per remote device (none for a MIG GPU);
// classOf gives the PCI class of the GPUs by bus id, a remote GPU's tclass.
func gpuXMLNode(g GPU, classOf map[string]string) *xmlNode {
	gpu := &xmlNode{name: "gpu"}
	gpu.attr("dev", strconv.Itoa(g.Index))
	gpu.attr("sm", smVersion(g.ComputeCapability))
	gpu.attr("rank", strconv.Itoa(g.Index))
	gpu.attr("gdr", "1")
	if g.MIGEnabled {
		return gpu
	}
	for _, r := range g.NVLinks {
		nl := &xmlNode{name: "nvlink", key: r.PCIBusID}
		nl.attr("target", r.PCIBusID)
		nl.attr("count", strconv.Itoa(r.Links))
		switch r.Type {
		case NVLinkRemoteGPU:
			c := classOf[r.PCIBusID]
			if c == "" {
				c = "0x030200"
			}
			nl.attr("tclass", c)
		case NVLinkRemoteNPU:
			nl.attr("tclass", pciClassIBMNPU)
		default:
			nl.attr("tclass", pciClassNVSwitch)
		}
		gpu.subs = append(gpu.subs, nl)
	}
	return gpu
}

// addNICs places a <nic> for each RDMA device with an active port, under its <pci> node
// (or its CPU when its bus id is unknown), with a <net> per active port; the nets' dev
// counts across devices in NCCL_IB_HCA order.
func (b *ncclTopoBuilder) addNICs() {
	dev := 0
	for _, d := range b.inv.rdmaInOrder() {
		var nets []*xmlNode
		for _, p := range d.Ports {
			if p.State != PortActive {
				continue
			}
			net := &xmlNode{name: "net"}
			net.attr("name", d.Name)
			net.attr("dev", strconv.Itoa(dev))
			net.attr("speed", strconv.FormatFloat(p.RateGbps*1000, 'f', -1, 64))
			net.attr("port", strconv.Itoa(p.Port))
			if g := strings.ReplaceAll(d.NodeGUID, ":", ""); g != "" {
				net.attr("guid", "0x"+g)
			}
			net.attr("gdr", "1")
			dev++
			nets = append(nets, net)
		}
		if len(nets) == 0 {
			continue
		}
		var parent *xmlNode
		if d.PCIBusID != "" {
			parent = b.place(d.PCIBusID, "0x020700", d.NUMANode)
		} else {
			parent = b.cpuFor(d.NUMANode)
		}
		parent.subs = append(parent.subs, &xmlNode{name: "nic", subs: nets})
	}
}

// rdmaInOrder returns the RDMA devices in natural name order (NCCL_IB_HCA's order).
func (inv *Inventory) rdmaInOrder() []RDMADevice {
	devs := append([]RDMADevice(nil), inv.RDMADevices...)
	sort.Slice(devs, func(i, j int) bool { return naturalLess(devs[i].Name, devs[j].Name) })
	return devs
}

// numaCPUMask returns a NUMA node's CPUs as a sysfs cpumap; all NUMA nodes' CPUs for
// -1 or an unknown node.
func (inv *Inventory) numaCPUMask(numa int) string {
	var cpus []int
	maxCPU := -1
	for _, n := range inv.NUMANodes {
		list := parseCPUListLoose(n.CPUs)
		for _, c := range list {
			maxCPU = max(maxCPU, c)
		}
		if n.ID == numa || numa < 0 {
			cpus = append(cpus, list...)
		}
	}
	if len(cpus) == 0 {
		for _, n := range inv.NUMANodes {
			cpus = append(cpus, parseCPUListLoose(n.CPUs)...)
		}
	}
	if maxCPU < 0 {
		return ""
	}
	words := make([]uint32, maxCPU/32+1)
	for _, c := range cpus {
		words[c/32] |= 1 << uint(c%32)
	}
	parts := make([]string, len(words))
	for i := range words {
		parts[len(words)-1-i] = fmt.Sprintf("%08x", words[i])
	}
	return strings.Join(parts, ",")
}

// ncclArch maps `uname -m` names to the arch values NCCL knows (kvDictCpuArch in
// src/graph/topo.cc).
func ncclArch(arch string) string {
	switch arch {
	case "aarch64", "arm64":
		return "arm64"
	case "ppc64le", "ppc64":
		return "ppc64"
	}
	return arch
}

// smVersion turns "9.0" into NCCL's sm attribute "90".
func smVersion(cc string) string {
	major, minor, _ := strings.Cut(cc, ".")
	if major == "" {
		return "0"
	}
	if minor == "" {
		minor = "0"
	}
	return major + minor
}

// xmlNode is an element of NCCL's XML dialect: attributes in insertion order, no text.
type xmlNode struct {
	name  string
	key   string // sort key among siblings of the same name
	attrs [][2]string
	subs  []*xmlNode
}

func (n *xmlNode) attr(k, v string) {
	// NCCL's parser knows no escapes: keep values free of quotes and brackets.
	v = strings.NewReplacer(`"`, "", "<", "", ">", "").Replace(v)
	n.attrs = append(n.attrs, [2]string{k, v})
}

// sort orders children the way NCCL keeps them: by element name, then key (bus id).
func (n *xmlNode) sort() {
	sort.SliceStable(n.subs, func(i, j int) bool {
		a, b := n.subs[i], n.subs[j]
		if a.name != b.name {
			return a.name < b.name
		}
		return a.key < b.key
	})
	for _, s := range n.subs {
		s.sort()
	}
}

func (n *xmlNode) write(w *bufio.Writer, indent int) {
	pad := strings.Repeat(" ", indent)
	w.WriteString(pad + "<" + n.name)
	for _, a := range n.attrs {
		fmt.Fprintf(w, " %s=\"%s\"", a[0], a[1])
	}
	if len(n.subs) == 0 {
		w.WriteString("/>\n")
		return
	}
	w.WriteString(">\n")
	for _, s := range n.subs {
		s.write(w, indent+2)
	}
	w.WriteString(pad + "</" + n.name + ">\n")
}
