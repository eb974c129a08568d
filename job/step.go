package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/topology"
)

// StepConfig is one node's step of a job: what `gangrun agent` starts on each node the
// job runs on (like slurmstepd), as a process of its own that outlives the agent.
type StepConfig struct {
	// Store is the cluster's Consul; ConsulAddr its address, for the job's rendezvous.
	Store      store.Store
	ConsulAddr string
	// Job and Node name the job and this node.
	Job, Node string
	// Inventory is the node's topology (its agent's); nil probes.
	Inventory *topology.Inventory
	// GuardianArgv starts the supervisor's guardian; nil runs without one.
	GuardianArgv []string
	// Subreaper makes the step sweep what its workers leave (launcher.Config.Subreaper).
	Subreaper bool
	// Log receives the step's own messages until the job's output file is open (they go
	// into it, beside the workers' lines, from then on); nil discards them.
	Log *zap.Logger
	// StateDir is the agent's state directory: the step writes its outcome in the
	// node's ledger there (ledger.go); "" writes none.
	StateDir string
	// Prover checks the job's attestation before anything runs, and gives the uid and
	// gid the workers run as (auth.go); nil checks nothing (agent --auth none).
	Prover Prover
	// Signals are the signals sent to the step process: SIGINT, SIGTERM and SIGHUP stop
	// the workers as a cancel does (the job's end is then the controller's to say);
	// SIGUSR1 and SIGUSR2 are passed on to them.
	Signals <-chan os.Signal
}

// stepSessionTTL is the TTL of a step's session, which holds the node's GPU keys and
// the step key: the GPUs come back 2×TTL (plus the lock-delay) after the step dies
// without giving them back.
const stepSessionTTL = allocator.SessionTTL

// RunStep runs job cfg.Job's step on node cfg.Node and returns its exit code: the job's
// command in the job's rendezvous, through launcher.Prepare as `gangrun run`, with the
// node's granted devices. It takes the node's GPU keys over from the agent first
// (allocator.HandOver) and gives them back last, so the GPUs are never free while a
// worker may run; it stops the workers when the job is cancelled, reaches its time
// limit, or moves off this node; and it records the job's end. A step with nothing to
// do (the job ended, or no longer runs here) returns 0 at once.
func RunStep(ctx context.Context, cfg StepConfig) int {
	st := &step{cfg: cfg, log: cfg.Log}
	if st.log == nil {
		st.log = zap.NewNop()
	}
	return st.run(ctx)
}

// step is one node's step of a job: what RunStep runs.
type step struct {
	cfg   StepConfig
	log   *zap.Logger
	job   *Job
	lease *store.Lease
	sess  string         // the step's Consul session (openSession), once open
	stop  chan os.Signal // the supervisor's signals: the step's own stop and warnings

	cleanup []func()   // run when the step ends
	user    *proc.User // who the workers run as: the job's user (nil: the step's own)

	mu     sync.Mutex
	ending Status // what the step's own stop means (Cancelled, Timeout); "" when none
	// fenced is set once the step's lease is over (Consul unreachable): its workers
	// are stopped and it ends without writing anything more.
	fenced bool
	// stopSupervisor ends the supervisor's run (a fenced step: no rejoin).
	stopSupervisor func()
	// signalledTo is when the newest signal request given to the processes was asked
	// (signalled; watch's alone).
	signalledTo time.Time
}

// run is the step's life: read the job, open the step's session, take the node's GPUs
// over, check the user, run the workers (or a batch job's script) and record how they
// ended. It returns the step's exit code.
func (st *step) run(ctx context.Context) int {
	defer func() {
		for _, f := range st.cleanup {
			f()
		}
	}()
	patience := time.Now().Add(stepStartPatience)
	j, err := st.readJob(ctx, patience)
	if err != nil {
		st.log.Error("read the job", zap.Error(err))
		return 1
	}
	st.job = j
	if j.State.Status != Running || !slices.Contains(j.State.Nodes, st.cfg.Node) {
		st.log.Info("nothing to run on this node", zap.String("job", st.cfg.Job), zap.String("state", string(j.State.Status)))
		st.markEnded(ctx) // not silent: the job ended (or moved) before this step began
		return 0
	}
	sess, err := st.openSession(ctx, patience)
	if err != nil {
		st.log.Error("create the step's session", zap.Error(err))
		return 1
	}
	defer st.closeSession(ctx, sess)
	st.sess = sess
	gn, code, ok := st.takeOver(ctx, sess)
	if !ok {
		return code
	}
	defer st.giveBack(ctx, sess)
	if code, ok := st.checkUser(ctx); !ok {
		return code
	}
	if st.job.Spec.Batch != nil {
		return st.runBatch(ctx, gn) // a Slurm batch job: batchstep.go
	}
	return st.runWorkers(ctx, gn)
}

// readJob reads the step's job, waiting out an unavailable Consul until patience.
func (st *step) readJob(ctx context.Context, patience time.Time) (*Job, error) {
	var j *Job
	err := st.waitConsul(ctx, "read the job", patience, func() (err error) {
		// A job Consul does not have: a Consul that lost its data and is being
		// restored (the agent saw the job a moment ago); a deleted job waits in vain.
		if j, err = Read(ctx, st.cfg.Store, st.cfg.Job); errors.Is(err, ErrNotFound) {
			err = &store.UnavailableError{Op: "read job " + st.cfg.Job, Err: err}
		}
		return err
	})
	return j, err
}

// openSession creates the step's session, waiting out an unavailable Consul until
// patience, and keeps it (st.lease).
func (st *step) openSession(ctx context.Context, patience time.Time) (string, error) {
	s, id, node := st.cfg.Store, st.cfg.Job, st.cfg.Node
	since := time.Now()
	var sess string
	err := st.waitConsul(ctx, "create the step's session", patience, func() (err error) {
		sess, err = s.CreateSession(ctx, store.SessionOptions{Name: "gangrun step " + id + " " + node, TTL: stepSessionTTL,
			LockDelay: allocator.GrantLockDelay, Behavior: store.DeleteKeys, NodeHealth: true})
		return err
	})
	if err != nil {
		return "", err
	}
	st.lease = store.Keep(s, sess, stepSessionTTL, since, st.log)
	return sess, nil
}

// closeSession ends the lease, deletes the step key (and its usage record) and
// destroys session sess.
func (st *step) closeSession(ctx context.Context, sess string) {
	s, id, node := st.cfg.Store, st.cfg.Job, st.cfg.Node
	st.lease.Close()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), store.CallTimeout)
	defer cancel()
	// The step key goes before the session, so that Consul puts no lock-delay on it: a
	// step of the job's next placement may start on this node at once.
	_, _ = s.Txn(dctx, []store.Op{{Verb: store.CheckSession, Key: stepKey(id, node), Session: sess},
		{Verb: store.Delete, Key: stepKey(id, node)}, {Verb: store.Delete, Key: usageKey(id, node)}})
	_ = s.DestroySession(dctx, sess)
}

// takeOver locks the step key with session sess, takes the node's GPUs over from its
// agent and reads the job again (st.job): ok false, with the step's exit code, when it
// cannot, or when the job ended or moved meanwhile. When it returns ok, or after it took
// the GPUs, giveBack must run.
func (st *step) takeOver(ctx context.Context, sess string) (allocator.GrantNode, int, bool) {
	s, id, node := st.cfg.Store, st.cfg.Job, st.cfg.Node
	rec, _ := schema.Marshal(schema.JobStep, StepRecord{Node: node, Host: hostname(), PID: os.Getpid(), Started: time.Now().UTC(), Placement: st.job.State.Placement})
	if err := st.lockStepKey(ctx, sess, rec); err != nil {
		st.log.Error("another step of the job runs on this node", zap.Error(err))
		return allocator.GrantNode{}, 1, false
	}
	gn, err := allocator.HandOver(ctx, s, id, node, sess)
	if err != nil {
		st.log.Error("take the node's GPUs over from its agent", zap.Error(err))
		return allocator.GrantNode{}, 1, false
	}
	// The job's state again, now that the GPUs are this step's: it may have been
	// cancelled, or moved, meanwhile.
	j, err := Read(ctx, s, id)
	if err != nil || j.State.Status != Running || !slices.Contains(j.State.Nodes, node) {
		st.log.Info("the job ended or moved while the step started")
		st.markEnded(ctx)
		st.giveBack(ctx, sess)
		return allocator.GrantNode{}, 0, false
	}
	st.job = j
	return gn, 0, true
}

// giveBack gives the node's GPUs back from session sess to its agent.
func (st *step) giveBack(ctx context.Context, sess string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), store.CallTimeout)
	defer cancel()
	if err := allocator.ReleaseNode(rctx, st.cfg.Store, st.cfg.Job, st.cfg.Node, sess); err != nil {
		st.log.Warn("give the node's GPUs back (they go with the step's session)", zap.Error(err))
	}
}

// checkUser sets the user the job runs as (st.user): the one its attestation proves,
// where the node checks credentials (auth.go). ok false, with the step's exit code,
// when it is refused (recorded as the job's failure) or cannot be checked here.
func (st *step) checkUser(ctx context.Context) (int, bool) {
	j, node := st.job, st.cfg.Node
	var proven *proc.User
	if st.cfg.Prover != nil {
		var r *refusal
		var err error
		proven, err = stepUser(ctx, st.cfg.Prover, j, node)
		switch {
		case errors.As(err, &r):
			st.log.Error("the job's credential is refused: nothing runs", zap.Error(err))
			_ = audit.Write(context.WithoutCancel(ctx), st.cfg.Store, sealEntry(ctx, st.cfg.Prover, audit.Entry{User: "gangrun", Token: "agent", Action: audit.ActionRefuse,
				Target: "job " + st.cfg.Job, Owner: j.Spec.User, Detail: "on node " + node + ": " + r.Error()}))
			_ = st.recordEnd(ctx, Failed, 1, r.Error())
			return 1, false
		case err != nil:
			// This node cannot check (its munged does not answer): the node's trouble,
			// not the job's. The step ends without an outcome, and the controller
			// places the job again, away from this node.
			st.log.Error("cannot check the job's credential on this node: nothing runs here", zap.Error(err))
			return 1, false
		}
	}
	var err error
	if st.user, err = jobUser(j.Spec.User, proven, node); err != nil {
		st.log.Error("the job's user", zap.Error(err))
		_ = st.recordEnd(ctx, Failed, 1, err.Error())
		return 1, false
	}
	return 0, true
}

// runWorkers runs the job's workers on the node under a supervisor, as `gangrun run`
// does, and records how the run ended; it returns the step's exit code.
func (st *step) runWorkers(ctx context.Context, gn allocator.GrantNode) int {
	id, node := st.cfg.Job, st.cfg.Node
	out, err := st.output()
	if err != nil {
		st.log.Error("open the job's output", zap.Error(err))
		_ = st.recordEnd(ctx, Failed, 1, err.Error())
		return 1
	}
	defer out.Close()
	st.log = stepLogger(out).With(zap.String("step", node))
	p, err := st.prepare(ctx, gn, out)
	if err != nil {
		fmt.Fprintf(out, "gangrun: job %s cannot start on %s: %v\n", id, node, err)
		_ = st.recordEnd(ctx, Failed, 2, err.Error())
		return 2
	}
	defer p.Close()
	sup, err := p.Supervisor()
	if err != nil {
		fmt.Fprintf(out, "gangrun: job %s cannot start on %s: %v\n", id, node, err)
		code := launcher.StartExitCode(err, 2)
		_ = st.recordEnd(ctx, Failed, code, err.Error())
		return code
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	sctx, stopSupervisor := context.WithCancel(ctx)
	defer stopSupervisor()
	st.stopSupervisor = stopSupervisor
	go st.watch(wctx)
	res := sup.Run(sctx)
	stopWatch()
	return st.recordOutcome(ctx, res)
}

// recordOutcome records how the supervisor's run ended (res), unless the step stopped
// it itself or its lease is over; it returns the step's exit code.
func (st *step) recordOutcome(ctx context.Context, res launcher.Result) int {
	st.mu.Lock()
	ending, fenced := st.ending, st.fenced
	st.mu.Unlock()
	if fenced {
		// Consul did not answer for the lease: nothing can be recorded now, and the
		// job's controller requeues the job once Consul answers (its node a node
		// failure, not excluded: the node's agent re-registers). Leave at once.
		st.log.Warn("the step's lease is over: its workers have stopped; the step ends without recording how", zap.Int("exit_code", res.ExitCode))
		return res.ExitCode
	}
	defer st.markEnded(ctx)
	switch {
	case ending != "":
		// Stopped by the step itself: cancelled, or the time limit; recorded already.
	case res.ExitCode == 0:
		_ = st.recordEnd(ctx, Completed, 0, "")
	case res.Failure != nil && res.Err == nil:
		_ = st.recordEnd(ctx, Failed, res.ExitCode, res.Failure.String())
	case errors.Is(res.Err, launcher.ErrCommandNotFound) || errors.Is(res.Err, launcher.ErrNotExecutable) || errors.Is(res.Err, launcher.ErrWorkDir):
		// The job's command or directory, which the job's user cannot use (the checks
		// before the start were root's): the job's fault, not the node's.
		_ = st.recordEnd(ctx, Failed, res.ExitCode, res.Err.Error())
	default:
		// The step could not go on (the coordinator lost, an error of its own): the job's
		// controller sees its key go and handles the node as lost.
		st.log.Error("the job's step ends without an outcome for the job", zap.Int("exit_code", res.ExitCode), zap.Error(res.Err))
	}
	return res.ExitCode
}

// stepStartPatience bounds how long a starting step waits for Consul to answer before
// it holds a lease of its own (Consul restarting, or restored from a snapshot, just as
// the agent started the step): half of StepStartTimeout, after which the job's
// controller handles the node as lost anyway.
const stepStartPatience = StepStartTimeout / 2

// waitConsul runs f until it succeeds, fails with anything but an unavailable Consul
// (store.ErrUnavailable), or until, saying once that the step waits for Consul.
func (st *step) waitConsul(ctx context.Context, what string, until time.Time, f func() error) error {
	backoff := 100 * time.Millisecond
	for said := false; ; said = true {
		err := f()
		if err == nil || !errors.Is(err, store.ErrUnavailable) || !time.Now().Before(until) {
			return err
		}
		if !said {
			st.log.Warn("Consul does not answer: the step waits for it", zap.String("to", what), zap.Error(err),
				zap.Duration("at_most", time.Until(until).Round(time.Second)))
		}
		if !store.Sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// lockStepKey takes the job's step key on this node for session sess. A step that
// died holding it leaves Consul's lock-delay on it (allocator.GrantLockDelay): the lock
// is tried again for up to twice that while the job still runs on this node.
func (st *step) lockStepKey(ctx context.Context, sess string, rec []byte) error {
	s, id, node := st.cfg.Store, st.cfg.Job, st.cfg.Node
	deadline := time.Now().Add(2 * allocator.GrantLockDelay)
	for {
		_, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: stepKey(id, node), Value: rec, Session: sess}})
		if err == nil || !errors.Is(err, store.ErrLockDelay) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
		if j, rerr := Read(ctx, s, id); rerr != nil || j.State.Status != Running || !slices.Contains(j.State.Nodes, node) {
			return err
		}
	}
}

// output opens the job's output file on this node: --output expanded, appended to
// (the nodes of a pattern without %n share one file; each line is written whole). It
// is opened, and created, with the permissions of the job's user, as slurmstepd
// opens a step's output after dropping to the user: a path the user could not write
// is refused, and a new file is the user's.
func (st *step) output() (f *os.File, err error) {
	path := st.job.Spec.OutputPath(st.cfg.Node)
	err = proc.AsUser(st.user, func() error {
		// Without blocking: a named pipe with no reader would hold the step in open(2).
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0o644)
		return err
	})
	if errors.Is(err, syscall.ENXIO) {
		err = errors.New("a named pipe that no one reads: want a file")
	}
	if err != nil {
		return nil, fmt.Errorf("output %s: %w", path, err)
	}
	// A file, or a character device (/dev/null); a pipe or socket someone reads could
	// stop the step when full.
	if fi, err := f.Stat(); err != nil || !(fi.Mode().IsRegular() || fi.Mode()&os.ModeCharDevice != 0) {
		f.Close()
		return nil, fmt.Errorf("output %s: is not a file: want a file (or /dev/null)", path)
	}
	return f, nil
}

// jobUser is the Unix user a job's workers run as on node: the job's submitter
// (Spec.User), as Slurm runs a job's tasks as its user — the user its MUNGE
// attestation proves (proven), or, when nothing is checked (agent --auth none), the
// user of that name here; nil when that is the step's own user. Errors: the user does not exist on the node (Slurm's "User not found on
// host"), or the step is not root and so cannot switch to another user (slurmd runs as
// root for this).
func jobUser(name string, proven *proc.User, node string) (*proc.User, error) {
	u := proven
	if u == nil {
		var err error
		if u, err = proc.LookupUser(name); err != nil {
			return nil, fmt.Errorf("the job's user cannot run on node %s: %w", node, err)
		}
	}
	if u.IsSelf() {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the job's user %s cannot run on node %s: its agent runs as uid %d, not root, and so cannot start processes as another user (run the agents as root, as slurmd runs)", u.Name, node, os.Geteuid())
	}
	return u, nil
}

// prepare builds the node's run of the job: `gangrun run` with the job's settings, the
// job's rendezvous on Consul, and the node's granted devices.
func (st *step) prepare(ctx context.Context, gn allocator.GrantNode, out io.Writer) (*launcher.Prepared, error) {
	spec, state := st.job.Spec, st.job.State
	command := spec.Command
	if spec.Script != "" {
		path, cleanup, err := writeScript(spec, st.user)
		if err != nil {
			return nil, err
		}
		st.cleanup = append(st.cleanup, cleanup)
		command = append(append(Interpreter(spec.Script), path), spec.Command...)
	}
	// The user must reach the directory (every component searchable: "DIR/." makes the
	// lookup pass through DIR itself); the workers enter it again as the user.
	err := proc.AsUser(st.user, func() error {
		fd, err := unix.Open(spec.WorkDir+"/.", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	})
	if err == nil {
		err = os.Chdir(spec.WorkDir)
	}
	if err != nil {
		return nil, fmt.Errorf("work directory %s: %w", spec.WorkDir, err)
	}
	ckpt := spec.CheckpointPath()
	addr, _ := allocator.NodeAddr(ctx, st.cfg.Store, st.cfg.Node) // "": the run finds its own
	environ := os.Environ()
	if st.user != nil {
		environ = slices.DeleteFunc(environ, func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			return k == "USER" || k == "LOGNAME" || k == "HOME"
		})
		environ = append(environ, st.user.Env()...)
	}
	environ = append(environ, "GANGRUN_NODELIST="+hostlist.Compress(state.Nodes))
	if spec.Array != nil {
		environ = append(environ, spec.Array.Environ()...)
	}
	st.stop = make(chan os.Signal, 4)
	// Supervised as `gangrun run` is, with the job's settings, less the restarts the
	// job has had already (State.Restarts).
	sup := spec.StepSupervision()
	sup.MaxRestarts = max(sup.MaxRestarts-state.Restarts, 0)
	return launcher.Prepare(ctx, launcher.Spec{
		Command: command, NProcPerNode: strconv.Itoa(max(len(gn.Devices), 1)), NProcGiven: true,
		NNodes: fmt.Sprintf("%d:%d", min(spec.MinNodes, len(state.Nodes)), len(state.Nodes)), NNodesGiven: true,
		Coordinator: "consul://" + st.cfg.ConsulAddr, FollowRun: true, JobID: spec.ID, NodeName: st.cfg.Node, AdvertiseAddr: addr,
		// A CPU-only job's node gives it no device: an empty list, not nil (all).
		Inventory: st.cfg.Inventory, Devices: append([]string{}, gn.Devices...), Env: spec.Env, Environ: environ,
		Cgroup: string(cgroup.Auto), Mem: spec.NodeMem(), PidsLimit: cgroup.DefaultPidsLimit,
		Supervision: sup, TermTimeout: spec.TermTimeout,
		CheckpointDir: ckpt, Stdout: out, Stderr: out, Report: out, Log: st.log,
		GuardianArgv: st.cfg.GuardianArgv, Signals: st.stop, Subreaper: st.cfg.Subreaper, User: st.user,
		RendezvousStore: sealedRendezvous(st.cfg.Prover, spec.ID),
		Events:          &attempts{step: st, ch: make(chan event.Event, 64)},
		// A worker that dies while the job is being stopped (a pre-emption's SIGUSR1
		// that it does not handle) ends the step: no restart in the grace.
		NoRestart: func() string {
			st.mu.Lock()
			defer st.mu.Unlock()
			switch st.ending {
			case "":
				return ""
			case Preempted:
				return "the job is being pre-empted"
			}
			return "the job is being stopped (" + string(st.ending) + ")"
		},
	})
}

// writeScript writes the job's script, as submitted, where the step runs it: a
// directory of its own under TMPDIR (the user's, when u is set, as the script is),
// which the returned cleanup removes. When u cannot reach it there (the agent's TMPDIR
// is private to the agent), it goes under /tmp instead.
func writeScript(spec Spec, u *proc.User) (path string, cleanup func(), err error) {
	path, cleanup, err = writeScriptIn(os.TempDir(), spec, u)
	if err == nil && u != nil && os.TempDir() != "/tmp" {
		readable := proc.AsUser(u, func() error {
			f, err := os.Open(path)
			if err == nil {
				f.Close()
			}
			return err
		}) == nil
		if !readable {
			cleanup()
			return writeScriptIn("/tmp", spec, u)
		}
	}
	return path, cleanup, err
}

// writeScriptIn is writeScript in the directory tmp.
func writeScriptIn(tmp string, spec Spec, u *proc.User) (path string, cleanup func(), err error) {
	dir, err := os.MkdirTemp(tmp, "gangrun-job-"+spec.ID+"-")
	if err != nil {
		return "", nil, fmt.Errorf("write the job's script: %w", err)
	}
	name := "script"
	if spec.Batch != nil {
		name = "slurm_script" // as slurmd names the batch script it runs ($0)
	}
	path = filepath.Join(dir, name)
	err = os.WriteFile(path, []byte(spec.Script), 0o755)
	if err == nil && u != nil {
		if err = os.Chown(path, int(u.UID), int(u.GID)); err == nil {
			err = os.Chown(dir, int(u.UID), int(u.GID))
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("write the job's script: %w", err)
	}
	return path, func() { os.RemoveAll(dir) }, nil
}

// watch follows the job's state while the supervisor runs and stops the workers when
// the job is cancelled or moves off this node; it keeps the time limit (with --signal's
// warning before it).
func (st *step) watch(ctx context.Context) {
	spec := st.job.Spec
	var w watchTimers
	defer w.stop()
	tl := spec.TimeLimit
	if l := st.job.State.TimeLimit; l != nil {
		tl = *l // changed before this step started
	}
	w.warn, w.limit = st.timeLimit(&w, tl)
	changes := st.followState(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-st.lease.Done():
			st.leaseOver()
			return
		case sig := <-st.cfg.Signals:
			if ss, ok := sig.(syscall.Signal); ok && (ss == syscall.SIGINT || ss == syscall.SIGTERM || ss == syscall.SIGHUP) {
				st.log.Warn("the step was told to stop", zap.String("signal", ss.String()))
				st.stopWorkers(Requeued)
			} else {
				st.stop <- sig
			}
		case <-w.warn:
			st.log.Info("sending the workers the time limit's warning", zap.String("signal", signalName(spec.Signal)), zap.Duration("before", spec.SignalBefore))
			st.stop <- spec.Signal
		case <-w.failedStop:
			w.failedStop = nil
			st.log.Warn("the job failed on another node, and this node's workers still run: stopping them", zap.Duration("after", failedStopGrace))
			st.stopWorkers(Failed)
		case <-w.graceEnd:
			w.graceEnd = nil
			st.log.Warn("the pre-emption's grace is over: killing the workers")
			// The grace is a hard limit (Slurm's GraceTime), not a start of the job's own
			// --term-timeout: after a SIGUSR1 the first SIGTERM would begin that; a second
			// terminating signal kills the workers at once.
			st.stop <- syscall.SIGTERM
			st.stop <- syscall.SIGTERM
		case <-w.limit:
			st.log.Warn("time limit reached: stopping the job", zap.Duration("time_limit", w.timeLimit))
			_, _, _ = update(ctx, st.cfg.Store, spec.ID, func(j *Job) bool {
				return j.State.Status == Running && j.State.apply(Transition{Event: EvEnd, End: Timeout, Words: "time limit " + w.timeLimit.String() + " reached"}) == nil
			})
			st.stopWorkers(Timeout)
		case j := <-changes:
			st.changed(j, &w)
		}
	}
}

// watchTimers are the timers of a step's watch; a nil channel is a timer not set.
type watchTimers struct {
	warn, limit <-chan time.Time // --signal's warning, the time limit
	timeLimit   time.Duration    // the limit they keep (0: none)
	graceEnd    <-chan time.Time // a pre-emption's grace
	failedStop  <-chan time.Time // the job failed on another node: failedStopGrace
	timers      []*time.Timer
}

// after starts a timer of d and returns its channel.
func (w *watchTimers) after(d time.Duration) <-chan time.Time {
	t := time.NewTimer(d)
	w.timers = append(w.timers, t)
	return t.C
}

// stop stops every timer started.
func (w *watchTimers) stop() {
	for _, t := range w.timers {
		t.Stop()
	}
}

// timeLimit starts the job's time limit tl and its --signal warning on w (nil channels
// for none).
func (st *step) timeLimit(w *watchTimers, tl time.Duration) (warn, limit <-chan time.Time) {
	spec := st.job.Spec
	w.timeLimit = tl
	if tl <= 0 {
		return nil, nil
	}
	// From this placement's start: a job requeued (pre-empted, or after losing a node)
	// gets its whole --time again, as Slurm's requeued jobs do.
	start := st.job.State.placedAt()
	if start.IsZero() {
		start = time.Now()
	}
	end := start.Add(tl)
	limit = w.after(time.Until(end))
	if spec.Signal != 0 && spec.SignalBefore < tl {
		warn = w.after(time.Until(end.Add(-spec.SignalBefore)))
	}
	return warn, limit
}

// followState watches the job's state key until ctx ends and sends each new state.
func (st *step) followState(ctx context.Context) <-chan *Job {
	spec := st.job.Spec
	changes := make(chan *Job, 1)
	go func() {
		w := store.NewWatcher(st.cfg.Store, jobsPrefix+spec.ID+"/state")
		for {
			entries, err := w.Next(ctx)
			if err != nil {
				return
			}
			j, err := decode(spec.ID, append(entries, store.Entry{Key: specKey(spec.ID), Value: mustRecord(schema.JobSpec, spec)}))
			if err != nil {
				continue
			}
			select {
			case changes <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	return changes
}

// leaseOver stops the workers and the supervisor once Consul has not answered for the
// step's lease (LeaseStop after the last renewal it accepted): it may soon give this
// node's GPUs and the job's place to others. The supervisor does not rejoin, and the
// step ends: a step that waited for Consul would never end if it never came back.
func (st *step) leaseOver() {
	st.log.Warn("the step's lease is over: stopping the workers and ending the step; the job is requeued once Consul answers", zap.Error(st.lease.Err()))
	st.mu.Lock()
	st.fenced = true
	st.mu.Unlock()
	st.stopWorkers(NodeFail)
	st.stopSupervisor()
}

// changed acts on the job's new state j: stops the workers when the job ends, is
// stopped or leaves this node, gives a pre-emption's signal, and sets w's timers (a
// time limit scontrol update changed among them).
func (st *step) changed(j *Job, w *watchTimers) {
	st.signalled(j)
	if l := j.State.TimeLimit; l != nil && *l != w.timeLimit && j.State.Status == Running {
		st.log.Info("the job's time limit changed (scontrol update)", zap.Duration("from", w.timeLimit), zap.Duration("to", *l))
		w.warn, w.limit = st.timeLimit(w, *l)
	}
	switch {
	case st.job.Spec.Batch != nil && j.State.Status == Completing:
		// A batch job ends with its batch script (on the batch host) or is stopped:
		// every node stops its tasks at once (no rendezvous tells them).
		st.stopWorkers(j.State.End)
	case j.State.Status == Completing && j.State.End != Completed && j.State.End != Failed:
		st.log.Warn("stopping the job", zap.String("reason", j.State.Reason))
		st.stopWorkers(j.State.End)
	case j.State.Status == Completing && j.State.End == Failed && w.failedStop == nil:
		// A gang's failure reaches every node's supervisor through the job's rendezvous,
		// which stops its workers; a step that failed before it joined the rendezvous
		// (its output refused, its user unknown on its node) never does, and the other
		// nodes would wait for it for ever.
		w.failedStop = w.after(failedStopGrace)
	case j.State.Status == Preempted && len(j.State.Preemptions) > 0:
		if ch := st.preempt(j.State.Preemptions[len(j.State.Preemptions)-1]); ch != nil {
			w.graceEnd = ch
		}
	case j.State.Status != Running && j.State.Status != Completing:
		st.log.Warn("the job left the running state: stopping", zap.String("state", string(j.State.Status)))
		st.stopWorkers(j.State.Status)
	case !slices.Contains(j.State.Nodes, st.cfg.Node):
		st.log.Warn("the job no longer runs on this node: stopping its workers")
		st.stopWorkers(Requeued)
	}
}

// failedStopGrace is how long a step whose job failed elsewhere leaves its supervisor to
// learn it through the rendezvous before stopping the workers itself.
const failedStopGrace = 10 * time.Second

// stopWorkers has the supervisor stop the workers (SIGTERM, its grace, SIGKILL), once;
// why is what the stop means for the job.
func (st *step) stopWorkers(why Status) {
	st.mu.Lock()
	first := st.ending == ""
	if first {
		st.ending = why
	}
	st.mu.Unlock()
	if first {
		st.stop <- syscall.SIGTERM
	}
}

// markEnded notes in the job's state that this node's step of the placement ended and
// said so (State.StepsEnded), before its key goes.
func (st *step) markEnded(ctx context.Context) {
	placement := st.job.State.Placement
	_, _, err := update(context.WithoutCancel(ctx), st.cfg.Store, st.cfg.Job, func(j *Job) bool {
		if j.State.Placement != placement || slices.Contains(j.State.StepsEnded, st.cfg.Node) {
			return false
		}
		j.State.StepsEnded = append(j.State.StepsEnded, st.cfg.Node)
		return true
	})
	if err != nil {
		st.log.Warn("note the step's end in the job's state", zap.Error(err))
	}
}

// recordEnd records how the job ended, as seen by this step's supervisor: the job goes
// COMPLETING with end status (the first step to say wins) and, when the gang failed,
// its exit code and root cause; and the node is noted among the steps that ended and
// said so (markEnded), whoever said first. The controller finishes the job when every step has
// stopped.
func (st *step) recordEnd(ctx context.Context, end Status, code int, why string) error {
	placement := st.job.State.Placement
	if st.cfg.StateDir != "" {
		// First in the node's ledger, which outlives a Consul restored from a snapshot
		// taken before this (ledger.go).
		if err := writeLedger(st.cfg.StateDir, ledgerEntry{Job: st.cfg.Job, Submitted: st.job.Spec.Submitted, Placement: placement, Node: st.cfg.Node,
			End: end, ExitCode: code, Why: why, At: time.Now().UTC()}); err != nil {
			st.log.Warn("the step's outcome in the node's ledger", zap.Error(err))
		}
	}
	_, _, err := update(context.WithoutCancel(ctx), st.cfg.Store, st.cfg.Job, func(j *Job) bool {
		changed := false
		if j.State.Status == Running && j.State.apply(Transition{Event: EvEnd, End: end, Words: why}) == nil {
			j.State.ExitCode, changed = code, true
		}
		// This step said how it ended: its node is not one that went silent.
		if j.State.Placement == placement && !slices.Contains(j.State.StepsEnded, st.cfg.Node) {
			j.State.StepsEnded = append(j.State.StepsEnded, st.cfg.Node)
			changed = true
		}
		return changed
	})
	return err
}

// attempts is the step's event sink: it keeps the job's attempts (rendezvous rounds) in
// its state, off the supervisor's goroutine.
type attempts struct {
	step *step
	ch   chan event.Event
	once sync.Once
}

// Emit implements event.Sink.
func (a *attempts) Emit(e event.Event) {
	a.once.Do(func() { go a.loop() })
	healthy := e.Kind == event.StateChanged && e.State == string(launcher.StateHealthy) && e.Attempt >= 0
	switch {
	case e.Kind == event.RoundClosed, e.Kind == event.CheckpointChosen, e.Kind == event.RoundEnded, healthy:
		select {
		case a.ch <- e:
		default: // the state is behind; the next event catches it up
		}
	}
}

func (a *attempts) loop() {
	ctx := context.Background()
	for e := range a.ch {
		var ckptTime time.Time
		if e.Kind == event.CheckpointChosen && e.Checkpoint != "" {
			// The checkpoint's time, for the job's ETTR: when the work it holds was saved.
			if fi, err := os.Stat(e.Checkpoint); err == nil {
				ckptTime = fi.ModTime().UTC()
			}
		}
		_, _, _ = update(ctx, a.step.cfg.Store, a.step.cfg.Job, func(j *Job) bool { return record(&j.State, e, ckptTime) })
	}
}

// record notes event e in the job's attempts (ckptTime: the modification time of the
// checkpoint a CheckpointChosen names), and counts a restart once an attempt follows
// one that ended (State.countRestarts); false when it changes nothing (another node's
// step noted it first).
func record(st *State, e event.Event, ckptTime time.Time) bool {
	i := slices.IndexFunc(st.Attempts, func(a Attempt) bool { return a.Number == e.Attempt })
	changed := false
	if i < 0 {
		st.Attempts = append(st.Attempts, Attempt{Number: e.Attempt, Started: e.Time.UTC()})
		i, changed = len(st.Attempts)-1, true
	}
	a := &st.Attempts[i]
	switch e.Kind {
	case event.RoundClosed:
		if len(a.Nodes) == 0 && len(e.Nodes) > 0 {
			a.Nodes, changed = e.Nodes, true
		}
	case event.CheckpointChosen:
		if a.ResumeFrom == "" && e.Checkpoint != "" {
			a.ResumeFrom, a.ResumeFromTime, changed = e.Checkpoint, ckptTime, true
		}
	case event.StateChanged: // HEALTHY: this node's workers started
		if a.WorkersStarted.IsZero() {
			a.WorkersStarted, changed = e.Time.UTC(), true
		}
	case event.RoundEnded:
		if a.Ended.IsZero() {
			a.Ended, a.Cause, a.Failure, changed = e.Time.UTC(), e.Cause, e.Failure, true
			if e.Detail != "" {
				a.Cause += ": " + e.Detail
			}
		}
	}
	return st.countRestarts() || changed
}

// stepLogger writes the step's own messages into the job's output, as `gangrun run`
// writes its log lines beside the workers' output.
func stepLogger(w io.Writer) *zap.Logger {
	l, _ := launcher.NewLogger("text", w)
	return l
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// mustRecord is v as a record of kind k (schema.Marshal).
func mustRecord(k schema.Kind, v any) []byte {
	b, _ := schema.Marshal(k, v)
	return b
}
