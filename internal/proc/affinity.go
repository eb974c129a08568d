package proc

import (
	"os/exec"
	"runtime"

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
	return StartPlaced(cmd, cpus, nil)
}

// StartPlaced is StartBound with the process also started inside place (a step's
// cgroup), from its first instruction: the forking thread enters place, forks, and
// leaves it again; its CPU affinity, which a cpuset move resets, is restored after.
// An error entering place starts nothing. A nil place is StartBound.
func StartPlaced(cmd *exec.Cmd, cpus []int, place Placement) (p *Process, bound []int, err error) {
	if len(cpus) == 0 && place == nil {
		p, err = Start(cmd)
		return p, nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		if place != nil {
			return nil, nil, err
		}
		p, err = Start(cmd)
		return p, nil, err
	}
	for _, c := range cpus {
		if c >= 0 && c < len(old)*64 && old.IsSet(c) {
			set.Set(c)
			bound = append(bound, c)
		}
	}
	if place != nil {
		tid := unix.Gettid()
		if err := place.Enter(tid); err != nil {
			_ = unix.SchedSetaffinity(0, &old)
			return nil, nil, err
		}
		defer func() {
			// Moving back into the cgroups this thread came from cannot fail short of
			// someone removing them; it would then stay in the step's until its end.
			_ = place.Leave(tid)
			_ = unix.SchedSetaffinity(0, &old)
		}()
	}
	if len(bound) > 0 {
		if unix.SchedSetaffinity(0, &set) != nil {
			bound = nil
		}
	}
	p, err = Start(cmd)
	if place == nil {
		// Restoring a set just read cannot fail short of a kernel bug; if it did, this
		// thread would keep the narrow set: gangrun's scheduling would suffer, not the child.
		_ = unix.SchedSetaffinity(0, &old)
	}
	return p, bound, err
}
