package launcher

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/rendezvous"
)

// HeartbeatEnv names the file each worker may touch to say it is alive
// (GANGRUN_HEARTBEAT_FILE, one per rank and attempt). Once a rank has touched it, it
// is judged by it under --hang-timeout: no touch for that long and the rank is hung,
// whatever the other ranks print.
const HeartbeatEnv = "GANGRUN_HEARTBEAT_FILE"

// heartbeatName is the heartbeat file's name in the rank's attempt directory.
const heartbeatName = "heartbeat"

// Torch's file-based watchdog contract (torch/distributed/elastic/agent/server/
// local_elastic_agent.py, timer/file_based_local_timer.py): with
// TORCHELASTIC_ENABLE_FILE_TIMER=1 in the launcher's environment, the launcher serves a
// named pipe whose path the workers find in TORCHELASTIC_TIMER_FILE; a worker's
// FileTimerClient writes one JSON request per line, {"version", "pid", "scope_id",
// "expiration_time" (Unix seconds; negative releases the scope), "signal"}, and a
// timer that expires with a signal above 0 means that worker is stuck.
const (
	FileTimerEnableEnv = "TORCHELASTIC_ENABLE_FILE_TIMER"
	FileTimerFileEnv   = "TORCHELASTIC_TIMER_FILE"
)

// stackGrace bounds the wait for the ranks to write their stacks once asked.
const stackGrace = 3 * time.Second

// timerRequest is one FileTimerClient request.
type timerRequest struct {
	PID        int     `json:"pid"`
	Scope      string  `json:"scope_id"`
	Expiration float64 `json:"expiration_time"`
	Signal     int     `json:"signal"`
}

// fileTimer is gangrun's side of torch's file-based watchdog: the named pipe, and the
// timers set through it, kept by the goroutine that reads it (every request applied in
// order, none dropped: a lost release would later look like a hang).
type fileTimer struct {
	path    string
	created string     // the directory gangrun made for the pipe, removed on close
	made    bool       // gangrun made the pipe at the user's path: removed on close
	user    *proc.User // who the workers run as (Config.User)
	f       *os.File

	mu     sync.Mutex
	timers map[timerKey]timerRequest
}

// timerKey is a timer's identity, as torch's server keys them: the worker and the scope.
type timerKey struct {
	pid   int
	scope string
}

// openFileTimer creates the named pipe at path ("" for one of gangrun's own) and starts
// reading it; the workers write it as u (Config.User; nil: gangrun's user), whose
// permissions create (and remove) a pipe at a path they named. An error means the
// watchdog cannot be served (the path exists and is not a pipe, the directory cannot
// be written).
func openFileTimer(path string, u *proc.User) (*fileTimer, error) {
	ft := &fileTimer{timers: map[timerKey]timerRequest{}, user: u}
	mkfifo := func() error { return proc.AsUser(u, func() error { return unix.Mkfifo(path, 0o600) }) }
	if path == "" {
		dir, err := os.MkdirTemp("", "gangrun-watchdog-")
		if err != nil {
			return nil, err
		}
		ft.created, path = dir, filepath.Join(dir, "timer")
		mkfifo = func() error {
			err := unix.Mkfifo(path, 0o600)
			if err == nil && !u.IsSelf() {
				// Gangrun's own directory, which the user's workers only pass through.
				if err = os.Chmod(dir, 0o711); err == nil {
					err = os.Chown(path, int(u.UID), int(u.GID))
				}
			}
			return err
		}
	}
	ft.path = path
	if err := mkfifo(); err == nil {
		ft.made = ft.created == ""
	} else if !errors.Is(err, unix.EEXIST) {
		ft.close()
		return nil, fmt.Errorf("%s=%s: %w", FileTimerFileEnv, path, err)
	}
	// Read and write: the open does not wait for a writer, and the pipe never reads
	// end-of-file when the workers close it. A path the user named is opened with the
	// user's permissions, following no link, without blocking, and must be a pipe: not
	// someone else's, not a device or file put there (or swapped in) meanwhile.
	openAs := u
	if ft.created != "" {
		openAs = nil // gangrun's own directory
	}
	var f *os.File
	err := proc.AsUser(openAs, func() (err error) {
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		return err
	})
	if err == nil {
		if fi, serr := f.Stat(); serr != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			f.Close()
			err = errors.New("exists and is not a named pipe")
		}
	}
	if errors.Is(err, unix.ELOOP) {
		err = errors.New("is a symbolic link: name the pipe itself")
	}
	if err != nil {
		ft.close()
		return nil, fmt.Errorf("%s=%s: %w", FileTimerFileEnv, path, err)
	}
	ft.f = f
	go ft.read(f)
	return ft, nil
}

func (ft *fileTimer) read(f *os.File) {
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r timerRequest
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.PID <= 0 {
			continue
		}
		ft.mu.Lock()
		if k := (timerKey{r.PID, r.Scope}); r.Expiration < 0 {
			delete(ft.timers, k) // a release
		} else {
			ft.timers[k] = r
		}
		ft.mu.Unlock()
	}
}

// close stops serving the pipe and removes what gangrun created.
func (ft *fileTimer) close() {
	if ft.f != nil {
		_ = ft.f.Close()
	}
	if ft.created != "" {
		_ = os.RemoveAll(ft.created)
	}
	if ft.made {
		_ = proc.AsUser(ft.user, func() error { return os.Remove(ft.path) })
	}
}

// expired returns the first timer past now that carries a signal (torch's server reaps
// only those), if any.
func (ft *fileTimer) expired(now time.Time) (timerRequest, bool) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var first timerRequest
	found := false
	for _, r := range ft.timers {
		if r.Signal > 0 && r.Expiration <= float64(now.UnixNano())/1e9 && (!found || r.Expiration < first.Expiration) {
			first, found = r, true
		}
	}
	return first, found
}

// forget drops timer r (its worker is none of this attempt's).
func (ft *fileTimer) forget(r timerRequest) {
	ft.mu.Lock()
	delete(ft.timers, timerKey{r.PID, r.Scope})
	ft.mu.Unlock()
}

// reset forgets every timer (a new attempt's workers have new pids).
func (ft *fileTimer) reset() {
	ft.mu.Lock()
	clear(ft.timers)
	ft.mu.Unlock()
}

// workerOf returns the worker whose process group pid belongs to: the worker itself or
// one of its processes.
func (g *group) workerOf(pid int) *worker {
	pgid, err := unix.Getpgid(pid)
	for _, w := range g.workers {
		if w.p.Pid() == pid || (err == nil && w.p.Pid() == pgid) {
			return w
		}
	}
	return nil
}

// heartbeats reads the heartbeats the live workers touched during this attempt (after
// started). It returns the worker whose heartbeat is the oldest, when that is older
// than timeout, with its age — the rank stuck where the others wait stopped first —
// and the newest heartbeat (zero when none), which counts as the gang's activity.
func (g *group) heartbeats(started time.Time, timeout time.Duration) (stale *worker, age time.Duration, newest time.Time) {
	var oldest time.Time
	for _, w := range g.live() {
		if w.spec.rank < 0 {
			continue
		}
		fi, err := os.Stat(filepath.Join(w.spec.dir, heartbeatName))
		if err != nil || fi.ModTime().Before(started) {
			continue // never touched: judged by the gang's output
		}
		if stale == nil || fi.ModTime().Before(oldest) {
			stale, oldest = w, fi.ModTime()
		}
		if fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	if stale == nil || time.Since(oldest) < timeout {
		return nil, 0, newest
	}
	return stale, time.Since(oldest), newest
}

// isPython reports whether argv runs a Python interpreter (pythonName: python,
// python3.11) or a .py script, whose stacks faulthandler can dump.
func isPython(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	base := filepath.Base(argv[0])
	return pythonName.MatchString(base) || strings.HasSuffix(base, ".py")
}

// collectStacks asks every live worker of g for its Python stack before a hung gang is
// stopped: with PYTHONFAULTHANDLER set (gangrun sets it while a hang can be judged),
// SIGABRT makes faulthandler write every thread's traceback to the worker's stderr —
// the attempt's logs, with its rank prefix — and end the process; core dumps are
// turned off for it first. It waits up to stackGrace for them to exit.
func (s *Supervisor) collectStacks(g *group) {
	live := g.live()
	if len(live) == 0 {
		return
	}
	if !isPython(live[0].spec.argv) {
		s.log.Info("the hung gang is not a Python command: no stacks to collect")
		return
	}
	s.log.Warn("collecting every rank's Python stack (faulthandler, SIGABRT) into its stderr", zap.Int("ranks", len(live)))
	for _, w := range live {
		_ = unix.Prlimit(w.p.Pid(), unix.RLIMIT_CORE, &unix.Rlimit{}, nil)
		_ = w.p.SignalLeader(syscall.SIGABRT)
	}
	deadline := time.NewTimer(stackGrace)
	defer deadline.Stop()
	for len(g.live()) > 0 {
		select {
		case i := <-g.exits:
			g.workers[i].reap(s.guard)
		case <-deadline.C:
			return
		}
	}
}

// hung is the outcome of a hang of worker w (nil: the whole gang's) of kind (Hang or
// Watchdog), after the ranks' stacks are collected.
func (s *Supervisor) hung(g *group, w *worker, kind failure.Kind, reason string) outcome {
	s.collectStacks(g)
	f := &rendezvous.Failure{Node: s.cfg.NodeName, Rank: -1, LocalRank: -1, ExitCode: 1, Kind: kind, Reason: reason}
	if w != nil {
		f.Rank, f.LocalRank = w.spec.rank, w.spec.localRank
	}
	return outcome{kind: outFailed, failure: f}
}
