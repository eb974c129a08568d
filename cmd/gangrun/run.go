package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
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
	cpuBind       string
	memBind       string
	ncclTopo      string
	cgroup        string
	mem           int64
	pidsLimit     int64
	termTimeout   time.Duration
	logFormat     string
	nprocGiven    bool // --nproc-per-node was on the command line
	nnodesGiven   bool // --nnodes was on the command line
}

func (g *gangFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.nnodes, "nnodes", "1", "number of nodes, N or MIN:MAX")
	fs.StringVar(&g.nproc, "nproc-per-node", "auto", "workers per node: N, auto (the GPUs seen, narrowed by CUDA_VISIBLE_DEVICES; else 1), gpu or cpu")
	fs.StringVar(&g.coordinator, "coordinator", "", "embedded (default), consul://HOST:PORT, or slurm (default under srun)")
	fs.StringVar(&g.jobID, "job-id", "", "job id (default: generated; required with consul)")
	fs.StringVar(&g.nodeName, "node-name", "", "this node's name (default: hostname)")
	fs.StringVar(&g.advertiseAddr, "advertise-addr", "", "address the other nodes use for this one")
	fs.IntVar(&g.masterPort, "master-port", 0, "MASTER_PORT; 0 picks a free port for every attempt")
	fs.StringVar(&g.topologyFile, "topology-file", "", "use a recorded inventory instead of probing: gangrun topo --json, or nvidia-smi topo -m and/or -q -x output")
	fs.StringArrayVar(&g.env, "env", nil, "extra worker environment KEY=VAL (repeatable)")
	fs.StringVar(&g.cpuBind, "cpu-bind", "numa", "bind each worker to its GPU's NUMA node CPUs, shared fairly (numa), or not at all (none)")
	fs.StringVar(&g.memBind, "mem-bind", "local", "a bound worker's memory: from its GPU's NUMA node, preferred (local) or only (strict), or no policy (none)")
	fs.StringVar(&g.ncclTopo, "nccl-topo", "auto", "set NCCL_TOPO_FILE from the probed topology: auto (when the PCIe tree is flat, as in a VM), always or never")
	fs.StringVar(&g.cgroup, "cgroup", "auto", "confine the step to a cgroup of its own (cpuset, --mem, --pids-limit, GPU devices): auto (when the node allows it), required or off")
	memVar(fs, &g.mem, "the step's memory limit on this node, Slurm's --mem syntax: 4G, 500M, 1024 (megabytes); 0 is none")
	fs.Int64Var(&g.pidsLimit, "pids-limit", cgroup.DefaultPidsLimit, "most processes and threads the step may have on this node at once (its cgroup's pids.max); 0 is none")
	durationVar(fs, &g.termTimeout, "term-timeout", launcher.DefaultTermTimeout, durationFlag{max: maxGrace},
		"SIGTERM to SIGKILL grace when stopping workers (at most 24h)")
	fs.StringVar(&g.logFormat, "log-format", "text", "gangrun's own log lines: text or json")
}

// trainFlags are `gangrun run`'s flags beyond gangFlags: supervision (as submit's),
// checkpoints, logs.
type trainFlags struct {
	supervision   supervisionFlags
	checkpointDir string
	resumeArg     string
	logDir        string
	tee           bool
	teeStd        string // torchrun's --tee value (0-3, LOCAL_RANK:N,...); "" for gangrun's true/false
	localRankArg  bool
}

func (t *trainFlags) register(fs *pflag.FlagSet) {
	t.supervision.register(fs)
	fs.StringVar(&t.checkpointDir, "checkpoint-dir", "", "where the trainer writes checkpoints; the newest complete one is resumed from")
	fs.StringVar(&t.resumeArg, "resume-arg", "", "on resume, append FLAG PATH to the command")
	fs.StringVar(&t.logDir, "log-dir", "", "write DIR/attempt_K/rank_N/{stdout,stderr}.log")
	t.tee = true
	fs.VarP(&teeFlag{on: &t.tee, std: &t.teeStd}, "tee", "t", "with --log-dir, also show worker output on the console (--tee=false: files only); torchrun's 0-3 or LOCAL_RANK:N,... (streams to a log file and the console)")
	fs.Lookup("tee").NoOptDefVal = "true"
	fs.BoolVar(&t.localRankArg, "local-rank-arg", false, "append --local_rank=N (legacy torch.distributed.launch scripts)")
}

func runRun(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "run", "[FLAGS] -- COMMAND [ARGS...]  |  [FLAGS] SCRIPT [ARGS...] (torchrun's form)")
	fs.SetInterspersed(false) // the command's own flags belong to the command
	fs.SetNormalizeFunc(normalizeFlag)
	var g gangFlags
	var t trainFlags
	var tf torchrunFlags
	g.register(fs)
	t.register(fs)
	tf.register(fs)
	grant := fs.String("grant", "", "run on this node's GPUs of grant ID (gangrun alloc); under alloc, $GANGRUN_GRANT is used")
	args, err := expandArgs(fs, args)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	l, err := tf.apply(e, fs, &g, &t, fs.Args(), fs.ArgsLenAtDash() == 0)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	g.nprocGiven, g.nnodesGiven = fs.Changed("nproc-per-node") || l.torchrunForm, fs.Changed("nnodes")
	if fs.Changed("pids-limit") && g.cgroup == string(cgroup.Off) {
		return usageErr(e, "run", "--pids-limit %d needs the step's cgroup, and --cgroup is off", g.pidsLimit)
	}
	log, err := newLogger(g.logFormat, e.stderr)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	defer log.Sync() //nolint:errcheck // stderr cannot be synced on some systems
	sup, err := t.supervision.supervision()
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	spec := g.spec(e, l.command, log)
	spec.Streams, spec.Role, spec.SignalsToHandle, spec.VirtualLocalRank = l.streams, l.role, l.signals, l.virtualLocalRank
	spec.AutoIsCPUs, spec.LogDirPerRun = l.autoIsCPUs, l.torchrunForm
	spec.Supervision = sup
	spec.CheckpointDir, spec.ResumeArg, spec.LogDir, spec.Tee = t.checkpointDir, t.resumeArg, t.logDir, t.tee
	spec.LocalRankArg = t.localRankArg
	// The gangrun binary (not a test calling dispatch) has no other children than its
	// guardian and workers: it can reap whatever the workers leave behind.
	spec.Subreaper = e.self != ""
	if code := g.underGrant(ctx, e, *grant, &spec); code != exitOK {
		return code
	}
	p, err := launcher.Prepare(ctx, spec)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	defer p.Close()
	code, _ := supervise(ctx, e, "run", p)
	return code
}

// spec is the launcher.Spec the gang flags describe for command; the command's own
// flags (run's training flags, bench's fixed ones) complete it.
func (g *gangFlags) spec(e *env, command []string, log *zap.Logger) launcher.Spec {
	var guardian []string
	if e.self != "" {
		guardian = []string{e.self, guardianCommand}
	}
	return launcher.Spec{
		Command: command, NProcPerNode: g.nproc, NProcGiven: g.nprocGiven, NNodes: g.nnodes, NNodesGiven: g.nnodesGiven,
		Coordinator: g.coordinator, JobID: g.jobID, NodeName: g.nodeName, AdvertiseAddr: g.advertiseAddr,
		MasterPort: g.masterPort, TopologyFile: g.topologyFile, Env: g.env, CPUBind: g.cpuBind, MemBind: g.memBind, NCCLTopo: g.ncclTopo,
		Cgroup: g.cgroup, Mem: g.mem, PidsLimit: g.pidsLimit, Getenv: e.getenv, TermTimeout: g.termTimeout,
		Stdout: e.stdout, Stderr: e.stderr, Report: e.stderr, Log: log, GuardianArgv: guardian, Signals: e.signals,
	}
}

// underGrant narrows spec to this node's devices of a grant of `gangrun alloc`: grant
// id, read from Consul (the --coordinator's when it is consul://, else CONSUL_HTTP_ADDR),
// or, when id is "", the one alloc put in $GANGRUN_GRANT; nothing when neither is set.
// It returns exitOK, or the exit code after saying what is wrong.
func (g *gangFlags) underGrant(ctx context.Context, e *env, id string, spec *launcher.Spec) int {
	var sum allocator.Summary
	switch {
	case id != "":
		addr := ""
		if strings.HasPrefix(g.coordinator, "consul://") {
			a, err := store.ParseConsulURL(g.coordinator)
			if err != nil {
				return usageErr(e, "run", "%v", err)
			}
			addr = a
		}
		s, code := openStore(e, "run", addr)
		if code != exitOK {
			return code
		}
		defer s.Close()
		var err error
		if sum, err = allocator.GrantedSummary(ctx, s, id); err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return failErr(e, "run", err)
			}
			return usageErr(e, "run", "%v", err)
		}
	case e.getenv("GANGRUN_GRANT") != "":
		var err error
		if sum, err = allocator.ParseSummary(e.getenv("GANGRUN_GRANT")); err != nil {
			return usageErr(e, "run", "%v", err)
		}
	default:
		return exitOK
	}
	node := g.nodeName
	if node == "" {
		node, _ = os.Hostname()
	}
	gn, err := sum.Node(node)
	if err != nil {
		return usageErr(e, "run", "%v", err)
	}
	spec.Devices, spec.Grant = gn.Devices, sum.ID
	if !g.nprocGiven {
		spec.NProcPerNode = "auto" // the granted devices
	}
	return exitOK
}

// supervise runs the prepared gang's supervisor with cfg (p.Config, possibly adjusted
// by the command) and returns gangrun's exit code and how the run ended: the
// supervisor's Result, or, when cfg is refused before anything starts, a Result whose
// Err says why.
func supervise(ctx context.Context, e *env, cmd string, p *launcher.Prepared) (int, launcher.Result) {
	sup, err := p.Supervisor()
	if code := commandExitCode(err); code != exitUsage {
		fmt.Fprintf(e.stderr, "gangrun %s: %s\n", cmd, oneLine(err.Error()))
		return code, launcher.Result{ExitCode: code, Err: err}
	}
	if err != nil {
		return usageErr(e, cmd, "%v", err), launcher.Result{ExitCode: exitUsage, Err: err}
	}
	cfg := p.Config
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	for _, note := range p.Inventory.Notes {
		log.Info("topology", zap.String("note", note))
	}
	log.Info("gangrun "+cmd, zap.String("job_id", cfg.JobID), zap.String("node", cfg.NodeName),
		zap.Int("nproc_per_node", cfg.NProcPerNode), zap.Int("max_restarts", cfg.MaxRestarts))
	if !e.startup.handOver() {
		return exitFailure, launcher.Result{ExitCode: exitFailure, Err: ctx.Err()} // stopped by a signal: main says so
	}
	res := sup.Run(ctx)
	if res.Err != nil {
		log.Error(cmd+" failed", zap.Error(res.Err))
		// A Consul that could not be reached is said last, alone, in one line: the
		// address, where it came from, and what to do.
		var ue *store.UnavailableError
		if errors.As(res.Err, &ue) && ue.Unreachable() {
			fmt.Fprintf(e.stderr, "gangrun %s: %s\n", cmd, oneLine(ue.Error()))
		}
	}
	return res.ExitCode, res
}

// commandExitCode is the exit code for an error finding the command to launch: 127
// when it does not exist, 126 when it exists but cannot be executed (POSIX shells'
// codes), exitUsage for any other error.
func commandExitCode(err error) int { return launcher.StartExitCode(err, exitUsage) }

// newLogger returns gangrun's own logger (launcher.NewLogger).
func newLogger(format string, w io.Writer) (*zap.Logger, error) { return launcher.NewLogger(format, w) }

// teeFlag is --tee: gangrun's boolean (with --log-dir, the console too; --tee alone is
// true), or torchrun's value, the streams to copy to a log file and the console (0 to
// 3, or LOCAL_RANK:N pairs: launcher.ParseStd).
type teeFlag struct {
	on  *bool
	std *string
}

// Set takes true or false (gangrun's), or torchrun's value.
func (f *teeFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "true":
		*f.on, *f.std = true, ""
		return nil
	case "false":
		*f.on, *f.std = false, ""
		return nil
	}
	if _, err := launcher.ParseStd(s); err != nil {
		return errors.New("want true or false, or torchrun's 0 (none), 1 (stdout), 2 (stderr), 3 (both) or LOCAL_RANK:N pairs such as 0:1,1:2")
	}
	*f.std = s
	return nil
}

// String returns the value as given.
func (f *teeFlag) String() string {
	if f.std != nil && *f.std != "" {
		return *f.std
	}
	if f.on != nil {
		return strconv.FormatBool(*f.on)
	}
	return "true"
}

// Type names the value in --help.
func (f *teeFlag) Type() string { return "tee" }
