package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/rendezvous"
)

// runFlags are `gangrun run`'s flags (DESIGN.md, the command line).
type runFlags struct {
	nnodes        string
	nproc         string
	coordinator   string
	jobID         string
	nodeName      string
	advertiseAddr string
	masterPort    int
	maxRestarts   int
	backoff       string
	checkpointDir string
	resumeArg     string
	logDir        string
	tee           bool
	termTimeout   time.Duration
	hangTimeout   time.Duration
	localRankArg  bool
	topologyFile  string
	env           []string
	logFormat     string
	nprocGiven    bool // --nproc-per-node was on the command line
}

func runRun(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "run", "[FLAGS] -- COMMAND [ARGS...]")
	fs.SetInterspersed(false) // the command's own flags belong to the command
	var f runFlags
	fs.StringVar(&f.nnodes, "nnodes", "1", "number of nodes, N or MIN:MAX")
	fs.StringVar(&f.nproc, "nproc-per-node", "auto", "workers per node: N, auto (GPUs seen, else 1), gpu or cpu")
	fs.StringVar(&f.coordinator, "coordinator", "", "embedded (default), consul://HOST:PORT, or slurm (default under srun)")
	fs.StringVar(&f.jobID, "job-id", "", "job id (default: generated; required with consul)")
	fs.StringVar(&f.nodeName, "node-name", "", "this node's name (default: hostname)")
	fs.StringVar(&f.advertiseAddr, "advertise-addr", "", "address the other nodes use for this one")
	fs.IntVar(&f.masterPort, "master-port", 0, "MASTER_PORT; 0 picks a free port for every attempt")
	fs.IntVar(&f.maxRestarts, "max-restarts", launcher.DefaultMaxRestarts, "restarts of the gang after failures")
	fs.StringVar(&f.backoff, "restart-backoff", "exp", "wait before each restart: exp (1s doubling to 30s) or a duration (0s: none)")
	fs.StringVar(&f.checkpointDir, "checkpoint-dir", "", "where the trainer writes checkpoints; the newest complete one is resumed from")
	fs.StringVar(&f.resumeArg, "resume-arg", "", "on resume, append FLAG PATH to the command")
	fs.StringVar(&f.logDir, "log-dir", "", "write DIR/attempt_K/rank_N/{stdout,stderr}.log")
	fs.BoolVar(&f.tee, "tee", true, "with --log-dir, also show worker output on the console (--tee=false: files only)")
	fs.DurationVar(&f.termTimeout, "term-timeout", launcher.DefaultTermTimeout, "SIGTERM to SIGKILL grace when stopping workers")
	fs.DurationVar(&f.hangTimeout, "hang-timeout", 0, "no output from any rank for this long is a failure; 0 is off")
	fs.BoolVar(&f.localRankArg, "local-rank-arg", false, "append --local_rank=N (legacy torch.distributed.launch scripts)")
	fs.StringVar(&f.topologyFile, "topology-file", "", "use a recorded inventory (gangrun topo --json) instead of probing")
	fs.StringArrayVar(&f.env, "env", nil, "extra worker environment KEY=VAL (repeatable)")
	fs.StringVar(&f.logFormat, "log-format", "text", "gangrun's own log lines: text or json")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	f.nprocGiven = fs.Changed("nproc-per-node")
	command := fs.Args()
	if len(command) == 0 {
		return usageErr(e, "run", "no command to run: give it after --, as in gangrun run -- python train.py")
	}
	log, err := newLogger(f.logFormat, e.stderr)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	defer log.Sync() //nolint:errcheck // stderr cannot be synced on some systems

	cfg, code := f.config(e, command, log)
	if code != exitOK {
		return code
	}
	var rdzv rendezvous.Rendezvous = rendezvous.NewLocal(cfg.JobID)
	sup, err := launcher.New(cfg, rdzv)
	if errors.Is(err, launcher.ErrCommandNotFound) {
		fmt.Fprintf(e.stderr, "gangrun run: %s\n", oneLine(err.Error()))
		return exitNotFound
	}
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	log.Info("gangrun run", zap.String("job_id", cfg.JobID), zap.String("node", cfg.NodeName),
		zap.Int("nproc_per_node", cfg.NProcPerNode), zap.Int("max_restarts", cfg.MaxRestarts))
	res := sup.Run(ctx)
	if res.Err != nil {
		log.Error("run failed", zap.Error(res.Err))
	}
	return res.ExitCode
}

// config turns the flags into a launcher.Config, or a usage error's exit code.
func (f *runFlags) config(e *env, command []string, log *zap.Logger) (launcher.Config, int) {
	fail := func(format string, a ...any) (launcher.Config, int) {
		return launcher.Config{}, usageErr(e, "run", format, a...)
	}
	nmin, nmax, err := launcher.ParseNNodes(f.nnodes)
	if err != nil {
		return fail("%v", err)
	}
	if nmax > 1 && f.coordinator == "" {
		return fail("--nnodes %s needs a coordinator shared by the nodes: --coordinator consul://HOST:PORT or slurm", f.nnodes)
	}
	if f.coordinator != "" && f.coordinator != "embedded" {
		return fail("--coordinator %q: not supported yet (embedded only)", f.coordinator)
	}
	gpus := 0 // GPUs seen on this node; topology probing plugs in here
	nproc, err := launcher.ResolveNProcPerNode(f.nproc, gpus, runtime.NumCPU())
	if err != nil {
		return fail("%v", err)
	}
	if tr, ok, err := launcher.ParseTorchrun(command); err != nil {
		return fail("%v", err)
	} else if ok {
		// A wrapped torchrun's own --nproc_per_node counts when gangrun's was not given.
		if v, given := tr.NProcPerNode(); given && !f.nprocGiven {
			n, err := launcher.ResolveNProcPerNode(v, gpus, runtime.NumCPU())
			if err != nil {
				return fail("torchrun --nproc_per_node: %v", err)
			}
			nproc = n
		}
	}
	if f.maxRestarts < 0 {
		return fail("--max-restarts %d: must not be negative", f.maxRestarts)
	}
	if f.masterPort < 0 || f.masterPort > 65535 {
		return fail("--master-port %d: want 0..65535", f.masterPort)
	}
	if f.termTimeout < 0 {
		return fail("--term-timeout %s: must not be negative", f.termTimeout)
	}
	if f.hangTimeout < 0 {
		return fail("--hang-timeout %s: must not be negative", f.hangTimeout)
	}
	backoff, err := launcher.ParseBackoff(f.backoff)
	if err != nil {
		return fail("%v", err)
	}
	for _, kv := range f.env {
		if _, err := launcher.ParseEnvFlag(kv); err != nil {
			return fail("%v", err)
		}
	}
	node := f.nodeName
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fail("--node-name not given and the hostname is unknown: %v", err)
		}
		node = h
	}
	jobID := f.jobID
	if jobID == "" {
		jobID = newJobID()
	}
	var guardian []string
	if exe, err := os.Executable(); err == nil {
		guardian = []string{exe, guardianCommand}
	}
	return launcher.Config{
		Command: command, NProcPerNode: nproc, NNodesMin: nmin, NNodesMax: nmax,
		MaxRestarts: f.maxRestarts, Backoff: backoff,
		CheckpointDir: f.checkpointDir, ResumeArg: f.resumeArg,
		LogDir: f.logDir, Tee: f.tee, TermTimeout: f.termTimeout, HangTimeout: f.hangTimeout,
		LocalRankArg: f.localRankArg, MasterPort: f.masterPort, JobID: jobID,
		NodeName: node, Addr: f.advertiseAddr,
		Env:    launcher.EnvConfig{Base: os.Environ(), Extra: f.env},
		Stdout: e.stdout, Stderr: e.stderr, Log: log, Report: e.stderr,
		GuardianArgv: guardian, Signals: e.signals,
	}, exitOK
}

// newJobID returns a fresh job id such as "gr-3f9a1c0b7d2e".
func newJobID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "gr-" + hex.EncodeToString(b[:])
}

// newLogger returns gangrun's own logger: zap's console encoder ("text") or JSON.
func newLogger(format string, w io.Writer) (*zap.Logger, error) {
	ec := zapcore.EncoderConfig{
		TimeKey: "ts", LevelKey: "level", NameKey: "logger", MessageKey: "msg",
		LineEnding: zapcore.DefaultLineEnding, EncodeLevel: zapcore.CapitalLevelEncoder,
		EncodeTime: zapcore.ISO8601TimeEncoder, EncodeDuration: zapcore.StringDurationEncoder,
		EncodeName: zapcore.FullNameEncoder,
	}
	var enc zapcore.Encoder
	switch format {
	case "text":
		enc = zapcore.NewConsoleEncoder(ec)
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), zapcore.InfoLevel)
	return zap.New(core).Named("gangrun"), nil
}
