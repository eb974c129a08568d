package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/rendezvous"
	"github.com/gangrun/gangrun/topology"
)

// gangFlags are the flags of every command that launches a gang (`run`, `bench nccl`):
// where the gang's nodes meet and what each node runs.
type gangFlags struct {
	nnodes        string
	nproc         string
	coordinator   string
	jobID         string
	nodeName      string
	advertiseAddr string
	masterPort    int
	topologyFile  string
	env           []string
	termTimeout   time.Duration
	logFormat     string
	nprocGiven    bool // --nproc-per-node was on the command line
	nnodesGiven   bool // --nnodes was on the command line
}

func (g *gangFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.nnodes, "nnodes", "1", "number of nodes, N or MIN:MAX")
	fs.StringVar(&g.nproc, "nproc-per-node", "auto", "workers per node: N, auto (GPUs seen, else 1), gpu or cpu")
	fs.StringVar(&g.coordinator, "coordinator", "", "embedded (default), consul://HOST:PORT, or slurm (default under srun)")
	fs.StringVar(&g.jobID, "job-id", "", "job id (default: generated; required with consul)")
	fs.StringVar(&g.nodeName, "node-name", "", "this node's name (default: hostname)")
	fs.StringVar(&g.advertiseAddr, "advertise-addr", "", "address the other nodes use for this one")
	fs.IntVar(&g.masterPort, "master-port", 0, "MASTER_PORT; 0 picks a free port for every attempt")
	fs.StringVar(&g.topologyFile, "topology-file", "", "use a recorded inventory (gangrun topo --json) instead of probing")
	fs.StringArrayVar(&g.env, "env", nil, "extra worker environment KEY=VAL (repeatable)")
	durationVar(fs, &g.termTimeout, "term-timeout", launcher.DefaultTermTimeout, durationFlag{max: maxGrace},
		"SIGTERM to SIGKILL grace when stopping workers (at most 24h)")
	fs.StringVar(&g.logFormat, "log-format", "text", "gangrun's own log lines: text or json")
}

// trainFlags are `gangrun run`'s flags beyond gangFlags: restarts, checkpoints, logs.
type trainFlags struct {
	maxRestarts   int
	backoff       string
	checkpointDir string
	resumeArg     string
	logDir        string
	tee           bool
	hangTimeout   time.Duration
	localRankArg  bool
}

func (t *trainFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&t.maxRestarts, "max-restarts", launcher.DefaultMaxRestarts, "restarts of the gang after failures")
	fs.StringVar(&t.backoff, "restart-backoff", "exp", "wait before each restart: exp (1s doubling to 30s) or a duration (0s: none)")
	fs.StringVar(&t.checkpointDir, "checkpoint-dir", "", "where the trainer writes checkpoints; the newest complete one is resumed from")
	fs.StringVar(&t.resumeArg, "resume-arg", "", "on resume, append FLAG PATH to the command")
	fs.StringVar(&t.logDir, "log-dir", "", "write DIR/attempt_K/rank_N/{stdout,stderr}.log")
	fs.BoolVar(&t.tee, "tee", true, "with --log-dir, also show worker output on the console (--tee=false: files only)")
	durationVar(fs, &t.hangTimeout, "hang-timeout", 0, durationFlag{min: minHangTimeout, max: maxWait, zeroOK: true,
		minWhy: "it is checked every 100ms to 5s, so a shorter one cannot be honoured"},
		"no output from any rank for this long is a failure; 0 is off (else 1s to 10000h)")
	fs.BoolVar(&t.localRankArg, "local-rank-arg", false, "append --local_rank=N (legacy torch.distributed.launch scripts)")
}

func runRun(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "run", "[FLAGS] -- COMMAND [ARGS...]")
	fs.SetInterspersed(false) // the command's own flags belong to the command
	var g gangFlags
	var t trainFlags
	g.register(fs)
	t.register(fs)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	g.nprocGiven, g.nnodesGiven = fs.Changed("nproc-per-node"), fs.Changed("nnodes")
	command := fs.Args()
	if len(command) == 0 {
		return usageErr(e, "run", "no command to run: give it after --, as in gangrun run -- python train.py")
	}
	if t.maxRestarts < 0 || t.maxRestarts > launcher.MaxRestartsLimit {
		return usageErr(e, "run", "--max-restarts %d: want 0 to %d", t.maxRestarts, launcher.MaxRestartsLimit)
	}
	if t.hangTimeout < 0 {
		return usageErr(e, "run", "--hang-timeout %s: must not be negative", t.hangTimeout)
	}
	if t.resumeArg != "" && t.checkpointDir == "" {
		return usageErr(e, "run", "--resume-arg %s needs --checkpoint-dir (where gangrun finds the checkpoint to resume from)", t.resumeArg)
	}
	backoff, err := launcher.ParseBackoff(t.backoff)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	log, err := newLogger(g.logFormat, e.stderr)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	defer log.Sync() //nolint:errcheck // stderr cannot be synced on some systems

	gang, code := g.gang(ctx, e, "run", command, t.maxRestarts, log)
	if code != exitOK {
		return code
	}
	cfg := gang.config
	cfg.MaxRestarts, cfg.Backoff = t.maxRestarts, backoff
	cfg.CheckpointDir, cfg.ResumeArg = t.checkpointDir, t.resumeArg
	cfg.LogDir, cfg.Tee, cfg.HangTimeout, cfg.LocalRankArg = t.logDir, t.tee, t.hangTimeout, t.localRankArg
	// One node alone in its log directory: a rerun into it is refused before anything
	// starts. The nodes of a job (Consul, Slurm) share one, each adding its ranks.
	cfg.FreshLogDir = gang.coordinator == "embedded"
	// The gangrun binary (not a test calling dispatch) has no other children than its
	// guardian and workers: it can reap whatever the workers leave behind.
	cfg.Subreaper = e.self != ""
	return superviseGang(ctx, e, "run", cfg, gang, log)
}

// superviseGang validates cfg (g's configuration completed by the command), runs the
// supervisor in g's rendezvous and returns gangrun's exit code.
func superviseGang(ctx context.Context, e *env, cmd string, cfg launcher.Config, g gang, log *zap.Logger) int {
	code, _ := supervise(ctx, e, cmd, cfg, g, log)
	return code
}

// supervise is superviseGang returning also how the run ended: the supervisor's
// Result, or, when cfg is refused before anything starts, a Result whose Err says why.
func supervise(ctx context.Context, e *env, cmd string, cfg launcher.Config, g gang, log *zap.Logger) (int, launcher.Result) {
	sup, err := launcher.New(cfg, g.rdzv)
	if code := commandExitCode(err); code != exitUsage {
		fmt.Fprintf(e.stderr, "gangrun %s: %s\n", cmd, oneLine(err.Error()))
		return code, launcher.Result{ExitCode: code, Err: err}
	}
	if err != nil {
		return usageErr(e, cmd, "%v", err), launcher.Result{ExitCode: exitUsage, Err: err}
	}
	for _, note := range g.inventory.Notes {
		log.Info("topology", zap.String("note", note))
	}
	log.Info("gangrun "+cmd, zap.String("job_id", cfg.JobID), zap.String("node", cfg.NodeName),
		zap.Int("nproc_per_node", cfg.NProcPerNode), zap.Int("max_restarts", cfg.MaxRestarts))
	if g.close != nil {
		defer g.close()
	}
	if !e.startup.handOver() {
		return exitFailure, launcher.Result{ExitCode: exitFailure, Err: ctx.Err()} // stopped by a signal: main says so
	}
	res := sup.Run(ctx)
	if res.Err != nil {
		log.Error(cmd+" failed", zap.Error(res.Err))
	}
	return res.ExitCode, res
}

// commandExitCode is the exit code for an error finding the command to launch: 127
// when it does not exist, 126 when it exists but cannot be executed (POSIX shells'
// codes), exitUsage for any other error.
func commandExitCode(err error) int {
	switch {
	case errors.Is(err, launcher.ErrCommandNotFound):
		return exitNotFound
	case errors.Is(err, launcher.ErrNotExecutable):
		return exitNotExec
	}
	return exitUsage
}

// gang is what gangFlags resolve to: a launcher configuration without the training
// options, and the rendezvous the node joins.
type gang struct {
	config    launcher.Config
	rdzv      rendezvous.Rendezvous
	inventory *topology.Inventory
	// coordinator is "embedded", "slurm" or the consul:// URL.
	coordinator string
	// close leaves the rendezvous (a Consul session); nil when there is nothing to close.
	close func()
}

// gang resolves the flags for command, or returns a usage error's exit code.
// maxRestarts is the run's restart budget (the Consul rendezvous finishes a job that
// runs out of it).
func (g *gangFlags) gang(ctx context.Context, e *env, cmd string, command []string, maxRestarts int, log *zap.Logger) (gang, int) {
	fail := func(format string, a ...any) (gang, int) {
		return gang{}, usageErr(e, cmd, format, a...)
	}
	nmin, nmax, err := launcher.ParseNNodes(g.nnodes)
	if err != nil {
		return fail("%v", err)
	}
	coordinator := g.coordinator
	if coordinator == "" && rendezvous.InSlurmStep(e.getenv) {
		coordinator = "slurm"
	}
	var slurm rendezvous.SlurmEnv
	switch {
	case coordinator == "" || coordinator == "embedded":
		if nmax > 1 {
			return fail("--nnodes %s needs a coordinator shared by the nodes: --coordinator consul://HOST:PORT or slurm", g.nnodes)
		}
		coordinator = "embedded"
	case coordinator == "slurm":
		if slurm, err = rendezvous.ReadSlurmEnv(e.getenv); err != nil {
			return fail("%v", err)
		}
		if len(slurm.TasksPerNode) > slurm.NodeID && slurm.TasksPerNode[slurm.NodeID] > 1 {
			return fail("SLURM_TASKS_PER_NODE=%s: run one gangrun per node (srun --ntasks-per-node=1); gangrun starts the workers", e.getenv("SLURM_TASKS_PER_NODE"))
		}
		if g.nnodesGiven && (nmin != len(slurm.Nodes) || nmax != len(slurm.Nodes)) {
			return fail("--nnodes %s conflicts with the Slurm allocation's %d nodes (SLURM_JOB_NODELIST)", g.nnodes, len(slurm.Nodes))
		}
		nmin, nmax = len(slurm.Nodes), len(slurm.Nodes)
		if g.jobID == "" {
			g.jobID = slurm.JobID
		}
		if g.nodeName == "" {
			g.nodeName = slurm.Nodes[slurm.NodeID]
		}
	case strings.HasPrefix(coordinator, "consul://"):
		if g.jobID == "" {
			return fail("--coordinator %s needs --job-id (the nodes of a job meet under it)", coordinator)
		}
		if _, err := store.ParseConsulURL(coordinator); err != nil {
			return fail("%v", err)
		}
	default:
		return fail("--coordinator %q: want embedded, slurm or consul://HOST:PORT", coordinator)
	}
	if g.jobID != "" {
		if err := store.CheckSegment("--job-id", g.jobID); err != nil {
			return fail("%v", err)
		}
	}
	if g.masterPort < 0 || g.masterPort > 65535 {
		return fail("--master-port %d: want 0..65535", g.masterPort)
	}
	if g.termTimeout < 0 {
		return fail("--term-timeout %s: must not be negative", g.termTimeout)
	}
	given := map[string]string{}
	for _, kv := range g.env {
		if _, err := launcher.ParseEnvFlag(kv); err != nil {
			return fail("%v", err)
		}
		name, _, _ := strings.Cut(kv, "=")
		if first, dup := given[name]; dup {
			return fail("--env %s given twice (%q and %q): give each variable once", name, first, kv)
		}
		given[name] = kv
	}
	inv, err := nodeInventory(ctx, g.topologyFile, g.nodeName)
	if err != nil {
		return fail("%v", err)
	}
	devices := inv.Allocatable()
	gpusSeen := len(devices)
	if coordinator == "slurm" && slurm.GPUsOnNode >= 0 && !g.nprocGiven {
		gpusSeen = slurm.GPUsOnNode // what Slurm gave this step (it sets CUDA_VISIBLE_DEVICES)
	}
	nproc, err := launcher.ResolveNProcPerNode(g.nproc, gpusSeen, runtime.NumCPU())
	if err != nil {
		return fail("%v", err)
	}
	if tr, ok, err := launcher.ParseTorchrun(command); err != nil {
		return fail("%v", err)
	} else if ok {
		// A wrapped torchrun's own --nproc_per_node counts when gangrun's was not given.
		if v, given := tr.NProcPerNode(); given && !g.nprocGiven {
			n, err := launcher.ResolveNProcPerNode(v, gpusSeen, runtime.NumCPU())
			if err != nil {
				return fail("torchrun --nproc_per_node: %v", err)
			}
			nproc = n
		}
	}
	node := g.nodeName
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fail("--node-name not given and the hostname is unknown: %v", err)
		}
		node = h
	}
	// The node name is a key segment in Consul and a name the other nodes see; on one
	// node it is still GANGRUN_NODE_NAME and in every log line: the same rule for all.
	if err := store.CheckSegment("--node-name", node); err != nil {
		return fail("%v", err)
	}
	if g.advertiseAddr != "" && net.ParseIP(g.advertiseAddr) == nil {
		return fail("--advertise-addr %q: want an IP address (the other nodes connect to it)", g.advertiseAddr)
	}
	jobID := g.jobID
	if jobID == "" {
		jobID = newJobID()
	}
	var guardian []string
	if e.self != "" {
		guardian = []string{e.self, guardianCommand}
	}
	var nccl []string
	for _, v := range inv.NCCLEnv() {
		nccl = append(nccl, v.String())
	}
	visible := chosenDevices(inv, devices)
	if coordinator == "slurm" {
		visible = nil // Slurm sets CUDA_VISIBLE_DEVICES for the step itself
	}
	if visible != nil {
		for _, kv := range g.env {
			if strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
				return fail("--env %s: gangrun sets CUDA_VISIBLE_DEVICES=%s on this node (the devices it can allocate: MIG instances, or the GPUs not failed); drop it",
					kv, strings.Join(visible, ","))
			}
		}
	}
	cfg := launcher.Config{
		Command: command, NProcPerNode: nproc, NNodesMin: nmin, NNodesMax: nmax,
		TermTimeout: g.termTimeout, MasterPort: g.masterPort, JobID: jobID,
		NodeName: node, Addr: g.advertiseAddr,
		Env:    launcher.EnvConfig{Base: os.Environ(), Extra: g.env, NCCL: nccl, CUDAVisibleDevices: visible},
		Stdout: e.stdout, Stderr: e.stderr, Log: log, Report: e.stderr,
		GuardianArgv: guardian, Signals: e.signals,
	}
	out := gang{config: cfg, inventory: inv, coordinator: coordinator}
	switch {
	case coordinator == "embedded":
		out.rdzv = rendezvous.NewLocal(jobID)
	case coordinator == "slurm":
		out.rdzv = rendezvous.NewStatic(slurm, jobID)
	default:
		addr, _ := store.ParseConsulURL(coordinator)
		s, err := store.NewConsul(addr)
		if err != nil {
			return fail("%v", err)
		}
		if cfg.Addr == "" {
			cfg.Addr = rendezvous.DefaultAddr(addr)
			out.config.Addr = cfg.Addr
		}
		if labels, err := allocator.NodeLabels(ctx, s, node); err == nil {
			out.config.Switch = labels[allocator.LabelSwitch]
		}
		host, _ := os.Hostname()
		rc, err := rendezvous.NewDynamic(s, rendezvous.DynamicConfig{JobID: jobID, MinNodes: nmin, MaxNodes: nmax,
			MaxRestarts: maxRestarts, Host: host, Log: log.Named("rendezvous")})
		if err != nil {
			return fail("%v", err)
		}
		out.rdzv = rc
		out.close = func() { _ = rc.Close(context.Background()); s.Close() }
	}
	return out, exitOK
}

// chosenDevices returns CUDA_VISIBLE_DEVICES when gangrun narrows what the workers see:
// when some GPU is failed or runs MIG, the allocatable devices in local-rank order;
// nil when every GPU is allocatable as a whole (the workers see them all).
func chosenDevices(inv *topology.Inventory, devices []topology.Device) []string {
	whole := true
	for _, d := range devices {
		whole = whole && d.MIGProfile == ""
	}
	if whole && len(devices) == len(inv.GPUs) {
		return nil
	}
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = d.ID
	}
	return ids
}

// nodeInventory reads the recorded inventory file, or probes this machine.
func nodeInventory(ctx context.Context, file, node string) (*topology.Inventory, error) {
	if file != "" {
		inv, err := topology.LoadFile(file)
		if err != nil {
			return nil, topologyFileError(err)
		}
		return inv, nil
	}
	return topology.NewProber(topology.ProbeOptions{Node: node}).Inventory(ctx)
}

// topologyFileError words a topology.LoadFile error after the flag that named the
// file: "--topology-file PATH: is a named pipe (FIFO), want a regular file".
func topologyFileError(err error) error {
	var fe *topology.FileError
	if errors.As(err, &fe) {
		return fmt.Errorf("--topology-file %s: %w", fe.Path, fe.Err)
	}
	return fmt.Errorf("--topology-file: %w", err)
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
