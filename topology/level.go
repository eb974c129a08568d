package topology

import (
	"fmt"
	"strings"
)

// Level is the PCIe path between two devices, with nvidia-smi's codes (`nvidia-smi topo
// -m` legend, the same path types NCCL_P2P_LEVEL takes). Smaller is closer:
//
//	LevelSelf  X     the same device
//	LevelPIX   PIX   through at most one PCIe switch
//	LevelPXB   PXB   through several PCIe switches, not through the host bridge
//	LevelPHB   PHB   through a PCIe host bridge (the CPU's root complex)
//	LevelNODE  NODE  between host bridges of one NUMA node
//	LevelSYS   SYS   across NUMA nodes (QPI/UPI, Infinity Fabric)
//
// In JSON a Level is its code ("PIX").
type Level int

// The levels, closest first.
const (
	LevelSelf Level = iota
	LevelPIX
	LevelPXB
	LevelPHB
	LevelNODE
	LevelSYS
)

var levelCodes = [...]string{"X", "PIX", "PXB", "PHB", "NODE", "SYS"}

// String returns the level's code: X, PIX, PXB, PHB, NODE or SYS.
func (l Level) String() string {
	if l < 0 || int(l) >= len(levelCodes) {
		return fmt.Sprintf("Level(%d)", int(l))
	}
	return levelCodes[l]
}

// ParseLevel reads a level code (case-insensitive); the error names the bad value.
func ParseLevel(s string) (Level, error) {
	for i, c := range levelCodes {
		if strings.EqualFold(s, c) {
			return Level(i), nil
		}
	}
	return 0, fmt.Errorf("unknown PCIe level %q (want X, PIX, PXB, PHB, NODE or SYS)", s)
}

// MarshalText encodes the level as its code.
func (l Level) MarshalText() ([]byte, error) {
	if l < 0 || int(l) >= len(levelCodes) {
		return nil, fmt.Errorf("invalid level %d", int(l))
	}
	return []byte(levelCodes[l]), nil
}

// UnmarshalText decodes a level code.
func (l *Level) UnmarshalText(b []byte) error {
	v, err := ParseLevel(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// Link is the connection between two GPUs of one node; it is symmetric.
type Link struct {
	// NVLinks is the number of NVLinks between the two GPUs (through an NVSwitch
	// fabric, the smaller of their link counts into it); 0 without NVLink and always 0
	// when either GPU has MIG enabled, since MIG instances get no NVLink or P2P.
	NVLinks int
	// Level is the PCIe path between the two GPUs.
	Level Level
}

// String returns the code nvidia-smi topo -m prints for the pair: "NV18" with NVLink,
// else the PCIe level ("PIX", "SYS"), and "X" for a GPU with itself.
func (l Link) String() string {
	if l.NVLinks > 0 {
		return fmt.Sprintf("NV%d", l.NVLinks)
	}
	return l.Level.String()
}

// Link returns the link between the GPUs with NVML indices a and b. Link(a, a) is
// Link{Level: LevelSelf}. A pair missing from GPULinks (a hand-written recording) is
// reported as SYS without NVLink. The error names an index that is not a GPU here.
func (inv *Inventory) Link(a, b int) (Link, error) {
	ga, ok := inv.GPU(a)
	if !ok {
		return Link{}, fmt.Errorf("node %s has no gpu %d", inv.Node, a)
	}
	gb, ok := inv.GPU(b)
	if !ok {
		return Link{}, fmt.Errorf("node %s has no gpu %d", inv.Node, b)
	}
	if a == b {
		return Link{Level: LevelSelf}, nil
	}
	if a > b {
		a, b = b, a
	}
	l := Link{Level: LevelSYS}
	for _, gl := range inv.GPULinks {
		if gl.A == a && gl.B == b {
			l = Link{NVLinks: gl.NVLinks, Level: gl.Level}
			break
		}
	}
	if ga.MIGEnabled || gb.MIGEnabled {
		l.NVLinks = 0
	}
	return l, nil
}

// pciTree answers PCIe-distance questions from an inventory's PCIDevices.
type pciTree map[string]PCIDevice

func newPCITree(devs []PCIDevice) pciTree {
	t := make(pciTree, len(devs))
	for _, d := range devs {
		t[d.BusID] = d
	}
	return t
}

// ancestors returns the bridges above busID, nearest first, and the host bridge
// ("pci0000:15") the chain ends at; ok is false when busID is not in the tree.
func (t pciTree) ancestors(busID string) (chain []string, host string, ok bool) {
	d, ok := t[busID]
	if !ok {
		return nil, "", false
	}
	for i := 0; i < 64; i++ { // bounded: a malformed recording could loop
		p := d.Parent
		parent, isDev := t[p]
		if !isDev {
			return chain, p, true
		}
		chain = append(chain, p)
		d = parent
	}
	return chain, "", false
}

// switches returns the PCIe switches above busID, nearest first, each named by its
// upstream port: every second bridge of the chain, starting at the grandparent. This
// is how NCCL folds a switch's downstream and upstream ports into one node
// (src/graph/xml.cc, ncclTopoGetXmlFromSys); a root port, the last bridge of a chain of
// odd length, is not a switch.
func switches(chain []string) []string {
	var sw []string
	for i := 1; i < len(chain); i += 2 {
		sw = append(sw, chain[i])
	}
	return sw
}

// level returns the PCIe level between two PCI functions, from the tree and the NUMA
// nodes of the two devices (used when the tree does not know them).
func (t pciTree) level(a, b string, numaA, numaB int) Level {
	if a == b && a != "" { // two devices without bus ids are not one device
		return LevelSelf
	}
	ca, ha, okA := t.ancestors(a)
	cb, hb, okB := t.ancestors(b)
	if okA && okB && ha == hb {
		sa, sb := switches(ca), switches(cb)
		if len(sa) > 0 && len(sb) > 0 && sa[0] == sb[0] {
			return LevelPIX
		}
		if len(ca) > 0 && len(cb) > 0 && ca[0] == cb[0] {
			return LevelPIX // functions behind one bridge (a multi-function device)
		}
		for _, x := range sa {
			for _, y := range sb {
				if x == y {
					return LevelPXB
				}
			}
		}
		return LevelPHB
	}
	if numaA >= 0 && numaB >= 0 && numaA != numaB {
		return LevelSYS
	}
	return LevelNODE
}

// pciLevel returns the PCIe level between two PCI functions of the inventory.
func (inv *Inventory) pciLevel(a, b string) Level {
	t := newPCITree(inv.PCIDevices)
	return t.level(a, b, t.numa(a), t.numa(b))
}

func (t pciTree) numa(busID string) int {
	if d, ok := t[busID]; ok {
		return d.NUMANode
	}
	return -1
}

// GPUNICLevel returns the PCIe level between GPU gpu and RDMA device nic: as recorded
// in GPUNICLevels when it is there, else from the PCI tree. The error names an unknown
// GPU or device.
func (inv *Inventory) GPUNICLevel(gpu int, nic string) (Level, error) {
	g, ok := inv.GPU(gpu)
	if !ok {
		return 0, fmt.Errorf("node %s has no gpu %d", inv.Node, gpu)
	}
	d, ok := inv.RDMADevice(nic)
	if !ok {
		return 0, fmt.Errorf("node %s has no rdma device %q", inv.Node, nic)
	}
	for _, l := range inv.GPUNICLevels {
		if l.GPU == gpu && l.NIC == nic {
			return l.Level, nil
		}
	}
	t := newPCITree(inv.PCIDevices)
	return t.level(g.PCIBusID, d.PCIBusID, g.NUMANode, d.NUMANode), nil
}

// nicLevel returns the PCIe level between two RDMA devices as recorded in NICLevels.
func (inv *Inventory) nicLevel(a, b string) (Level, bool) {
	for _, l := range inv.NICLevels {
		if (l.A == a && l.B == b) || (l.A == b && l.B == a) {
			return l.Level, true
		}
	}
	return 0, false
}
