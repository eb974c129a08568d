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

	"golang.org/x/sys/unix"
)

// Guardian is a helper process that SIGKILLs the process groups registered with it when
// its supervisor dies without releasing them (for instance when the supervisor itself is
// SIGKILLed, which no in-process cleanup survives). Parent-death signals already kill
// each group's leader; the guardian catches the rest of the group: a trainer's data
// loader processes, a shell's children.
//
// The protocol is one line per event on the guardian's stdin: "+PGID" registers a group,
// "-PGID" forgets one, "dPATH" names a scratch directory to remove if the supervisor
// dies, "q" means a clean shutdown. End of input without "q" means the supervisor died:
// the guardian kills every group still registered, removes the scratch directories, and
// exits.
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

// RemoveOnDeath has the guardian remove dir (recursively) if the supervisor dies without
// a clean shutdown. dir must be absolute and hold no newline. A nil Guardian ignores the
// call.
func (g *Guardian) RemoveOnDeath(dir string) error {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, "\n") {
		return fmt.Errorf("guardian: scratch dir %q: want an absolute path on one line", dir)
	}
	return g.send("d" + dir)
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
// group still registered, returns nil). SIGINT, SIGTERM and SIGHUP are ignored so that a
// signal meant for the supervisor's terminal or job cannot end the guardian first.
func RunGuardian(r io.Reader) error {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	groups := map[int]bool{}
	var dirs []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "q":
			return nil
		case strings.HasPrefix(line, "d/"):
			dirs = append(dirs, line[1:])
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
	}
	for pgid := range groups {
		_ = unix.Kill(-pgid, unix.SIGKILL)
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
	return nil
}
