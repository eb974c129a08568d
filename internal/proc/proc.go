// Package proc starts processes that each lead their own process group, signals whole
// groups, and makes sure no member of a group outlives its supervisor.
//
// Three mechanisms together cover every path by which a supervisor can end:
//   - each process leads a new process group (setpgid), so a signal reaches it and every
//     descendant that stayed in its group;
//   - each process gets a parent-death signal (prctl PR_SET_PDEATHSIG, SIGKILL), so it
//     dies with the supervisor even when the supervisor is SIGKILLed;
//   - the leader's exit is observed without reaping it (waitid WNOWAIT), so its process
//     group id cannot be reused until Release has SIGKILLed the whole group; and a
//     Guardian process SIGKILLs the groups that are still registered when the supervisor
//     dies without releasing them.
//
// Linux only.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Process is a started command that leads its own process group. The zero value is not
// usable; create one with Start (or Adopt).
type Process struct {
	cmd    *exec.Cmd
	pid    int
	exited chan struct{}

	releaseOnce sync.Once
	status      ExitStatus
	releaseErr  error
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	// Code is the exit code, or -1 when the process was killed by a signal.
	Code int
	// Signal is the signal that killed the process, or 0.
	Signal syscall.Signal
}

// ShellCode returns the status as a shell reports it: the exit code, or 128+N for death
// by signal N (POSIX shells' convention, also torchrun's).
func (s ExitStatus) ShellCode() int {
	if s.Signal != 0 {
		return 128 + int(s.Signal)
	}
	return s.Code
}

// Success reports whether the process exited with code 0.
func (s ExitStatus) Success() bool { return s.Signal == 0 && s.Code == 0 }

// String describes the status: "exit code 3" or "signal SIGKILL (9)".
func (s ExitStatus) String() string {
	if s.Signal != 0 {
		return fmt.Sprintf("signal %s (%d)", SignalName(s.Signal), int(s.Signal))
	}
	return fmt.Sprintf("exit code %d", s.Code)
}

// SignalName returns the conventional name of sig, such as "SIGTERM".
func SignalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return fmt.Sprintf("SIG%d", int(sig))
}

// Start starts cmd as the leader of a new process group with a SIGKILL parent-death
// signal. cmd must not have been started; its SysProcAttr is replaced, all but its
// Credential (the user the process runs as: User.Credential) and a terminal session's
// Setsid, Setctty and Ctty (a process on a pseudo-terminal leads a new session, and so
// a new process group of the same id, with the terminal as its controlling one; see
// KillSession). The caller owns the
// returned Process and must call Release once, which also reaps it.
//
// Start returns the error of exec.Cmd.Start (for instance exec.ErrNotFound wrapped in
// *exec.Error, or a *os.PathError for a missing or non-executable file).
func Start(cmd *exec.Cmd) (*Process, error) { return startIn(cmd, -1) }

// startIn is Start with the process cloned into the cgroup v2 directory open as
// cgroupFD (clone3's CLONE_INTO_CGROUP) when cgroupFD >= 0.
func startIn(cmd *exec.Cmd, cgroupFD int) (*Process, error) {
	var given syscall.SysProcAttr
	if cmd.SysProcAttr != nil {
		given = *cmd.SysProcAttr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    !given.Setsid, // a session leader leads its group already (setpgid would fail)
		Setsid:     given.Setsid,
		Setctty:    given.Setsid && given.Setctty,
		Ctty:       given.Ctty,
		Pdeathsig:  syscall.SIGKILL, // set in the child after its credentials: kept
		Credential: given.Credential,
	}
	if cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgroupFD
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go p.watch()
	return p, nil
}

// ErrNotOurChild is Adopt's error for a pid that is not a child of this process.
var ErrNotOurChild = errors.New("not a child of this process")

// Adopt returns the Process of pid, a child of this process that it did not start
// itself: a process re-parented here, which this process is a child subreaper for
// (BecomeSubreaper), after its parent died. pid must lead its own process group (setsid
// or setpgid, which Adopt does not check: Signal and Release signal the group pid).
// The caller owns the Process and must call Release once, as for Start's.
//
// Errors: ErrNotOurChild when /proc says pid's parent is another process (or pid is
// gone); /proc's error when it cannot be read.
func Adopt(pid int) (*Process, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNotOurChild)
		}
		return nil, err
	}
	f := StatFields(string(data)) // state ppid ...
	if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrNotOurChild)
	}
	p := &Process{pid: pid, exited: make(chan struct{})}
	go p.watch()
	return p, nil
}

// watch waits for the leader to exit without reaping it, so its pid (and so its process
// group id) stays reserved until Release.
func (p *Process) watch() {
	defer close(p.exited)
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		// nil: it exited. ECHILD: already reaped by Release. Either way it is gone.
		return
	}
}

// Pid returns the leader's process id, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Exited is closed once the group leader has exited. Other members of its group may
// still run until Release.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Signal sends sig to every process in the group. A group that no longer exists is not
// an error.
func (p *Process) Signal(sig syscall.Signal) error {
	err := unix.Kill(-p.pid, sig)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %s to process group %d: %w", SignalName(sig), p.pid, err)
	}
	return nil
}

// SignalLeader sends sig to the process itself, not its group: a signal the process is
// to handle (SIGUSR1 before a pre-emption), which its children (a DataLoader's workers)
// without a handler would die of. A process that has exited is not an error.
func (p *Process) SignalLeader(sig syscall.Signal) error {
	err := unix.Kill(p.pid, sig)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %s to process %d: %w", SignalName(sig), p.pid, err)
	}
	return nil
}

// Release SIGKILLs whatever is left of the process group, reaps the leader and returns
// how the leader ended. It blocks until the leader has exited. It is safe to call more
// than once; later calls return the first result.
func (p *Process) Release() (ExitStatus, error) {
	p.releaseOnce.Do(func() {
		// The leader's pid is still reserved here (not reaped), so the group id cannot
		// name anybody else's processes.
		_ = p.Signal(syscall.SIGKILL)
		if p.cmd == nil { // adopted
			p.status, p.releaseErr = wait(p.pid)
			return
		}
		err := p.cmd.Wait()
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			p.releaseErr = fmt.Errorf("reap pid %d: %w", p.pid, err)
			return
		}
		p.status = statusOf(p.cmd.ProcessState)
	})
	return p.status, p.releaseErr
}

// wait reaps pid, a child of this process, and returns how it ended.
func wait(pid int) (ExitStatus, error) {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return ExitStatus{Code: -1}, fmt.Errorf("reap pid %d: %w", pid, err)
		}
		if ws.Signaled() {
			return ExitStatus{Code: -1, Signal: ws.Signal()}, nil
		}
		return ExitStatus{Code: ws.ExitStatus()}, nil
	}
}

func statusOf(ps *os.ProcessState) ExitStatus {
	if ps == nil {
		return ExitStatus{Code: -1}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ExitStatus{Code: -1, Signal: ws.Signal()}
	}
	return ExitStatus{Code: ps.ExitCode()}
}
