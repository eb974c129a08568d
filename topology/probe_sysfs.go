package topology

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// sysfs reads the kernel's view of devices under root ("/" on a real machine, a fixture
// tree in tests). Paths follow the kernel's layout (Documentation/ABI) and rdmamap's
// names for the InfiniBand class. rdmamap's own functions are not called: they read
// the fixed /sys and so cannot be pointed at a fixture, and its IPoIB lookup compares
// the node GUID where the port GUID is what the address carries.
type sysfs struct{ root string }

func (s sysfs) path(p ...string) string {
	return filepath.Join(append([]string{s.root}, p...)...)
}

// read returns a sysfs file's content without the trailing newline; "" on error.
func (s sysfs) read(p ...string) string {
	b, err := os.ReadFile(s.path(p...))
	if err != nil {
		return ""
	}
	return strings.TrimRight(string(b), "\n")
}

func (s sysfs) readInt(def int, p ...string) int {
	v, err := strconv.Atoi(strings.TrimSpace(s.read(p...)))
	if err != nil {
		return def
	}
	return v
}

// names lists a directory's entries, natural order; nil when it cannot be read.
func (s sysfs) names(p ...string) ([]string, error) {
	entries, err := os.ReadDir(s.path(p...))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Slice(out, func(i, j int) bool { return naturalLess(out[i], out[j]) })
	return out, nil
}

// rel returns the path of p relative to the root, with symlinks resolved, as an
// absolute path inside the root ("/sys/devices/pci0000:15/..."); false when p does not
// resolve inside the root.
func (s sysfs) resolve(p ...string) (string, bool) {
	real, err := filepath.EvalSymlinks(s.path(p...))
	if err != nil {
		return "", false
	}
	root, err := filepath.EvalSymlinks(s.root)
	if err != nil {
		return "", false
	}
	r, err := filepath.Rel(root, real)
	if err != nil || strings.HasPrefix(r, "..") {
		return "", false
	}
	return "/" + filepath.ToSlash(r), true
}

// isBusID reports whether s is a PCI function address: DDDD:BB:DD.F (4 to 8 hex
// digits of domain).
func isBusID(s string) bool {
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(dom) < 4 || len(dom) > 8 || !isHex(dom) {
		return false
	}
	return len(rest) == 7 && isHex(rest[0:2]) && rest[2] == ':' && isHex(rest[3:5]) && rest[5] == '.' && rest[6] >= '0' && rest[6] <= '7'
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// pciDevices returns the PCI functions busIDs and every bridge above them, from the
// device paths under /sys/devices (/sys/bus/pci/devices/<id> resolved). Ids sysfs does
// not know are left out.
func (s sysfs) pciDevices(busIDs []string) []PCIDevice {
	seen := map[string]bool{}
	var out []PCIDevice
	for _, id := range busIDs {
		if id == "" || seen[id] {
			continue
		}
		p, ok := s.resolve("sys/bus/pci/devices", id)
		if !ok {
			continue
		}
		parent := ""
		dir := ""
		for _, comp := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
			dir = dir + "/" + comp
			if !isBusID(comp) {
				parent = comp // a host bridge (pci0000:15) or a VMD-like domain
				continue
			}
			if !seen[comp] {
				seen[comp] = true
				out = append(out, s.pciDevice(dir, comp, parent))
			}
			parent = comp
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].BusID < out[j].BusID })
	return out
}

func (s sysfs) pciDevice(dir, busID, parent string) PCIDevice {
	return PCIDevice{
		BusID:           busID,
		Parent:          parent,
		Class:           s.read(dir, "class"),
		Vendor:          s.read(dir, "vendor"),
		Device:          s.read(dir, "device"),
		SubsystemVendor: s.read(dir, "subsystem_vendor"),
		SubsystemDevice: s.read(dir, "subsystem_device"),
		LinkSpeed:       s.read(dir, "max_link_speed"),
		LinkWidth:       s.readInt(0, dir, "max_link_width"),
		NUMANode:        s.readInt(-1, dir, "numa_node"),
	}
}

// localCPUList returns the CPUs closest to a PCI function (its local_cpulist).
func (s sysfs) localCPUList(busID string) string {
	if busID == "" {
		return ""
	}
	return canonicalCPUList(s.read("sys/bus/pci/devices", busID, "local_cpulist"))
}

// cpus reads the processor description (/proc/cpuinfo) and the NUMA nodes
// (/sys/devices/system/node).
func (s sysfs) cpus() (CPUInfo, []NUMANode) {
	info := parseCPUInfo(s.read("proc/cpuinfo"))
	online := parseCPUListLoose(s.read("sys/devices/system/cpu/online"))
	if len(online) > 0 {
		info.LogicalCPUs = len(online)
	}
	packages := map[int]bool{}
	pkgOf := func(cpu int) int {
		return s.readInt(-1, "sys/devices/system/cpu", fmt.Sprintf("cpu%d", cpu), "topology/physical_package_id")
	}
	for _, c := range online {
		if p := pkgOf(c); p >= 0 {
			packages[p] = true
		}
	}
	if len(packages) > 0 {
		info.Sockets = len(packages)
	}

	nodes := []NUMANode{}
	names, _ := s.names("sys/devices/system/node")
	for _, n := range names {
		id, err := strconv.Atoi(strings.TrimPrefix(n, "node"))
		if !strings.HasPrefix(n, "node") || err != nil {
			continue
		}
		list := canonicalCPUList(s.read("sys/devices/system/node", n, "cpulist"))
		node := NUMANode{ID: id, Socket: -1, CPUs: list}
		if cpus := parseCPUListLoose(list); len(cpus) > 0 {
			node.Socket = pkgOf(cpus[0])
		}
		nodes = append(nodes, node)
	}
	return info, nodes
}

// HostMemoryMiB returns this machine's memory in MiB (/proc/meminfo's MemTotal), 0 when
// it cannot be read.
func HostMemoryMiB() int64 {
	return parseMemTotal(sysfs{root: "/"}.read("proc/meminfo"))
}

// parseMemTotal returns /proc/meminfo text's MemTotal in MiB (the kernel writes it in
// KiB: "MemTotal:       16318412 kB"), 0 when it is missing or does not parse.
func parseMemTotal(text string) int64 {
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0
		}
		kib, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kib < 0 {
			return 0
		}
		return kib / 1024
	}
	return 0
}

// parseCPUInfo reads the first processor's description from /proc/cpuinfo text and
// counts processors and physical ids. Missing text gives the running architecture.
func parseCPUInfo(text string) CPUInfo {
	info := CPUInfo{Vendor: "unknown"}
	physical := map[string]bool{}
	first := true
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			if info.LogicalCPUs > 0 {
				first = false
			}
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "processor":
			info.LogicalCPUs++
		case "physical id":
			physical[val] = true
		}
		if !first {
			continue
		}
		switch key {
		case "vendor_id":
			info.Arch, info.Vendor = "x86_64", val
		case "cpu family":
			info.FamilyID, _ = strconv.Atoi(val)
		case "model":
			info.ModelID, _ = strconv.Atoi(val)
		case "model name":
			info.ModelName = val
		case "CPU implementer":
			info.Arch, info.Vendor = "aarch64", armImplementer(val)
		case "cpu":
			if strings.Contains(val, "POWER") {
				info.Arch, info.Vendor, info.ModelName = "ppc64le", "IBM", val
			}
		}
	}
	if info.Arch == "" {
		info.Arch = unameArch(runtime.GOARCH)
	}
	info.Sockets = len(physical)
	if info.Sockets == 0 && info.LogicalCPUs > 0 {
		info.Sockets = 1
	}
	return info
}

// armImplementer names an ARM "CPU implementer" code (ARM's MIDR_EL1 implementer ids).
func armImplementer(code string) string {
	switch strings.ToLower(code) {
	case "0x41":
		return "ARM"
	case "0x42":
		return "Broadcom"
	case "0x48":
		return "HiSilicon"
	case "0x4e":
		return "NVIDIA"
	case "0x50":
		return "APM"
	case "0x51":
		return "Qualcomm"
	case "0xc0":
		return "Ampere"
	}
	return code
}

// unameArch maps GOARCH to what `uname -m` prints.
func unameArch(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	case "ppc64le":
		return "ppc64le"
	}
	return goarch
}

// rdmaDevices reads every device of the InfiniBand class. An error (no class
// directory, no devices) is the reason there are none.
func (s sysfs) rdmaDevices() ([]RDMADevice, error) {
	class := strings.TrimPrefix(rdmamap.RdmaClassDir, "/")
	names, err := s.names(class)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return []RDMADevice{}, fmt.Errorf("%s does not exist (no RDMA driver loaded)", rdmamap.RdmaClassDir)
		}
		return []RDMADevice{}, fmt.Errorf("read %s: %w", rdmamap.RdmaClassDir, err)
	}
	if len(names) == 0 {
		return []RDMADevice{}, fmt.Errorf("%s is empty", rdmamap.RdmaClassDir)
	}
	out := make([]RDMADevice, 0, len(names))
	for _, name := range names {
		out = append(out, s.rdmaDevice(class, name))
	}
	return out, nil
}

func (s sysfs) rdmaDevice(class, name string) RDMADevice {
	dir := filepath.Join(class, name)
	d := RDMADevice{
		Name:            name,
		NUMANode:        s.readInt(-1, dir, "device/numa_node"),
		NodeGUID:        s.read(dir, rdmamap.RdmaNodeGuidFile),
		Model:           s.read(dir, "hca_type"),
		FirmwareVersion: s.read(dir, "fw_ver"),
		Ports:           []RDMAPort{},
	}
	if p, ok := s.resolve(dir, "device"); ok && isBusID(filepath.Base(p)) {
		d.PCIBusID = filepath.Base(p)
	}
	ports, _ := s.names(dir, rdmamap.RdmaPortsdir)
	for _, pn := range ports {
		num, err := strconv.Atoi(pn)
		if err != nil {
			continue
		}
		d.Ports = append(d.Ports, s.rdmaPort(filepath.Join(dir, rdmamap.RdmaPortsdir, pn), num))
	}
	return d
}

func (s sysfs) rdmaPort(dir string, num int) RDMAPort {
	p := RDMAPort{
		Port:      num,
		State:     afterColon(s.read(dir, "state")),
		PhysState: afterColon(s.read(dir, "phys_state")),
		Rate:      s.read(dir, "rate"),
		LinkLayer: s.read(dir, "link_layer"),
	}
	if f := strings.Fields(p.Rate); len(f) > 0 {
		p.RateGbps, _ = strconv.ParseFloat(f[0], 64)
	}
	gids, _ := s.names(dir, "gids")
	for _, gn := range gids {
		idx, err := strconv.Atoi(gn)
		if err != nil {
			continue
		}
		addr, err := netip.ParseAddr(s.read(dir, "gids", gn))
		if err != nil || addr.IsUnspecified() {
			continue // empty table entry
		}
		g := GID{
			Index:  idx,
			GID:    addr.String(),
			Type:   s.read(dir, rdmamap.RdmaGidAttrDir, "types", gn),
			Netdev: s.read(dir, rdmamap.RdmaGidAttrDir, rdmamap.RdmaGidAttrNdevDir, gn),
		}
		p.GIDs = append(p.GIDs, g)
		if idx == 0 && p.LinkLayer == LinkLayerInfiniBand {
			raw := addr.As16()
			p.PortGUID = guidText(raw[8:])
		}
	}
	return p
}

// afterColon turns sysfs's "4: ACTIVE" into "ACTIVE".
func afterColon(s string) string {
	if _, v, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(s)
}

// guidText prints 8 bytes the way sysfs prints GUIDs: "b83f:d203:00a1:b2c4".
func guidText(b []byte) string {
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7])
}

// ipoibPortGUID extracts the port GUID from an IPoIB hardware address: 20 bytes, the
// last 8 of which are the port GUID (RFC 4391, section 9.1.1).
func ipoibPortGUID(mac string) (string, bool) {
	parts := strings.Split(mac, ":")
	if len(parts) != 20 {
		return "", false
	}
	b := make([]byte, 8)
	for i, h := range parts[12:] {
		v, err := strconv.ParseUint(h, 16, 8)
		if err != nil {
			return "", false
		}
		b[i] = byte(v)
	}
	return guidText(b), true
}

// netdevs reads every interface of /sys/class/net, with addresses from addrs, and
// returns each physical interface's dev_port (its port index on a multi-port PCI
// function) by name.
func (s sysfs) netdevs(addrs func(string) ([]netip.Prefix, error)) ([]Netdev, map[string]int) {
	out := []Netdev{}
	devPorts := map[string]int{}
	names, _ := s.names("sys/class/net")
	for _, name := range names {
		dir := filepath.Join("sys/class/net", name)
		n := Netdev{
			Name:      name,
			Type:      arphrdType(s.readInt(-1, dir, "type")),
			OperState: s.read(dir, "operstate"),
			MTU:       s.readInt(0, dir, "mtu"),
			MAC:       s.read(dir, "address"),
			NUMANode:  -1,
			Addresses: []string{},
		}
		if sp := s.readInt(0, dir, "speed"); sp > 0 {
			n.SpeedMbps = sp
		}
		if p, ok := s.resolve(dir, "device"); ok && isBusID(filepath.Base(p)) {
			n.PCIBusID = filepath.Base(p)
			n.NUMANode = s.readInt(-1, dir, "device/numa_node")
			devPorts[name] = s.readInt(0, dir, "dev_port")
		} else if _, err := os.Lstat(s.path(dir, "device")); err != nil {
			n.Virtual = true
		}
		if ps, err := addrs(name); err == nil {
			for _, p := range ps {
				n.Addresses = append(n.Addresses, p.String())
			}
		}
		out = append(out, n)
	}
	return out, devPorts
}

// arphrdType names the ARPHRD_* link type of /sys/class/net/<if>/type
// (include/uapi/linux/if_arp.h).
func arphrdType(t int) string {
	switch t {
	case 1:
		return "ether"
	case 32:
		return "infiniband"
	case 772:
		return "loopback"
	}
	return fmt.Sprintf("other:%d", t)
}

// parseCPUListLoose reads the kernel's cpulist syntax ("0-3,8,10-11"), skipping
// malformed parts, in ascending order without duplicates.
func parseCPUListLoose(s string) []int {
	cpus, _ := ParseCPUList(s)
	return cpus
}

// maxCPUListCPU bounds CPU numbers ParseCPUList accepts (the kernel's NR_CPUS limit is
// 8192).
const maxCPUListCPU = 8191

// ParseCPUList parses the kernel's cpulist syntax ("0-55,112-167"; see
// Documentation/admin-guide/cputopology.rst) into ascending CPU numbers without
// duplicates. An empty string is an empty list. The error names the first malformed
// range; the CPUs read before it are still returned.
func ParseCPUList(s string) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	var firstErr error
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, errA := strconv.Atoi(lo)
		b := a
		var errB error
		if isRange {
			b, errB = strconv.Atoi(hi)
		}
		if errA != nil || errB != nil || a < 0 || b < a || b > maxCPUListCPU {
			if firstErr == nil {
				firstErr = fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
			continue
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	sort.Ints(out)
	return out, firstErr
}

// FormatCPUList writes CPU numbers in the kernel's cpulist syntax, ranges collapsed:
// [0 1 2 3 8] → "0-3,8". The input need not be sorted.
func FormatCPUList(cpus []int) string {
	c := append([]int(nil), cpus...)
	sort.Ints(c)
	var b bytes.Buffer
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] <= c[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if c[i] == c[j] {
			fmt.Fprintf(&b, "%d", c[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", c[i], c[j])
		}
		i = j + 1
	}
	return b.String()
}

func canonicalCPUList(s string) string { return FormatCPUList(parseCPUListLoose(s)) }

// cpuListFromMask turns NVML's CPU affinity mask (64-bit words, CPU 0 in bit 0 of word
// 0) into a cpulist.
func cpuListFromMask(mask []uint) string {
	var cpus []int
	for w, word := range mask {
		for bit := 0; bit < 64; bit++ {
			if uint64(word)&(1<<uint(bit)) != 0 {
				cpus = append(cpus, w*64+bit)
			}
		}
	}
	return FormatCPUList(cpus)
}
