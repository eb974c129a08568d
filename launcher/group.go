package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gangrun/gangrun/internal/proc"
)

// pumpGrace bounds how long a stopped group's output readers may wait for the last
// lines once every process of the group is dead; only a process that left the group
// (setsid) can still hold the pipes open by then.
const pumpGrace = 2 * time.Second

// workerSpec is one process to start.
type workerSpec struct {
	localRank int
	rank      int
	argv      []string
	env       []string
	prefix    string   // console prefix, "[rank3]: "
	base      string   // the log directory (or scratch directory) the attempt's tree is under
	rel       []string // dir below base: attempt_K, rank_N (or node_N)
	dir       string   // base/rel...: the per-attempt, per-rank directory, error file and logs
	errorFile string   // TORCHELASTIC_ERROR_FILE, already in env
	logFiles  bool     // write stdout.log / stderr.log into dir
	// noFile and noConsole leave stream i (0 stdout, 1 stderr) out of its log file
	// (when logFiles) and off the console (Config.Streams).
	noFile, noConsole [2]bool
	cpus              []int          // CPUs to bind the worker to (proc.StartBound); nil: unbound
	mem               proc.MemPolicy // its NUMA memory policy; no nodes: the default
	place             proc.Placement // the step's cgroup to start it in; nil: none
	user              *proc.User     // who it runs as (Config.User); nil: gangrun's user
}

// worker is one started process of a group.
type worker struct {
	spec    workerSpec
	p       *proc.Process
	readers []*os.File
	files   []*os.File
	pumps   sync.WaitGroup
	targets [2]*pumpTarget // a standby's pumps' targets, set when it becomes this worker
	warm    bool           // started from a standby

	// memRefused: the worker was to start under spec.mem, and the kernel refused it.
	memRefused bool

	exited   bool
	status   proc.ExitStatus
	exitedAt time.Time
}

// group is one attempt's processes on this node.
type group struct {
	workers []*worker
	// exits receives the index of each worker as its leader exits.
	exits chan int
	// warm counts the workers started from a standby.
	warm int
}

// warmStart returns spec's worker started from a standby, its log files already
// created, or nil to start it cold.
type warmStart func(spec workerSpec, files []*os.File) *worker

// startGroup starts every spec. On error the workers already started are killed and
// reaped before it returns.
// warm, when non-nil, is asked for each worker first.
func startGroup(specs []workerSpec, console, consoleErr *lineWriter, act *activity, guard *proc.Guardian, warm warmStart) (*group, error) {
	g := &group{exits: make(chan int, len(specs))}
	// cgroup v1: one move of the forking thread into the step's cgroup for the whole
	// group, not one per worker: each move costs a cgroup migration per controller.
	// cgroup v2 has no such move: each worker is cloned into it (its spec's place).
	byThread := len(specs) > 0 && proc.EntersByThread(specs[0].place)
	start := func() error {
		for i, s := range specs {
			if byThread {
				s.place = nil // the whole group starts in it (below)
			}
			w, err := startWorker(s, console, consoleErr, act, warm)
			if err != nil {
				return err
			}
			// Should the guardian be gone, the parent-death signal still covers the leader.
			_ = guard.Watch(w.p.Pid())
			g.workers = append(g.workers, w)
			if w.warm {
				g.warm++
			}
			go func(i int, w *worker) {
				<-w.p.Exited()
				g.exits <- i
			}(i, w)
		}
		return nil
	}
	var err error
	if byThread {
		err = proc.InPlacement(specs[0].place, start)
	} else {
		err = start()
	}
	if err != nil {
		g.kill(guard)
		return nil, err
	}
	return g, nil
}

// errorFileName is the name of a worker's TORCHELASTIC_ERROR_FILE in its directory.
const errorFileName = "error.json"

// startWorker starts the process of spec s: it makes the rank's directory and log
// files, asks warm (when non-nil) for a worker started from a standby, else starts s's
// command itself, its stdout and stderr pumped to the console (console, consoleErr)
// and the log files, each line counted as activity (act). An error names the rank.
func startWorker(s workerSpec, console, consoleErr *lineWriter, act *activity, warm warmStart) (*worker, error) {
	dir, err := makeRankDir(s)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	w := &worker{spec: s}
	if err := w.openLogFiles(dir); err != nil {
		return nil, err
	}
	if warm != nil {
		if ww := warm(s, w.files); ww != nil {
			ww.warm = true
			return ww, nil
		}
	}
	cmd := workerCommand(s)
	var childEnds []*os.File
	for _, name := range []string{"stdout", "stderr"} {
		r, wr, err := os.Pipe()
		if err != nil {
			closeFiles(childEnds, w.readers, w.files)
			return nil, fmt.Errorf("rank %d: %s pipe: %w", s.rank, name, err)
		}
		w.readers = append(w.readers, r)
		childEnds = append(childEnds, wr)
	}
	cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[1]
	p, _, memBound, err := proc.StartPlacedMem(cmd, s.cpus, s.mem, s.place)
	w.memRefused = err == nil && len(s.mem.Nodes) > 0 && !memBound
	closeFiles(childEnds)
	if err != nil {
		closeFiles(w.readers, w.files)
		return nil, startError(s, err)
	}
	w.p = p
	w.startPumps(console, consoleErr, act)
	return w, nil
}

// makeRankDir makes spec s's directory below its log (or scratch) directory,
// following no link below it (logdir.go: each is made relative to its parent's
// descriptor), and returns it open. It is the user's, and theirs alone, when the
// workers run as another user; a stale error file in it from an earlier attempt with
// the same number is removed (torch's error handler warns about and overwrites one,
// and it would be misread as this attempt's root cause).
func makeRankDir(s workerSpec) (*os.File, error) {
	dir, err := workerDir(s.base, s.rel)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", s.rank, err)
	}
	fail := func(err error) (*os.File, error) {
		dir.Close()
		return nil, fmt.Errorf("rank %d: %w", s.rank, err)
	}
	if !s.user.IsSelf() {
		// The directories above it are gangrun's.
		if err := dir.Chown(int(s.user.UID), int(s.user.GID)); err != nil {
			return fail(err)
		}
		if err := dir.Chmod(0o700); err != nil {
			return fail(err)
		}
	}
	if err := removeStaleAt(dir, errorFileName); err != nil {
		return fail(err)
	}
	return dir, nil
}

// openLogFiles creates w's stdout.log and stderr.log in dir when its spec writes log
// files (w.files, nil for a stream kept out of its file); on error it closes those
// already created.
func (w *worker) openLogFiles(dir *os.File) error {
	if !w.spec.logFiles {
		return nil
	}
	for i, name := range []string{"stdout", "stderr"} {
		if w.spec.noFile[i] {
			w.files = append(w.files, nil)
			continue
		}
		f, err := createLogFile(dir, name+".log")
		if err != nil {
			closeFiles(w.files)
			return fmt.Errorf("rank %d: %w", w.spec.rank, err)
		}
		w.files = append(w.files, f)
	}
	return nil
}

// workerCommand is the command of spec s, with its environment; for a worker that
// runs as another user, with the user's credentials, the program the user finds on
// the PATH, and gangrun's working directory entered as the user.
func workerCommand(s workerSpec) *exec.Cmd {
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Env = s.env
	if s.user.IsSelf() {
		return cmd
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.user.Credential()} // kept by proc.Start
	// The worker enters gangrun's working directory itself, as the user, after taking
	// the user's ids (os/exec's chdir in the child): gangrun's own chdir was root's,
	// and a directory the user may not reach must not be inherited.
	if wd, err := os.Getwd(); err == nil {
		cmd.Dir = wd
	}
	// The program the user finds on the PATH, not the one root found.
	if path, err := lookPathAs(s.user, s.argv[0]); err == nil {
		cmd.Path, cmd.Err = path, nil
	} else {
		cmd.Err = err
	}
	return cmd
}

// startError is the error of spec s's process that failed to start: ErrWorkDir for a
// working directory it cannot enter, ErrCommandNotFound for a command gone since New
// checked it, ErrNotExecutable for one that lost its execute bit or is in no format the
// kernel runs, else err, naming the rank.
func startError(s workerSpec, err error) error {
	if pe := (*os.PathError)(nil); errors.As(err, &pe) && pe.Op == "chdir" {
		return fmt.Errorf("start rank %d: %w %s: %v", s.rank, ErrWorkDir, pe.Path, pe.Err)
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		// The command vanished since New checked it.
		return fmt.Errorf("start rank %d: %w: %s (%v)", s.rank, ErrCommandNotFound, s.argv[0], unwrapPath(err))
	}
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
		// It lost its execute bit since New checked it, or is in no format the kernel
		// runs (no #! line, not a binary for this machine).
		return fmt.Errorf("start rank %d: %w", s.rank, &notExecutableError{s.argv[0], unwrapPath(err).Error()})
	}
	return fmt.Errorf("start rank %d (%s): %w", s.rank, s.argv[0], err)
}

// startPumps copies each of w's output streams, line by line with its prefix, to its
// console sink (console for stdout, consoleErr for stderr; none for a stream kept off
// the console) and its log file, counting each line as activity (act).
func (w *worker) startPumps(console, consoleErr *lineWriter, act *activity) {
	sinks := []*lineWriter{console, consoleErr}
	for i, r := range w.readers {
		var file io.Writer
		if w.spec.logFiles && w.files[i] != nil {
			file = w.files[i]
		}
		sink := sinks[i]
		if w.spec.noConsole[i] {
			sink = nil
		}
		w.pumps.Add(1)
		go func(r io.Reader, sink *lineWriter, file io.Writer) {
			defer w.pumps.Done()
			pump(r, w.spec.prefix, sink, file, act)
		}(r, sink, file)
	}
}

// closeFiles closes every file of lists that is not nil.
func closeFiles(lists ...[]*os.File) {
	for _, list := range lists {
		for _, f := range list {
			if f != nil {
				f.Close()
			}
		}
	}
}

// reap kills what is left of w's process group, reaps the leader and records how it
// ended. Idempotent.
func (w *worker) reap(guard *proc.Guardian) proc.ExitStatus {
	if w.exited {
		return w.status
	}
	st, err := w.p.Release()
	if err != nil {
		st = proc.ExitStatus{Code: -1}
	}
	_ = guard.Forget(w.p.Pid())
	w.exited, w.status, w.exitedAt = true, st, time.Now()
	return st
}

// pids returns the group's worker pids, which are also their process group ids.
func (g *group) pids() map[int]bool {
	out := make(map[int]bool, len(g.workers))
	for _, w := range g.workers {
		out[w.p.Pid()] = true
	}
	return out
}

// reportOutputWait bounds how long the failure report waits for the root-cause worker's
// last output lines: its pipes close when it exits, unless a child of it still holds them.
const reportOutputWait = 250 * time.Millisecond

// awaitOutput waits up to d for w's output readers to reach the end of its pipes and
// reports whether they did. It closes nothing: finishOutput does that.
func (w *worker) awaitOutput(d time.Duration) bool {
	done := make(chan struct{})
	go func() { w.pumps.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// finishOutput waits for w's output readers (bounded by pumpGrace), then closes its
// pipes and log files.
func (w *worker) finishOutput() {
	if !w.awaitOutput(pumpGrace) {
		for _, r := range w.readers {
			r.Close() // unblocks the pump
		}
		w.pumps.Wait()
	}
	for _, f := range append(w.readers, w.files...) {
		f.Close()
	}
}

// live returns the workers whose leader has not been reaped.
func (g *group) live() []*worker {
	var out []*worker
	for _, w := range g.workers {
		if !w.exited {
			out = append(out, w)
		}
	}
	return out
}

// signal sends sig to every live worker: a terminating one (SIGTERM, SIGINT, SIGHUP, SIGQUIT) to
// its whole process group, any other (SIGUSR1, SIGUSR2) to the worker process alone,
// as torchrun forwards it, so a child without a handler (a DataLoader worker) lives.
func (g *group) signal(sig syscall.Signal) {
	for _, w := range g.live() {
		if proc.Terminating(sig) {
			_ = w.p.Signal(sig) // stopping: the worker's whole process group
		} else {
			_ = w.p.SignalLeader(sig) // forwarded for the worker to handle: it alone
		}
	}
}

// kill SIGKILLs and reaps every worker and closes their output.
func (g *group) kill(guard *proc.Guardian) {
	for _, w := range g.workers {
		w.reap(guard)
	}
	for _, w := range g.workers {
		w.finishOutput()
	}
}

// rankPrefix is the console prefix of a worker's lines: "[rank3]: ".
func rankPrefix(rank int) string { return "[rank" + strconv.Itoa(rank) + "]: " }
