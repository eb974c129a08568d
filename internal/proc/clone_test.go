package proc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// cgroupDir is a cgroup v2 directory opened for CLONE_INTO_CGROUP: a ClonePlacement
// made without the cgroup package.
type cgroupDir struct{ fd int }

func (c cgroupDir) Enter(int) error { return errors.New("entered by thread") }
func (c cgroupDir) Leave(int) error { return errors.New("left by thread") }
func (c cgroupDir) CgroupFD() int   { return c.fd }

// TestStartPlacedClonesIntoCgroup: a ClonePlacement's process is created inside the
// cgroup v2 directory (clone3 CLONE_INTO_CGROUP; the development VM's hybrid layout
// has the v2 hierarchy at /sys/fs/cgroup/unified), its first look at /proc/self/cgroup
// says so, its CPU binding holds, and no thread of this process is moved;
// InPlacement refuses such a placement.
func TestStartPlacedClonesIntoCgroup(t *testing.T) {
	const mount = "/sys/fs/cgroup/unified"
	var fs unix.Statfs_t
	if err := unix.Statfs(mount, &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Fatalf("%s is not a cgroup2 mount here (%v)", mount, err)
	}
	name := "gangrun-proc-test-" + strconv.Itoa(os.Getpid())
	dir := filepath.Join(mount, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	place := cgroupDir{fd}
	if EntersByThread(place) {
		t.Error("EntersByThread is true for a placement with a cgroup descriptor")
	}
	if err := InPlacement(place, func() error { t.Error("InPlacement ran fn"); return nil }); err == nil {
		t.Error("InPlacement accepted a clone placement")
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	if mine.IsSet(1) {
		cpu = 1
	}
	cmd := exec.Command("/bin/sh", "-c", `cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status`)
	var out strings.Builder
	cmd.Stdout = &out
	p, bound, err := StartPlaced(cmd, []int{cpu}, place)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	if st, err := p.Release(); err != nil || !st.Success() {
		t.Fatalf("%v %v\n%s", st, err, out.String())
	}
	if len(bound) != 1 || bound[0] != cpu {
		t.Errorf("bound %v, want [%d]", bound, cpu)
	}
	if !strings.Contains(out.String(), "\n0::/"+name+"\n") || !strings.Contains(out.String(), "Cpus_allowed_list:\t"+strconv.Itoa(cpu)+"\n") {
		t.Errorf("the child's own view is not in /%s on CPU %d:\n%s", name, cpu, out.String())
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/cgroup")
		if strings.Contains(string(b), name) {
			t.Errorf("thread %s of the test is in %s", task.Name(), name)
		}
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil || after != mine {
		t.Errorf("this thread's affinity changed: %v, %v", after, err)
	}
}
