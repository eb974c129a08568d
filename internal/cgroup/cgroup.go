// Package cgroup confines a step (one `gangrun run`, or a cluster job's step on a node)
// to a control group of its own, as Slurm's task/cgroup plugin does: a cpuset of its
// ranks' CPUs (ConstrainCores), a memory limit (ConstrainRAMSpace, --mem), a pids limit,
// and, where the node can, no access to the node's GPUs it was not given
// (ConstrainDevices). It uses containerd's cgroups library
// (github.com/containerd/cgroups/v3: its cgroup1 package for v1, cgroup2 for v2) for
// the hierarchy's files. cgroup2 brings github.com/cilium/ebpf, with which it builds
// and attaches v2's device program (v2 has no devices files), and containerd's logger:
// 1.8 MB more binary, under 0.3 ms more start-up (their package init, measured with
// GODEBUG=inittrace=1).
//
// Which hierarchy: cgroup v1 where its controllers are mounted (a legacy or hybrid
// node, as /sys/fs/cgroup/{cpuset,memory,...}), cgroup v2 where the node has only the
// unified hierarchy (/sys/fs/cgroup is cgroup2fs: Ubuntu 22.04 and later, RHEL 9). A
// hybrid node keeps v1: its v2 mount (/sys/fs/cgroup/unified) has the controllers
// bound to v1 taken away. The environment variable GANGRUN_CGROUP2_ROOT (Cgroup2RootEnv)
// names a cgroup2 mount to use instead, for tests and for a hybrid node whose v2
// hierarchy holds the controllers.
//
// A worker is in the step's cgroup from its first instruction. cgroup v1: the thread
// that forks it joins the cgroup for the moment of the fork (a child inherits its
// forking thread's cgroups) and leaves it again (Enter, Leave; proc.StartPlaced), as
// v1 lets a single thread move (its "tasks" file). cgroup v2 does not (a thread may
// only move with its whole process, threaded mode aside), so the worker is created
// inside: clone3 with CLONE_INTO_CGROUP and the step directory's descriptor (CgroupFD;
// Go's SysProcAttr.UseCgroupFD; Linux 5.7). Moving the child after its start was the
// other way, and was not taken: whatever it ran before the move (its first threads,
// a process it forked) would be outside, and the move costs a migration per worker.
// See newV2 for v2's parent cgroup, controllers and devices.
//
// Linux only.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/topology"
)

// Mode is --cgroup: whether a step is confined to a cgroup of its own.
type Mode string

// The values of --cgroup.
const (
	// Off runs the step in gangrun's own cgroups.
	Off Mode = "off"
	// Auto confines the step when the node allows it, and otherwise says why once and
	// runs it unconfined. The default.
	Auto Mode = "auto"
	// Required fails the step when it cannot be confined.
	Required Mode = "required"
)

// ParseMode parses --cgroup: "off", "auto" (also "") or "required".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", Auto:
		return Auto, nil
	case Off, Required:
		return Mode(s), nil
	}
	return "", fmt.Errorf("--cgroup %q: want off, auto or required", s)
}

// DefaultPidsLimit is --pids-limit: the most tasks (processes and threads: the pids
// controller counts both) a step may have on a node at once. A torch worker holds
// about 50 to 100 threads, a DataLoader worker a dozen more: 8 ranks with 16 loader
// workers each stay under 4,000, and 32768 leaves room while still stopping a fork
// bomb before it takes the node's pid space (kernel.pid_max is 32768 on many systems).
const DefaultPidsLimit = 32768

// MaxMem bounds --mem: 1 PiB per node, so that a unit typed for another (T for G) is
// refused rather than read as no limit.
const MaxMem = int64(1) << 50

// MinMem is the smallest --mem other than 0: below it, the kernel's own allocations for
// the thread that moves workers into the cgroup (opening the cgroup's files) fail, and
// no worker could start anyway.
const MinMem = int64(16) << 20

// ParseMem parses --mem the way Slurm's --mem is read: a whole number with an
// optional unit suffix K, M, G or T (either case; powers of 1024), which may be
// followed by B ("4GB", as Slurm 22.05 accepts it), megabytes when none is given;
// "0" means no limit (Slurm: all the node's memory). It returns bytes per node.
// Errors name the value.
func ParseMem(s string) (int64, error) {
	n, err := ParseMemSize(s)
	if err == nil && n != 0 && n < MinMem {
		return 0, fmt.Errorf("--mem %q: want at least 16M (or 0 for no limit): a step needs more to start", s)
	}
	return n, err
}

// ParseMemSize parses a memory size as ParseMem does, without its least limit: a
// part of a node's memory (sbatch's --mem-per-cpu, --mem-per-gpu), which the node's
// total (the limit) is made of.
func ParseMemSize(s string) (int64, error) {
	bad := fmt.Errorf("--mem %q: want a size such as 4G, 500M or 1024 (megabytes), or 0 for no limit", s)
	v := strings.TrimSpace(s)
	if v == "" {
		return 0, bad
	}
	unit := int64(1) << 20
	if n := len(v); n >= 2 && (v[n-1] == 'B' || v[n-1] == 'b') && strings.ContainsRune("kKmMgGtT", rune(v[n-2])) {
		v = v[:n-1] // "4GB" is 4G, as Slurm 22.05's sbatch reads it (submitit writes --mem=NGB)
	}
	switch v[len(v)-1] {
	case 'k', 'K':
		unit, v = 1<<10, v[:len(v)-1]
	case 'm', 'M':
		unit, v = 1<<20, v[:len(v)-1]
	case 'g', 'G':
		unit, v = 1<<30, v[:len(v)-1]
	case 't', 'T':
		unit, v = 1<<40, v[:len(v)-1]
	}
	if v == "" || strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return 0, bad
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > MaxMem/unit {
		return 0, fmt.Errorf("--mem %q: want at most 1P per node", s)
	}
	return n * unit, nil
}

// FormatMem writes bytes as --mem would take them, in the largest unit that divides
// them: 4294967296 is "4G", 1536 MiB "1536M", 0 "0".
func FormatMem(b int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if b != 0 && b%u.n == 0 {
			return strconv.FormatInt(b/u.n, 10) + u.s
		}
	}
	return strconv.FormatInt(b, 10)
}

// NVIDIAMajor is the major number of the NVIDIA driver's character devices:
// /dev/nvidiaN (minor N, the GPU's minor number), /dev/nvidiactl (255) and
// /dev/nvidia-modeset (254); NV_MAJOR_DEVICE_NUMBER in the driver's source.
const NVIDIAMajor = 195

// DeviceRule is one line of a cgroup v1 devices.deny or devices.allow file.
type DeviceRule struct {
	// Allow is true for devices.allow, false for devices.deny.
	Allow bool
	// Type is "c" (character), "b" (block) or "a" (all).
	Type string
	// Major and Minor are the device's numbers; -1 is any.
	Major, Minor int64
	// Access is a subset of "rwm": read, write, mknod.
	Access string
	// Path names the device node, for messages ("/dev/nvidia3").
	Path string
}

// String is the rule as the kernel's devices.list shows it, with the file it goes to:
// "deny c 195:3 rwm".
func (r DeviceRule) String() string {
	verb := "deny"
	if r.Allow {
		verb = "allow"
	}
	num := func(n int64) string {
		if n < 0 {
			return "*"
		}
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%s %s %s:%s %s", verb, r.Type, num(r.Major), num(r.Minor), r.Access)
}

// GPUDeviceRules returns the device rules that confine a step to devices, the devices
// its workers are given, on the node of inv: each GPU of the node none of whose
// devices is among them (a whole GPU, or one of its MIG devices) is denied, its
// /dev/nvidiaN (major NVIDIAMajor, minor the GPU's minor number), read, write and
// mknod. Slurm's ConstrainDevices does the same from gres.conf: the step's cgroup
// inherits its parent's access and loses the GPUs not granted. The control devices
// (/dev/nvidiactl, /dev/nvidia-uvm) stay usable; a MIG device's capability nodes
// (/dev/nvidia-caps) are not narrowed. Nil when every GPU is given, or the node has
// none.
func GPUDeviceRules(inv *topology.Inventory, devices []topology.Device) []DeviceRule {
	given := map[int]bool{}
	for _, d := range devices {
		given[d.GPU] = true
	}
	var out []DeviceRule
	for _, g := range inv.GPUs {
		if given[g.Index] {
			continue
		}
		out = append(out, DeviceRule{Type: "c", Major: NVIDIAMajor, Minor: int64(g.Minor), Access: "rwm",
			Path: "/dev/nvidia" + strconv.Itoa(g.Minor)})
	}
	return out
}

// Limits is what a step's cgroup holds it to.
type Limits struct {
	// CPUs is the step's cpuset (cpuset.cpus): the union of its ranks' CPU sets; nil
	// is every CPU gangrun's own cpuset has.
	CPUs []int
	// MemoryBytes is the memory limit (memory.limit_in_bytes, and with swap accounting
	// memory.memsw.limit_in_bytes too: no swap beyond it); 0 is none.
	MemoryBytes int64
	// PidsLimit is pids.max; 0 is none.
	PidsLimit int64
	// Devices are the devices rules (GPUDeviceRules), applied where the devices
	// controller exists.
	Devices []DeviceRule
}

// controllers are the cgroup v1 controllers a step uses, in the order it joins them.
var controllers = []cgroup1.Name{cgroup1.Cpuset, cgroup1.Memory, cgroup1.Pids, cgroup1.Devices}

// Step is a step's cgroup: one directory per controller, named alike in each
// hierarchy, below gangrun's own cgroup there. Create it with New; Delete it when the
// step ends.
type Step struct {
	name  string
	cg    cgroup1.Cgroup // the step's (v1)
	own   cgroup1.Cgroup // gangrun's own, where a thread that forked a worker goes back (v1)
	dirs  []string
	names []string

	v2  *cgroup2.Manager // the step's, on cgroup v2; nil on v1
	fd  int              // v2: the step directory, open for CLONE_INTO_CGROUP; -1 on v1
	why string           // v2: what the step is not held to, and why (Why)
}

// Unusable is the error New returns when the node's cgroups cannot confine a step
// (no cgroup v1 controllers, a read-only hierarchy, no permission): Auto then runs
// the step unconfined.
type Unusable struct{ Why string }

// Error is "cgroups cannot be used: " and why.
func (e *Unusable) Error() string { return "cgroups cannot be used: " + e.Why }

// New creates the step's cgroup name (a single path element, unique on the node: the
// caller adds its pid and a random part) and sets lim: on cgroup v1, below gangrun's
// own cgroup in each of the cpuset, memory, pids and devices hierarchies that are
// mounted; on cgroup v2 (see the package doc), one directory beside gangrun's own
// cgroup (newV2). An error that is the node's (*Unusable) says why in plain words;
// nothing is left behind on error.
func New(name string, lim Limits) (*Step, error) {
	if name == "" || strings.ContainsAny(name, "/\n") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup name %q: want one path element", name)
	}
	root, err := v2Root()
	if err != nil {
		return nil, err
	}
	if root != "" {
		return newV2(name, lim, root)
	}
	if cgroups.Mode() == cgroups.Unavailable {
		return nil, &Unusable{"no cgroup file system is mounted (/sys/fs/cgroup)"}
	}
	if os.Geteuid() != 0 {
		return nil, &Unusable{fmt.Sprintf("gangrun runs as uid %d, and only root may create cgroups here", os.Geteuid())}
	}
	h, err := loadHierarchies()
	if err != nil {
		return nil, err
	}
	use, names, own := h.use, h.names, h.own
	if lim.MemoryBytes > 0 && !slices.Contains(names, string(cgroup1.Memory)) {
		return nil, &Unusable{"--mem needs the memory controller, which is not mounted under /sys/fs/cgroup"}
	}
	hier := cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return use, nil })
	path := func(n cgroup1.Name) (string, error) {
		p, err := h.ownPath(n)
		if err != nil {
			return "", err
		}
		return filepath.Join(p, name), nil
	}
	var dirs []string
	for _, s := range use {
		p, _ := path(s.Name())
		dirs = append(dirs, filepath.Join(cgroupRoot, string(s.Name()), p))
	}
	for _, d := range dirs {
		if _, err := os.Lstat(d); err == nil {
			return nil, fmt.Errorf("cgroup %s exists already: another step has this name", d)
		}
	}
	res := resources(lim, names)
	cg, err := cgroup1.New(path, res, hier)
	if err != nil {
		removeDirs(dirs)
		return nil, whyNot(err, dirs, lim)
	}
	return &Step{name: name, cg: cg, own: own, dirs: dirs, names: names, fd: -1}, nil
}

// hierarchies are the cgroup v1 hierarchies this process uses, read once: gangrun's
// own cgroups do not change while it runs, and reading them (the mount table for each
// controller) is most of the cost of New.
type hierarchies struct {
	use     []cgroup1.Subsystem
	names   []string
	ownPath cgroup1.Path
	own     cgroup1.Cgroup
}

var (
	hierOnce sync.Once
	hier     *hierarchies
	hierErr  error
)

// loadHierarchies finds the controllers a step uses among those mounted and this
// process's own cgroup in each (once per process).
func loadHierarchies() (*hierarchies, error) {
	hierOnce.Do(func() { hier, hierErr = readHierarchies() })
	return hier, hierErr
}

func readHierarchies() (*hierarchies, error) {
	subsystems, err := cgroup1.Default()
	if err != nil {
		return nil, &Unusable{"the cgroup v1 hierarchies cannot be listed: " + err.Error()}
	}
	ownPath := cgroup1.NestedPath("")
	h := &hierarchies{}
	paths := map[cgroup1.Name]string{}
	for _, c := range controllers {
		for _, s := range subsystems {
			if s.Name() != c {
				continue
			}
			p, err := ownPath(c)
			if err != nil {
				continue // not a hierarchy this process is in
			}
			paths[c] = p
			h.use = append(h.use, s)
			h.names = append(h.names, string(c))
		}
	}
	if !slices.Contains(h.names, string(cgroup1.Cpuset)) && !slices.Contains(h.names, string(cgroup1.Memory)) {
		return nil, &Unusable{"neither the cpuset nor the memory controller of cgroup v1 is mounted under /sys/fs/cgroup"}
	}
	h.ownPath = func(n cgroup1.Name) (string, error) {
		p, ok := paths[n]
		if !ok {
			return "", cgroup1.ErrControllerNotActive
		}
		return p, nil
	}
	if h.own, err = cgroup1.Load(h.ownPath, cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return h.use, nil })); err != nil {
		return nil, &Unusable{"gangrun's own cgroup cannot be read: " + err.Error()}
	}
	return h, nil
}

// cgroupRoot is where the cgroup v1 hierarchies are mounted (containerd's library
// reads the same from /proc/self/mountinfo; every distribution mounts them here).
const cgroupRoot = "/sys/fs/cgroup"

// resources is lim in the OCI runtime spec's form, which the library takes.
func resources(lim Limits, names []string) *specs.LinuxResources {
	res := &specs.LinuxResources{}
	if len(lim.CPUs) > 0 {
		res.CPU = &specs.LinuxCPU{Cpus: topology.FormatCPUList(lim.CPUs)}
	}
	if lim.MemoryBytes > 0 {
		m := lim.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &m}
		if _, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes")); err == nil {
			sw := m // memory+swap = memory: the step does not swap beyond its limit
			res.Memory.Swap = &sw
		}
	}
	if lim.PidsLimit > 0 {
		p := lim.PidsLimit
		res.Pids = &specs.LinuxPids{Limit: &p}
	}
	if slices.Contains(names, string(cgroup1.Devices)) {
		for _, r := range lim.Devices {
			maj, minr := r.Major, r.Minor
			res.Devices = append(res.Devices, specs.LinuxDeviceCgroup{Allow: r.Allow, Type: r.Type, Major: &maj, Minor: &minr, Access: r.Access})
		}
	}
	return res
}

// whyNot words an error creating the step's cgroup.
func whyNot(err error, dirs []string, lim Limits) error {
	switch {
	case errors.Is(err, unix.EROFS):
		return &Unusable{"the cgroup hierarchy is mounted read-only (" + err.Error() + ")"}
	case errors.Is(err, os.ErrPermission):
		return &Unusable{"no permission to create a cgroup (" + err.Error() + ")"}
	case errors.Is(err, unix.EINVAL) && len(lim.CPUs) > 0:
		return fmt.Errorf("cgroup: cpuset %s is not within gangrun's own cpuset: %w", topology.FormatCPUList(lim.CPUs), err)
	}
	return fmt.Errorf("create cgroup %s: %w", strings.Join(dirs, ", "), err)
}

// Name returns the step cgroup's name (the last element of each directory).
func (s *Step) Name() string { return s.name }

// Dirs returns the step's cgroup directories, absolute: on cgroup v1 one per
// controller used ("/sys/fs/cgroup/memory/.../NAME"), on v2 the one directory
// ("/sys/fs/cgroup/.../NAME").
func (s *Step) Dirs() []string { return slices.Clone(s.dirs) }

// Controllers returns the controllers the step's cgroup uses ("cpuset", "memory",
// "pids", "devices"), in that order. On cgroup v2 "devices" stands for the eBPF
// device program that holds it to its devices rules, listed when it is attached.
func (s *Step) Controllers() []string { return slices.Clone(s.names) }

// V2 reports whether the step's cgroup is on the unified hierarchy (cgroup v2).
func (s *Step) V2() bool { return s.v2 != nil }

// Why is one line on what the step's cgroup does not hold it to although asked, and
// why: on cgroup v2, a controller its parent cgroup does not offer (the CPUs, the pids
// limit), or device rules the kernel's eBPF refused. "" when nothing is missing (and
// always on v1, which uses the controllers that are mounted).
func (s *Step) Why() string { return s.why }

// CgroupFD returns the step's cgroup v2 directory, open, for clone3's
// CLONE_INTO_CGROUP (proc.ClonePlacement); -1 on cgroup v1, whose steps are entered by
// thread (Enter). Valid until Delete.
func (s *Step) CgroupFD() int { return s.fd }

// errThreadMove is Enter's and Leave's answer on cgroup v2.
var errThreadMove = errors.New("cgroup v2 does not move a single thread: start the process into the step's cgroup (CgroupFD)")

// Enter moves thread tid (of this process) into the step's cgroup in every hierarchy:
// what it forks next starts there. Its CPU affinity becomes the step's cpuset (the
// kernel resets it on a cpuset move). cgroup v1 only: on v2 it fails (errThreadMove).
func (s *Step) Enter(tid int) error {
	if s.v2 != nil {
		return errThreadMove
	}
	if err := s.cg.AddTask(cgroup1.Process{Pid: tid}); err != nil {
		_ = s.Leave(tid)
		return fmt.Errorf("move thread %d into cgroup %s: %w", tid, s.name, err)
	}
	return nil
}

// Leave moves thread tid back into gangrun's own cgroups (cgroup v1 only).
func (s *Step) Leave(tid int) error {
	if s.v2 != nil {
		return errThreadMove
	}
	if err := s.own.AddTask(cgroup1.Process{Pid: tid}); err != nil {
		return fmt.Errorf("move thread %d back out of cgroup %s: %w", tid, s.name, err)
	}
	return nil
}

// OOMKills returns how many processes the kernel's OOM killer has killed in the
// step's cgroup: on v1 memory.oom_control's oom_kill (kernel 4.13 and later), on v2
// memory.events' oom_kill; 0 without the memory controller or when it cannot be read.
// memory.failcnt is no substitute: with the memory+swap limit set it stays 0 on kernel
// 6.18 while the OOM killer kills.
func (s *Step) OOMKills() uint64 {
	if !slices.Contains(s.names, string(cgroup1.Memory)) {
		return 0
	}
	if s.v2 != nil {
		st, err := s.v2.StatFiltered(cgroup2.StatMemoryEvents)
		if err != nil || st.MemoryEvents == nil {
			return 0
		}
		return st.MemoryEvents.OomKill
	}
	st, err := s.cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil || st.MemoryOomControl == nil {
		return 0
	}
	return st.MemoryOomControl.OomKill
}

// PidsRefused returns how many times the step's pids limit refused a fork or clone
// (pids.events' "max" count, v1 and v2 alike: the kernel's cgroup-v1/pids.rst and
// cgroup-v2.rst), 0 without the pids controller. The library's stats carry no events.
func (s *Step) PidsRefused() uint64 {
	if !slices.Contains(s.names, string(cgroup1.Pids)) {
		return 0
	}
	for _, d := range s.dirs {
		data, err := os.ReadFile(filepath.Join(d, "pids.events"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "max "); ok {
				n, _ := strconv.ParseUint(v, 10, 64)
				return n
			}
		}
	}
	return 0
}

// deleteWait bounds how long Delete and RemoveDir wait for the processes they killed
// to leave the cgroup.
const deleteWait = 10 * time.Second

// Delete removes the step's cgroup: it SIGKILLs whatever is still in it (a process
// that left its worker's process group, setsid), waits for it to go, and removes the
// directories (RemoveDir). An error names what is left.
func (s *Step) Delete() error {
	var errs []error
	for _, d := range s.dirs {
		if err := RemoveDir(d); err != nil {
			errs = append(errs, err)
		}
	}
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
	return errors.Join(errs...)
}

// RemoveDir removes one step cgroup directory dir, cgroup v1 or v2, after killing the
// processes in it and waiting (up to 10 s) for them to leave; a directory already gone
// is not an error. On v2 the kill is cgroup.kill (Linux 5.14: every process in it,
// at once, through the library's Kill), else, and on v1, SIGKILL to each process its
// cgroup.procs lists, until none is left. It is what the guardian runs for a step's
// cgroup when gangrun died without removing it. dir must be absolute and inside a
// cgroup file system, not the root of one.
func RemoveDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("remove cgroup %q: not an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	v2 := fs.Type == unix.CGROUP2_SUPER_MAGIC
	if !v2 && fs.Type != unix.CGROUP_SUPER_MAGIC {
		return fmt.Errorf("remove cgroup %s: not in a cgroup file system", dir)
	}
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil || st.Dev != parent.Dev {
		return fmt.Errorf("remove cgroup %s: the root of a cgroup hierarchy, not a step's", dir)
	}
	kill := func() {
		for _, pid := range pidsIn(dir) {
			_ = unix.Kill(pid, syscall.SIGKILL)
		}
	}
	if v2 {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err == nil {
			// Loaded by its parent as the mount point: Kill uses the path alone.
			if m, err := cgroup2.Load("/"+filepath.Base(dir), cgroup2.WithMountpoint(filepath.Dir(dir))); err == nil {
				kill = func() { _ = m.Kill() }
			}
		}
	}
	deadline := time.Now().Add(deleteWait)
	delay := time.Millisecond
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w (processes %v)", dir, err, pidsIn(dir))
		}
		kill()
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// pidsIn returns the processes listed in dir's cgroup.procs, this one left out (a
// thread of it may be there while it forks a worker, on v1).
func pidsIn(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil && n > 1 && n != os.Getpid() {
			out = append(out, n)
		}
	}
	return out
}

// removeDirs removes dirs, best effort (after a failed New).
func removeDirs(dirs []string) {
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}
