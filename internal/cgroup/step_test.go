package cgroup_test

import (
	"crypto/rand"
	"encoding/hex"
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

// uniqueName is a step cgroup name no other test (of this run or another) uses.
func uniqueName(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "gangrun-test-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b)
}

// newStep creates a step cgroup for the test and removes it at its end.
func newStep(t *testing.T, lim cgroup.Limits) *cgroup.Step {
	t.Helper()
	st, err := cgroup.New(uniqueName(t), lim)
	if err != nil {
		t.Fatalf("this machine has writable cgroup v1 hierarchies (cpuset, memory, pids, devices) and the tests run as root: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Delete(); err != nil {
			t.Errorf("delete: %v", err)
		}
		for _, d := range st.Dirs() {
			if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s left behind (%v)", d, err)
			}
		}
	})
	return st
}

// cgroupsOf returns /proc/PID/cgroup as controller -> path.
func cgroupsOf(t *testing.T, pid string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				out[c] = parts[2]
			}
		}
	}
	return out
}

// statusField returns a field of /proc/PID/status.
func statusField(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return ""
}

// TestStepPlacesWorker: a process started through the step is in the step's cgroup in
// every controller from its start, runs on the step's cpuset (and its own binding
// within it); the thread that forked it is back in this process's cgroups; Delete
// kills what is left and removes every directory.
func TestStepPlacesWorker(t *testing.T) {
	st := newStep(t, cgroup.Limits{CPUs: []int{0}, PidsLimit: 64})
	if got := st.Controllers(); strings.Join(got, ",") != "cpuset,memory,pids,devices" {
		t.Errorf("controllers %v, want cpuset, memory, pids and devices (all mounted here)", got)
	}
	// The child reports its own cgroups and CPUs as its first act.
	cmd := exec.Command("/bin/sh", "-c", `cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status; exec sleep 60`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	buf := make([]byte, 4096)
	var text string
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(text, "Cpus_allowed_list") && time.Now().Before(deadline) {
		n, err := out.Read(buf)
		text += string(buf[:n])
		if err != nil {
			break
		}
	}
	for _, c := range []string{"cpuset", "memory", "pids", "devices"} {
		if !strings.Contains(text, ":"+c+":") || !strings.Contains(text, "/"+st.Name()+"\n") {
			t.Errorf("the child's first look at /proc/self/cgroup lacks %s in %s:\n%s", c, st.Name(), text)
		}
	}
	if !strings.Contains(text, "Cpus_allowed_list:\t0\n") {
		t.Errorf("the child's CPUs are not the step's cpuset 0:\n%s", text)
	}
	for c, path := range cgroupsOf(t, strconv.Itoa(p.Pid())) {
		if c == "cpuset" || c == "memory" || c == "pids" || c == "devices" {
			if filepath.Base(path) != st.Name() {
				t.Errorf("/proc/%d/cgroup: %s is %s, want .../%s", p.Pid(), c, path, st.Name())
			}
		}
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		for c, path := range cgroupsOf(t, "self/task/"+task.Name()) {
			if strings.Contains(path, st.Name()) {
				t.Errorf("thread %s of the test is still in the step's %s cgroup %s", task.Name(), c, path)
			}
		}
	}
	if err := st.Delete(); err != nil {
		t.Fatal(err)
	}
	st2, _ := p.Release()
	if st2.Signal != syscall.SIGKILL {
		t.Errorf("the process left in the cgroup ended %v, want SIGKILL from Delete", st2)
	}
}

// TestStepBindsWithinCpuset: a rank's own binding (StartBound's set) applies inside the
// step's cpuset, and the forking thread gets its affinity back.
func TestStepBindsWithinCpuset(t *testing.T) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	st := newStep(t, cgroup.Limits{})
	p, bound, err := proc.StartPlaced(exec.Command("sleep", "60"), []int{1}, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if len(bound) != 1 || bound[0] != 1 {
		t.Fatalf("bound %v, want [1]", bound)
	}
	if got := statusField(t, p.Pid(), "Cpus_allowed_list"); got != "1" {
		t.Errorf("Cpus_allowed_list %q, want 1", got)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil || after != mine {
		t.Errorf("this thread's affinity changed: %v, %v", after, err)
	}
}

// TestStepMemoryLimit: a process allocating past the step's memory limit is killed
// by the kernel in the step's cgroup, and the step counts the OOM kill.
func TestStepMemoryLimit(t *testing.T) {
	st := newStep(t, cgroup.Limits{MemoryBytes: 64 << 20})
	if n := st.OOMKills(); n != 0 {
		t.Fatalf("a new cgroup reports %d OOM kills", n)
	}
	python := os.Getenv("GANGRUN_PYTHON")
	if python == "" {
		python = "python3"
	}
	// 256 MiB, written (bytes of 'x'), in 16 MiB pieces.
	cmd := exec.Command(python, "-c", "b = [b'x' * (16 << 20) for _ in range(16)]; print('survived')")
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	status, _ := p.Release()
	if status.Signal != syscall.SIGKILL {
		t.Fatalf("the allocator ended %v, want SIGKILL by the OOM killer", status)
	}
	if n := st.OOMKills(); n < 1 {
		t.Errorf("OOMKills() = %d after the allocator was killed, want at least 1", n)
	}
}

// TestStepDeniesDevices: a devices rule from GPUDeviceRules denies its device node to
// the step's processes, and leaves the other GPUs' alone: opening a denied node fails
// with EPERM (the devices controller's answer), an allowed one gets as far as the
// driver (ENXIO here, where no NVIDIA driver is loaded).
func TestStepDeniesDevices(t *testing.T) {
	inv, err := topology.LoadFile(filepath.Join("..", "..", "topology", "testdata", "inventories", "pcie-2socket.json"))
	if err != nil {
		t.Fatal(err)
	}
	all := inv.Allocatable()
	rules := cgroup.GPUDeviceRules(inv, all[:2]) // GPUs 2 and 3 denied
	st := newStep(t, cgroup.Limits{Devices: rules})
	dir := t.TempDir()
	for _, g := range inv.GPUs {
		if err := unix.Mknod(filepath.Join(dir, "nvidia"+strconv.Itoa(g.Minor)), unix.S_IFCHR|0o666, int(unix.Mkdev(cgroup.NVIDIAMajor, uint32(g.Minor)))); err != nil {
			t.Fatal(err)
		}
	}
	script := `for m in 0 1 2 3; do if exec 3<` + dir + `/nvidia$m; then echo "$m opened"; fi 2>&1 | sed "s/^/$m: /"; done`
	cmd := exec.Command("/bin/bash", "-c", script)
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 0, 4096)
	buf := make([]byte, 4096)
	for {
		n, err := outPipe.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			break
		}
	}
	p.Release()
	text := string(b)
	for _, g := range inv.GPUs {
		m := strconv.Itoa(g.Minor)
		denied := g.Index >= 2
		line := ""
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, m+": ") {
				line = l
			}
		}
		switch {
		case denied && !strings.Contains(line, "Operation not permitted"):
			t.Errorf("GPU %d (/dev/nvidia%s) is not granted: want EPERM from the devices controller, got %q", g.Index, m, line)
		case !denied && !strings.Contains(line, "No such device"):
			t.Errorf("GPU %d (/dev/nvidia%s) is granted: want the driver's ENXIO, got %q", g.Index, m, line)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}
