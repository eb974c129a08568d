package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Placement puts the thread that forks a process somewhere its child inherits (a
// cgroup) for the moment of the fork: Enter moves thread tid of this process there,
// Leave moves it back. cgroup.Step implements it.
//
// A Placement that also implements ClonePlacement with a descriptor (>= 0) is entered
// at the clone instead, and its Enter and Leave are not called.
type Placement interface {
	Enter(tid int) error
	Leave(tid int) error
}

// ClonePlacement is a Placement that a process enters as it is created rather than
// through its forking thread: a cgroup v2 directory, which does not let one thread of
// a multi-threaded process move into it. CgroupFD returns the directory's open file
// descriptor, which Start hands to clone3 (CLONE_INTO_CGROUP, through
// syscall.SysProcAttr's UseCgroupFD and CgroupFD; Linux 5.7), so the child is in the
// cgroup from its first instruction; -1 means the placement is entered by thread
// (Enter, Leave) after all (a cgroup v1 step). cgroup.Step implements it.
type ClonePlacement interface {
	CgroupFD() int
}

// cloneFD returns place's descriptor to clone into, or -1 when place is entered by
// its forking thread (or is nil).
func cloneFD(place Placement) int {
	if c, ok := place.(ClonePlacement); ok {
		return c.CgroupFD()
	}
	return -1
}

// EntersByThread reports whether processes start in place through their forking
// thread (InPlacement: cgroup v1), as opposed to at the clone (ClonePlacement: cgroup
// v2, where each start takes the placement itself: StartPlaced). False for nil.
func EntersByThread(place Placement) bool { return place != nil && cloneFD(place) < 0 }

// StartBound is Start with the process bound to cpus (sched_setaffinity) from its
// first instruction: the calling goroutine is locked to its OS thread, which takes the
// CPU set for the moment of the fork (a child inherits its forking thread's affinity)
// and then gets its own set back. Binding after the start would miss the threads the
// program creates early (an OpenMP or NCCL pool). The set is narrowed to the CPUs
// gangrun itself may use (a cgroup cpuset, taskset); bound is the set applied, nil
// when none of cpus is usable or cpus is empty, in which case the process starts
// unbound.
//
// The thread is never left to exit while locked: a parent-death signal fires when the
// thread that forked the child exits, so the goroutine unlocks it again.
func StartBound(cmd *exec.Cmd, cpus []int) (p *Process, bound []int, err error) {
	p, bound, _, err = startBound(cmd, cpus, MemPolicy{}, -1)
	return p, bound, err
}

// StartPlaced is StartBound with the process also started inside place (a step's
// cgroup), from its first instruction: through its forking thread (InPlacement), or,
// for a ClonePlacement, by clone3 into it (its binding to cpus is then checked and,
// should the kernel have widened it to the cgroup's cpuset, applied again). An error
// entering place starts nothing. A nil place is StartBound.
func StartPlaced(cmd *exec.Cmd, cpus []int, place Placement) (p *Process, bound []int, err error) {
	p, bound, _, err = StartPlacedMem(cmd, cpus, MemPolicy{}, place)
	return p, bound, err
}

// StartPlacedMem is StartPlaced with the process also started under the memory policy
// mp (set_mempolicy, on the forking thread for the moment of the fork, as the CPU set
// is); memBound reports whether mp was applied (see withMemPolicy: not when the kernel
// refuses its nodes, and the process then starts with gangrun's own policy).
func StartPlacedMem(cmd *exec.Cmd, cpus []int, mp MemPolicy, place Placement) (p *Process, bound []int, memBound bool, err error) {
	if place == nil {
		return startBound(cmd, cpus, mp, -1)
	}
	if fd := cloneFD(place); fd >= 0 {
		return startBound(cmd, cpus, mp, fd)
	}
	err = InPlacement(place, func() error {
		var serr error
		p, bound, memBound, serr = startBound(cmd, cpus, mp, -1)
		return serr
	})
	return p, bound, memBound, err
}

// InPlacement runs fn on a thread of its own that has entered place (a step's cgroup):
// the processes fn starts (Start, StartBound) begin there, as a child inherits its
// forking thread's cgroups. The thread leaves place after fn, and gets back its CPU
// affinity, which a cpuset move resets; an error entering place runs nothing. The
// thread stays locked to fn's goroutine throughout, so the Go runtime starts no
// thread of its own from it (a locked thread's state is not inherited: newm goes
// through its template thread).
//
// A ClonePlacement (cgroup v2) has no thread to enter: InPlacement refuses it and runs
// nothing; pass it to each start instead (StartPlaced, EntersByThread).
func InPlacement(place Placement, fn func() error) error {
	if cloneFD(place) >= 0 {
		return errors.New("InPlacement: this placement is entered at the clone (cgroup v2), not by a thread: pass it to StartPlaced")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	tid := unix.Gettid()
	if err := place.Enter(tid); err != nil {
		_ = unix.SchedSetaffinity(0, &old)
		return err
	}
	defer func() {
		// Moving back into the cgroups this thread came from cannot fail short of
		// someone removing them; it would then stay in the step's until its end.
		_ = place.Leave(tid)
		_ = unix.SchedSetaffinity(0, &old)
	}()
	return fn()
}

// startBound is StartPlacedMem's work, once inside the placement; cgroupFD, when >= 0,
// is a cgroup v2 directory the process is cloned into.
func startBound(cmd *exec.Cmd, cpus []int, mp MemPolicy, cgroupFD int) (p *Process, bound []int, memBound bool, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := func() { p, err = startIn(cmd, cgroupFD) }
	var old, set unix.CPUSet
	if len(cpus) > 0 && unix.SchedGetaffinity(0, &old) == nil {
		for _, c := range cpus {
			if c >= 0 && c < len(old)*64 && old.IsSet(c) {
				set.Set(c)
				bound = append(bound, c)
			}
		}
	}
	if len(bound) == 0 || unix.SchedSetaffinity(0, &set) != nil {
		// Unbound: no CPUs asked, none usable, or the set refused.
		memBound = withMemPolicy(mp, start)
		return p, nil, memBound, err
	}
	memBound = withMemPolicy(mp, start)
	// Restoring a set just read cannot fail short of a kernel bug; if it did, this
	// thread would keep the narrow set: gangrun's scheduling would suffer, not the child.
	_ = unix.SchedSetaffinity(0, &old)
	if err == nil && cgroupFD >= 0 {
		rebindIfWidened(p.Pid(), &set, bound)
	}
	return p, bound, memBound, err
}

// rebindIfWidened applies bound to process pid again if its CPU set is not want: a
// child cloned into another cpuset (CLONE_INTO_CGROUP) is given that cpuset's CPUs by
// cpuset_fork, which since Linux 6.2 keeps within the set its forking thread asked for
// (sched_setaffinity's user mask, which the child inherits) and before 6.3 copied the
// forking thread's set: both keep the binding, so this is a check. Should a kernel
// between or after reset it, the set is applied again at once, before the program's
// first thread of its own as a rule (a worker's interpreter starts single-threaded).
func rebindIfWidened(pid int, want *unix.CPUSet, bound []int) {
	var got unix.CPUSet
	if unix.SchedGetaffinity(pid, &got) == nil && got != *want {
		_, _ = BindProcess(pid, bound)
	}
}

// BindProcess binds every thread of running process pid to cpus, as `taskset -a -p`
// does (sched_setaffinity on each task in /proc/PID/task): for a process that was
// started before its CPUs were known (a warm standby). Threads it creates later inherit
// the set from their creator. The set is narrowed to the CPUs gangrun itself may use;
// bound is the set applied, nil when none was usable. Errors: the process's tasks
// cannot be listed, or a task refused the set (one that exited meanwhile is skipped).
func BindProcess(pid int, cpus []int) (bound []int, err error) {
	var own, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &own); err != nil {
		return nil, err
	}
	for _, c := range cpus {
		if c >= 0 && c < len(own)*64 && own.IsSet(c) {
			set.Set(c)
			bound = append(bound, c)
		}
	}
	if len(bound) == 0 {
		return nil, nil
	}
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return nil, err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("bind thread %d of process %d: %w", tid, pid, err)
		}
	}
	return bound, nil
}
