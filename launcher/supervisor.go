// Package launcher starts a node's training workers with torchrun's environment,
// supervises them, and restarts the whole gang from its latest complete checkpoint when
// any worker fails.
//
// The Supervisor moves a worker group through the states torch's elastic agent names
// (torch/distributed/elastic/agent/server/api.py, WorkerState): it joins a rendezvous
// round, starts the workers (HEALTHY), and watches them until they all succeed
// (SUCCEEDED), one fails or hangs (FAILED), the round ends elsewhere (UNHEALTHY: another
// node failed or membership changed), or gangrun is told to stop (STOPPED). After a
// failure it stops every worker, reports the root cause, and starts a new round while
// the restart budget lasts.
package launcher

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/checkpoint"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/tcpstore"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/rendezvous"
	"github.com/gangrun/gangrun/topology"
)

// Defaults of `gangrun run` (docs/run.md, "Flags").
const (
	// DefaultMaxRestarts is --max-restarts: how many failed attempts are retried.
	DefaultMaxRestarts = 3
	// MaxRestartsLimit bounds --max-restarts: 10000 restarts, even 1s apart, is about
	// three hours of a gang failing; more is a typo.
	MaxRestartsLimit = 10000
	// MaxBackoff bounds a fixed --restart-backoff: 24h.
	MaxBackoff = 24 * time.Hour
	// DefaultTermTimeout is --term-timeout: the SIGTERM → SIGKILL grace.
	DefaultTermTimeout = 30 * time.Second
	// DefaultBackoffInitial and DefaultBackoffMax bound the default exponential
	// --restart-backoff: 1s before the first restart, doubling up to 30s.
	DefaultBackoffInitial = time.Second
	DefaultBackoffMax     = 30 * time.Second
	// StrikesBeforeFallback is how many attempts in a row may die, from the same
	// checkpoint, before writing a newer one, before that checkpoint is skipped.
	StrikesBeforeFallback = 2
	// HealthyStretch is how long an attempt must run to count as progress when it wrote
	// no newer checkpoint: 10 minutes, the running time after which Kubernetes resets a
	// container's crash back-off (kubelet's backOff, "CrashLoopBackOff").
	HealthyStretch = 10 * time.Minute
	// DefaultNoRestartExitCode is --no-restart-exit-code: a worker that exits with it
	// ends the run at once with that code, whatever the restart budget (a trainer that
	// knows a restart cannot help: a bad config, a dataset missing).
	DefaultNoRestartExitCode = 99
)

// Backoff is the wait before each restart: before the k-th restart in a row without
// progress (1-based) it waits min(Max, Initial × 2^(k−1)). Initial == Max gives a fixed
// delay; zero values none. A failed attempt that made progress (a newer complete
// checkpoint than it resumed from, or HealthyStretch of running) restarts at once, and
// the count starts again.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// ParseBackoff parses --restart-backoff: "" or "exp" for the default exponential 1s..30s,
// or a Go duration ("5s", "0s" for none, at most MaxBackoff) for a fixed delay.
func ParseBackoff(s string) (Backoff, error) {
	if s == "" || s == "exp" {
		return Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxBackoff {
		return Backoff{}, fmt.Errorf("--restart-backoff %q: want a duration such as 5s (0s for none, at most 24h) or exp", s)
	}
	return Backoff{Initial: d, Max: d}, nil
}

// Delay returns the wait before restart k (k >= 1).
func (b Backoff) Delay(k int) time.Duration {
	d := b.Initial
	for i := 1; i < k && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	return d
}

// String describes the policy: "exponential 1s..30s", "2s", "none".
func (b Backoff) String() string {
	switch {
	case b.Initial == 0 && b.Max == 0:
		return "none"
	case b.Initial == b.Max:
		return b.Initial.String()
	}
	return fmt.Sprintf("exponential %s..%s", b.Initial, b.Max)
}

// Config is one node's `gangrun run`.
type Config struct {
	// Notes are lines Run logs once when it starts: what Prepare found about the node
	// (no CPU binding and why, the NCCL_TOPO_FILE written), kept until the run starts
	// so that a usage error stays one line.
	Notes []string
	// Confine is the step's cgroup: where its workers run and what holds them.
	Confine Confinement
	// User, when set and not gangrun's own user, is who the workers and standbys run
	// as (a cluster job's submitter; gangrun stays root, as slurmstepd does): each
	// rank's attempt directory (its error file, heartbeat) is the user's, the scratch
	// directories above it only let the user through, and the files the user's
	// processes write are read with the user's permissions (proc.AsUser). The
	// environment's USER, LOGNAME and HOME are the caller's to set (User.Env).
	User *proc.User
	// Command is the training command: argv[0] is looked up on PATH.
	Command []string
	// Torchrun is Command parsed as a wrapped torchrun (Prepare sets it, having parsed
	// it once); nil has New parse Command itself.
	Torchrun *Torchrun
	// NProcPerNode is the number of workers on this node (LOCAL_WORLD_SIZE). For a
	// wrapped torchrun it is passed as --nproc_per_node and one torchrun process runs.
	NProcPerNode int
	// NNodesMin and NNodesMax are --nnodes MIN[:MAX]; a wrapped torchrun's own --nnodes
	// must match. Zero values mean 1.
	NNodesMin, NNodesMax int
	// MaxRestarts is how many failed attempts are retried (0: none).
	MaxRestarts int
	// Backoff is the wait before each restart.
	Backoff Backoff
	// NoRestartExitCode, 1..255, is the worker exit code that ends the run at once with
	// it, without a restart (--no-restart-exit-code); 0: none.
	NoRestartExitCode int
	// CheckpointDir is where the trainer writes checkpoints; "" disables resuming.
	CheckpointDir string
	// ResumeArg, when set, appends "ResumeArg PATH" to the command when resuming.
	ResumeArg string
	// LogDir, when set, receives LogDir/attempt_K/rank_N/{stdout,stderr}.log and the
	// workers' error files. LogDir itself may be a symbolic link; below it gangrun
	// follows none: it creates attempt_K and rank_N (0755) and the log files (0644, new:
	// never an existing file overwritten) relative to their parents' descriptors with
	// O_NOFOLLOW, and an attempt whose files cannot be created so fails to start.
	LogDir string
	// FreshLogDir makes New refuse a LogDir that already holds an attempt_* entry (an
	// earlier run's logs), so that a rerun into the same directory is a usage error and
	// not a failed attempt. For a node alone in its LogDir (one node, the embedded
	// coordinator); the nodes of a job that share one leave it false.
	FreshLogDir bool
	// LogDirPerRun makes the run write its logs under a directory of its own in LogDir,
	// created when it starts: LogDir/<job id>_<random>, as torchrun's --log-dir does
	// (torch/distributed/elastic/multiprocessing/api.py, DefaultLogsSpecs: mkdtemp with
	// the run id as prefix), so a LogDir reused run after run is never refused.
	LogDirPerRun bool
	// Tee keeps worker output on the console when LogDir is set (without LogDir the
	// console always gets it).
	Tee bool
	// Streams, when set, decides instead of LogDir and Tee where each local rank's
	// stdout and stderr go (torchrun's --redirects, --tee, --local-ranks-filter and
	// --log-line-prefix-template); a stream it sends to a file needs LogDir.
	Streams *Streams
	// TermTimeout is the SIGTERM → SIGKILL grace when stopping workers.
	TermTimeout time.Duration
	// HangTimeout: no output from any rank for this long counts as a failure; 0 is off.
	HangTimeout time.Duration
	// LocalRankArg appends --local_rank=N to each worker's command (legacy
	// torch.distributed.launch scripts).
	LocalRankArg bool
	// MasterPort is MASTER_PORT when non-zero; 0 picks a free port for every attempt.
	MasterPort int
	// JobID names the job (TORCHELASTIC_RUN_ID, GANGRUN_JOB_ID).
	JobID string
	// NodeName is this node's name; Addr the address other nodes reach it at; Switch
	// its switch label.
	NodeName string
	Addr     string
	Switch   string
	// Env holds the inherited environment, --env entries, NCCL settings and chosen GPUs.
	// Its MaxRestarts, NodeName and CheckpointDir are filled in from this Config.
	Env EnvConfig
	// Stdout and Stderr receive the workers' prefixed output.
	Stdout io.Writer
	Stderr io.Writer
	// Log receives gangrun's own messages; nil discards them.
	Log *zap.Logger
	// Report receives the multi-line failure report (root cause, message, traceback);
	// nil sends it to Log only.
	Report io.Writer
	// GuardianArgv starts the guardian process (proc.Guardian); nil runs without one.
	GuardianArgv []string
	// Subreaper makes this process a child subreaper (proc.BecomeSubreaper) and, after
	// every attempt, SIGKILLs the workers' descendants that left their process group
	// (setsid) and were re-parented here: children whose environment carries this run's
	// GANGRUN_JOB_ID and GANGRUN_NODE_NAME, other than those the process had when Run
	// began. It also reaps every exited child it does not wait for itself, so it is only
	// for a process with no other children that something waits for (so never in tests
	// that run the supervisor inside a test binary with children of its own).
	Subreaper bool
	// Signals delivers the signals sent to gangrun: SIGINT, SIGTERM, SIGHUP and SIGQUIT are
	// forwarded to every worker and stop the run; SIGUSR1 and SIGUSR2 are forwarded only, to each worker process (not its children).
	Signals <-chan os.Signal
	// WarmRestarts (--warm-restarts) has every attempt after the first start its ranks
	// from standby interpreters prepared while the previous attempt ran, when Command is
	// a Python interpreter running a script or -m module (docs/run.md, "Warm restarts").
	WarmRestarts bool
	// WarmImports are the modules a standby imports before it waits (--warm-imports);
	// nil is DefaultWarmImports, whose import errors are ignored.
	WarmImports []string
	// NoRestart, when set, is asked before each restart after a failure: a reason not
	// to restart ("" lets it) ends the run instead, failed. A cluster job's step uses it
	// while the job is being stopped (pre-empted with a signal its workers may die of).
	NoRestart func() string
	// WarmDelay is how long after an attempt's workers start its standbys for the next
	// attempt are started (--warm-delay), so that their imports do not compete for the
	// CPUs with the workers' own start-up (their imports, the process group's set-up,
	// the checkpoint's load); 0 starts them at once. A failure within it restarts cold.
	// With Subreaper, a warm worker forks its rank's next standby as it starts, so only
	// ranks without one (the first attempt's, those whose standby could not fork) wait
	// for WarmDelay.
	WarmDelay time.Duration
	// Events receives the worker group's state changes (event.StateChanged, with
	// GroupState names), failures, restarts, the checkpoint each attempt resumes from
	// and how each round ended; nil discards them.
	Events event.Sink
}

// Confinement is the cgroup a step's workers run in (docs/run.md, "Confining the
// step: cgroups"), Slurm's task/cgroup: Run creates it before the first attempt,
// starts every worker and standby inside it, tells the guardian its directories, and
// removes it when the run ends.
type Confinement struct {
	// Mode is --cgroup. Off creates none; Auto says once why when the node cannot
	// (cgroup.Unusable) and runs unconfined; Required ends the run then, exit code 1.
	Mode cgroup.Mode
	// Why, when set, is the one line Run logs about running without a cgroup of its
	// own (Prepare's reason: under Slurm's coordinator).
	Why string
	// Limits are the cgroup's cpuset, memory and pids limits and devices rules.
	Limits cgroup.Limits
}

// Result is how a run ended.
type Result struct {
	// ExitCode is gangrun's exit code: 0 on success; the root-cause worker's code
	// (128+N for signal N) when restarts ran out; 128+N when gangrun was stopped by
	// signal N; 127 when the command does not exist; 1 for other failures.
	ExitCode int
	// Attempts is the number of rounds that started workers.
	Attempts int
	// Failure is the last root cause; nil when none failed.
	Failure *rendezvous.Failure
	// Err is the error that ended the run when no worker was to blame.
	Err error
}

// Supervisor runs and restarts one node's workers. Create it with New; Run once.
type Supervisor struct {
	cfg    Config
	rdzv   rendezvous.Rendezvous
	log    *zap.Logger
	events event.Sink
	state  GroupState // the worker group's state, as last recorded
	torch  *Torchrun  // non-nil when wrapping torchrun

	console, consoleErr *lineWriter
	act                 activity
	guard               *proc.Guardian
	scratch             string // per-attempt dirs when there is no LogDir

	inherited map[int]bool // children this process had before it started any: never swept

	excluded []string   // checkpoints skipped after StrikesBeforeFallback failures
	stuck    int        // failures in a row without progress (the backoff's k)
	timer    *fileTimer // torch's file-based watchdog, when enabled
	// stopSignal is a terminating signal that arrived while an attempt's workers were
	// being stopped for another reason: the run ends after them.
	stopSignal syscall.Signal
	started    time.Time      // when the current attempt's workers started
	strikes    map[string]int // failures in a row per checkpoint resumed from
	unpin      func() error
	pinned     string

	warmDir  string           // holds the standby program; "" when warm restarts are off
	standbys map[int]*standby // by local rank, for the next attempt
	// forked are the standbys the current attempt's warm workers forked at their
	// activation, for the attempt after (by local rank).
	forked   map[int]*standby
	pending  map[int]*pendingFork // activated standbys whose fork is still to be told
	forkTold bool                 // the log said that a standby could not fork
	// masterChecked: a warm rank of this attempt waited for rank 0's store (awaitMaster);
	// masterSilent: one waited in vain, so none waits again.
	masterChecked, masterSilent bool
	// nextSpecs are the specs whose standbys are due WarmDelay after the attempt's start
	// (nil: none due).
	nextSpecs []workerSpec
	// memRefusedTold: the log said once that a worker's memory policy was refused.
	memRefusedTold bool

	// store is the workers' TCPStore this node serves for the current attempt as node
	// rank 0 (Env.AgentStore); nil when none.
	store *tcpstore.Server

	cg      *cgroup.Step // the step's cgroup; nil when unconfined
	oomBase uint64       // the cgroup's OOM kills when the current attempt started
	// pidsBase is the cgroup's refused forks (pids.events) when the attempt started.
	pidsBase uint64
}

// placement is where workers start: the step's cgroup, or nil (a nil *cgroup.Step in
// the interface would not be nil).
func (s *Supervisor) placement() proc.Placement {
	if s.cg == nil {
		return nil
	}
	return s.cg
}

// confine creates the step's cgroup (Config.Confine) and has the guardian remove it
// should this process die; an error ends the run only under --cgroup required.
func (s *Supervisor) confine() error {
	c := s.cfg.Confine
	if c.Why != "" {
		s.log.Info(c.Why)
	}
	if c.Mode == "" || c.Mode == cgroup.Off {
		return nil
	}
	job := safeName(s.cfg.JobID)
	if len(job) > 64 {
		job = job[:64] // a cgroup's name is a file name: at most 255 bytes
	}
	name := "gangrun-" + job + "-" + strconv.Itoa(os.Getpid()) + "-" + randomHex(3)
	st, err := cgroup.New(name, c.Limits)
	if err != nil {
		if c.Mode == cgroup.Required {
			return fmt.Errorf("--cgroup required: %w", err)
		}
		s.log.Info("running the step unconfined (--cgroup auto): " + err.Error())
		return nil
	}
	s.cg = st
	for _, d := range st.Dirs() {
		if err := s.guard.RemoveCgroupOnDeath(d); err != nil {
			s.log.Warn("guardian", zap.Error(err))
		}
	}
	fields := []zap.Field{zap.String("cgroup", name), zap.Strings("controllers", st.Controllers()),
		zap.String("cpus", topology.FormatCPUList(c.Limits.CPUs))}
	if c.Limits.MemoryBytes > 0 {
		fields = append(fields, zap.String("mem", cgroup.FormatMem(c.Limits.MemoryBytes)))
	}
	if c.Limits.PidsLimit > 0 {
		fields = append(fields, zap.Int64("pids_limit", c.Limits.PidsLimit))
	}
	if n := len(c.Limits.Devices); n > 0 && slices.Contains(st.Controllers(), "devices") {
		paths := make([]string, n)
		for i, r := range c.Limits.Devices {
			paths[i] = r.Path
		}
		fields = append(fields, zap.Strings("devices_denied", paths))
	}
	if st.V2() {
		fields = append(fields, zap.String("hierarchy", "v2"))
	}
	s.log.Info("step confined to its cgroup", fields...)
	if why := st.Why(); why != "" {
		s.log.Info("the step's cgroup lacks part of its confinement: " + why)
	}
	return nil
}

// unconfine removes the step's cgroup, killing what is left in it.
func (s *Supervisor) unconfine() {
	if s.cg == nil {
		return
	}
	if err := s.cg.Delete(); err != nil {
		s.log.Warn("remove the step's cgroup", zap.Error(err))
	}
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// New validates cfg and returns a Supervisor that joins rounds of rdzv. Errors are the
// user's: a missing command (wraps ErrCommandNotFound), one that cannot be executed
// (ErrNotExecutable: a directory, no execute permission), a torchrun option that
// conflicts with gangrun's, an unreadable checkpoint directory (or one that is a named
// pipe, refused without blocking), a log directory that cannot be written (or, with
// FreshLogDir, holds an earlier run's logs).
func New(cfg Config, rdzv rendezvous.Rendezvous) (*Supervisor, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("no command to run (give it after --)")
	}
	if cfg.NProcPerNode < 1 {
		return nil, fmt.Errorf("--nproc-per-node %d: must be at least 1", cfg.NProcPerNode)
	}
	if err := checkMaxRestarts(cfg.MaxRestarts); err != nil {
		return nil, err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
		if need := uint64(cfg.NProcPerNode)*fdsPerWorker + fdsReserved; need > lim.Cur {
			return nil, fmt.Errorf("--nproc-per-node %d: needs about %d open files, and this process may open %d (ulimit -n)",
				cfg.NProcPerNode, need, lim.Cur)
		}
	}
	if _, err := LookCommand(cfg.Command[0]); err != nil {
		return nil, err
	}
	if !cfg.User.IsSelf() {
		if _, err := lookPathAs(cfg.User, cfg.Command[0]); err != nil {
			return nil, err
		}
	}
	if cfg.CheckpointDir != "" {
		// With the permissions of the user the workers run as: a directory root may read
		// and the user may not would fail every attempt later.
		if err := proc.AsUser(cfg.User, func() error { return checkReadableDir(cfg.CheckpointDir) }); err != nil {
			return nil, err
		}
	}
	if cfg.LogDir != "" {
		if err := checkLogDir(cfg.LogDir, cfg.FreshLogDir && !cfg.LogDirPerRun); err != nil {
			return nil, err
		}
	}
	cfg.NNodesMin, cfg.NNodesMax = max(cfg.NNodesMin, 1), max(cfg.NNodesMax, cfg.NNodesMin, 1)
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	cfg.Env.MaxRestarts = cfg.MaxRestarts
	cfg.Env.NodeName = cfg.NodeName
	cfg.Env.CheckpointDir = cfg.CheckpointDir
	s := &Supervisor{cfg: cfg, rdzv: rdzv, log: cfg.Log, events: event.Or(cfg.Events), strikes: map[string]int{}}
	t, isTorchrun := cfg.Torchrun, cfg.Torchrun != nil
	if t == nil {
		var err error
		if t, isTorchrun, err = ParseTorchrun(cfg.Command); err != nil {
			return nil, err
		}
	}
	if isTorchrun {
		s.torch = t
		if err := t.CheckStatic(cfg.NNodesMin, cfg.NNodesMax, cfg.NProcPerNode, cfg.MasterPort); err != nil {
			return nil, err
		}
	}
	// A wrapped torchrun serves its workers' store itself.
	s.cfg.Env.AgentStore = !isTorchrun && s.cfg.Env.UsesAgentStore()
	if cfg.Streams.NeedsFiles() && cfg.LogDir == "" {
		return nil, errors.New("--redirects and --tee write log files: they need --log-dir")
	}
	if cfg.LogDir == "" || cfg.Tee || cfg.Streams != nil {
		s.console = &lineWriter{w: cfg.Stdout}
		s.consoleErr = &lineWriter{w: cfg.Stderr}
	}
	return s, nil
}

// checkReadableDir accepts a directory that does not exist yet (the trainer creates it)
// and rejects one that exists but cannot be listed, or is not a directory (a named pipe
// is refused without blocking in open(2)).
func checkReadableDir(dir string) error {
	// The trainer writes its checkpoints there, and gangrun its pins and fence: a
	// kernel file system (/proc, /sys) takes none.
	if fsys := userfile.PseudoFS(dir); fsys != "" {
		return fmt.Errorf("--checkpoint-dir %s: cannot be written: %s is in the kernel's %s file system, where no files can be created", dir, userfile.ExistingAncestor(dir), fsys)
	}
	f, err := userfile.OpenDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("--checkpoint-dir %s: dangling symbolic link", dir)
		}
		if existingAncestorIsFile(dir) {
			return fmt.Errorf("--checkpoint-dir %s: cannot be created: %s", dir, whyNotWritable(dir, unix.ENOTDIR))
		}
		return nil
	}
	if errors.Is(err, userfile.ErrNotDir) {
		if fi, serr := os.Stat(dir); serr == nil && fi.Mode().IsRegular() {
			return fmt.Errorf("--checkpoint-dir %s: is a file, not a directory", dir)
		}
	}
	if err != nil {
		return fmt.Errorf("--checkpoint-dir %w", err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("--checkpoint-dir %s: cannot be read: %w", dir, err)
	}
	return nil
}

// existingAncestorIsFile reports whether the nearest existing ancestor of path is not
// a directory (so path cannot be created).
func existingAncestorIsFile(path string) bool {
	a := existingAncestor(path)
	if a == "" || a == filepath.Clean(path) {
		return false
	}
	fi, err := os.Stat(a)
	return err == nil && !fi.IsDir()
}

// zombieReapEvery is how often a subreaper supervisor reaps exited orphans during an
// attempt.
const zombieReapEvery = 5 * time.Second

// File descriptors gangrun holds: per worker, the two ends of its stdout and stderr
// pipes while it starts and its two log files; and a reserve for everything else (the
// Consul client's connections, the guardian's pipe, the error files read).
const (
	fdsPerWorker = 6
	fdsReserved  = 64
)

// unwrapPath returns the cause inside a *fs.PathError ("permission denied"), whose
// own text repeats the operation and path.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// outcomeKind says how monitoring an attempt ended.
type outcomeKind int

const (
	outSucceeded outcomeKind = iota // every local worker exited 0
	outFailed                       // a local worker failed, or the gang hung
	outEnded                        // the round ended elsewhere
	outStopped                      // gangrun was told to stop
)

type outcome struct {
	kind    outcomeKind
	failure *rendezvous.Failure
	failed  *worker // the root-cause worker when kind is outFailed; nil for a hang
	sig     syscall.Signal
}

// Run supervises the job until it succeeds, runs out of restarts, or is stopped, and
// returns how it ended. It never panics on worker behaviour.
func (s *Supervisor) Run(ctx context.Context) Result {
	var undo cleanups
	defer func() { undo.run() }()
	if err := s.setUp(&undo); err != nil {
		return Result{ExitCode: 1, Err: err}
	}
	return s.loop(ctx)
}

// cleanups are what Run undoes when it returns, last added first (as deferred calls).
type cleanups []func()

// add has f run when Run returns, before those added earlier.
func (c *cleanups) add(f func()) { *c = append(*c, f) }

// run runs the cleanups, last added first.
func (c cleanups) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// setUp prepares the node for the run's first round, in this order: the notes logged,
// the processes this one already has noted, the guardian and the subreaper, the step's
// cgroup, the log or scratch directory, the checkpoint pin, the workers' store, the
// standby program and torch's file-based watchdog. What it sets up is undone by undo,
// also when it fails; an error ends the run with exit code 1.
func (s *Supervisor) setUp(undo *cleanups) error {
	for _, n := range s.cfg.Notes {
		s.cfg.Log.Info(n)
	}
	s.adoptProcess()
	undo.add(func() {
		if err := s.guard.Close(); err != nil {
			s.log.Warn("guardian", zap.Error(err))
		}
	})
	if err := s.confine(); err != nil {
		return err
	}
	undo.add(s.unconfine) // after the standbys and workers are gone, before the guardian
	if err := s.makeLogDirs(undo); err != nil {
		return err
	}
	undo.add(func() { s.pin("") })
	undo.add(s.closeStore)
	undo.add(s.setupWarm())
	s.serveFileTimer(undo)
	return nil
}

// adoptProcess readies this process to supervise workers: with Config.Subreaper it
// notes the children it already has (never swept) and becomes a child subreaper, and
// with Config.GuardianArgv it starts the guardian. Each that fails is logged and run
// without.
func (s *Supervisor) adoptProcess() {
	if s.cfg.Subreaper {
		// Children this process inherited when it was exec'd (a shell's `exec >
		// >(tee run.log)` before `exec gangrun run`) are not the workers': the sweep
		// leaves them alone.
		s.inherited = map[int]bool{}
		for _, pid := range proc.Children() {
			s.inherited[pid] = true
		}
	}
	if len(s.cfg.GuardianArgv) > 0 {
		g, err := proc.StartGuardian(s.cfg.GuardianArgv)
		if err != nil {
			s.log.Warn("no guardian: only parent-death signals protect the workers if gangrun is killed", zap.Error(err))
		}
		s.guard = g
	}
	if s.cfg.Subreaper {
		if err := proc.BecomeSubreaper(); err != nil {
			s.log.Warn("not a subreaper: a worker's child that leaves its process group (setsid) may outlive the run", zap.Error(err))
			s.cfg.Subreaper = false
		}
	}
}

// makeLogDirs creates the run's own directory under LogDir (Config.LogDirPerRun) and
// makes it LogDir, or, without a LogDir, the scratch directory of the workers' error
// files and heartbeats, removed when Run returns (undo) or should this process die
// (the guardian).
func (s *Supervisor) makeLogDirs(undo *cleanups) error {
	if s.cfg.LogDir != "" && s.cfg.LogDirPerRun {
		if err := os.MkdirAll(s.cfg.LogDir, logDirMode); err != nil {
			return fmt.Errorf("--log-dir %s: %w", s.cfg.LogDir, err)
		}
		dir, err := os.MkdirTemp(s.cfg.LogDir, safeName(s.cfg.JobID)+"_")
		if err != nil {
			return fmt.Errorf("--log-dir %s: %w", s.cfg.LogDir, err)
		}
		s.cfg.LogDir = dir
		s.log.Info("worker logs in this run's directory", zap.String("dir", dir))
	}
	if s.cfg.LogDir != "" {
		return nil
	}
	dir, err := os.MkdirTemp("", "gangrun-"+safeName(s.cfg.JobID)+"-")
	if err != nil {
		return fmt.Errorf("create scratch dir: %w", err)
	}
	s.scratch = dir
	if !s.cfg.User.IsSelf() {
		// The user's workers pass through to their own rank directories; they list
		// nothing here.
		if err := os.Chmod(dir, 0o711); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("scratch dir: %w", err)
		}
	}
	undo.add(func() { os.RemoveAll(dir) })
	if err := s.guard.RemoveOnDeath(dir); err != nil {
		s.log.Warn("guardian", zap.Error(err))
	}
	return nil
}

// serveFileTimer serves torch's file-based watchdog (FileTimerEnableEnv) to the
// workers this node starts itself (a wrapped torchrun serves its own), closed when Run
// returns (undo); one that cannot be served is logged, and its timers not judged.
func (s *Supervisor) serveFileTimer(undo *cleanups) {
	env := newEnvMap(s.cfg.Env.Base, s.cfg.Env.Extra)
	if env[FileTimerEnableEnv] != "1" || s.torch != nil {
		return
	}
	ft, err := openFileTimer(env[FileTimerFileEnv], s.cfg.User)
	if err != nil {
		s.log.Warn("torch's file-based watchdog cannot be served: its timers are not judged", zap.Error(err))
		return
	}
	s.timer = ft
	undo.add(ft.close)
	if ft.created != "" {
		if err := s.guard.RemoveOnDeath(ft.created); err != nil {
			s.log.Warn("guardian", zap.Error(err))
		}
	}
	s.log.Info("serving torch's file-based watchdog", zap.String(FileTimerFileEnv, ft.path))
}

// loop moves the worker group between its states (GroupState), as torch's elastic
// agent's _invoke_run does (torch/distributed/elastic/agent/server/api.py): each
// state's step returns the next state, or done when the run ends.
func (s *Supervisor) loop(ctx context.Context) Result {
	var res Result
	var at attempt
	state := StateInit
	s.setState(state, &at)
	for {
		var next GroupState
		var done bool
		switch state {
		case StateInit:
			next, done = s.begin(ctx, &at, &res)
		case StateHealthy:
			next = s.watch(ctx, &at)
		case StateSucceeded:
			next, done = s.succeeded(ctx, &at, &res)
		case StateFailed:
			next, done = s.failed(ctx, &at, &res)
		case StateUnhealthy:
			next, done = s.unhealthy(ctx, &at, &res)
		case StateStopped:
			_ = at.round.Leave(context.WithoutCancel(ctx))
			s.log.Info("forwarding signal to workers and stopping", zap.String("signal", proc.SignalName(at.out.sig)), zap.Duration("term_timeout", s.cfg.TermTimeout))
			s.stop(at.g, at.out.sig, at.round.End().KillBy)
			res.ExitCode = 128 + int(at.out.sig)
			done = true
		}
		if done {
			return res
		}
		s.setState(next, &at)
		state = next
	}
}

// GroupState is the state of this node's worker group, in the names of torch's elastic
// agent (torch/distributed/elastic/agent/server/api.py, WorkerState).
type GroupState string

// The worker group's states. Run starts in INIT and moves: INIT → HEALTHY (workers
// started); HEALTHY → SUCCEEDED (every worker exited 0), FAILED (a worker here failed,
// or the gang hung), UNHEALTHY (the round ended elsewhere: another node failed, the
// membership changed, or this node's lease with the coordinator is over) or STOPPED (a
// signal to gangrun); SUCCEEDED, FAILED and UNHEALTHY → INIT (the next round) or the
// end of the run; STOPPED ends it.
const (
	StateInit      GroupState = "INIT"
	StateHealthy   GroupState = "HEALTHY"
	StateUnhealthy GroupState = "UNHEALTHY"
	StateFailed    GroupState = "FAILED"
	StateSucceeded GroupState = "SUCCEEDED"
	StateStopped   GroupState = "STOPPED"
)

// attempt is what the states of one round share.
type attempt struct {
	round   rendezvous.Round
	a       rendezvous.Assignment
	g       *group
	out     outcome
	started time.Time // when its workers started
}

// setState records that the worker group is now in state st (INIT again starts the
// next round; any other state entered twice is recorded once).
func (s *Supervisor) setState(st GroupState, at *attempt) {
	if st == s.state && st != StateInit {
		return
	}
	s.state = st
	e := event.Event{Time: time.Now(), Kind: event.StateChanged, Job: s.cfg.JobID, Node: s.cfg.NodeName, Attempt: -1, State: string(st)}
	if at.round != nil {
		e.Attempt = at.a.Round
	}
	s.events.Emit(e)
}

// begin is INIT: it joins the next round and starts this node's workers (HEALTHY), or
// ends the run (the job finished meanwhile, a signal, an error).
func (s *Supervisor) begin(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	round, done := s.joinNext(ctx, at, res)
	if done {
		return "", true
	}
	*at = attempt{round: round, a: round.Assignment()}
	if end := round.End(); end.Lost {
		// The lease ran out between the round's closing and now (a stall): nothing of
		// this round may be written or started.
		s.log.Warn("the round was lost before its workers started: joining the next", zap.String("reason", end.Detail))
		return StateInit, false
	}
	s.checkResume(at)
	a := at.a
	s.pin(a.ResumeFrom)
	s.fence(a)
	s.events.Emit(event.Event{Time: time.Now(), Kind: event.CheckpointChosen, Job: s.cfg.JobID, Node: s.cfg.NodeName,
		Attempt: a.Round, Checkpoint: a.ResumeFrom})
	specs, err := s.specs(a)
	if err == nil {
		err = s.serveStore(a)
	}
	if err != nil {
		s.failStart(ctx, round, err, res)
		return "", true
	}
	s.log.Info("starting workers", s.attemptFields(a)...)
	g, err := s.startAttempt(at, specs)
	if err != nil {
		s.closeStore()
		s.failStart(ctx, round, err, res)
		if errors.Is(err, ErrCommandNotFound) {
			res.ExitCode = 127
		} else if errors.Is(err, ErrNotExecutable) {
			res.ExitCode = 126
		}
		return "", true
	}
	at.g = g
	res.Attempts++
	s.afterStart(a, g, specs)
	return StateHealthy, false
}

// joinNext joins the next round for begin. done reports that the run ends instead, res
// saying how: a terminating signal (STOPPED), the job finished while this node waited
// for room (its end reported as its nodes did: 0, or the root cause's code), or the
// rendezvous' error.
func (s *Supervisor) joinNext(ctx context.Context, at *attempt, res *Result) (round rendezvous.Round, done bool) {
	round, sig, err := s.join(ctx)
	if sig != 0 {
		s.setState(StateStopped, at)
		res.ExitCode = 128 + int(sig)
		return nil, true
	}
	var finished *rendezvous.JobFinishedError
	if errors.As(err, &finished) {
		res.Err, res.Failure = err, finished.Failure
		switch {
		case finished.Succeeded:
			s.log.Info(finished.Error())
			res.Err = nil
		case finished.Failure != nil && finished.Failure.ExitCode != 0:
			s.log.Error(finished.Error())
			res.ExitCode = finished.Failure.ExitCode
		default:
			s.log.Error(finished.Error())
			res.ExitCode = 1
		}
		return nil, true
	}
	if err != nil {
		res.ExitCode, res.Err = 1, err
		return nil, true
	}
	return round, false
}

// checkResume drops from at's assignment a checkpoint to resume from outside this
// job's checkpoint directory: never a choice of gangrun's (it picks among the
// directory's checkpoints), and loading it would hand the workers someone else's files
// (a pickle runs code).
func (s *Supervisor) checkResume(at *attempt) {
	if at.a.ResumeFrom == "" || beneath(s.cfg.CheckpointDir, at.a.ResumeFrom) {
		return
	}
	s.log.Warn("the round names a checkpoint to resume from outside the checkpoint directory: starting without it",
		zap.String("resume_from", at.a.ResumeFrom), zap.String("checkpoint_dir", s.cfg.CheckpointDir))
	at.a.ResumeFrom = ""
}

// failStart reports to the gang that this node's workers of round could not start
// (err, a start error of no rank) and ends the run with exit code 1.
func (s *Supervisor) failStart(ctx context.Context, round rendezvous.Round, err error, res *Result) {
	_ = round.Fail(ctx, rendezvous.Failure{Node: s.cfg.NodeName, Rank: -1, LocalRank: -1, ExitCode: 1, Kind: failure.StartError, Reason: err.Error()})
	res.ExitCode, res.Err = 1, err
}

// attemptFields are the log fields of "starting workers" for assignment a.
func (s *Supervisor) attemptFields(a rendezvous.Assignment) []zap.Field {
	fields := []zap.Field{zap.Int("attempt", a.Round), zap.Int("restarts", a.RestartCount),
		zap.Int("max_restarts", s.cfg.MaxRestarts), zap.Int("node_rank", a.NodeRank),
		zap.Int("nnodes", a.NNodes), zap.Int("world_size", a.WorldSize),
		zap.String("master", a.MasterEndpoint())}
	if a.ResumeFrom != "" {
		fields = append(fields, zap.String("resume_from", a.ResumeFrom))
	}
	return fields
}

// watch is HEALTHY: it monitors the workers until the attempt ends, and names the state
// that follows.
func (s *Supervisor) watch(ctx context.Context, at *attempt) GroupState {
	at.out = s.monitor(ctx, at.g, at.round, at.a)
	switch at.out.kind {
	case outSucceeded:
		return StateSucceeded
	case outFailed:
		return StateFailed
	case outStopped:
		return StateStopped
	}
	return StateUnhealthy
}

// succeeded is SUCCEEDED: this node's workers all exited 0; it reports that and waits
// for the gang. The run ends when the gang succeeded (or can no longer be asked);
// otherwise the round ended elsewhere and the gang goes on.
func (s *Supervisor) succeeded(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	s.stop(at.g, 0, time.Time{})
	end, sig, err := s.awaitSuccess(ctx, at.round)
	if sig != 0 {
		s.setState(StateStopped, at)
		res.ExitCode = 128 + int(sig)
		return "", true
	}
	if end.Kind == rendezvous.Succeeded {
		s.log.Info("all workers finished", zap.Int("attempt", at.a.Round))
		s.events.Emit(event.Event{Time: time.Now(), Kind: event.RoundEnded, Job: s.cfg.JobID, Node: s.cfg.NodeName,
			Attempt: at.a.Round, Cause: end.Kind.String()})
		res.ExitCode = 0
		return "", true
	}
	if err != nil || end.Lost {
		// This node's workers all finished, and the coordinator can no longer say how
		// the others did. Starting them again would run a finished job a second time;
		// each other node's gangrun reports its own end.
		reason := end.Detail
		if err != nil {
			reason = err.Error()
		}
		s.log.Warn("this node's workers all finished; the other nodes' outcome is unknown: the rendezvous was lost",
			zap.Int("attempt", at.a.Round), zap.String("reason", reason))
		res.ExitCode = 0
		return "", true
	}
	return s.next(ctx, at, res)
}

// failed is FAILED: a worker of this node failed (or the gang hung). It tells the gang
// first, so the other nodes stop at once, reports the root cause and stops the workers.
func (s *Supervisor) failed(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	out := at.out
	_ = at.round.Fail(ctx, *out.failure)
	if out.failed != nil {
		// The report says "see its output above": let the worker's last lines (its
		// traceback) reach the console first.
		out.failed.awaitOutput(reportOutputWait)
	}
	s.report(at.a, out.failure)
	s.events.Emit(event.Event{Time: time.Now(), Kind: event.WorkerFailed, Job: s.cfg.JobID, Node: s.cfg.NodeName,
		Attempt: at.a.Round, Rank: out.failure.Rank, ExitCode: out.failure.ExitCode, Failure: out.failure.Kind,
		Cause: out.failure.Reason, Detail: out.failure.Message})
	s.stop(at.g, syscall.SIGTERM, at.round.End().KillBy)
	return s.next(ctx, at, res)
}

// unhealthy is UNHEALTHY: the round ended elsewhere (or this node's lease is over); it
// stops the workers, by the lease's kill time when one applies.
func (s *Supervisor) unhealthy(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	end := at.round.End()
	if end.Lost {
		fields := []zap.Field{zap.String("reason", end.Detail)}
		if !end.KillBy.IsZero() {
			// The lease's kill time; none when the job's state went (the stop timeout applies).
			fields = append(fields, zap.Duration("kill_in", time.Until(end.KillBy).Round(100*time.Millisecond)))
		}
		s.log.Warn("stopping this node's workers: the round is over for this node", fields...)
	}
	s.stop(at.g, syscall.SIGTERM, end.KillBy)
	return s.next(ctx, at, res)
}

// next decides, once a round's workers are stopped, how the run goes on: after a failed
// round, a restart (INIT, after the backoff) while the budget lasts, else the end with
// the root cause's code; after a membership change, the next round at once.
func (s *Supervisor) next(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	a := at.a
	end := at.round.End()
	if s.stopSignal != 0 {
		// Told to stop while the workers were stopping: no next round.
		_ = at.round.Leave(context.WithoutCancel(ctx))
		s.log.Info("stopping: a signal arrived while the workers were stopping", zap.String("signal", proc.SignalName(s.stopSignal)))
		s.setState(StateStopped, at)
		res.ExitCode = 128 + int(s.stopSignal)
		return "", true
	}
	detail, kind := end.Detail, failure.Kind("")
	if end.Failure != nil {
		detail, kind = end.Failure.String(), end.Failure.Kind
	}
	s.events.Emit(event.Event{Time: time.Now(), Kind: event.RoundEnded, Job: s.cfg.JobID, Node: s.cfg.NodeName,
		Attempt: a.Round, Cause: end.Kind.String(), Detail: detail, Failure: kind})
	switch end.Kind {
	case rendezvous.Failed:
		res.Failure = end.Failure
		if end.Failure != nil && end.Failure.Node != s.cfg.NodeName {
			s.log.Warn("gang failed on another node", zap.String("root_cause", end.Failure.String()))
		}
		used := a.RestartCount + 1
		if end.OutOfRestarts { // the rendezvous judges the budget (the run's, which a job may raise)
			code := 1
			if end.Failure != nil && end.Failure.ExitCode != 0 {
				code = end.Failure.ExitCode
			}
			s.log.Error("no restarts left", zap.Int("restarts", a.RestartCount), zap.Int("max_restarts", s.cfg.MaxRestarts), zap.Int("exit_code", code))
			s.setState(StateFailed, at)
			res.ExitCode = code
			return "", true
		}
		if end.Failure != nil && s.cfg.NoRestartExitCode != 0 && end.Failure.ExitCode == s.cfg.NoRestartExitCode {
			s.log.Error("a worker exited with the no-restart code: the run ends without a restart",
				zap.Int("exit_code", end.Failure.ExitCode), zap.String("root_cause", end.Failure.String()))
			s.setState(StateFailed, at)
			res.ExitCode = end.Failure.ExitCode
			return "", true
		}
		if s.cfg.NoRestart != nil {
			if why := s.cfg.NoRestart(); why != "" {
				code := 1
				if end.Failure != nil && end.Failure.ExitCode != 0 {
					code = end.Failure.ExitCode
				}
				s.log.Warn("no restart: "+why, zap.Int("exit_code", code))
				s.setState(StateFailed, at)
				res.ExitCode = code
				return "", true
			}
		}
		newest := s.newestCheckpoint() // one listing of the directory for both judgements
		progressed := s.progressed(at, newest)
		s.strike(a.ResumeFrom, newest)
		delay := time.Duration(0)
		if progressed {
			s.stuck = 0
		} else {
			s.stuck++
			delay = s.cfg.Backoff.Delay(s.stuck)
		}
		s.log.Info("restarting the gang", zap.Int("restart", used), zap.Int("max_restarts", s.cfg.MaxRestarts),
			zap.Bool("progressed", progressed), zap.Duration("backoff", delay))
		cause := ""
		if end.Failure != nil {
			cause = end.Failure.Reason
		}
		s.events.Emit(event.Event{Time: time.Now(), Kind: event.Restarting, Job: s.cfg.JobID, Node: s.cfg.NodeName,
			Attempt: a.Round, Cause: cause, Failure: kind, Detail: "backoff " + delay.String()})
		if sig := s.sleep(ctx, delay); sig != 0 {
			s.setState(StateStopped, at)
			res.ExitCode = 128 + int(sig)
			return "", true
		}
	case rendezvous.MembershipChanged:
		s.log.Info("gang membership changed: re-forming", zap.String("detail", end.Detail))
	default:
		// Succeeded ends the run in succeeded; a round still running here has been left.
	}
	return StateInit, false
}

// join joins the next round, giving up when gangrun is told to stop.
func (s *Supervisor) join(ctx context.Context) (rendezvous.Round, syscall.Signal, error) {
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type joined struct {
		r   rendezvous.Round
		err error
	}
	ch := make(chan joined, 1)
	go func() {
		r, err := s.rdzv.Join(jctx, rendezvous.JoinRequest{
			Node: s.cfg.NodeName, Addr: s.cfg.Addr, LocalWorldSize: s.cfg.NProcPerNode,
			Switch: s.cfg.Switch, MasterPort: s.cfg.MasterPort, ChooseResume: s.chooseResume,
			OnLease: s.onLease,
		})
		ch <- joined{r, err}
	}()
	j, stop, byCtx := awaitOrStop(ctx, s.cfg.Signals, ch)
	if stop == 0 {
		if j.err != nil {
			return nil, 0, fmt.Errorf("rendezvous: %w", j.err)
		}
		return j.r, 0, nil
	}
	cancel()
	// A round joined meanwhile is left, unless Run's context ended.
	if j := <-ch; j.r != nil && !byCtx {
		_ = j.r.Leave(context.WithoutCancel(ctx))
	}
	return nil, stop, nil
}

// onLease hands the rendezvous' lease to the guardian: if this process is frozen when
// killBy passes, the guardian kills the workers in its place.
func (s *Supervisor) onLease(killBy time.Time) {
	if err := s.guard.KillBy(killBy); err != nil {
		s.log.Warn("guardian", zap.Error(err))
	}
}

// awaitSuccess reports this node's success and waits for the whole gang's. It returns
// how the round ended, the terminating signal that cut the wait short (0 if none), and
// the coordinator's error when the success could not be reported or waited for.
func (s *Supervisor) awaitSuccess(ctx context.Context, round rendezvous.Round) (rendezvous.End, syscall.Signal, error) {
	type result struct {
		end rendezvous.End
		err error
	}
	ch := make(chan result, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		end, err := round.Succeed(sctx)
		ch <- result{end, err}
	}()
	r, stop, byCtx := awaitOrStop(ctx, s.cfg.Signals, ch)
	if stop == 0 {
		return r.end, 0, r.err
	}
	if !byCtx {
		cancel()
		_ = round.Leave(context.WithoutCancel(ctx))
	}
	return rendezvous.End{}, stop, nil
}

// monitor watches one attempt until it ends.
func (s *Supervisor) monitor(ctx context.Context, g *group, round rendezvous.Round, a rendezvous.Assignment) outcome {
	var hang <-chan time.Time
	if s.cfg.HangTimeout > 0 {
		t := time.NewTicker(hangCheckInterval(s.cfg.HangTimeout))
		defer t.Stop()
		hang = t.C
	}
	var reap <-chan time.Time
	if s.cfg.Subreaper {
		// Orphans of the workers' descendants are re-parented here: reap those that
		// exit while the attempt runs, so zombies do not pile up over a long job.
		t := time.NewTicker(zombieReapEvery)
		defer t.Stop()
		reap = t.C
	}
	var watchdog <-chan time.Time
	if s.timer != nil {
		t := time.NewTicker(100 * time.Millisecond) // torch's FileTimerServer's max_interval
		defer t.Stop()
		watchdog = t.C
	}
	var warmUp <-chan time.Time
	if s.nextSpecs != nil {
		t := time.NewTimer(time.Until(s.started.Add(s.cfg.WarmDelay)))
		defer t.Stop()
		warmUp = t.C
	}
	remaining := len(g.workers)
	for {
		select {
		case <-warmUp:
			s.prepareStandbys(s.nextSpecs)
			s.nextSpecs = nil
		case <-watchdog:
			if r, ok := s.timer.expired(time.Now()); ok {
				if w := g.workerOf(r.PID); w != nil {
					return s.hung(g, w, failure.Watchdog, fmt.Sprintf("watchdog timer %q expired (torch.distributed.elastic.timer); every rank's stack is in its stderr", r.Scope))
				}
				s.timer.forget(r) // a pid of no worker of this attempt
			}
		case <-reap:
			keep := s.standbyPids(g.pids()) // exited leaders are reaped by their Release
			keep[s.guard.Pid()] = true
			proc.ReapZombies(keep)
		case i := <-g.exits:
			w := g.workers[i]
			st := w.reap(s.guard)
			if round.End().Lost {
				// The lease is over (this process may just have woken from a stall, and
				// the guardian killed the workers meanwhile): that, not the worker, ended
				// the attempt.
				return outcome{kind: outEnded}
			}
			if !st.Success() {
				return outcome{kind: outFailed, failure: s.failureOf(a, w), failed: w}
			}
			remaining--
			if remaining == 0 {
				return outcome{kind: outSucceeded}
			}
		case <-round.Ended():
			return outcome{kind: outEnded}
		case in := <-s.cfg.Signals:
			if stop := s.signalWhileRunning(g, in); stop != 0 {
				return outcome{kind: outStopped, sig: stop}
			}
		case <-hang:
			w, age, newest := g.heartbeats(s.started, s.cfg.HangTimeout)
			s.act.touchAt(newest) // a heartbeat is activity, as a line of output is
			if w != nil {
				return s.hung(g, w, failure.Hang, fmt.Sprintf("no heartbeat for %s, the longest of any rank (--hang-timeout %s); every rank's stack is in its stderr",
					age.Round(time.Second), s.cfg.HangTimeout))
			}
			if idle := time.Since(round.Activity(ctx, s.act.lastTime())); idle >= s.cfg.HangTimeout {
				return s.hung(g, nil, failure.Hang, fmt.Sprintf("no output from any rank for %s (--hang-timeout %s)", idle.Round(time.Second), s.cfg.HangTimeout))
			}
		case <-ctx.Done():
			return outcome{kind: outStopped, sig: syscall.SIGTERM}
		}
	}
}

// hangCheckInterval is how often --hang-timeout is checked: a tenth of it, between
// 100ms and 5s.
func hangCheckInterval(d time.Duration) time.Duration {
	return min(max(d/10, 100*time.Millisecond), 5*time.Second)
}

// stop ends an attempt: it sends sig (when non-zero) to every live worker, waits up to
// TermTimeout (cut short to end by killBy, when set: the lease's kill time) for them to
// exit, SIGKILLs the rest, reaps everything and drains output. A terminating signal
// arriving meanwhile kills at once.
func (s *Supervisor) stop(g *group, sig syscall.Signal, killBy time.Time) {
	grace := s.cfg.TermTimeout
	if !killBy.IsZero() {
		grace = max(min(grace, time.Until(killBy)), 0)
	}
	if sig != 0 {
		g.signal(sig)
	}
	if len(g.live()) > 0 && grace > 0 {
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
	wait:
		for len(g.live()) > 0 {
			select {
			case i := <-g.exits:
				g.workers[i].reap(s.guard)
			case <-deadline.C:
				s.log.Warn("workers still running after the grace: sending SIGKILL",
					zap.Int("workers", len(g.live())), zap.Duration("grace", grace))
				break wait
			case in := <-s.cfg.Signals:
				if s.signalWhileStopping(g, in) {
					break wait
				}
			}
		}
	}
	g.kill(s.guard)
	s.closeStore() // the attempt's workers are gone: the next attempt's find a new one
	if s.cfg.Subreaper {
		keep := s.standbyPids(map[int]bool{s.guard.Pid(): true})
		for pid := range s.inherited {
			keep[pid] = true
		}
		// Only what came from this run's workers: their environment carries the job and
		// node gangrun gave them, which nothing else among this process's children does.
		marks := []string{"GANGRUN_JOB_ID=" + s.cfg.JobID, "GANGRUN_NODE_NAME=" + s.cfg.NodeName}
		ours := func(pid int) bool { return proc.Marked(pid, marks) }
		if n := proc.KillOrphans(keep, g.pids(), ours); n > 0 {
			s.log.Info("killed processes the workers left outside their process groups", zap.Int("processes", n))
		}
	}
}

// serveStore starts the workers' TCPStore for attempt a on MASTER_PORT, on every
// interface as torch's own server binds, when this node serves it: node rank 0 with
// Env.AgentStore. The previous attempt's is closed first. An error (the port is taken)
// names the port.
func (s *Supervisor) serveStore(a rendezvous.Assignment) error {
	s.closeStore()
	if !s.cfg.Env.AgentStore || a.NodeRank != 0 {
		return nil
	}
	st, err := tcpstore.Listen(net.JoinHostPort("", strconv.Itoa(a.MasterPort)))
	if err != nil {
		return fmt.Errorf("MASTER_PORT %d: gangrun serves the workers' store there (TORCHELASTIC_USE_AGENT_STORE=True) and cannot: %w", a.MasterPort, err)
	}
	s.store = st
	return nil
}

// closeStore closes the attempt's TCPStore, if this node serves one.
func (s *Supervisor) closeStore() {
	if s.store != nil {
		_ = s.store.Close()
		s.store = nil
	}
}

// sleep waits d, returning early with the signal that stops gangrun.
func (s *Supervisor) sleep(ctx context.Context, d time.Duration) syscall.Signal {
	if d <= 0 {
		return 0
	}
	t := time.NewTimer(d)
	defer t.Stop()
	_, stop, _ := awaitOrStop(ctx, s.cfg.Signals, t.C)
	return stop
}

// specs builds the processes of one attempt.
func (s *Supervisor) specs(a rendezvous.Assignment) ([]workerSpec, error) {
	base := s.cfg.LogDir
	if base == "" {
		base = s.scratch
	}
	attempt := attemptPrefix + strconv.Itoa(a.Round)
	attemptDir := filepath.Join(base, attempt)
	resume := []string(nil)
	if a.ResumeFrom != "" && s.cfg.ResumeArg != "" {
		resume = []string{s.cfg.ResumeArg, a.ResumeFrom}
		if strings.HasSuffix(s.cfg.ResumeArg, "=") { // --resume-arg --resume= : one argument
			resume = []string{s.cfg.ResumeArg + a.ResumeFrom}
		}
	}
	if s.torch != nil {
		v := TorchrunValues{NNodes: a.NNodes, NodeRank: a.NodeRank, MasterAddr: a.MasterAddr, MasterPort: a.MasterPort, NProcPerNode: s.cfg.NProcPerNode}
		if err := s.torch.CheckRound(v); err != nil {
			return nil, err
		}
		node := "node_" + strconv.Itoa(a.NodeRank)
		dir := filepath.Join(attemptDir, node)
		errFile := filepath.Join(dir, errorFileName)
		return []workerSpec{{
			localRank: -1, rank: -1,
			argv:   append(s.torch.Command(v), resume...),
			env:    TorchrunEnv(s.cfg.Env, a, errFile),
			prefix: "[node" + strconv.Itoa(a.NodeRank) + "]: ",
			base:   base, rel: []string{attempt, node},
			dir: dir, errorFile: errFile, logFiles: s.cfg.LogDir != "", place: s.placement(), user: s.cfg.User,
		}}, nil
	}
	specs := make([]workerSpec, 0, a.LocalWorldSize)
	// A hung gang's stacks (collectStacks) need faulthandler, unless the user chose.
	_, userSet := newEnvMap(s.cfg.Env.Base, s.cfg.Env.Extra)["PYTHONFAULTHANDLER"]
	faulthandler := !userSet && (s.cfg.HangTimeout > 0 || s.timer != nil)
	for lr := 0; lr < a.LocalWorldSize; lr++ {
		rank := a.RankOffset + lr
		rankDir := "rank_" + strconv.Itoa(rank)
		dir := filepath.Join(attemptDir, rankDir)
		errFile := filepath.Join(dir, errorFileName)
		argv := append(append([]string{}, s.cfg.Command...), resume...)
		if s.cfg.LocalRankArg {
			argv = append(argv, "--local_rank="+strconv.Itoa(lr))
		}
		env := append(WorkerEnv(s.cfg.Env, a, lr, errFile), HeartbeatEnv+"="+filepath.Join(dir, heartbeatName))
		if s.timer != nil {
			env = append(env, FileTimerFileEnv+"="+s.timer.path)
		}
		if faulthandler {
			env = append(env, "PYTHONFAULTHANDLER=1")
		}
		var cpus []int
		var mem proc.MemPolicy
		if lr < len(s.cfg.Env.Ranks) {
			rp := s.cfg.Env.Ranks[lr]
			cpus, mem = rp.CPUs, proc.MemPolicy{Nodes: rp.Mems, Strict: rp.MemBind == topology.MemBindStrict}
		}
		spec := workerSpec{
			localRank: lr, rank: rank, argv: argv, cpus: cpus, mem: mem, place: s.placement(), user: s.cfg.User,
			env:    env,
			prefix: rankPrefix(rank), base: base, rel: []string{attempt, rankDir},
			dir: dir, errorFile: errFile, logFiles: s.cfg.LogDir != "",
		}
		if st := s.cfg.Streams; st != nil {
			file, console := st.route(lr)
			spec.logFiles = s.cfg.LogDir != "" && (file[0] || file[1])
			for i := range 2 {
				spec.noFile[i], spec.noConsole[i] = !file[i], !console[i]
			}
			if p := st.prefix(cmp.Or(s.cfg.Env.Role, RoleName), lr, rank); p != "" {
				spec.prefix = p
			}
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// readErrorFile is ReadErrorFile with the permissions of the user the workers run as:
// the file is theirs to write, and a link they put there must not let gangrun read for
// them what they could not.
func (s *Supervisor) readErrorFile(path string) (r ErrorReport, ok bool) {
	_ = proc.AsUser(s.cfg.User, func() error {
		r, ok = ReadErrorFile(path)
		return nil
	})
	return r, ok
}

// failureOf describes a failed worker as the root cause.
func (s *Supervisor) failureOf(a rendezvous.Assignment, w *worker) *rendezvous.Failure {
	f := &rendezvous.Failure{
		Node: s.cfg.NodeName, Rank: w.spec.rank, LocalRank: w.spec.localRank,
		ExitCode: w.status.ShellCode(), Kind: failure.Exit, Reason: w.status.String(),
	}
	if w.status.Signal != 0 {
		f.Kind = failure.Signal // the OOM killer's SIGKILL too: its Reason says so
	}
	if r, ok := s.readErrorFile(w.spec.errorFile); ok {
		f.Message = r.FirstLine()
	}
	if w.status.Signal == syscall.SIGKILL && s.cg != nil && s.cg.OOMKills() > s.oomBase {
		f.Reason = s.oomReason(w.status)
	}
	if s.cg != nil {
		if n := s.cg.PidsRefused(); n > s.pidsBase {
			// A fork bomb, or a worker that starts more threads than --pids-limit: the
			// exit status alone does not say that the limit refused them.
			f.Reason += fmt.Sprintf(" (the step's --pids-limit %d refused %d forks or threads in this attempt)", s.cfg.Confine.Limits.PidsLimit, n-s.pidsBase)
		}
	}
	return f
}

// oomReason is the root cause of a worker the kernel's OOM killer killed in the
// step's cgroup.
func (s *Supervisor) oomReason(st proc.ExitStatus) string {
	limit := "no --mem: a parent cgroup's limit or the node's"
	if m := s.cfg.Confine.Limits.MemoryBytes; m > 0 {
		limit = "--mem " + cgroup.FormatMem(m)
	}
	return fmt.Sprintf("out of memory in its cgroup (%s): the kernel's OOM killer sent %s", limit, st)
}

// report prints the root cause of a failed attempt: one log line, and a block with
// the worker's error message and traceback when it wrote an error file.
func (s *Supervisor) report(a rendezvous.Assignment, f *rendezvous.Failure) {
	fields := []zap.Field{zap.Int("attempt", a.Round), zap.String("node", f.Node), zap.String("reason", f.Reason), zap.Int("exit_code", f.ExitCode)}
	if f.Rank >= 0 {
		fields = append(fields, zap.Int("rank", f.Rank), zap.Int("local_rank", f.LocalRank))
	}
	var errFile string
	if f.Rank >= 0 {
		errFile = filepath.Join(s.attemptBase(a), "rank_"+strconv.Itoa(f.Rank), errorFileName)
	} else if s.torch != nil {
		errFile = filepath.Join(s.attemptBase(a), "node_"+strconv.Itoa(a.NodeRank), errorFileName)
	}
	r, hasReport := s.readErrorFile(errFile)
	if hasReport {
		fields = append(fields, zap.String("message", r.FirstLine()))
		if s.cfg.LogDir != "" {
			fields = append(fields, zap.String("error_file", errFile))
		}
	}
	s.log.Error("worker failed: root cause", fields...)
	if s.cfg.Report == nil {
		return
	}
	var b strings.Builder
	b.WriteString("=== gangrun: root cause of attempt " + strconv.Itoa(a.Round) + " ===\n")
	who := "node " + f.Node
	if f.Rank >= 0 {
		who = fmt.Sprintf("rank %d (local rank %d) on node %s", f.Rank, f.LocalRank, f.Node)
	}
	fmt.Fprintf(&b, "  worker:  %s\n  status:  %s\n", who, f.Reason)
	if hasReport {
		fmt.Fprintf(&b, "  error:   %s\n", r.Message)
		if !r.Time.IsZero() {
			fmt.Fprintf(&b, "  time:    %s\n", r.Time.UTC().Format(time.RFC3339))
		}
		if r.Traceback != "" {
			b.WriteString("  traceback:\n")
			for _, line := range strings.Split(r.Traceback, "\n") {
				b.WriteString("    " + line + "\n")
			}
		}
	} else if f.Rank >= 0 {
		b.WriteString("  (no error file: the worker did not use torch's @record; see its output above)\n")
	}
	io.WriteString(s.cfg.Report, b.String())
}

func (s *Supervisor) attemptBase(a rendezvous.Assignment) string {
	base := s.cfg.LogDir
	if base == "" {
		base = s.scratch
	}
	return filepath.Join(base, "attempt_"+strconv.Itoa(a.Round))
}

// chooseResume picks the checkpoint the gang resumes from: the newest complete one under
// CheckpointDir, skipping those excluded after repeated failures.
func (s *Supervisor) chooseResume(_ context.Context) (string, error) {
	if s.cfg.CheckpointDir == "" {
		return "", nil
	}
	if _, err := os.Stat(s.cfg.CheckpointDir); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	c, err := s.latestCheckpoint()
	if errors.Is(err, checkpoint.ErrNoComplete) {
		s.log.Info("no complete checkpoint yet: starting from the beginning", zap.String("checkpoint_dir", s.cfg.CheckpointDir))
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return c.Path, nil
}

// newestCheckpoint returns the newest complete checkpoint under CheckpointDir not
// excluded, "" when there is none (or no CheckpointDir, or it cannot be read).
func (s *Supervisor) newestCheckpoint() string {
	if s.cfg.CheckpointDir == "" {
		return ""
	}
	latest, err := s.latestCheckpoint()
	if err != nil {
		return ""
	}
	return latest.Path
}

// latestCheckpoint is checkpoint.Latest of CheckpointDir, skipping the excluded, read
// with the permissions of the user the workers run as (Config.User): the directory is
// the user's to name, and gangrun reads (and, for pins and fences, writes) there only
// what the user could.
func (s *Supervisor) latestCheckpoint() (c checkpoint.Checkpoint, err error) {
	err = proc.AsUser(s.cfg.User, func() error {
		c, err = checkpoint.Latest(s.cfg.CheckpointDir, checkpoint.Options{Exclude: s.excluded})
		return err
	})
	return c, err
}

// progressed reports whether the failed attempt at made progress: it ran HealthyStretch,
// or newest (newestCheckpoint's answer) is a complete checkpoint other than the one it
// resumed from.
func (s *Supervisor) progressed(at *attempt, newest string) bool {
	if !at.started.IsZero() && time.Since(at.started) >= HealthyStretch {
		return true
	}
	return newest != "" && newest != at.a.ResumeFrom
}

// strike records that an attempt resumed from path failed, newest being
// newestCheckpoint's answer after it. When it failed before a newer complete checkpoint
// appeared StrikesBeforeFallback times in a row, path is skipped from then on: a
// checkpoint that crashes every load must not burn the whole restart budget.
func (s *Supervisor) strike(path, newest string) {
	if path == "" || s.cfg.CheckpointDir == "" {
		return
	}
	if newest != "" && newest != path {
		// The attempt got past path and wrote a newer checkpoint: not path's fault.
		delete(s.strikes, path)
		return
	}
	s.strikes[path]++
	if s.strikes[path] >= StrikesBeforeFallback {
		s.excluded = append(s.excluded, path)
		s.log.Warn("attempts failed repeatedly before writing a newer checkpoint: falling back to an earlier one",
			zap.String("skipped", path), zap.Int("failures", s.strikes[path]))
	}
}

// pin keeps the checkpoint the job resumes from out of `gangrun ckpt prune`'s reach,
// releasing the previous pin; "" releases all.
func (s *Supervisor) pin(path string) {
	if path == s.pinned {
		return
	}
	if s.unpin != nil {
		if err := proc.AsUser(s.cfg.User, s.unpin); err != nil {
			s.log.Warn("unpin checkpoint", zap.String("path", s.pinned), zap.Error(err))
		}
		s.unpin, s.pinned = nil, ""
	}
	if path == "" || s.cfg.CheckpointDir == "" {
		return
	}
	var release func() error
	err := proc.AsUser(s.cfg.User, func() (err error) {
		release, err = checkpoint.Pin(s.cfg.CheckpointDir, path, s.cfg.JobID+"/"+s.cfg.NodeName)
		return err
	})
	if err != nil {
		s.log.Warn("pin checkpoint", zap.String("path", path), zap.Error(err))
		return
	}
	s.unpin, s.pinned = release, path
}

// fence records in the checkpoint directory that attempt a.Round of the job is the one
// entitled to write there (checkpoint.Fence), before its workers start.
func (s *Supervisor) fence(a rendezvous.Assignment) {
	if s.cfg.CheckpointDir == "" {
		return
	}
	f := checkpoint.Fence{Job: s.cfg.JobID, Attempt: a.Round, Node: s.cfg.NodeName}
	if err := proc.AsUser(s.cfg.User, func() error { return checkpoint.WriteFence(s.cfg.CheckpointDir, f) }); err != nil {
		s.log.Warn("write the checkpoint directory's fence", zap.Error(err))
	}
}

// safeName keeps the characters of s that are safe in a file name.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}

// beneath reports whether path lies inside dir (lexically, both made absolute and
// cleaned); false when dir is "".
func beneath(dir, path string) bool {
	if dir == "" {
		return false
	}
	d, err1 := filepath.Abs(dir)
	p, err2 := filepath.Abs(path)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// startAttempt starts the workers of specs for attempt at: it notes the start (the
// attempt's time, the cgroup's OOM kills and refused forks so far, the watchdog's and
// the output's clocks) and starts them from the standbys when there are any
// (Config.WarmRestarts), else cold.
func (s *Supervisor) startAttempt(at *attempt, specs []workerSpec) (*group, error) {
	at.started = time.Now()
	s.started = at.started
	if s.cg != nil {
		s.oomBase, s.pidsBase = s.cg.OOMKills(), s.cg.PidsRefused()
	}
	if s.timer != nil {
		s.timer.reset()
	}
	s.act.touch()
	var warm warmStart
	s.masterChecked = false
	if s.nextSpecs != nil && len(s.standbys) == 0 {
		s.log.Info("starting cold: the last attempt ended within --warm-delay, before its standbys were started",
			zap.Duration("warm_delay", s.cfg.WarmDelay))
	} else if len(s.standbys) > 0 {
		warm = s.takeStandby
	}
	s.nextSpecs = nil
	return startGroup(specs, s.console, s.consoleErr, &s.act, s.guard, warm)
}

// afterStart follows the start of attempt a's workers g: it says once that the kernel
// refused a worker's memory binding and, with warm restarts, readies the standbys of
// the attempt after (those the warm workers forked, and fresh ones for the other ranks
// of specs, at once or WarmDelay later).
func (s *Supervisor) afterStart(a rendezvous.Assignment, g *group, specs []workerSpec) {
	for _, w := range g.workers {
		if w.memRefused && !s.memRefusedTold {
			s.memRefusedTold = true
			s.log.Info("no memory binding: the kernel refused the NUMA node of the workers' GPUs (a node this machine lacks, or one outside gangrun's cpuset)",
				zap.Int("rank", w.spec.rank), zap.Ints("numa_nodes", w.spec.mem.Nodes))
		}
	}
	if s.warmDir == "" {
		return
	}
	s.log.Info("workers started", zap.Int("attempt", a.Round), zap.Int("warm", g.warm), zap.Int("cold", len(g.workers)-g.warm))
	// The standbys not used are dropped; those the warm workers forked serve the
	// attempt after, and only the ranks without one get a fresh standby.
	s.adoptForked()
	forked := s.forked
	s.forked = nil
	s.dropStandbys()
	s.standbys = forked
	if s.cfg.WarmDelay <= 0 {
		s.prepareStandbys(specs)
	} else if !s.standbysFor(specs) {
		s.nextSpecs = specs // monitor starts them when they are due
	}
}
