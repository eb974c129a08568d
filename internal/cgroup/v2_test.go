package cgroup_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/topology"
)

// unifiedMount is this machine's cgroup v2 mount: the development VM is hybrid, and
// its v2 hierarchy offers only hugetlb (the other controllers are bound to v1), so the
// tests below exercise v2's placement, removal, kill and eBPF devices for real, and
// its cpuset, memory and pids limits only as the resources handed to the library
// (v2_internal_test.go).
const unifiedMount = "/sys/fs/cgroup/unified"

// useV2 points the package at the cgroup v2 mount for the test (Cgroup2RootEnv).
func useV2(t *testing.T) {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(unifiedMount, &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Fatalf("%s is not a cgroup2 mount here (%v): the development VM's hybrid layout has it", unifiedMount, err)
	}
	t.Setenv(cgroup.Cgroup2RootEnv, unifiedMount)
}

// v2Line returns the 0:: line's path of /proc/PID/cgroup (PID may be "self/task/N").
func v2Line(t *testing.T, pid string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	t.Fatalf("no 0:: line in /proc/%s/cgroup:\n%s", pid, b)
	return ""
}

// TestV2StepClonesWorkerInto: on cgroup v2 the step is one directory beside this
// process's own cgroup (here the root's child); a process started through it is in it
// from its first instruction (its own first read of /proc/self/cgroup), cloned there
// (no thread of this process ever is); the limits whose controllers v2 does not offer
// here are named by Why; Delete kills what is left (cgroup.kill) and removes it.
func TestV2StepClonesWorkerInto(t *testing.T) {
	useV2(t)
	st, err := cgroup.New(uniqueName(t), cgroup.Limits{CPUs: []int{0}, PidsLimit: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Delete()
	dir := filepath.Join(unifiedMount, st.Name())
	if !st.V2() || strings.Join(st.Dirs(), ",") != dir || st.CgroupFD() < 0 {
		t.Fatalf("V2 %v, dirs %v, fd %d; want v2, [%s], an open directory", st.V2(), st.Dirs(), st.CgroupFD(), dir)
	}
	if got := st.Controllers(); len(got) != 0 {
		t.Errorf("controllers %v, want none (v2 offers only hugetlb here)", got)
	}
	want := `cgroup v2 offers no cpuset or pids controller in /sys/fs/cgroup/unified (its cgroup.controllers: "hugetlb"), so the step's cpuset and pids limit cannot be applied`
	if st.Why() != want {
		t.Errorf("Why() = %q, want %q", st.Why(), want)
	}
	if err := st.Enter(unix.Gettid()); err == nil {
		t.Error("Enter moved a single thread on cgroup v2")
	}
	cmd := exec.Command("/bin/sh", "-c", `cat /proc/self/cgroup; exec sleep 60`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var text string
	buf := make([]byte, 4096)
	for !strings.Contains(text, "0::") {
		n, err := out.Read(buf)
		text += string(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.Contains(text, "0::/"+st.Name()+"\n") {
		t.Errorf("the child's first look at /proc/self/cgroup is not in /%s:\n%s", st.Name(), text)
	}
	if got := v2Line(t, strconv.Itoa(p.Pid())); got != "/"+st.Name() {
		t.Errorf("/proc/%d/cgroup 0:: %s, want /%s", p.Pid(), got, st.Name())
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		if got := v2Line(t, "self/task/"+task.Name()); strings.Contains(got, st.Name()) {
			t.Errorf("thread %s of the test is in the step's cgroup %s", task.Name(), got)
		}
	}
	// A process that left the worker's group is killed by Delete all the same.
	if err := st.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left behind (%v)", dir, err)
	}
	if s, _ := p.Release(); s.Signal != syscall.SIGKILL {
		t.Errorf("the process left in the cgroup ended %v, want SIGKILL from Delete", s)
	}
}

// TestV2StepKillsEscapees: RemoveDir (what the guardian runs after gangrun's death)
// kills a setsid descendant of a worker too, and removes the directory.
func TestV2StepKillsEscapees(t *testing.T) {
	useV2(t)
	st, err := cgroup.New(uniqueName(t), cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Delete()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command("/bin/sh", "-c", `setsid sleep 300 & echo $! > `+ready+`.tmp; mv `+ready+`.tmp `+ready+`; exec sleep 300`)
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var b []byte
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err = os.ReadFile(ready); err == nil {
			break
		}
	}
	escapee, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("no pid from the worker: %q, %v", b, err)
	}
	if got := v2Line(t, strconv.Itoa(escapee)); got != "/"+st.Name() {
		t.Fatalf("the setsid child is in %s, want /%s", got, st.Name())
	}
	if err := cgroup.RemoveDir(st.Dirs()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(st.Dirs()[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup left behind (%v)", err)
	}
	// The escapee is not this process's child: it is gone once its pid answers no more
	// (or is a zombie waiting for init).
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(escapee) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the setsid child %d outlived its step's cgroup", escapee)
		}
	}
}

// TestV2MemNeedsMemoryController: --mem where cgroup v2 offers no memory controller
// is *Unusable, in one line naming it and the parent; nothing is left behind.
func TestV2MemNeedsMemoryController(t *testing.T) {
	useV2(t)
	before, _ := os.ReadDir(unifiedMount)
	_, err := cgroup.New(uniqueName(t), cgroup.Limits{MemoryBytes: 1 << 30})
	var u *cgroup.Unusable
	want := `cgroups cannot be used: --mem needs the memory controller, which cgroup v2 does not offer in /sys/fs/cgroup/unified (its cgroup.controllers: "hugetlb")`
	if !errors.As(err, &u) || err.Error() != want {
		t.Errorf("New with --mem: %v, want *Unusable %q", err, want)
	}
	if after, _ := os.ReadDir(unifiedMount); len(after) != len(before) {
		t.Errorf("%s held %d entries, now %d", unifiedMount, len(before), len(after))
	}
}

// TestV2BadRoot: a Cgroup2RootEnv that is not the root of a cgroup2 mount is
// *Unusable, naming it.
func TestV2BadRoot(t *testing.T) {
	for _, root := range []string{t.TempDir(), "/sys/fs/cgroup/memory", "relative"} {
		t.Setenv(cgroup.Cgroup2RootEnv, root)
		_, err := cgroup.New(uniqueName(t), cgroup.Limits{})
		var u *cgroup.Unusable
		if !errors.As(err, &u) || !strings.Contains(err.Error(), cgroup.Cgroup2RootEnv+"="+root+" is not the root of a cgroup2 mount") {
			t.Errorf("%s: %v", root, err)
		}
	}
}

// TestV2StepDeniesDevices: on cgroup v2 the devices rules are an eBPF program on the
// step's directory: opening a denied GPU node fails with EPERM, an allowed one gets as
// far as the driver (ENXIO here, where no NVIDIA driver is loaded), and other devices
// (/dev/null) stay open.
func TestV2StepDeniesDevices(t *testing.T) {
	useV2(t)
	inv, err := topology.LoadFile(filepath.Join("..", "..", "topology", "testdata", "inventories", "pcie-2socket.json"))
	if err != nil {
		t.Fatal(err)
	}
	rules := cgroup.GPUDeviceRules(inv, inv.Allocatable()[:2]) // GPUs 2 and 3 denied
	st, err := cgroup.New(uniqueName(t), cgroup.Limits{Devices: rules})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Delete(); err != nil {
			t.Error(err)
		}
	}()
	if got := strings.Join(st.Controllers(), ","); got != "devices" || st.Why() != "" {
		t.Fatalf("controllers %q, why %q; want the eBPF device program attached (devices), nothing missing", got, st.Why())
	}
	dir := t.TempDir()
	for _, g := range inv.GPUs {
		if err := unix.Mknod(filepath.Join(dir, "nvidia"+strconv.Itoa(g.Minor)), unix.S_IFCHR|0o666, int(unix.Mkdev(cgroup.NVIDIAMajor, uint32(g.Minor)))); err != nil {
			t.Fatal(err)
		}
	}
	script := `for m in 0 1 2 3; do if exec 3<` + dir + `/nvidia$m; then echo "$m opened"; fi 2>&1 | sed "s/^/$m: /"; done; echo x > /dev/null && echo "null: writable"`
	cmd := exec.Command("/bin/bash", "-c", script)
	b, err := startAndRead(cmd, st)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, g := range inv.GPUs {
		m := strconv.Itoa(g.Minor)
		line := ""
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, m+": ") {
				line = l
			}
		}
		switch denied := g.Index >= 2; {
		case denied && !strings.Contains(line, "Operation not permitted"):
			t.Errorf("GPU %d (/dev/nvidia%s) is not granted: want EPERM from the eBPF program, got %q", g.Index, m, line)
		case !denied && !strings.Contains(line, "No such device"):
			t.Errorf("GPU %d (/dev/nvidia%s) is granted: want the driver's ENXIO, got %q", g.Index, m, line)
		}
	}
	if !strings.Contains(text, "null: writable") {
		t.Errorf("/dev/null is not usable in the step:\n%s", text)
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}

// startAndRead starts cmd in st and returns its stdout once it has ended.
func startAndRead(cmd *exec.Cmd, st *cgroup.Step) ([]byte, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		return nil, err
	}
	var b []byte
	buf := make([]byte, 4096)
	for {
		n, err := out.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			break
		}
	}
	p.Release()
	return b, nil
}

// TestV2FreshMount: Cgroup2RootEnv may name any cgroup2 mount, not only one below
// /sys/fs/cgroup: the test mounts the v2 hierarchy afresh in a temporary directory, and
// a step made there holds its worker and is removed (RemoveDir checks the file system,
// not the path); the mount is undone after.
func TestV2FreshMount(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mount cgroup2 on %s (the tests run as root): %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	t.Setenv(cgroup.Cgroup2RootEnv, mnt)
	st, err := cgroup.New(uniqueName(t), cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Delete()
	if st.Dirs()[0] != filepath.Join(mnt, st.Name()) {
		t.Errorf("dirs %v, want below %s", st.Dirs(), mnt)
	}
	b, err := startAndRead(exec.Command("cat", "/proc/self/cgroup"), st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "0::/"+st.Name()+"\n") {
		t.Errorf("the child is not in /%s:\n%s", st.Name(), b)
	}
	if err := st.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(st.Dirs()[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left behind (%v)", st.Dirs()[0], err)
	}
}
