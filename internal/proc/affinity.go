package proc

import (
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

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
	if len(cpus) == 0 {
		p, err = Start(cmd)
		return p, nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		p, err = Start(cmd)
		return p, nil, err
	}
	for _, c := range cpus {
		if c >= 0 && c < len(old)*64 && old.IsSet(c) {
			set.Set(c)
			bound = append(bound, c)
		}
	}
	if len(bound) == 0 {
		p, err = Start(cmd)
		return p, nil, err
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		p, err = Start(cmd)
		return p, nil, err
	}
	p, err = Start(cmd)
	// Restoring a set just read cannot fail short of a kernel bug; if it did, this
	// thread would keep the narrow set: gangrun's scheduling would suffer, not the child.
	_ = unix.SchedSetaffinity(0, &old)
	return p, bound, err
}
