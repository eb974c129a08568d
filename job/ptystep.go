package job

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/proc"
)

// An srun --pty step (Slurm's "task zero in pseudo terminal mode"): its one task runs
// on a pseudo-terminal of its node, as the job's user in the job's cgroup like every
// srun task, leading a session of its own with the terminal as its controlling one.
// The node's connection to srun carries the terminal both ways: what the task writes
// goes to srun as it comes (Out frames of whatever the terminal gave, not whole
// lines), and srun sends what its user types (In) and its terminal's new sizes
// (Winsize, which the node sets with TIOCSWINSZ: the task's foreground group gets
// SIGWINCH from the kernel). Keys such as Ctrl-C are bytes in srun's raw terminal,
// which this terminal's line discipline turns into signals, as sshd's does. srun's
// own signals come as Signal frames, as for any step. When the task exits, whatever
// else of its session is left (a job the shell put in the background) is SIGKILLed,
// as slurmstepd kills what is left of a step; losing srun hangs the shell up (SIGHUP),
// then stops it as any task.

// Winsize is a terminal's size in characters (struct winsize's rows and columns).
type Winsize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ptyInputQueue bounds the input chunks waiting for a task that does not read its
// terminal (its input queue full) before srun's connection waits for it.
const ptyInputQueue = 1024

// ptyDrain bounds how long the node reads what is left in the terminal once the task
// and its session have ended (a process that left the session may hold it open).
const ptyDrain = 2 * time.Second

// runPty runs --pty step r's one task on a pseudo-terminal here (node i of the step;
// the job's GPUs on the node gpus), streams the terminal to srun over c and takes
// srun's input from conn, and records the step cancelled if srun was lost first.
func (bs *batchStep) runPty(ctx context.Context, r StepRequest, c *srunConn, conn net.Conn, i int, gpus []string) {
	defer c.send(Frame{Done: true})
	master, tty, err := openPty(*r.Pty, bs.stepUID())
	if err != nil {
		c.send(Frame{Error: "cannot open a pseudo-terminal: " + err.Error()})
		return
	}
	defer master.Close()
	taskGPUs := gpus
	if r.GPUsPerTask > 0 {
		taskGPUs = gpus[:r.GPUsPerTask]
	}
	p, err := bs.startPtyTask(r, bs.taskEnv(r, i, r.FirstTask(i), 0, gpus, taskGPUs), tty)
	tty.Close()
	if err != nil {
		msg := fmt.Sprintf("slurmstepd-%s: error: execve(): %s: %s\r\n", bs.st.cfg.Node, r.Command[0], execError(err))
		c.send(Frame{Task: r.FirstTask(i), FD: 2, Out: []byte(msg)})
		c.send(Frame{Task: r.FirstTask(i), Exit: &TaskExit{Code: 2}})
		return
	}
	feed := newPtyFeed(master)
	from := followSrun(conn, bs.signal, feed)
	from.add(p)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := master.Read(buf)
			if n > 0 {
				c.send(Frame{Task: r.FirstTask(i), FD: 1, Out: slices.Clone(buf[:n])})
			}
			if err != nil {
				return // EIO: no process has the terminal open any more
			}
		}
	}()
	exit := bs.awaitPty(r, p, from)
	_ = master.SetReadDeadline(time.Now().Add(ptyDrain))
	select {
	case <-copied:
	case <-time.After(ptyDrain + time.Second):
		master.Close() // not pollable after all: Close ends the Read
		<-copied
	}
	feed.close()
	c.send(Frame{Task: r.FirstTask(i), Exit: exit})
	if from.gone.Load() {
		_ = EndSrunStep(context.WithoutCancel(ctx), bs.st.cfg.Store, r.Job, r.Step, SrunState{State: Cancelled, ExitCode: 1,
			Ended: time.Now().UTC(), Reason: "srun ended before its tasks"})
	}
}

// startPtyTask starts step r's task with environment env on terminal tty (its stdin,
// stdout and stderr, and its controlling terminal: a new session), and counts it among
// the step's.
func (bs *batchStep) startPtyTask(r StepRequest, env []string, tty *os.File) (*proc.Process, error) {
	if err := findCommand(r.Command[0], env, r.WorkDir); err != nil {
		return nil, err
	}
	argv := append(taskPIDShim(), r.Command...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, r.WorkDir, tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0} // Ctty: the child's fd 0
	p, err := bs.startCmd(cmd)
	if err != nil {
		return nil, err
	}
	bs.track(r, p)
	return p, nil
}

// awaitPty waits for the terminal's task p of step r to exit; if srun is lost first,
// it hangs the task up (SIGHUP and SIGCONT to the session's leader, as a terminal's
// hangup does) and stops it as any task. Then it SIGKILLs what is left of the task's
// session (proc.KillSession: the shell's jobs, each in a group of its own), reaps the
// task and returns its exit.
func (bs *batchStep) awaitPty(r StepRequest, p *proc.Process, from *srunFeed) *TaskExit {
	select {
	case <-p.Exited():
	case <-from.lost:
		from.gone.Store(true)
		_ = p.SignalLeader(syscall.SIGHUP)
		_ = p.SignalLeader(syscall.SIGCONT)
		terminate([]*proc.Process{p}, bs.grace, bs.signal)
	}
	if n := proc.KillSession(p.Pid()); n > 0 {
		bs.log.Info("the terminal's task has exited: killed what was left of its session",
			zap.String("srun_step", r.Job+"."+strconv.Itoa(r.Step)), zap.Int("processes", n))
	}
	return bs.forget(r, p)
}

// ptyFeed is a --pty task's terminal as srun's connection feeds it: input written in
// order by a goroutine of its own (a task that does not read its terminal holds up
// srun's input, not its signals, until ptyInputQueue chunks wait), and window sizes
// set at once. A nil ptyFeed takes nothing.
type ptyFeed struct {
	master *os.File
	in     chan []byte
	done   chan struct{}
	once   sync.Once
}

// newPtyFeed starts feeding master, a terminal's master side, until close.
func newPtyFeed(master *os.File) *ptyFeed {
	f := &ptyFeed{master: master, in: make(chan []byte, ptyInputQueue), done: make(chan struct{})}
	go func() {
		for {
			select {
			case b := <-f.in:
				_, _ = master.Write(b) // an error: the terminal is gone, and so is the input
			case <-f.done:
				return
			}
		}
	}()
	return f
}

// take gives the terminal frame fr's input and window size.
func (f *ptyFeed) take(fr Frame) {
	if f == nil {
		return
	}
	if ws := fr.Winsize; ws != nil && ws.Rows > 0 && ws.Cols > 0 {
		_ = setWinsize(f.master, *ws)
	}
	if len(fr.In) > 0 {
		select {
		case f.in <- fr.In:
		case <-f.done:
		}
	}
}

// close ends the feed (again: nothing; nil: nothing).
func (f *ptyFeed) close() {
	if f != nil {
		f.once.Do(func() { close(f.done) })
	}
}

// openPty opens a new pseudo-terminal of size ws: its master side (this process's,
// pollable: reads take deadlines) and its slave side (the task's), the slave owned by
// uid with group tty and mode 0620, as login and sshd leave a user's terminal. The
// slave is opened from the master (TIOCGPTPEER, Linux 4.13; before it, by its
// /dev/pts name).
func openPty(ws Winsize, uid uint32) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var sfd, n int
	err = control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		ptn, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
		if err != nil {
			return fmt.Errorf("its number: %w", err)
		}
		n = int(ptn)
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
		if errno != 0 {
			sfd = -1
			return nil
		}
		sfd = int(r)
		return nil
	})
	name := "/dev/pts/" + strconv.Itoa(n)
	if err == nil && sfd < 0 {
		sfd, err = unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	slave = os.NewFile(uintptr(sfd), name)
	gid := -1
	if g, err := user.LookupGroup("tty"); err == nil {
		gid, _ = strconv.Atoi(g.Gid)
	}
	if err := errors.Join(unix.Fchown(sfd, int(uid), gid), unix.Fchmod(sfd, 0o620), setWinsize(master, ws)); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return master, slave, nil
}

// setWinsize sets the terminal's size (TIOCSWINSZ on its master side).
func setWinsize(master *os.File, ws Winsize) error {
	return control(master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	})
}

// control runs fn on f's descriptor without taking it out of the poller (as f.Fd()
// would, making it blocking: a Read would no longer take a deadline).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
