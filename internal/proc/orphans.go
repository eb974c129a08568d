package proc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// orphanWait bounds how long KillOrphans waits for the processes it SIGKILLed to exit
// (one stuck in uninterruptible sleep, in a driver call say, is left to init).
const orphanWait = 2 * time.Second

// BecomeSubreaper makes the calling process a child subreaper (prctl
// PR_SET_CHILD_SUBREAPER, Linux 3.4+): a descendant orphaned by its parent's death is
// re-parented to this process instead of init. A worker's child that left the worker's
// process group (setsid, a daemonising data loader) so escapes no signal to the group
// for good: KillOrphans finds it among this process's children.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return os.NewSyscallError("prctl PR_SET_CHILD_SUBREAPER", err)
	}
	return nil
}

// KillOrphans SIGKILLs and reaps every child of this process whose pid is not in keep
// (the children it started itself and still owns) and for which ours reports true (nil:
// every one), then does the same for the children those leave behind, until none is
// left or orphanWait has passed. Only a subreaper (BecomeSubreaper) has such children.
// It returns how many of them had left the process groups in groups (the groups just
// killed, whose own stragglers it only reaps).
//
// ours keeps the sweep to what this program's workers left behind: a process that
// inherited children when it was exec'd (a shell's `exec > >(tee log)` before `exec
// gangrun ...`) must not kill them, nor what they leave behind (see Marked).
//
// Call it only when every process this program started and waits for is in keep or
// already reaped: it reaps what it kills, which would steal another waiter's status.
func KillOrphans(keep, groups map[int]bool, ours func(pid int) bool) int {
	escaped := 0
	deadline := time.Now().Add(orphanWait)
	for time.Now().Before(deadline) {
		var kids []child
		for _, k := range children(os.Getpid(), keep) {
			if ours == nil || ours(k.pid) {
				kids = append(kids, k)
			}
		}
		if len(kids) == 0 {
			return escaped
		}
		for _, k := range kids {
			if unix.Kill(k.pid, syscall.SIGKILL) == nil && !groups[k.pgid] {
				escaped++
			}
		}
		for _, k := range kids {
			reap(k.pid, deadline)
		}
	}
	return escaped
}

// Children returns the pids of this process's current children.
func Children() []int {
	var out []int
	for _, k := range children(os.Getpid(), nil) {
		out = append(out, k.pid)
	}
	return out
}

// Marked reports whether process pid's environment (as it was at its exec,
// /proc/PID/environ) holds every one of the "KEY=VALUE" entries in marks. A supervisor
// gives its workers such entries (GANGRUN_JOB_ID, GANGRUN_NODE_NAME); their descendants
// inherit them unless they clear their environment. An environment that cannot be read
// (the process exited, or changed its credentials) is not marked.
func Marked(pid int, marks []string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	have := map[string]bool{}
	for _, kv := range strings.Split(string(data), "\x00") {
		have[kv] = true
	}
	for _, m := range marks {
		if !have[m] {
			return false
		}
	}
	return true
}

// ReapZombies reaps the children of this process that have exited and whose pids are
// not in keep, without killing anything: a subreaper inherits every orphan of its
// descendants (a trainer's double-forked helper, say), and each one that exits stays a
// zombie until reaped, using up a pid. Returns how many it reaped. The same rule as
// KillOrphans: keep must hold every child some other code waits for.
func ReapZombies(keep map[int]bool) int {
	n := 0
	for _, k := range children(os.Getpid(), keep) {
		if k.state != 'Z' {
			continue
		}
		var ws unix.WaitStatus
		if got, _ := unix.Wait4(k.pid, &ws, unix.WNOHANG, nil); got == k.pid {
			n++
		}
	}
	return n
}

// child is a child process: its pid, process group and state letter ('Z': zombie).
type child struct {
	pid, pgid int
	state     byte
}

// reap waits for pid, a child of this process, to exit and reaps it, until deadline.
func reap(pid int, deadline time.Time) {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if got == pid || errors.Is(err, unix.ECHILD) || (err != nil && !errors.Is(err, unix.EINTR)) {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// children lists the processes whose parent is ppid, from /proc/PID/stat, leaving out
// the pids in keep.
func children(ppid int, keep map[int]bool) []child {
	var out []child
	eachProcess(func(pid int, fields []string) {
		if keep[pid] || len(fields) < 3 {
			return
		}
		// After comm: state ppid pgrp ...
		if p, err := strconv.Atoi(fields[1]); err != nil || p != ppid {
			return
		}
		pgid, _ := strconv.Atoi(fields[2])
		out = append(out, child{pid: pid, pgid: pgid, state: fields[0][0]})
	})
	return out
}

// eachProcess calls fn for each process in /proc with the fields of its
// /proc/PID/stat after comm ("state ppid pgrp session ..."); a process that exits
// meanwhile is left out.
func eachProcess(fn func(pid int, fields []string)) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue // it exited meanwhile
		}
		if fields := StatFields(string(b)); fields != nil {
			fn(pid, fields)
		}
	}
}

// StatFields returns the fields of a /proc/PID/stat line (proc(5)) after comm, nil
// when it has none: the line is "pid (comm) state ppid ...", and comm may hold spaces
// and parentheses, so the fields start after its last ')'. Field N of proc(5) (from 1)
// is StatFields(s)[N-3], state the first.
func StatFields(s string) []string {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}
