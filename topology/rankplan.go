package topology

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUBind is how workers are bound to CPUs (`gangrun run --cpu-bind`).
type CPUBind string

// The CPU binding modes.
const (
	// CPUBindNUMA binds each worker to the CPUs of its GPU's NUMA node (or the GPU's
	// CPU affinity when the NUMA node is unknown), split fairly between the workers
	// whose GPUs share those CPUs. The default.
	CPUBindNUMA CPUBind = "numa"
	// CPUBindNone leaves the workers on every CPU gangrun may use.
	CPUBindNone CPUBind = "none"
)

// ParseCPUBind reads a --cpu-bind value ("" is CPUBindNUMA); the error names the value.
func ParseCPUBind(s string) (CPUBind, error) {
	switch CPUBind(s) {
	case "", CPUBindNUMA:
		return CPUBindNUMA, nil
	case CPUBindNone:
		return CPUBindNone, nil
	}
	return "", fmt.Errorf("--cpu-bind %q: want numa or none", s)
}

// MemBind is where a bound worker's memory comes from (`gangrun run --mem-bind`),
// after numactl's policies (numactl(8)).
type MemBind string

// The memory binding modes.
const (
	// MemBindLocal prefers the NUMA node of the worker's GPU (numactl --preferred):
	// other nodes only when it is full. The default.
	MemBindLocal MemBind = "local"
	// MemBindStrict allows that node only (numactl --membind): a worker that needs more
	// than it holds is OOM-killed rather than spill over.
	MemBindStrict MemBind = "strict"
	// MemBindNone sets no policy: Linux's default local allocation, wherever the worker
	// runs.
	MemBindNone MemBind = "none"
)

// ParseMemBind reads a --mem-bind value ("" is MemBindLocal); the error names the value.
func ParseMemBind(s string) (MemBind, error) {
	switch MemBind(s) {
	case "", MemBindLocal:
		return MemBindLocal, nil
	case MemBindStrict, MemBindNone:
		return MemBind(s), nil
	}
	return "", fmt.Errorf("--mem-bind %q: want local, strict or none", s)
}

// NCCLTopo says when workers get NCCL_TOPO_FILE (`gangrun run --nccl-topo`).
type NCCLTopo string

// The NCCL_TOPO_FILE modes.
const (
	// NCCLTopoAuto sets it when the probed PCIe tree is flat (FlatPCIe). The default.
	NCCLTopoAuto NCCLTopo = "auto"
	// NCCLTopoAlways sets it on every node with GPUs.
	NCCLTopoAlways NCCLTopo = "always"
	// NCCLTopoNever never sets it.
	NCCLTopoNever NCCLTopo = "never"
)

// ParseNCCLTopo reads a --nccl-topo value ("" is NCCLTopoAuto); the error names the value.
func ParseNCCLTopo(s string) (NCCLTopo, error) {
	switch NCCLTopo(s) {
	case "", NCCLTopoAuto:
		return NCCLTopoAuto, nil
	case NCCLTopoAlways, NCCLTopoNever:
		return NCCLTopo(s), nil
	}
	return "", fmt.Errorf("--nccl-topo %q: want auto, always or never", s)
}

// FlatPCIe reports whether the node's PCIe tree, as probed, is flat: it has GPUs, every
// GPU is in the recorded tree, all hang under one host bridge, and none sits behind a
// PCIe switch. That is what a VM's virtual PCIe tree looks like (nccl-tests issue 256:
// H200 VMs with low bus bandwidth), where NCCL's own topology detection sees no
// locality and needs an NCCL_TOPO_FILE.
func (inv *Inventory) FlatPCIe() bool {
	if len(inv.GPUs) == 0 {
		return false
	}
	t := newPCITree(inv.PCIDevices)
	host := ""
	for i, g := range inv.GPUs {
		chain, h, ok := t.ancestors(g.PCIBusID)
		if !ok || len(switches(chain)) > 0 {
			return false
		}
		if i == 0 {
			host = h
		} else if h != host {
			return false
		}
	}
	return true
}

// WriteNCCLTopoFile writes the node's NCCL topology file (WriteNCCLTopoXML) into dir,
// named after a hash of its contents, unless a file of that name is already there:
// the nodes' runs share one file per distinct topology. It returns the file's path.
func (inv *Inventory) WriteNCCLTopoFile(dir string) (string, error) {
	var buf bytes.Buffer
	if err := inv.WriteNCCLTopoXML(&buf); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	path := filepath.Join(dir, "nccl-topo-"+hex.EncodeToString(sum[:6])+".xml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("NCCL topology file: %w", err)
	}
	// dir is under a shared /tmp: one someone else made (or can write) could hold a
	// file of their choosing under the expected name.
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("NCCL topology file: %s is not a directory of this user's that only it may write", dir)
	}
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, buf.Bytes()) {
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, ".nccl-topo-*")
	if err != nil {
		return "", fmt.Errorf("NCCL topology file: %w", err)
	}
	_, err = tmp.Write(buf.Bytes())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("NCCL topology file: %w", err)
	}
	return path, nil
}

// RankPlan is what the node's topology gives one local rank.
type RankPlan struct {
	// LocalRank is the worker's local rank.
	LocalRank int
	// Device is the device the rank uses (local rank i uses the i-th device, modulo
	// their number); nil on a node without devices.
	Device *Device
	// CPUs is the rank's CPU set, ascending; nil when the rank is not bound.
	CPUs []int
	// Mems are the NUMA nodes the rank's memory comes from, under MemBind (the GPU's
	// node, else the nodes of its CPUs); nil when the rank is not bound or MemBind is
	// MemBindNone.
	Mems    []int
	MemBind MemBind
	// NCCL holds the rank's NCCL_* defaults, sorted by name (the user's own win).
	NCCL []EnvVar
}

// PlanOptions is the node-wide input of PlanRanks.
type PlanOptions struct {
	// Devices are the devices the node's workers use, in local-rank order.
	Devices []Device
	// NProc is the number of workers on the node.
	NProc int
	// CPUBind is the binding mode; "" is CPUBindNUMA.
	CPUBind CPUBind
	// MemBind is the memory policy of bound ranks; "" is MemBindLocal.
	MemBind MemBind
	// SocketIfname is the interface for NCCL_SOCKET_IFNAME (exact match); "" gives
	// SocketIfnameExclude.
	SocketIfname string
	// TopoFile is NCCL_TOPO_FILE; "" sets none.
	TopoFile string
}

// PlanRanks returns one RankPlan per local rank, and notes (for the log, once per
// node) saying why ranks are not bound. CPU binding: local rank i's CPUs are those of
// its GPU's NUMA node (GPU.NUMANode in NUMANodes), else the GPU's CPUAffinity; the
// ranks whose sets are equal share it fairly (splitCPUs). No rank is bound when the
// node has no devices, a rank's GPU has neither, or CPUBind is none. NCCL: see RankNCCLEnv.
func (inv *Inventory) PlanRanks(o PlanOptions) ([]RankPlan, []string) {
	plans := make([]RankPlan, o.NProc)
	sets := make([][]int, o.NProc)
	var notes []string
	bind := o.CPUBind != CPUBindNone
	if bind && len(o.Devices) == 0 {
		bind = false
		notes = append(notes, "no CPU binding: the node has no GPUs")
	}
	for i := range plans {
		plans[i].LocalRank = i
		if len(o.Devices) > 0 {
			d := o.Devices[i%len(o.Devices)]
			plans[i].Device = &d
		}
		var gpu *GPU
		if plans[i].Device != nil {
			gpu, _ = inv.GPU(plans[i].Device.GPU)
		}
		plans[i].NCCL = inv.RankNCCLEnv(gpu, o.SocketIfname, o.TopoFile)
		if !bind {
			continue
		}
		if gpu != nil {
			sets[i] = inv.gpuCPUs(gpu)
		}
		if len(sets[i]) == 0 {
			bind = false
			notes = append(notes, fmt.Sprintf("no CPU binding: the inventory knows neither the NUMA node nor the CPU affinity of the GPU of local rank %d", i))
		}
	}
	if !bind {
		return plans, notes
	}
	groups := map[string][]int{}
	for i, s := range sets {
		k := FormatCPUList(s)
		groups[k] = append(groups[k], i)
	}
	for _, ranks := range groups {
		for j, r := range ranks {
			plans[r].CPUs = splitCPUs(sets[r], j, len(ranks))
		}
	}
	if o.MemBind == "" {
		o.MemBind = MemBindLocal
	}
	if o.MemBind != MemBindNone {
		for i := range plans {
			var gpu *GPU
			if plans[i].Device != nil {
				gpu, _ = inv.GPU(plans[i].Device.GPU)
			}
			plans[i].Mems, plans[i].MemBind = inv.memNodes(gpu, plans[i].CPUs), o.MemBind
		}
	}
	return plans, notes
}

// memNodes returns the NUMA nodes a rank with GPU g bound to cpus takes its memory
// from: g's node when the inventory knows it, else every node holding one of cpus;
// nil when neither is known.
func (inv *Inventory) memNodes(g *GPU, cpus []int) []int {
	if g != nil && g.NUMANode >= 0 {
		for _, n := range inv.NUMANodes {
			if n.ID == g.NUMANode {
				return []int{n.ID}
			}
		}
	}
	var out []int
	for _, n := range inv.NUMANodes {
		nc, err := ParseCPUList(n.CPUs)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(nc, func(c int) bool { return slices.Contains(cpus, c) }) {
			out = append(out, n.ID)
		}
	}
	return out
}

// gpuCPUs returns the CPUs of the GPU's NUMA node, else its CPU affinity; nil if neither.
func (inv *Inventory) gpuCPUs(g *GPU) []int {
	if g.NUMANode >= 0 {
		for _, n := range inv.NUMANodes {
			if n.ID == g.NUMANode {
				if c := parseCPUListLoose(n.CPUs); len(c) > 0 {
					return c
				}
			}
		}
	}
	return parseCPUListLoose(g.CPUAffinity)
}

// splitCPUs returns part j of k fair parts of cpus (ascending). When every contiguous
// run of cpus has at least k CPUs, each run is split into k near-equal pieces and part
// j takes piece j of every run: with Linux's usual numbering ("0-55,112-167", hyper-
// threads in the second run) a part keeps both threads of its cores. Otherwise the
// list is split into k near-equal consecutive pieces; with fewer CPUs than parts, part j
// gets CPU j mod len(cpus).
func splitCPUs(cpus []int, j, k int) []int {
	if k <= 1 {
		return append([]int(nil), cpus...)
	}
	if len(cpus) < k {
		return []int{cpus[j%len(cpus)]}
	}
	var runs [][]int
	for i := 0; i < len(cpus); {
		e := i
		for e+1 < len(cpus) && cpus[e+1] == cpus[e]+1 {
			e++
		}
		runs = append(runs, cpus[i:e+1])
		i = e + 1
	}
	perRun := true
	for _, r := range runs {
		perRun = perRun && len(r) >= k
	}
	if !perRun {
		runs = [][]int{cpus}
	}
	var out []int
	for _, r := range runs {
		out = append(out, r[j*len(r)/k:(j+1)*len(r)/k]...)
	}
	return out
}

// RankNCCLEnv returns the NCCL settings of a worker using gpu (nil: none), sorted by
// name: NCCLEnv's, except that NCCL_IB_HCA lists first the active ports of the NICs
// on the GPU's own PCIe switch (GPU.NICs at level PIX or PXB), then the others;
// NCCL_SOCKET_IFNAME is "=" + ifname (exact match) when ifname is known, else
// SocketIfnameExclude; NCCL_TOPO_FILE is topoFile when set.
func (inv *Inventory) RankNCCLEnv(gpu *GPU, ifname, topoFile string) []EnvVar {
	env := inv.NCCLEnv()
	for i := range env {
		switch env[i].Name {
		case "NCCL_IB_HCA":
			if gpu != nil {
				env[i].Value = "=" + strings.Join(inv.hcaPortsNear(gpu), ",")
			}
		case "NCCL_SOCKET_IFNAME":
			if ifname != "" {
				env[i].Value = "=" + ifname
			}
		}
	}
	if topoFile != "" {
		env = append(env, EnvVar{"NCCL_TOPO_FILE", topoFile})
		sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	}
	return env
}

// hcaPortsNear is activeHCAPorts with the ports of gpu's switch-local NICs first.
func (inv *Inventory) hcaPortsNear(gpu *GPU) []string {
	near := map[string]bool{}
	for _, n := range gpu.NICs {
		if l, err := inv.GPUNICLevel(gpu.Index, n); err == nil && l <= LevelPXB {
			near[n] = true
		}
	}
	var first, rest []string
	for _, p := range inv.activeHCAPorts() {
		dev, _, _ := strings.Cut(p, ":")
		if near[dev] {
			first = append(first, p)
		} else {
			rest = append(rest, p)
		}
	}
	return append(first, rest...)
}

// InterfaceFor returns the name of this machine's network interface that NCCL's
// sockets should use to reach host (an IP address or a name): the interface holding
// the source address the kernel picks for a route to host (a UDP "connection" sends
// nothing), or the interface holding host itself when it is a local address. The
// error says why none was found.
func InterfaceFor(host string) (string, error) {
	if host == "" {
		return "", errors.New("no address to route to")
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return "", fmt.Errorf("route to %s: %w", host, err)
	}
	local := c.LocalAddr().(*net.UDPAddr).IP
	c.Close()
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(local) {
				return ifc.Name, nil
			}
		}
	}
	return "", fmt.Errorf("route to %s: no interface holds the source address %s", host, local)
}

// FormatRankEnv is a plan's variables as "NAME=value" lines for `gangrun topo --nccl-env
// --rank N`: the NCCL settings, then CUDA_VISIBLE_DEVICES when perRankDevice (a MIG
// node) and the CPU list and OMP_NUM_THREADS when the rank is bound.
func (p RankPlan) FormatRankEnv(perRankDevice bool) []string {
	var out []string
	for _, v := range p.NCCL {
		out = append(out, v.String())
	}
	if perRankDevice && p.Device != nil {
		out = append(out, "CUDA_VISIBLE_DEVICES="+p.Device.ID)
	}
	if p.CPUs != nil {
		out = append(out, "OMP_NUM_THREADS="+strconv.Itoa(len(p.CPUs)), "GANGRUN_CPUS="+FormatCPUList(p.CPUs))
	}
	return out
}

// HasMIG reports whether any of devices is a MIG device: CUDA then lets each process
// use one device only, so each worker gets its own CUDA_VISIBLE_DEVICES.
func HasMIG(devices []Device) bool {
	for _, d := range devices {
		if d.MIGProfile != "" {
			return true
		}
	}
	return false
}
