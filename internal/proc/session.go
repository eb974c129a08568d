package proc

import (
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sessionWait bounds how long KillSession keeps looking for processes of the session
// that are still alive after its SIGKILLs (one stuck in uninterruptible sleep, say).
const sessionWait = 2 * time.Second

// KillSession SIGKILLs every live process of session sid, its leader included, and
// returns how many it signalled. A shell on a pseudo-terminal (Start with Setsid) puts
// each job it runs in a process group of its own, which a signal to the shell's group
// does not reach: the session holds them all. It looks again until no process of the
// session is left alive (a process forking while it is killed) or sessionWait has
// passed; the dead are left for their parents to reap.
//
// The caller keeps the leader unreaped (Process.Exited, before Release) while it calls
// KillSession: its pid, and so the session id, cannot name anybody else's session.
// A process that left the session (setsid, a daemon) is not found.
func KillSession(sid int) int {
	killed := map[int]bool{}
	deadline := time.Now().Add(sessionWait)
	for {
		pids := sessionMembers(sid)
		if len(pids) == 0 || time.Now().After(deadline) {
			return len(killed)
		}
		for _, pid := range pids {
			if unix.Kill(pid, syscall.SIGKILL) == nil {
				killed[pid] = true
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sessionMembers are the pids of the processes of session sid that have not exited
// (zombies left out), from /proc/PID/stat.
func sessionMembers(sid int) []int {
	var out []int
	eachProcess(func(pid int, fields []string) {
		// state ppid pgrp session ...
		if len(fields) < 4 || fields[0] == "Z" || fields[0] == "X" {
			return
		}
		if got, err := strconv.Atoi(fields[3]); err == nil && got == sid {
			out = append(out, pid)
		}
	})
	return out
}
