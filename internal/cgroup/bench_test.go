package cgroup_test

import (
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
)

// benchLimits are a step's limits as `gangrun run --mem 1G` sets them on this VM.
var benchLimits = cgroup.Limits{CPUs: []int{0, 1}, MemoryBytes: 1 << 30, PidsLimit: cgroup.DefaultPidsLimit}

// launch8 starts 8 /bin/true as launcher's startGroup does (each bound to CPU 0, as
// --cpu-bind would; all inside place when it is set: from one move of the forking
// thread on cgroup v1, each cloned into it on v2) and reaps them.
func launch8(b *testing.B, place proc.Placement) {
	ps := make([]*proc.Process, 0, 8)
	each := place
	if proc.EntersByThread(place) {
		each = nil
	}
	start := func() error {
		for range 8 {
			p, _, err := proc.StartPlaced(exec.Command("/bin/true"), []int{0}, each)
			if err != nil {
				return err
			}
			ps = append(ps, p)
		}
		return nil
	}
	var err error
	if proc.EntersByThread(place) {
		err = proc.InPlacement(place, start)
	} else {
		err = start()
	}
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range ps {
		<-p.Exited()
		if st, err := p.Release(); err != nil || !st.Success() {
			b.Fatalf("%v %v", st, err)
		}
	}
}

// BenchmarkLaunch8 compares launching 8 ranks with and without a step cgroup, in one
// run: "plain" starts and reaps 8 processes; "cgroup" also creates the step's cgroup
// (cpuset, memory, pids, devices; a memory and a pids limit), starts the 8 inside it
// and removes it. benchmarks/README.md ("Confining a step") has the figures.
func BenchmarkLaunch8(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			launch8(b, nil)
		}
	})
	launch := func(b *testing.B, lim cgroup.Limits) {
		for b.Loop() {
			st, err := cgroup.New(uniqueName(nil), lim)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Delete() }) // after a failure; a second Delete finds nothing
			launch8(b, st)
			if err := st.Delete(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("cgroup", func(b *testing.B) { launch(b, benchLimits) })
	b.Run("cgroup-v2", func(b *testing.B) {
		b.Setenv(cgroup.Cgroup2RootEnv, unifiedMount)
		launch(b, benchLimitsV2)
	})
}

// benchLimitsV2 are the limits this VM's cgroup v2 can take (it offers no cpuset,
// memory or pids controller: those are bound to v1), with the devices rules of a
// node of 8 GPUs whose last 6 are not given: the eBPF program is built and attached.
var benchLimitsV2 = cgroup.Limits{CPUs: []int{0, 1}, PidsLimit: cgroup.DefaultPidsLimit, Devices: func() []cgroup.DeviceRule {
	var r []cgroup.DeviceRule
	for m := int64(2); m < 8; m++ {
		r = append(r, cgroup.DeviceRule{Type: "c", Major: cgroup.NVIDIAMajor, Minor: m, Access: "rwm"})
	}
	return r
}()}

// BenchmarkStepOpsV2 is BenchmarkStepOps on cgroup v2 (this VM's, at
// /sys/fs/cgroup/unified): creating the step's directory with its eBPF device program,
// opening it for CLONE_INTO_CGROUP, and removing it. There is no thread to move: each
// worker is cloned into it, at no cost over a plain start.
func BenchmarkStepOpsV2(b *testing.B) {
	b.Setenv(cgroup.Cgroup2RootEnv, unifiedMount)
	for b.Loop() {
		st, err := cgroup.New(uniqueName(nil), benchLimitsV2)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Delete() })
		if err := st.Delete(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStepOps measures the cgroup work alone that confining a step adds to a
// launch, without the processes, whose start time varies far more than it on a loaded
// machine: creating the step's cgroup, moving the forking thread in and out (once per
// attempt, whatever the number of ranks), and removing it.
func BenchmarkStepOps(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	for b.Loop() {
		st, err := cgroup.New(uniqueName(nil), benchLimits)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Delete() })
		if err := st.Enter(tid); err != nil {
			b.Fatal(err)
		}
		if err := st.Leave(tid); err != nil {
			b.Fatal(err)
		}
		if err := st.Delete(); err != nil {
			b.Fatal(err)
		}
	}
}
