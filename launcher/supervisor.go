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
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
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

	stuck int        // failures in a row without progress (the backoff's k)
	timer *fileTimer // torch's file-based watchdog, when enabled
	// stopSignal is a terminating signal that arrived while an attempt's workers were
	// being stopped for another reason: the run ends after them.
	stopSignal syscall.Signal
	started    time.Time // when the current attempt's workers started

	ckpt ckptState // the checkpoints skipped and pinned (below)
	warm warmState // the standbys of warm restarts (warm.go)

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
	s := &Supervisor{cfg: cfg, rdzv: rdzv, log: cfg.Log, events: event.Or(cfg.Events), ckpt: ckptState{strikes: map[string]int{}}}
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

// attemptBase is the directory of attempt a.Round: under LogDir, else under the scratch
// directory.
func (s *Supervisor) attemptBase(a rendezvous.Assignment) string {
	base := s.cfg.LogDir
	if base == "" {
		base = s.scratch
	}
	return filepath.Join(base, "attempt_"+strconv.Itoa(a.Round))
}

// ckptState is what the Supervisor keeps about the checkpoints it resumes from.
type ckptState struct {
	excluded []string       // checkpoints skipped after StrikesBeforeFallback failures
	strikes  map[string]int // failures in a row per checkpoint resumed from
	unpin    func() error   // releases the pin of pinned; nil when none
	pinned   string         // the checkpoint pinned (pin); "" when none
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
		c, err = checkpoint.Latest(s.cfg.CheckpointDir, checkpoint.Options{Exclude: s.ckpt.excluded})
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
		delete(s.ckpt.strikes, path)
		return
	}
	s.ckpt.strikes[path]++
	if s.ckpt.strikes[path] >= StrikesBeforeFallback {
		s.ckpt.excluded = append(s.ckpt.excluded, path)
		s.log.Warn("attempts failed repeatedly before writing a newer checkpoint: falling back to an earlier one",
			zap.String("skipped", path), zap.Int("failures", s.ckpt.strikes[path]))
	}
}

// pin keeps the checkpoint the job resumes from out of `gangrun ckpt prune`'s reach,
// releasing the previous pin; "" releases all.
func (s *Supervisor) pin(path string) {
	if path == s.ckpt.pinned {
		return
	}
	if s.ckpt.unpin != nil {
		if err := proc.AsUser(s.cfg.User, s.ckpt.unpin); err != nil {
			s.log.Warn("unpin checkpoint", zap.String("path", s.ckpt.pinned), zap.Error(err))
		}
		s.ckpt.unpin, s.ckpt.pinned = nil, ""
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
	s.ckpt.unpin, s.ckpt.pinned = release, path
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
