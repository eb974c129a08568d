package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gangrun/gangrun/internal/jsonfile"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/userfile"
)

// SchemaVersion is the version of the Inventory JSON this package writes and reads.
// It changes only when a field is renamed, removed or changes meaning; adding a field
// keeps it. LoadFile rejects any other version.
const SchemaVersion = 1

// Inventory is one node: what `gangrun topo --json` prints and --topology-file reads.
// Slices are never nil after probing or loading, and are ordered: GPUs by index, RDMA
// devices and netdevs by name (natural order, so mlx5_2 before mlx5_10), GPU links by
// (a, b), PCI devices by bus id.
type Inventory struct {
	// SchemaVersion is SchemaVersion for inventories this package writes.
	SchemaVersion int `json:"schema_version"`
	// Node is the node's name: the hostname unless ProbeOptions.Node was set.
	Node string `json:"node"`
	// Driver is the NVIDIA driver version NVML reports ("550.54.15"); empty without GPUs.
	Driver string `json:"driver_version,omitempty"`
	// CUDADriver is the CUDA version the driver supports ("12.4"); empty without GPUs.
	CUDADriver string `json:"cuda_driver_version,omitempty"`
	// CPU describes the node's processors (NCCL's topology file needs arch and vendor).
	CPU CPUInfo `json:"cpu"`
	// MemoryMiB is the node's memory in MiB (/proc/meminfo's MemTotal, as slurmd -C
	// reports RealMemory), which the allocator schedules as Slurm does --mem; 0 when
	// unknown (an inventory recorded before the field, or from nvidia-smi): the
	// allocator then checks no memory on the node.
	MemoryMiB int64 `json:"memory_mib,omitempty"`
	// NUMANodes lists the NUMA nodes with their CPUs, by id.
	NUMANodes []NUMANode `json:"numa_nodes"`
	// GPUs lists the NVIDIA GPUs by NVML index (the order nvidia-smi shows: PCI bus id).
	GPUs []GPU `json:"gpus"`
	// GPULinks holds one entry per unordered GPU pair (A < B).
	GPULinks []GPULink `json:"gpu_links"`
	// RDMADevices lists the RDMA devices (InfiniBand HCAs, RoCE NICs) by name.
	RDMADevices []RDMADevice `json:"rdma_devices"`
	// Netdevs lists the network interfaces (including lo, bridges and veths) by name.
	Netdevs []Netdev `json:"netdevs"`
	// PCIDevices holds the PCI functions of the GPUs, NICs and NVSwitches and every
	// bridge above them, so PCIe distances can be computed from a recording.
	PCIDevices []PCIDevice `json:"pci_devices"`
	// GPUNICLevels and NICLevels are PCIe levels recorded as such, for an inventory
	// without a PCI tree: read from `nvidia-smi topo -m` (ParseNvidiaSMI). GPUNICLevel
	// and the matrix use them before the tree. Empty for a probed node.
	GPUNICLevels []GPUNICLevel `json:"gpu_nic_levels,omitempty"`
	NICLevels    []NICLevel    `json:"nic_levels,omitempty"`
	// Notes explain what is missing or odd, one line each ("no GPUs: ...").
	Notes []string `json:"notes"`
}

// CPUInfo describes the node's processors, as /proc/cpuinfo and sysfs report them.
type CPUInfo struct {
	// Arch is the machine architecture as `uname -m` prints it: x86_64, aarch64, ppc64le.
	Arch string `json:"arch"`
	// Vendor is the CPUID vendor string on x86 (GenuineIntel, AuthenticAMD), else the
	// implementer's name (ARM, NVIDIA, ...) or "unknown".
	Vendor string `json:"vendor"`
	// FamilyID and ModelID are the CPUID family and model ("cpu family", "model" in
	// /proc/cpuinfo); NCCL uses them to pick its inter-socket bandwidth. 0 off x86.
	FamilyID int `json:"family_id"`
	ModelID  int `json:"model_id"`
	// ModelName is the marketing name ("Intel(R) Xeon(R) Platinum 8480C"); may be empty.
	ModelName string `json:"model_name,omitempty"`
	// Sockets is the number of physical packages.
	Sockets int `json:"sockets"`
	// LogicalCPUs is the number of online logical CPUs.
	LogicalCPUs int `json:"logical_cpus"`
}

// NUMANode is one NUMA node and its CPUs.
type NUMANode struct {
	// ID is the kernel's node number (/sys/devices/system/node/nodeN).
	ID int `json:"id"`
	// Socket is the physical package the node's CPUs belong to; -1 when unknown.
	Socket int `json:"socket"`
	// CPUs is the node's CPU list in the kernel's cpulist syntax ("0-55,112-167").
	CPUs string `json:"cpus"`
}

// GPU is one physical NVIDIA GPU.
type GPU struct {
	// Index is NVML's device index, the one nvidia-smi and CUDA (with
	// CUDA_DEVICE_ORDER=PCI_BUS_ID) use: GPUs in PCI bus id order.
	Index int `json:"index"`
	// UUID is NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
	UUID string `json:"uuid"`
	// Name is the product name ("NVIDIA H100 80GB HBM3").
	Name string `json:"name"`
	// MemoryBytes is the total framebuffer memory in bytes.
	MemoryBytes uint64 `json:"memory_bytes"`
	// PCIBusID is the sysfs form of the bus id, lowercase with a 4-digit domain
	// ("0000:1b:00.0"); nvidia-smi prints the same device as 00000000:1B:00.0.
	PCIBusID string `json:"pci_bus_id"`
	// Minor is the minor number of /dev/nvidiaN.
	Minor int `json:"minor_number"`
	// NUMANode is the NUMA node of the GPU's PCI device; -1 when the kernel does not say.
	NUMANode int `json:"numa_node"`
	// CPUAffinity is the CPU list closest to the GPU, in cpulist syntax ("0-55,112-167").
	CPUAffinity string `json:"cpu_affinity"`
	// ComputeCapability is the CUDA compute capability, "major.minor" ("9.0").
	ComputeCapability string `json:"compute_capability"`
	// TemperatureC is the core temperature in degrees Celsius when probed; 0 unknown.
	TemperatureC int `json:"temperature_c,omitempty"`
	// Health is the GPU's state when probed (and as updated by WatchHealth).
	Health Health `json:"health"`
	// MIGEnabled reports MIG mode in effect (not merely pending a reset).
	MIGEnabled bool `json:"mig_enabled"`
	// MIGDevices lists the MIG devices that exist (created instances, not the maximum
	// possible), by MIG device index. Empty unless MIGEnabled.
	MIGDevices []MIGDevice `json:"mig_devices,omitempty"`
	// NVLinks lists where the GPU's active NVLinks go, grouped by remote device.
	NVLinks []NVLinkRemote `json:"nvlinks,omitempty"`
	// NICs names the RDMA devices on the closest PCIe path to this GPU (all those at
	// the smallest PCIe level), by name; empty on a node without RDMA.
	NICs []string `json:"nics"`
}

// MIGDevice is one MIG device (a GPU instance with a compute instance) that exists.
type MIGDevice struct {
	// Index is NVML's MIG device index within the parent GPU.
	Index int `json:"index"`
	// UUID is "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", what CUDA_VISIBLE_DEVICES takes.
	UUID string `json:"uuid"`
	// Profile is the MIG profile name ("3g.20gb"), from the device name NVML reports.
	Profile string `json:"profile"`
	// MemoryBytes is the instance's memory in bytes.
	MemoryBytes uint64 `json:"memory_bytes"`
	// GPUInstanceID and ComputeInstanceID identify the instance on the parent GPU.
	GPUInstanceID     int `json:"gpu_instance_id"`
	ComputeInstanceID int `json:"compute_instance_id"`
}

// NVLinkRemote is a group of a GPU's active NVLinks that end at one remote device.
type NVLinkRemote struct {
	// PCIBusID is the remote device's bus id in sysfs form.
	PCIBusID string `json:"remote_pci_bus_id"`
	// Type is "gpu" or "nvswitch" (or "npu" for IBM NPUs, "unknown").
	Type string `json:"remote_type"`
	// Links is how many active links end there.
	Links int `json:"links"`
}

// Remote device types of NVLinkRemote.Type.
const (
	NVLinkRemoteGPU      = "gpu"
	NVLinkRemoteNVSwitch = "nvswitch"
	NVLinkRemoteNPU      = "npu"
	NVLinkRemoteUnknown  = "unknown"
)

// GPULink is the connection between GPUs A and B (A < B) as recorded at probe time.
type GPULink struct {
	// A and B are the GPUs' NVML indices, A < B.
	A int `json:"a"`
	B int `json:"b"`
	// NVLinks is the number of NVLinks between the pair; through an NVSwitch fabric it
	// is the smaller of the two GPUs' link counts into the fabric (what nvidia-smi shows).
	NVLinks int `json:"nvlinks"`
	// Level is the PCIe path between the pair, whether or not NVLink exists.
	Level Level `json:"level"`
}

// RDMADevice is one RDMA device: an InfiniBand HCA or a RoCE-capable NIC function.
type RDMADevice struct {
	// Name is the verbs device name (mlx5_0), /sys/class/infiniband/<name>.
	Name string `json:"name"`
	// PCIBusID is the PCI function, sysfs form; empty for devices without one.
	PCIBusID string `json:"pci_bus_id"`
	// NUMANode is the PCI device's NUMA node; -1 when unknown.
	NUMANode int `json:"numa_node"`
	// NodeGUID is the node GUID as sysfs prints it ("b83f:d203:00a1:b2c4").
	NodeGUID string `json:"node_guid"`
	// Model is the HCA type (MT4129) and FirmwareVersion its firmware; may be empty.
	Model           string `json:"model,omitempty"`
	FirmwareVersion string `json:"fw_version,omitempty"`
	// Ports lists the device's ports by number.
	Ports []RDMAPort `json:"ports"`
}

// RDMAPort is one port of an RDMA device.
type RDMAPort struct {
	// Port is the port number (from 1).
	Port int `json:"port"`
	// State is the logical state: DOWN, INIT, ARMED, ACTIVE or ACTIVE_DEFER.
	State string `json:"state"`
	// PhysState is the physical state: LinkUp, Polling, Disabled, ...
	PhysState string `json:"phys_state"`
	// RateGbps is the signalling rate in Gb/s (400 for 4X NDR); 0 when unknown.
	RateGbps float64 `json:"rate_gbps"`
	// Rate is the kernel's rate text ("400 Gb/sec (4X NDR)").
	Rate string `json:"rate"`
	// LinkLayer is InfiniBand or Ethernet (RoCE).
	LinkLayer string `json:"link_layer"`
	// PortGUID is the port GUID (low 64 bits of GID 0), sysfs notation; IB only.
	PortGUID string `json:"port_guid,omitempty"`
	// Netdev is the network interface on this port (IPoIB or the RoCE Ethernet
	// interface); empty when none was found.
	Netdev string `json:"netdev,omitempty"`
	// GIDs lists the non-empty entries of the port's GID table.
	GIDs []GID `json:"gids,omitempty"`
}

// Port states of RDMAPort.State.
const (
	PortActive = "ACTIVE"
	PortDown   = "DOWN"
)

// Link layers of RDMAPort.LinkLayer.
const (
	LinkLayerInfiniBand = "InfiniBand"
	LinkLayerEthernet   = "Ethernet"
)

// GID is one GID table entry of a port.
type GID struct {
	// Index is the GID index (what NCCL_IB_GID_INDEX names).
	Index int `json:"index"`
	// GID is the 128-bit GID as an IPv6 address ("::ffff:10.0.0.11", "fe80::...").
	GID string `json:"gid"`
	// Type is "IB/RoCE v1" or "RoCE v2" (gid_attrs/types); empty when not reported.
	Type string `json:"type,omitempty"`
	// Netdev is the interface the GID belongs to (gid_attrs/ndevs); RoCE only.
	Netdev string `json:"netdev,omitempty"`
}

// GID types of GID.Type, as the kernel spells them.
const (
	GIDTypeRoCEv1 = "IB/RoCE v1"
	GIDTypeRoCEv2 = "RoCE v2"
)

// Netdev is one network interface.
type Netdev struct {
	// Name is the interface name (/sys/class/net/<name>).
	Name string `json:"name"`
	// Type is "ether", "infiniband", "loopback" or "other:<ARPHRD number>".
	Type string `json:"type"`
	// OperState is the kernel's operstate: up, down, unknown, dormant, ...
	OperState string `json:"operstate"`
	// MTU is the MTU in bytes.
	MTU int `json:"mtu"`
	// MAC is the hardware address as sysfs prints it (20 bytes for IPoIB).
	MAC string `json:"mac,omitempty"`
	// SpeedMbps is the link speed in Mb/s; 0 when unknown or not reported.
	SpeedMbps int `json:"speed_mbps,omitempty"`
	// Virtual is true for interfaces without a device (lo, bridges, veths, tunnels).
	Virtual bool `json:"virtual"`
	// PCIBusID is the PCI function behind the interface; empty for virtual ones.
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// NUMANode is the PCI device's NUMA node; -1 when unknown or virtual.
	NUMANode int `json:"numa_node"`
	// Addresses lists the interface's IP addresses in CIDR notation.
	Addresses []string `json:"addresses"`
	// RDMADevice and RDMAPort name the RDMA port this interface sits on (IPoIB or RoCE).
	RDMADevice string `json:"rdma_device,omitempty"`
	RDMAPort   int    `json:"rdma_port,omitempty"`
}

// GPUNICLevel is the PCIe level between a GPU and an RDMA device, as recorded.
type GPUNICLevel struct {
	// GPU is the GPU's NVML index; NIC the RDMA device's name.
	GPU int    `json:"gpu"`
	NIC string `json:"nic"`
	// Level is the path between them (nvidia-smi's PIX ... SYS).
	Level Level `json:"level"`
}

// NICLevel is the PCIe level between two RDMA devices A < B (by name), as recorded.
type NICLevel struct {
	A     string `json:"a"`
	B     string `json:"b"`
	Level Level  `json:"level"`
}

// PCIDevice is one PCI function: a GPU, NIC, NVSwitch or a bridge above them.
type PCIDevice struct {
	// BusID is the function's address in sysfs form ("0000:16:00.0").
	BusID string `json:"bus_id"`
	// Parent is the upstream bridge's bus id, or the host bridge ("pci0000:15") for
	// devices on a root bus.
	Parent string `json:"parent"`
	// Class, Vendor, Device, SubsystemVendor and SubsystemDevice are the sysfs values
	// ("0x060400", "0x10de", ...).
	Class           string `json:"class"`
	Vendor          string `json:"vendor"`
	Device          string `json:"device"`
	SubsystemVendor string `json:"subsystem_vendor"`
	SubsystemDevice string `json:"subsystem_device"`
	// LinkSpeed is max_link_speed ("32.0 GT/s PCIe") and LinkWidth max_link_width (16).
	LinkSpeed string `json:"link_speed"`
	LinkWidth int    `json:"link_width"`
	// NUMANode is the device's NUMA node; -1 when unknown.
	NUMANode int `json:"numa_node"`
}

// Source yields a node's inventory: NewProber for the running machine, FileSource for
// a recording.
type Source interface {
	// Inventory returns the node's inventory. A node without GPUs or RDMA is not an
	// error (see Inventory.Notes); errors mean the inventory could not be made at all.
	Inventory(ctx context.Context) (*Inventory, error)
}

// FileSource returns a Source that reads the recorded inventory at path on every call
// (see LoadFile).
func FileSource(path string) Source { return fileSource(path) }

type fileSource string

func (f fileSource) Inventory(ctx context.Context) (*Inventory, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return LoadFile(string(f))
}

// MaxFileBytes is the largest recorded inventory LoadFile reads, in bytes (16 MiB). A
// node's inventory is a few tens of KiB; the bound keeps /dev/zero or a wrong path from
// exhausting memory.
const MaxFileBytes = 16 << 20

// ForNode returns node's inventory: read from the recorded file when one is given (a
// --topology-file), else probed on this machine. A file's errors are worded after the
// flag that names it ("--topology-file PATH: is a named pipe (FIFO), want a regular
// file"); a probe's are the prober's.
func ForNode(ctx context.Context, file, node string) (*Inventory, error) {
	if file == "" {
		return NewProber(ProbeOptions{Node: node}).Inventory(ctx)
	}
	inv, err := LoadFile(file)
	if err != nil {
		return nil, FlagError(err)
	}
	if node != "" && inv.FromNvidiaSMI() {
		inv.Node = node // an nvidia-smi recording names no node: --node-name's
	}
	return inv, nil
}

// FromNvidiaSMI reports whether the inventory was read from nvidia-smi output
// (ParseNvidiaSMI), not probed or recorded by gangrun.
func (inv *Inventory) FromNvidiaSMI() bool {
	for _, n := range inv.Notes {
		if n == smiNoteSource {
			return true
		}
	}
	return false
}

// FlagError words a LoadFile error after the --topology-file flag that named the file.
func FlagError(err error) error {
	var fe *FileError
	if errors.As(err, &fe) {
		return fmt.Errorf("--topology-file %s: %w", fe.Path, fe.Err)
	}
	return fmt.Errorf("--topology-file: %w", err)
}

// FileError is the error LoadFile returns: the file, and what is wrong with it.
type FileError struct {
	// Path is the file as given.
	Path string
	// Err says what is wrong, in one line, without the path.
	Err error
}

// Error returns "topology file PATH: what is wrong".
func (e *FileError) Error() string { return "topology file " + e.Path + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *FileError) Unwrap() error { return e.Err }

// LoadFile reads a recorded inventory: the JSON `gangrun topo --json` prints, or, for a
// node gangrun cannot run on, what `nvidia-smi topo -m` and/or `nvidia-smi -q -x`
// printed there (ParseNvidiaSMI; told apart by the first non-blank byte, '{' for JSON),
// named after the file without its extension. Errors
// are a *FileError naming the file and saying what is wrong: missing file; not a regular
// file (a named pipe, a directory, a device: refused before any read, so a FIFO never
// blocks); invalid JSON (with line and column, and for a value of the wrong type the
// field's path and what was expected, in JSON terms); a file over MaxFileBytes; a
// schema_version other than SchemaVersion; or inconsistent contents (a duplicate GPU
// index, a link to an unknown GPU, ...).
func LoadFile(path string) (*Inventory, error) {
	fail := func(err error) (*Inventory, error) { return nil, &FileError{Path: path, Err: err} }
	data, err := userfile.ReadFile(path, MaxFileBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fail(errors.New("no such file"))
	case errors.Is(err, userfile.ErrTooLarge):
		return fail(fmt.Errorf("larger than %d MiB: not a recorded inventory", MaxFileBytes>>20))
	case err != nil:
		var ue *userfile.Error
		if errors.As(err, &ue) {
			err = ue.Err // the path is FileError's
		}
		return fail(err)
	}
	if !looksLikeJSON(data) {
		// nvidia-smi's own output, recorded where gangrun cannot run: named after the
		// file ("dgx-07.txt" → dgx-07) until a --node-name says otherwise.
		base := filepath.Base(path)
		inv, err := ParseNvidiaSMI(data, strings.TrimSuffix(base, filepath.Ext(base)))
		if err != nil {
			return fail(fmt.Errorf("not a gangrun inventory (JSON) nor nvidia-smi output that reads: %w", err))
		}
		return inv, nil
	}
	inv, err := Decode(data)
	if err != nil {
		return fail(err)
	}
	return inv, nil
}

// Decode parses an inventory from JSON and checks it as LoadFile does.
func Decode(data []byte) (*Inventory, error) {
	var probe struct {
		SchemaVersion *int `json:"schema_version"`
	}
	// A byte-order mark, an empty file or a key given twice is refused in the file's
	// terms before anything is decoded (jsonfile.Check).
	if err := jsonfile.Check(data); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, jsonfile.Describe(data, err)
	}
	if probe.SchemaVersion == nil {
		return nil, fmt.Errorf("no schema_version: not a gangrun topology inventory")
	}
	switch v := *probe.SchemaVersion; {
	case v > SchemaVersion:
		// The reason every record's reader gives (internal/schema).
		return nil, &schema.NewerError{Kind: schema.Inventory, Got: v, Reads: SchemaVersion, Field: "schema_version"}
	case v != SchemaVersion:
		return nil, fmt.Errorf("schema_version %d is not supported (this gangrun reads %d)", v, SchemaVersion)
	}
	inv := &Inventory{}
	if err := json.Unmarshal(data, inv); err != nil {
		return nil, jsonfile.Describe(data, err)
	}
	inv.normalize()
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	return inv, nil
}

// Validate checks the inventory's internal consistency: GPU indices unique and
// non-negative, links between known GPUs with A < B and no pair twice, GPU NICs naming
// known RDMA devices, names unique. The error names the first bad value.
func (inv *Inventory) Validate() error {
	gpus := make(map[int]bool, len(inv.GPUs))
	for _, g := range inv.GPUs {
		if g.Index < 0 {
			return fmt.Errorf("gpu index %d is negative", g.Index)
		}
		if gpus[g.Index] {
			return fmt.Errorf("gpu index %d appears twice", g.Index)
		}
		gpus[g.Index] = true
		if err := g.Health.State.check(); err != nil {
			return fmt.Errorf("gpu %d: %w", g.Index, err)
		}
	}
	nics := make(map[string]bool, len(inv.RDMADevices))
	for _, d := range inv.RDMADevices {
		if nics[d.Name] {
			return fmt.Errorf("rdma device %q appears twice", d.Name)
		}
		nics[d.Name] = true
	}
	for _, g := range inv.GPUs {
		for _, n := range g.NICs {
			if !nics[n] {
				return fmt.Errorf("gpu %d: nic %q is not among rdma_devices", g.Index, n)
			}
		}
	}
	pairs := make(map[[2]int]bool, len(inv.GPULinks))
	for _, l := range inv.GPULinks {
		if !gpus[l.A] || !gpus[l.B] {
			return fmt.Errorf("gpu link %d-%d names an unknown gpu", l.A, l.B)
		}
		if l.A >= l.B {
			return fmt.Errorf("gpu link %d-%d: a must be smaller than b", l.A, l.B)
		}
		if pairs[[2]int{l.A, l.B}] {
			return fmt.Errorf("gpu link %d-%d appears twice", l.A, l.B)
		}
		if l.NVLinks < 0 {
			return fmt.Errorf("gpu link %d-%d: nvlinks %d is negative", l.A, l.B, l.NVLinks)
		}
		pairs[[2]int{l.A, l.B}] = true
	}
	for _, l := range inv.GPUNICLevels {
		if !gpus[l.GPU] || !nics[l.NIC] {
			return fmt.Errorf("gpu_nic_levels: gpu %d to %q names an unknown device", l.GPU, l.NIC)
		}
	}
	for _, l := range inv.NICLevels {
		if !nics[l.A] || !nics[l.B] {
			return fmt.Errorf("nic_levels: %q to %q names an unknown rdma device", l.A, l.B)
		}
	}
	names := make(map[string]bool, len(inv.Netdevs))
	for _, n := range inv.Netdevs {
		if names[n.Name] {
			return fmt.Errorf("netdev %q appears twice", n.Name)
		}
		names[n.Name] = true
	}
	return nil
}

// normalize replaces nil slices by empty ones and sorts everything into the
// documented order, so JSON output is stable.
func (inv *Inventory) normalize() {
	if inv.NUMANodes == nil {
		inv.NUMANodes = []NUMANode{}
	}
	if inv.GPUs == nil {
		inv.GPUs = []GPU{}
	}
	if inv.GPULinks == nil {
		inv.GPULinks = []GPULink{}
	}
	if inv.RDMADevices == nil {
		inv.RDMADevices = []RDMADevice{}
	}
	if inv.Netdevs == nil {
		inv.Netdevs = []Netdev{}
	}
	if inv.PCIDevices == nil {
		inv.PCIDevices = []PCIDevice{}
	}
	if inv.Notes == nil {
		inv.Notes = []string{}
	}
	for i := range inv.GPUs {
		if inv.GPUs[i].NICs == nil {
			inv.GPUs[i].NICs = []string{}
		}
	}
	for i := range inv.RDMADevices {
		if inv.RDMADevices[i].Ports == nil {
			inv.RDMADevices[i].Ports = []RDMAPort{}
		}
	}
	for i := range inv.Netdevs {
		if inv.Netdevs[i].Addresses == nil {
			inv.Netdevs[i].Addresses = []string{}
		}
	}
	sort.Slice(inv.NUMANodes, func(i, j int) bool { return inv.NUMANodes[i].ID < inv.NUMANodes[j].ID })
	sort.Slice(inv.GPUs, func(i, j int) bool { return inv.GPUs[i].Index < inv.GPUs[j].Index })
	sort.Slice(inv.GPULinks, func(i, j int) bool {
		if inv.GPULinks[i].A != inv.GPULinks[j].A {
			return inv.GPULinks[i].A < inv.GPULinks[j].A
		}
		return inv.GPULinks[i].B < inv.GPULinks[j].B
	})
	sort.Slice(inv.RDMADevices, func(i, j int) bool { return naturalLess(inv.RDMADevices[i].Name, inv.RDMADevices[j].Name) })
	sort.Slice(inv.Netdevs, func(i, j int) bool { return naturalLess(inv.Netdevs[i].Name, inv.Netdevs[j].Name) })
	sort.Slice(inv.PCIDevices, func(i, j int) bool { return inv.PCIDevices[i].BusID < inv.PCIDevices[j].BusID })
	sort.SliceStable(inv.GPUNICLevels, func(i, j int) bool {
		a, b := inv.GPUNICLevels[i], inv.GPUNICLevels[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		return naturalLess(a.NIC, b.NIC)
	})
	for i := range inv.NICLevels {
		if l := &inv.NICLevels[i]; naturalLess(l.B, l.A) {
			l.A, l.B = l.B, l.A
		}
	}
	sort.SliceStable(inv.NICLevels, func(i, j int) bool {
		a, b := inv.NICLevels[i], inv.NICLevels[j]
		if a.A != b.A {
			return naturalLess(a.A, b.A)
		}
		return naturalLess(a.B, b.B)
	})
}

// JSON returns the inventory as `gangrun topo --json` prints it: indented with two
// spaces, fields in declaration order, slices in the documented order, a final newline.
// Decoding the result and encoding it again gives the same bytes.
func (inv *Inventory) JSON() ([]byte, error) {
	c := *inv
	c.normalize()
	out, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode inventory of %s: %w", inv.Node, err)
	}
	return append(out, '\n'), nil
}

// GPU returns the GPU with NVML index i, or false.
func (inv *Inventory) GPU(i int) (*GPU, bool) {
	for k := range inv.GPUs {
		if inv.GPUs[k].Index == i {
			return &inv.GPUs[k], true
		}
	}
	return nil, false
}

// RDMADevice returns the RDMA device with the given name, or false.
func (inv *Inventory) RDMADevice(name string) (*RDMADevice, bool) {
	for k := range inv.RDMADevices {
		if inv.RDMADevices[k].Name == name {
			return &inv.RDMADevices[k], true
		}
	}
	return nil, false
}

// naturalLess orders names with embedded numbers numerically: mlx5_2 < mlx5_10,
// eth9 < eth10.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		ca, cb := a[0], b[0]
		if isDigit(ca) && isDigit(cb) {
			na, ra := leadingNumber(a)
			nb, rb := leadingNumber(b)
			if na != nb {
				return na < nb
			}
			if len(a)-len(ra) != len(b)-len(rb) { // "01" vs "1": shorter first
				return len(a)-len(ra) < len(b)-len(rb)
			}
			a, b = ra, rb
			continue
		}
		if ca != cb {
			return ca < cb
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// leadingNumber splits s into the value of its leading digits (saturating) and the rest.
func leadingNumber(s string) (uint64, string) {
	var n uint64
	i := 0
	for i < len(s) && isDigit(s[i]) {
		if n < 1<<59 {
			n = n*10 + uint64(s[i]-'0')
		}
		i++
	}
	return n, s[i:]
}
