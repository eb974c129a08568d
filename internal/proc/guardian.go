package proc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Guardian is a helper process that SIGKILLs the process groups registered with it when
// its supervisor dies without releasing them (for instance when the supervisor itself is
// SIGKILLed, which no in-process cleanup survives). Parent-death signals already kill
// each group's leader; the guardian catches the rest of the group: a trainer's data
// loader processes, a shell's children.
//
// It also enforces the supervisor's lease with the coordinator (store.Lease): the
// supervisor passes on the time by which its workers must be dead unless the lease is
// renewed, after every renewal; if that time passes with no newer one, the guardian
// SIGKILLs every registered group itself. A supervisor that is frozen (SIGSTOP, a stalled
// disk, a paused container) cannot stop its workers when its lease runs out, and the
// other nodes of the gang re-form without it soon after: the guardian, a process of its
// own, stops them in its place.
//
// The protocol is one line per event on the guardian's stdin: "+PGID" registers a group,
// "-PGID" forgets one, "dPATH" names a scratch directory to remove if the supervisor
// dies, "cPATH" a step's cgroup directory to empty and remove then (GuardianHooks), "kNS" sets the kill time to NS nanoseconds on CLOCK_MONOTONIC (shared by every
// process of the machine; "k0" clears it), "q" means a clean shutdown. End of input
// without "q" means the supervisor died: the guardian kills every group still
// registered, removes the step's cgroups (killing what is left in them) and the
// scratch directories, and exits.
type Guardian struct {
	mu  sync.Mutex
	w   *os.File
	cmd *exec.Cmd
}

// StartGuardian starts argv (typically the gangrun binary with its hidden guardian
// subcommand, which calls RunGuardian) in a process group of its own, without a
// parent-death signal, so that it outlives the supervisor.
func StartGuardian(argv []string) (*Guardian, error) {
	if len(argv) == 0 {
		return nil, errors.New("start guardian: empty command")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start guardian: %w", err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = r
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start guardian %s: %w", argv[0], err)
	}
	r.Close()
	return &Guardian{w: w, cmd: cmd}, nil
}

func (g *Guardian) send(line string) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil {
		return errors.New("guardian already closed")
	}
	if _, err := io.WriteString(g.w, line+"\n"); err != nil {
		return fmt.Errorf("tell guardian %q: %w", line, err)
	}
	return nil
}

// Watch registers process group pgid. A nil Guardian ignores the call.
func (g *Guardian) Watch(pgid int) error { return g.send("+" + strconv.Itoa(pgid)) }

// Forget unregisters process group pgid, once the supervisor has killed and reaped it
// itself. A nil Guardian ignores the call.
func (g *Guardian) Forget(pgid int) error { return g.send("-" + strconv.Itoa(pgid)) }

// KillBy has the guardian SIGKILL every registered group at t unless a later KillBy
// moves it; the zero time clears it. A nil Guardian ignores the call.
func (g *Guardian) KillBy(t time.Time) error {
	if g == nil {
		return nil
	}
	if t.IsZero() {
		return g.send("k0")
	}
	return g.send("k" + strconv.FormatInt(monotonicAt(t), 10))
}

// monotonicNow returns CLOCK_MONOTONIC in nanoseconds: one clock for every process of
// the machine (Go's own monotonic readings are private to a process).
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// monotonicAt converts t, a time of this process, to CLOCK_MONOTONIC nanoseconds; never
// below 1, so a time already past still reads as a deadline.
func monotonicAt(t time.Time) int64 {
	return max(monotonicNow()+int64(time.Until(t)), 1)
}

// RemoveOnDeath has the guardian remove dir (recursively) if the supervisor dies without
// a clean shutdown. dir must be absolute and hold no newline. A nil Guardian ignores the
// call.
func (g *Guardian) RemoveOnDeath(dir string) error {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, "\n") {
		return fmt.Errorf("guardian: scratch dir %q: want an absolute path on one line", dir)
	}
	return g.send("d" + dir)
}

// RemoveCgroupOnDeath has the guardian remove dir, a step's cgroup directory, if the
// supervisor dies without a clean shutdown: what is still in it is SIGKILLed first
// (GuardianHooks.RemoveCgroup). dir must be absolute and hold no newline. A nil
// Guardian ignores the call.
func (g *Guardian) RemoveCgroupOnDeath(dir string) error {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, "\n") {
		return fmt.Errorf("guardian: cgroup dir %q: want an absolute path on one line", dir)
	}
	return g.send("c" + dir)
}

// Pid returns the guardian process's pid; 0 for a nil Guardian.
func (g *Guardian) Pid() int {
	if g == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

// Close tells the guardian to exit without killing anything and waits for it. A nil
// Guardian ignores the call.
func (g *Guardian) Close() error {
	if g == nil {
		return nil
	}
	err := g.send("q")
	g.mu.Lock()
	if g.w != nil {
		g.w.Close()
		g.w = nil
	}
	g.mu.Unlock()
	if werr := g.cmd.Wait(); werr != nil && err == nil {
		err = fmt.Errorf("guardian: %w", werr)
	}
	return err
}

// RunGuardian is the guardian process's main loop: it reads the protocol described on
// Guardian from r until "q" (returns nil, kills nothing) or end of input (SIGKILLs every
// group still registered, returns nil), and kills every registered group when a kill
// time passes (reporting it on log). SIGINT, SIGTERM, SIGHUP and SIGQUIT are ignored so that a
// signal meant for the supervisor's terminal or job cannot end the guardian first.
func RunGuardian(r io.Reader, log io.Writer) error {
	return RunGuardianWith(r, log, GuardianHooks{})
}

// GuardianHooks are what the guardian calls for work outside this package.
type GuardianHooks struct {
	// RemoveCgroup empties (SIGKILL) and removes a step's cgroup directory
	// (cgroup.RemoveDir); nil leaves the directories named by "c" lines alone.
	RemoveCgroup func(dir string) error
}

// RunGuardianWith is RunGuardian with hooks: on end of input without "q" it also
// removes the cgroup directories registered with "c" lines, after killing the groups.
func RunGuardianWith(r io.Reader, log io.Writer, hooks GuardianHooks) error {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
	}()
	groups := map[int]bool{}
	var dirs, cgroupDirs []string
	var killAt int64 // CLOCK_MONOTONIC ns; 0: none
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	arm := func() {
		timer.Stop()
		if killAt > 0 {
			timer.Reset(time.Duration(max(killAt-monotonicNow(), 0)))
		}
	}
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				for pgid := range groups {
					_ = unix.Kill(-pgid, unix.SIGKILL)
				}
				for _, d := range cgroupDirs {
					if hooks.RemoveCgroup == nil {
						break
					}
					if err := hooks.RemoveCgroup(d); err != nil && log != nil {
						fmt.Fprintf(log, "gangrun guardian: %v\n", err)
					}
				}
				for _, d := range dirs {
					_ = os.RemoveAll(d)
				}
				return nil
			}
			switch {
			case line == "q":
				return nil
			case strings.HasPrefix(line, "d/"):
				dirs = append(dirs, line[1:])
			case strings.HasPrefix(line, "c/"):
				cgroupDirs = append(cgroupDirs, line[1:])
			case strings.HasPrefix(line, "k"):
				if ns, err := strconv.ParseInt(line[1:], 10, 64); err == nil && ns >= 0 {
					killAt = ns
					arm()
				}
			case strings.HasPrefix(line, "+"), strings.HasPrefix(line, "-"):
				pgid, err := strconv.Atoi(line[1:])
				if err != nil || pgid <= 1 {
					continue // never kill group 0, 1 or a negative id
				}
				if line[0] == '+' {
					groups[pgid] = true
				} else {
					delete(groups, pgid)
				}
			}
		case <-timer.C:
			if killAt == 0 {
				continue
			}
			if late := monotonicNow() - killAt; late < 0 {
				arm() // woken early: wait out the rest
				continue
			}
			n := 0
			for pgid := range groups {
				if unix.Kill(-pgid, unix.SIGKILL) == nil {
					n++
				}
			}
			if n > 0 && log != nil {
				fmt.Fprintf(log, "gangrun guardian: the supervisor's lease with the coordinator ran out and it did not stop its workers (frozen?): killed %d worker process group(s)\n", n)
			}
			killAt = 0
		}
	}
}
