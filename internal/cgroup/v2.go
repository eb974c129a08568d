package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/topology"
)

// Cgroup2RootEnv is the environment variable that points gangrun's step cgroups at a
// cgroup2 mount (its root directory, such as /sys/fs/cgroup/unified) whatever the
// node's mode: the tests drive cgroup v2 with it on a hybrid node, and an operator
// may use it on a hybrid node whose v2 hierarchy holds the controllers. Unset, a node
// with only the unified hierarchy uses v2 at /sys/fs/cgroup and any other uses v1.
const Cgroup2RootEnv = "GANGRUN_CGROUP2_ROOT"

// v2Root returns the cgroup2 mount the step's cgroup goes on, or "" for cgroup v1.
func v2Root() (string, error) {
	if r := os.Getenv(Cgroup2RootEnv); r != "" {
		var fs unix.Statfs_t
		var st, up unix.Stat_t
		if !filepath.IsAbs(r) || unix.Statfs(r, &fs) != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC ||
			unix.Stat(r, &st) != nil || unix.Stat(filepath.Dir(filepath.Clean(r)), &up) != nil || st.Dev == up.Dev {
			return "", &Unusable{fmt.Sprintf("%s=%s is not the root of a cgroup2 mount", Cgroup2RootEnv, r)}
		}
		return filepath.Clean(r), nil
	}
	if cgroups.Mode() == cgroups.Unified {
		return cgroupRoot, nil
	}
	return "", nil
}

// v2Wanted are the controllers a step's cgroup v2 enables, in Controllers' order,
// where its parent offers them: as on v1, every one that is there (memory counts OOM
// kills without --mem too).
var v2Wanted = []string{"cpuset", "memory", "pids"}

// newV2 creates the step's cgroup on the cgroup v2 hierarchy mounted at root.
//
// Where: beside gangrun's own cgroup, in its parent (stepParentV2), or in the root
// when gangrun is in the root. cgroup v2's "no internal processes" rule lets a cgroup
// that holds processes enable no controllers for its children, and gangrun's own
// cgroup holds gangrun: its parent must hold none, and be gangrun's to write. On a
// systemd node that is what a unit with Delegate=yes and DelegateSubgroup=NAME
// (systemd 254) gives: the unit's cgroup is delegated, the unit's processes run in
// its leaf NAME, and gangrun's step cgroups go beside that leaf. The controllers (of
// cpuset, memory and pids, those the parent's cgroup.controllers offers) are enabled
// in the parent's cgroup.subtree_control.
//
// What: cpuset.cpus (the ranks' CPUs; cpuset.mems is left to the parent's, as on v1:
// a rank's memory policy is then not remapped by the clone), memory.max (--mem) with
// memory.swap.max 0 where swap is accounted (as v1's memsw limit: --mem is not
// stretched by swap), pids.max, and the devices rules. v2 has no devices files: the
// rules become an eBPF program (BPF_CGROUP_DEVICE) that containerd's library builds
// and attaches, which allows every device but those the rules deny. Where the kernel
// refuses the program (no CONFIG_CGROUP_BPF, no CAP_BPF/CAP_SYS_ADMIN), the step runs
// without it and Why says so.
//
// Errors: --mem with no memory controller on offer, and a kernel before 5.7 (no
// CLONE_INTO_CGROUP), are *Unusable, as are permission errors and the no internal
// processes rule.
func newV2(name string, lim Limits, root string) (*Step, error) {
	if rel, ok := kernelAtLeast(5, 7); !ok {
		return nil, &Unusable{"cgroup v2 steps need Linux 5.7 or later (clone3's CLONE_INTO_CGROUP), and this kernel is " + rel}
	}
	own, err := cgroup2.NestedGroupPath("")
	if err != nil || !strings.HasPrefix(own, "/") {
		return nil, &Unusable{fmt.Sprintf("gangrun's own cgroup v2 cannot be read from /proc/self/cgroup (%v)", err)}
	}
	parent := stepParentV2(own)
	parentDir := filepath.Join(root, parent)
	offered, err := os.ReadFile(filepath.Join(parentDir, "cgroup.controllers"))
	if err != nil {
		return nil, &Unusable{fmt.Sprintf("the cgroup v2 parent %s cannot be read (%v)", parentDir, err)}
	}
	use, missing := v2Controllers(lim, strings.Fields(string(offered)))
	if lim.MemoryBytes > 0 && !slices.Contains(use, "memory") {
		return nil, &Unusable{fmt.Sprintf("--mem needs the memory controller, which cgroup v2 does not offer in %s (its cgroup.controllers: %q)",
			parentDir, strings.TrimSpace(string(offered)))}
	}
	group := path.Join(parent, name)
	dir := filepath.Join(root, group)
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("cgroup %s exists already: another step has this name", dir)
	}
	m, err := cgroup2.NewManager(root, group, &cgroup2.Resources{})
	if err != nil {
		return nil, whyNotV2(err, dir, parentDir, lim)
	}
	fail := func(err error) (*Step, error) {
		_ = os.Remove(dir)
		return nil, whyNotV2(err, dir, parentDir, lim)
	}
	if len(use) > 0 {
		// Written in each ancestor's subtree_control from the root down; those above the
		// parent have them already (the parent offers them), and only the parent's
		// answer counts.
		if err := m.ToggleControllers(use, cgroup2.Enable); err != nil {
			return fail(err)
		}
	}
	swap := false
	if slices.Contains(use, "memory") {
		_, err := os.Stat(filepath.Join(dir, "memory.swap.max"))
		swap = err == nil
	}
	if err := m.Update(resourcesV2(lim, use, swap)); err != nil {
		return fail(err)
	}
	names := slices.Clone(use)
	var why []string
	if len(missing) > 0 {
		why = append(why, fmt.Sprintf("cgroup v2 offers no %s controller in %s (its cgroup.controllers: %q), so the step's %s",
			strings.Join(missing, " or "), parentDir, strings.TrimSpace(string(offered)), missingWhat(missing)))
	}
	if len(lim.Devices) > 0 {
		if err := m.Update(&cgroup2.Resources{Devices: devicesV2(lim.Devices)}); err != nil {
			why = append(why, "the GPUs it was not given stay open to it: the kernel refused cgroup v2's eBPF device program ("+err.Error()+")")
		} else {
			names = append(names, "devices")
		}
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	return &Step{name: name, dirs: []string{dir}, names: names, v2: m, fd: fd, why: strings.Join(why, "; ")}, nil
}

// missingWhat names the limits a missing controller leaves out.
func missingWhat(missing []string) string {
	var out []string
	for _, c := range missing {
		switch c {
		case "cpuset":
			out = append(out, "cpuset")
		case "pids":
			out = append(out, "pids limit")
		}
	}
	return strings.Join(out, " and ") + " cannot be applied"
}

// stepParentV2 is the cgroup (a path in the v2 hierarchy) a step's cgroup goes in,
// given gangrun's own: its parent, or the root for the root (see newV2).
func stepParentV2(own string) string {
	if own == "/" {
		return "/"
	}
	return path.Dir(own)
}

// v2Controllers returns the controllers of v2Wanted that offered holds (use), and
// those a limit of lim needs but offered lacks (missing: cpuset for CPUs, pids for a
// pids limit; memory is New's error).
func v2Controllers(lim Limits, offered []string) (use, missing []string) {
	for _, c := range v2Wanted {
		if slices.Contains(offered, c) {
			use = append(use, c)
			continue
		}
		if (c == "cpuset" && len(lim.CPUs) > 0) || (c == "pids" && lim.PidsLimit > 0) {
			missing = append(missing, c)
		}
	}
	return use, missing
}

// resourcesV2 is lim in the library's cgroup v2 form, for the controllers use; swap
// is whether memory.swap.max exists (swap accounting).
func resourcesV2(lim Limits, use []string, swap bool) *cgroup2.Resources {
	res := &cgroup2.Resources{}
	if len(lim.CPUs) > 0 && slices.Contains(use, "cpuset") {
		res.CPU = &cgroup2.CPU{Cpus: topology.FormatCPUList(lim.CPUs)}
	}
	if lim.MemoryBytes > 0 && slices.Contains(use, "memory") {
		m := lim.MemoryBytes
		res.Memory = &cgroup2.Memory{Max: &m}
		if swap {
			var none int64 // memory.swap.max counts swap alone (v1's memsw counted both)
			res.Memory.Swap = &none
		}
	}
	if lim.PidsLimit > 0 && slices.Contains(use, "pids") {
		res.Pids = &cgroup2.Pids{Max: lim.PidsLimit}
	}
	return res
}

// devicesV2 is rules as the device list the library compiles into its eBPF program:
// every device allowed first, then rules. The program gives the last matching entry
// the say, and an empty or deny-only list would deny every device (there is no v1
// parent's list to inherit: each program attached on the path must allow an access).
func devicesV2(rules []DeviceRule) []specs.LinuxDeviceCgroup {
	every := int64(-1)
	out := []specs.LinuxDeviceCgroup{{Allow: true, Type: "a", Major: &every, Minor: &every, Access: "rwm"}}
	for _, r := range rules {
		maj, minr := r.Major, r.Minor
		out = append(out, specs.LinuxDeviceCgroup{Allow: r.Allow, Type: r.Type, Major: &maj, Minor: &minr, Access: r.Access})
	}
	return out
}

// whyNotV2 words an error creating the step's cgroup v2 directory dir in parentDir.
func whyNotV2(err error, dir, parentDir string, lim Limits) error {
	switch {
	case errors.Is(err, unix.EROFS):
		return &Unusable{"the cgroup v2 hierarchy is mounted read-only (" + err.Error() + ")"}
	case errors.Is(err, os.ErrPermission):
		return &Unusable{fmt.Sprintf("no permission to create a cgroup in %s (%v): it must be delegated to gangrun's user (systemd: Delegate=yes)", parentDir, err)}
	case errors.Is(err, unix.EBUSY):
		return &Unusable{fmt.Sprintf("%s holds processes, and cgroup v2 lets such a cgroup enable no controllers for its children (no internal processes): run gangrun in a leaf of a cgroup delegated to it (systemd: Delegate=yes, DelegateSubgroup=) (%v)", parentDir, err)}
	case errors.Is(err, unix.EINVAL) && len(lim.CPUs) > 0:
		return fmt.Errorf("cgroup: cpuset %s is not within the cpuset of %s: %w", topology.FormatCPUList(lim.CPUs), parentDir, err)
	}
	return fmt.Errorf("create cgroup %s: %w", dir, err)
}

// kernelAtLeast reports whether the running kernel is major.minor or later, with its
// release string.
func kernelAtLeast(major, minor int) (string, bool) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown", false
	}
	rel := unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return rel, false
	}
	maj, err1 := strconv.Atoi(parts[0])
	mnr, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return rel, false
	}
	return rel, maj > major || (maj == major && mnr >= minor)
}
