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
type Placement interface {
	Enter(tid int) error
	Leave(tid int) error
}

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
	p, bound, _, err = startBound(cmd, cpus, MemPolicy{})
	return p, bound, err
}

// StartPlaced is StartBound with the process also started inside place (a step's
// cgroup), from its first instruction (InPlacement). An error entering place starts
// nothing. A nil place is StartBound.
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
		return startBound(cmd, cpus, mp)
	}
	err = InPlacement(place, func() error {
		var serr error
		p, bound, memBound, serr = startBound(cmd, cpus, mp)
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
func InPlacement(place Placement, fn func() error) error {
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

// startBound is StartPlacedMem's work, once inside the placement.
func startBound(cmd *exec.Cmd, cpus []int, mp MemPolicy) (p *Process, bound []int, memBound bool, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := func() { p, err = Start(cmd) }
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
	return p, bound, memBound, err
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

// StandbyNice is the nice value a warm standby waits at (the lowest priority), so that
// its imports take only CPU time the running workers leave; SetNice gives it back its
// priority when it becomes a worker.
const StandbyNice = 19

// SetNice sets the nice value of every thread of running process pid to nice, as
// `renice -n NICE -p` does for each of /proc/PID/task (setpriority(2) with PRIO_PROCESS
// acts on one thread on Linux). Threads it creates later inherit the value from their
// creator. Lowering a nice value takes CAP_SYS_NICE or a matching RLIMIT_NICE
// (CanRaisePriority); raising it does not. Errors: the tasks cannot be listed, or one
// refused the value (one that exited meanwhile is skipped).
func SetNice(pid, nice int) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("nice %d for thread %d of process %d: %w", nice, tid, pid, err)
		}
	}
	return nil
}

// CanRaisePriority reports whether this process may set a thread's nice value back to
// 0 once it has raised it (setpriority(2): root, CAP_SYS_NICE, or an RLIMIT_NICE soft
// limit of at least 20, whose ceiling is 20 - limit).
func CanRaisePriority() bool {
	if os.Geteuid() == 0 {
		return true
	}
	var lim unix.Rlimit
	return unix.Getrlimit(unix.RLIMIT_NICE, &lim) == nil && lim.Cur >= 20
}
