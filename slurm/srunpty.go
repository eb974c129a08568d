package slurm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/gangrun/gangrun/job"
)

// srun --pty (Slurm's "execute task zero in pseudo terminal mode"): the step's one task
// runs on a pseudo-terminal of its node (job/ptystep.go), and srun's own terminal is
// its keyboard and screen. Once the node has connected, srun puts its terminal in raw
// mode (x/term's MakeRaw, cfmakeraw's settings, as Slurm's srun): every key is a byte
// for the task's terminal, whose line discipline echoes it and makes Ctrl-C a SIGINT
// for the task's foreground job, not for srun. The task's output comes back as the
// node reads it, byte by byte, and goes to srun's stdout untouched; srun's own
// messages on stderr get "\r\n" while the terminal is raw. SIGWINCH sends the
// terminal's new size (TIOCGWINSZ) to the node; SIGTERM and SIGHUP end the task with
// SIGKILL, as Slurm's srun forwards them ("forcing job termination"). The terminal is
// restored before srun returns.

// ptyDefaults gives srun --pty's layout defaults: without -n, -N or --ntasks-per-node,
// one task on the step's first node, whatever the job's SLURM_NTASKS, SLURM_NNODES and
// SLURM_NTASKS_PER_NODE say. (Slurm 22.05 starts a task per node there, task 0 on the
// terminal and the others with their output to /dev/null, where a shell ends at
// once; gangrun starts task 0 alone.)
func ptyDefaults(v values, getenv func(string) string) (values, func(string) string) {
	if !v.has("pty") || v.has("ntasks") || v.has("nodes") || v.has("ntasks-per-node") {
		return v, getenv
	}
	w := values{"ntasks": "1"}
	for k, val := range v {
		w[k] = val
	}
	return w, func(k string) string {
		switch k {
		case "SLURM_NTASKS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE":
			return ""
		}
		return getenv(k)
	}
}

// ptyRequest readies srun --pty's step request req (options v; nothing without --pty):
// the task's terminal starts with the size of srun's (its stdin), which it returns. done is true, with srun's exit code,
// where srun ends here: --pty with more than one task (Slurm 22.05 runs the others with
// their output to /dev/null; gangrun refuses). Without a terminal on stdin, srun says
// so as Slurm's does and runs the step without one.
func ptyRequest(e *Env, v values, req *job.StepRequest) (tty *os.File, code int, done bool) {
	if !v.has("pty") {
		return nil, 0, false
	}
	if req.NTasks() != 1 {
		return nil, errorf(e, "srun", 1, "--pty runs one task on a terminal, and this step has %d: give -n1 (gangrun does not run the other tasks with their output to /dev/null, as Slurm does)", req.NTasks()), true
	}
	err := error(unix.ENOTTY)
	var ws *unix.Winsize
	f, ok := e.Stdin.(*os.File)
	if ok {
		ws, err = unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	}
	if err != nil {
		msg := err.Error()
		var errno unix.Errno
		if errors.As(err, &errno) {
			msg = strings.ToUpper(msg[:1]) + msg[1:] // strerror's words
		}
		errorf(e, "srun", 0, "ioctl(TIOCGWINSZ): %s", msg)
		errorf(e, "srun", 0, "Not using a pseudo-terminal, disregarding --pty option")
		return nil, 0, false
	}
	req.Pty = &job.Winsize{Rows: ws.Row, Cols: ws.Col}
	return f, 0, false
}

// stepAllowed reports whether this process's user may start a step in job j: its user
// (as its acceptance attested, else as its record names), or root. Slurm's controller
// refuses a step of another user's job with "Access/permission denied"; the node checks
// the step's MUNGE credential the same way (job/batchstep.go, checkSrun).
func stepAllowed(j *job.Job) bool {
	uid := uint32(os.Getuid())
	switch {
	case uid == 0:
		return true
	case j.Auth != nil && j.Auth.Attestation != "":
		return j.Auth.UID == uid
	}
	return j.Spec.User == currentUser()
}

// ptySignal is the signal srun sends a --pty step's task for sig: SIGKILL for SIGTERM
// and SIGHUP (an interactive shell ignores SIGTERM), sig otherwise.
func ptySignal(sig syscall.Signal) syscall.Signal {
	if sig == syscall.SIGTERM || sig == syscall.SIGHUP {
		return syscall.SIGKILL
	}
	return sig
}

// runTerminal runs the step (run) with srun's terminal tty as its task's, raw while the
// node is connected; a nil tty is a step without a terminal.
func (r *srunRun) runTerminal(ctx context.Context, ln net.Listener, tty *os.File) (int, job.SrunState) {
	if tty == nil {
		return r.run(ctx, ln)
	}
	fd := int(tty.Fd())
	e := *r.e
	stderr := &rawLines{w: e.Stderr}
	e.Stderr, r.e = stderr, &e
	var mu sync.Mutex
	var saved *term.State
	stop := make(chan struct{})
	var wg sync.WaitGroup
	r.connected = func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		if saved != nil {
			return
		}
		stderr.switchMode(true, func() bool {
			s, err := term.MakeRaw(fd)
			saved = s
			return err == nil
		})
		wg.Add(2)
		go func() {
			defer wg.Done()
			pumpInput(fd, stop, func(b []byte) { r.send(c, job.Frame{In: b}) })
		}()
		go func() {
			defer wg.Done()
			watchWinsize(fd, *r.req.Pty, stop, func(ws job.Winsize) { r.send(c, job.Frame{Winsize: &ws}) })
		}()
	}
	code, st := r.run(ctx, ln)
	close(stop)
	wg.Wait()
	mu.Lock()
	if saved != nil {
		stderr.switchMode(false, func() bool { return term.Restore(fd, saved) == nil })
	}
	mu.Unlock()
	return code, st
}

// pumpInput sends what is typed on terminal fd (each read as it comes) until stop is
// closed or the terminal ends. It polls fd beside a pipe that stop closes, so that it
// returns without reading a key meant for whatever runs after srun.
func pumpInput(fd int, stop <-chan struct{}, send func([]byte)) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return
	}
	defer unix.Close(p[0])
	go func() {
		<-stop
		unix.Close(p[1])
	}()
	buf := make([]byte, 4096)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(p[0]), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if n <= 0 {
			return // the terminal is gone (hung up): SIGHUP ends the step
		}
		send(slices.Clone(buf[:n]))
	}
}

// watchWinsize sends terminal fd's size whenever srun gets SIGWINCH (and once at
// first, if it is no longer was, the size the step was created with) until stop.
func watchWinsize(fd int, was job.Winsize, stop <-chan struct{}, send func(job.Winsize)) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	defer signal.Stop(ch)
	check := func() {
		cols, rows, err := term.GetSize(fd)
		if ws := (job.Winsize{Rows: uint16(rows), Cols: uint16(cols)}); err == nil && ws != was {
			was = ws
			send(ws)
		}
	}
	check()
	for {
		select {
		case <-stop:
			return
		case <-ch:
			check()
		}
	}
}

// rawLines is srun's stderr while its terminal is raw (no output processing): each
// "\n" written as "\r\n", so that srun's own messages start at the line's start.
type rawLines struct {
	mu  sync.Mutex
	w   io.Writer
	raw bool
}

// switchMode runs change (the terminal's switch to raw, or back) with no write between,
// and then, if change says it took, counts the terminal raw or not: a line written
// during the switch would otherwise get its "\r" twice or not at all.
func (l *rawLines) switchMode(raw bool, change func() bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if change() {
		l.raw = raw
	}
}

func (l *rawLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.raw {
		return l.w.Write(p)
	}
	if _, err := l.w.Write(bytes.ReplaceAll(p, []byte("\n"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Sattach is sattach, which gangrun does not build: it refuses in one line, exit 1,
// naming what does the job (a terminal on a running job's node: srun --jobid ID
// --overlap --pty bash). Slurm's sattach attaches to a running step's standard I/O.
func Sattach(_ context.Context, e *Env, _ []string) int {
	return errorf(e, "sattach", 1, "sattach is %s; for a shell on a running job's node, srun --jobid ID --overlap --pty bash", notBuilt)
}
