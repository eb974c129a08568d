package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/rendezvous"
)

// torchrunFlags are the options of torchrun's command line that `gangrun run` takes
// beside its own (torch 2.x, torch/distributed/run.py get_args_parser; --nnodes,
// --nproc-per-node, --max-restarts, --master-port, --log-dir and --tee are gangrun's
// flags already). Every flag of `run` takes both spellings, --nproc-per-node and
// --nproc_per_node, and argparse's unique prefixes (expandArgs).
type torchrunFlags struct {
	standalone                         bool
	rdzvBackend, rdzvEndpoint, rdzvID  string
	rdzvConf                           string
	nodeRank                           int
	masterAddr, localAddr              string
	monitorInterval                    string
	startMethod, eventLogHandler, role string
	module, noPython, runPath          bool
	redirects                          string
	logLinePrefix, localRanksFilter    string
	dupStdout, dupStderr               string
	logsSpecs, numaBinding, signals    string
	printCompletion                    string
	shutdownTimeout                    int
	virtualLocalRank                   bool
	python                             string
}

func (f *torchrunFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.standalone, "standalone", false, "torchrun's: one node with a rendezvous of its own (gangrun's embedded coordinator)")
	fs.StringVar(&f.rdzvBackend, "rdzv-backend", "static", "torchrun's rendezvous backend: static or c10d (with --rdzv-endpoint, the node at HOST serves the others)")
	fs.StringVar(&f.rdzvEndpoint, "rdzv-endpoint", "", "torchrun's rendezvous endpoint, HOST[:PORT] (port 29400 when left out)")
	fs.StringVar(&f.rdzvID, "rdzv-id", "", "torchrun's rendezvous id: the job id (TORCHELASTIC_RUN_ID)")
	fs.StringVar(&f.rdzvConf, "rdzv-conf", "", "torchrun's c10d settings KEY=VALUE,...: is_host, join_timeout, last_call_timeout, close_timeout, read_timeout (seconds), use_libuv")
	fs.IntVar(&f.nodeRank, "node-rank", 0, "torchrun's static rendezvous: this node's rank (0 on one node)")
	fs.StringVar(&f.masterAddr, "master-addr", "127.0.0.1", "torchrun's static rendezvous: node rank 0's address (this machine on one node)")
	fs.StringVar(&f.localAddr, "local-addr", "", "torchrun's: this node's address for the others (gangrun's --advertise-addr; a name is resolved)")
	fs.StringVar(&f.monitorInterval, "monitor-interval", "0.1", "torchrun's worker polling interval in seconds: gangrun sees a worker's exit at once, which no interval exceeds")
	fs.StringVar(&f.startMethod, "start-method", "spawn", "torchrun's: spawn, fork or forkserver; a script's workers are new processes either way (as under torchrun)")
	fs.StringVar(&f.eventLogHandler, "event-log-handler", "null", "torchrun's event log: null, or console (gangrun's own log lines on stderr)")
	fs.StringVar(&f.role, "role", launcher.RoleName, "torchrun's worker role (ROLE_NAME)")
	fs.BoolVarP(&f.module, "module", "m", false, "torchrun's: run the script as a module (python -m)")
	fs.BoolVar(&f.noPython, "no-python", false, "torchrun's: run the script itself, not with python")
	fs.BoolVar(&f.runPath, "run-path", false, "torchrun's: run the script (an absolute path) with runpy.run_path")
	fs.StringVarP(&f.redirects, "redirects", "r", "", "torchrun's: streams to the log files only, 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:N,...")
	fs.StringVar(&f.logLinePrefix, "log-line-prefix-template", "", "torchrun's console prefix of worker lines, with ${role_name}, ${local_rank}, ${rank}, ${hostname}")
	fs.StringVar(&f.localRanksFilter, "local-ranks-filter", "", "torchrun's: show only these local ranks' output on the console (0,1,...)")
	fs.StringVar(&f.dupStdout, "duplicate-stdout-filters", "", "torchrun's: refused (gangrun copies no filtered lines)")
	fs.StringVar(&f.dupStderr, "duplicate-stderr-filters", "", "torchrun's: refused (gangrun copies no filtered lines)")
	fs.StringVar(&f.logsSpecs, "logs-specs", "", "torchrun's LogsSpecs plugin: refused (Python inside torchrun)")
	fs.StringVar(&f.numaBinding, "numa-binding", "", "torchrun's NUMA binding: exclusive (gangrun's --cpu-bind numa)")
	fs.StringVar(&f.signals, "signals-to-handle", launcher.DefaultSignalsToHandle, "torchrun's: the signals that stop the workers, among SIGTERM, SIGINT, SIGHUP, SIGQUIT")
	fs.IntVar(&f.shutdownTimeout, "shutdown-timeout", 0, "torchrun's SIGTERM to SIGKILL grace in seconds (gangrun's --term-timeout)")
	fs.BoolVar(&f.virtualLocalRank, "virtual-local-rank", false, "torchrun's: LOCAL_RANK 0 and CUDA_VISIBLE_DEVICES naming its own device for every worker")
	fs.StringVar(&f.printCompletion, "print-completion", "", "torchrun's shell completion: refused")
	fs.StringVar(&f.python, "python", "", "the interpreter of a script given without -- (default: $PYTHON_EXEC, else the python of the torchrun on PATH, else python, python3)")
}

// torchrunOptions are the destinations of torchrun 2.x's options that read PET_<NAME>
// from the environment when not given (run.py's env and check_env actions), by
// gangrun's flag name. torchrun reads them always; gangrun in its torchrun form.
var torchrunOptions = []string{"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
	"rdzv-conf", "standalone", "max-restarts", "monitor-interval", "start-method", "event-log-handler",
	"role", "module", "no-python", "run-path", "log-dir", "redirects", "tee", "log-line-prefix-template",
	"local-ranks-filter", "duplicate-stdout-filters", "duplicate-stderr-filters", "node-rank",
	"master-addr", "master-port", "local-addr", "signals-to-handle", "shutdown-timeout", "virtual-local-rank"}

// normalizeFlag makes every flag take torchrun's underscore spelling too.
func normalizeFlag(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

// teeValue is a value of torchrun's --tee: 0 to 3, or LOCAL_RANK:N pairs.
var teeValue = regexp.MustCompile(`^([0-3]|[0-9]+:[0-3](,[0-9]+:[0-3])*)$`)

// expandArgs rewrites the flags of run's args (up to --, or the command) as pflag reads
// them, the way torchrun's argparse reads them: a unique prefix of a flag's name is
// that flag (--nproc 2 is --nproc-per-node 2), and --tee and -t take torchrun's value
// as the next word (--tee 3, -t 0:1) while --tee alone stays gangrun's --tee=true. An
// ambiguous prefix is an error naming the flags it could be.
func expandArgs(fs *pflag.FlagSet, args []string) ([]string, error) {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--" || a == "-" || !strings.HasPrefix(a, "-"):
			return append(out, args[i:]...), nil
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			full, err := longFlag(fs, name)
			if err != nil {
				return nil, err
			}
			if full == "" { // unknown: pflag says so
				out = append(out, a)
				continue
			}
			a = "--" + full
			if hasValue {
				a += "=" + value
			}
			f := fs.Lookup(full)
			switch {
			case f == nil: // --help, pflag's own
			case hasValue:
			case full == "tee" && i+1 < len(args) && teeValue.MatchString(args[i+1]):
				a += "=" + args[i+1]
				i++
			case f.NoOptDefVal == "" && i+1 < len(args):
				out = append(out, a, args[i+1])
				i++
				continue
			}
			out = append(out, a)
		case a == "-t" && i+1 < len(args) && teeValue.MatchString(args[i+1]):
			out = append(out, "--tee="+args[i+1])
			i++
		case strings.HasPrefix(a, "-t") && len(a) > 2:
			out = append(out, "--tee="+strings.TrimPrefix(a[2:], "="))
		default:
			out = append(out, a)
			if len(a) != 2 {
				continue // -abc: pflag's to read
			}
			if f := fs.ShorthandLookup(a[1:]); f != nil && f.NoOptDefVal == "" && i+1 < len(args) {
				out = append(out, args[i+1])
				i++
			}
		}
	}
	return out, nil
}

// longFlag resolves name (either spelling) to a flag of fs: itself, or the one flag it
// is a prefix of; "" when none.
func longFlag(fs *pflag.FlagSet, name string) (string, error) {
	name = string(normalizeFlag(fs, name))
	if fs.Lookup(name) != nil || name == "help" {
		return name, nil
	}
	var matches []string
	fs.VisitAll(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Name, name) && name != "" {
			matches = append(matches, f.Name)
		}
	})
	switch len(matches) {
	case 0:
		return "", nil
	case 1:
		return matches[0], nil
	}
	sort.Strings(matches)
	return "", fmt.Errorf("--%s is ambiguous: it could be --%s", name, strings.Join(matches, ", --"))
}

// launch is what the torchrun options add to the run's Spec.
type launch struct {
	command                  []string
	streams                  *launcher.Streams
	role, signals            string
	virtualLocalRank         bool
	autoIsCPUs, torchrunForm bool
}

// apply checks the torchrun options and turns them into gangrun's: g and t are
// completed (coordinator, job id, defaults of the torchrun form), and the launch says
// the rest. args are the words after the flags; dashed says they came after --. An
// error is the user's (exit 2), naming the option.
func (f *torchrunFlags) apply(e *env, fs *pflag.FlagSet, g *gangFlags, t *trainFlags, args []string, dashed bool) (launch, error) {
	var l launch
	changed := fs.Changed
	if err := unsupported(f, fs); err != nil {
		return l, err
	}
	l.torchrunForm = f.module || f.noPython || f.runPath || (!dashed && len(args) > 0 && launcher.IsScript(args[0]))
	if l.torchrunForm {
		if err := f.torchrunDefaults(e, fs, g, t); err != nil {
			return l, err
		}
		l.autoIsCPUs = true
	}
	if g.nproc == "xpu" {
		return l, errors.New("--nproc-per-node xpu: gangrun counts NVIDIA GPUs and CPUs only (N, auto, gpu or cpu)")
	}
	if changed("python") && !l.torchrunForm {
		return l, fmt.Errorf("--python %s: it runs a script given without -- (torchrun's form); after -- the command runs as given", f.python)
	}
	if err := f.coordinator(fs, g, e.getenv); err != nil {
		return l, err
	}
	if f.localAddr != "" {
		if changed("advertise-addr") && g.advertiseAddr != f.localAddr {
			return l, fmt.Errorf("--local-addr %s and --advertise-addr %s: give one", f.localAddr, g.advertiseAddr)
		}
		addr, err := resolveAddr(f.localAddr)
		if err != nil {
			return l, err
		}
		g.advertiseAddr = addr
	}
	if err := f.checkAgentOptions(); err != nil {
		return l, err
	}
	l.role, l.signals = f.role, f.signals
	if err := f.termTimeout(fs, g); err != nil {
		return l, err
	}
	if err := f.numa(fs, g); err != nil {
		return l, err
	}
	l.virtualLocalRank = f.virtualLocalRank
	streams, err := f.streams(e, fs, t, l.torchrunForm)
	if err != nil {
		return l, err
	}
	l.streams = streams
	if !l.torchrunForm || len(args) == 0 {
		l.command = args
		return l, nil
	}
	if l.command, err = f.scriptCommand(e, args); err != nil {
		return l, err
	}
	return l, nil
}

// unsupported refuses the torchrun options gangrun cannot honour, saying what to do
// instead.
func unsupported(f *torchrunFlags, fs *pflag.FlagSet) error {
	switch {
	case fs.Changed("logs-specs"):
		return errors.New("--logs-specs: a LogsSpecs plugin is Python run inside torchrun; gangrun writes the logs itself (--log-dir, --redirects, --tee)")
	case fs.Changed("print-completion"):
		return errors.New("--print-completion: gangrun prints no shell completion script (torchrun's comes from its argparse parser)")
	case f.dupStdout != "" || f.dupStderr != "":
		return errors.New("--duplicate-stdout-filters, --duplicate-stderr-filters: gangrun copies no filtered lines to another file; grep the --log-dir files")
	}
	return nil
}

// torchrunDefaults gives the torchrun form its defaults: the PET_ variables, then
// torchrun's defaults where gangrun's differ and the option was not given (docs/run.md,
// "From torchrun"): one worker a node, no restarts and no backoff, no CPU binding, and
// TORCH_ELASTIC_SHUTDOWN_TIMEOUT (whole seconds) as the termination timeout.
func (f *torchrunFlags) torchrunDefaults(e *env, fs *pflag.FlagSet, g *gangFlags, t *trainFlags) error {
	changed := fs.Changed
	f.petDefaults(e, fs)
	if !changed("nproc-per-node") {
		g.nproc = "1"
	}
	if !changed("max-restarts") {
		t.supervision.sup.MaxRestarts = 0
	}
	if !changed("restart-backoff") {
		t.supervision.sup.Backoff = "0s" // torchrun restarts at once
	}
	if !changed("cpu-bind") && f.numaBinding == "" {
		g.cpuBind = "none" // torchrun binds nothing without --numa-binding
	}
	if !changed("term-timeout") && !changed("shutdown-timeout") {
		if v := e.getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=%q: want whole seconds", v)
			}
			g.termTimeout = time.Duration(n) * time.Second
		}
	}
	return nil
}

// checkAgentOptions checks the options of torchrun's agent that gangrun takes but
// has no use for or honours in part: --monitor-interval (seconds above 0),
// --start-method, --event-log-handler, --role (not empty) and --signals-to-handle
// (only the signals gangrun stops the workers on).
func (f *torchrunFlags) checkAgentOptions() error {
	if v, err := strconv.ParseFloat(f.monitorInterval, 64); err != nil || v <= 0 {
		return fmt.Errorf("--monitor-interval %q: want a number of seconds above 0", f.monitorInterval)
	}
	if !slices.Contains([]string{"spawn", "fork", "forkserver"}, f.startMethod) {
		return fmt.Errorf("--start-method %q: want spawn, fork or forkserver", f.startMethod)
	}
	if !slices.Contains([]string{"null", "console"}, f.eventLogHandler) {
		return fmt.Errorf("--event-log-handler %q: gangrun has null and console (its own log lines); no other handler is registered", f.eventLogHandler)
	}
	if f.role == "" {
		return errors.New(`--role "": must not be empty`)
	}
	for _, s := range strings.Split(f.signals, ",") {
		if !slices.Contains(strings.Split(launcher.DefaultSignalsToHandle, ","), strings.TrimSpace(s)) {
			return fmt.Errorf("--signals-to-handle %s: gangrun stops the workers on SIGTERM, SIGINT, SIGHUP and SIGQUIT and forwards SIGUSR1 and SIGUSR2 without stopping them; %q cannot be made to stop them", f.signals, s)
		}
	}
	return nil
}

// termTimeout sets g's termination timeout from --shutdown-timeout (whole seconds, up
// to maxGrace) when given; --term-timeout with it is refused.
func (f *torchrunFlags) termTimeout(fs *pflag.FlagSet, g *gangFlags) error {
	if !fs.Changed("shutdown-timeout") {
		return nil
	}
	if fs.Changed("term-timeout") {
		return errors.New("--shutdown-timeout and --term-timeout: give one")
	}
	if f.shutdownTimeout < 0 || time.Duration(f.shutdownTimeout)*time.Second > maxGrace {
		return fmt.Errorf("--shutdown-timeout %d: want 0 to %d seconds", f.shutdownTimeout, int(maxGrace/time.Second))
	}
	g.termTimeout = time.Duration(f.shutdownTimeout) * time.Second
	return nil
}

// numa maps --numa-binding onto g's --cpu-bind: exclusive is numa; torchrun's other
// modes are refused.
func (f *torchrunFlags) numa(fs *pflag.FlagSet, g *gangFlags) error {
	switch f.numaBinding {
	case "":
	case "exclusive":
		if fs.Changed("cpu-bind") && g.cpuBind != "numa" {
			return fmt.Errorf("--numa-binding exclusive and --cpu-bind %s: give one", g.cpuBind)
		}
		g.cpuBind = "numa"
	case "node", "socket", "core-complex":
		return fmt.Errorf("--numa-binding %s: gangrun binds a worker to a fair share of its GPU's NUMA node CPUs (exclusive), not to the whole node, socket or core complex", f.numaBinding)
	default:
		return fmt.Errorf("--numa-binding %q: want node, socket, exclusive or core-complex (gangrun honours exclusive)", f.numaBinding)
	}
	return nil
}

// scriptCommand is the workers' command in the torchrun form: args[0] a script (or
// with -m a module, with --no-python a program) and its arguments, run by --python or
// the Python found as launcher.FindPython finds it.
func (f *torchrunFlags) scriptCommand(e *env, args []string) ([]string, error) {
	o := launcher.ScriptOptions{Script: args[0], Args: args[1:], Module: f.module, NoPython: f.noPython, RunPath: f.runPath, Python: f.python}
	if o.Python == "" && (!o.NoPython || o.RunPath) {
		var err error
		if o.Python, err = launcher.FindPython(e.getenv); err != nil {
			return nil, err
		}
	}
	return launcher.ScriptCommand(o)
}

// petDefaults gives every torchrun option not on the command line its PET_<NAME> value
// from the environment, as torchrun's env action does (PET_NPROC_PER_NODE=4).
func (f *torchrunFlags) petDefaults(e *env, fs *pflag.FlagSet) {
	for _, name := range torchrunOptions {
		if fs.Changed(name) {
			continue
		}
		v := e.getenv("PET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
		if v == "" {
			continue
		}
		if fl := fs.Lookup(name); fl != nil && fl.NoOptDefVal == "true" && fl.Value.Type() == "bool" {
			// check_env: an integer, non-zero for true.
			n, err := strconv.Atoi(v)
			if err != nil {
				continue
			}
			v = strconv.FormatBool(n != 0)
		}
		_ = fs.Set(name, v) // a bad value is judged as the flag's would be, below
	}
}

// coordinator maps torchrun's rendezvous options onto gangrun's --coordinator and
// --job-id: --rdzv-id is the job id; --standalone, the static rendezvous and c10d's
// each have a helper.
func (f *torchrunFlags) coordinator(fs *pflag.FlagSet, g *gangFlags, getenv func(string) string) error {
	changed := fs.Changed
	lo, hi, err := launcher.ParseNNodes(g.nnodes)
	if err != nil {
		return err
	}
	custom := changed("coordinator") && g.coordinator != "" && g.coordinator != "embedded"
	if changed("rdzv-id") {
		if err := checkRdzvID(f.rdzvID); err != nil {
			return err
		}
		if changed("job-id") && g.jobID != f.rdzvID {
			return fmt.Errorf("--rdzv-id %s and --job-id %s: give one", f.rdzvID, g.jobID)
		}
		g.jobID = f.rdzvID
	}
	if f.standalone {
		return f.standaloneRdzv(fs, g, custom, hi)
	}
	switch f.rdzvBackend {
	case "static":
		return f.staticRdzv(fs, g, custom, lo, hi, getenv)
	case "c10d":
		return f.c10dRdzv(fs, g, custom)
	case "etcd", "etcd-v2":
		return fmt.Errorf("--rdzv-backend %s: gangrun speaks no etcd; give --rdzv-backend c10d --rdzv-endpoint HOST:PORT, or --coordinator consul://HOST:PORT", f.rdzvBackend)
	}
	return fmt.Errorf("--rdzv-backend %q: want static or c10d", f.rdzvBackend)
}

// standaloneRdzv is --standalone: the embedded coordinator on one node (at most hi
// nodes, --nnodes's upper bound), a fresh job id unless one is given. custom says
// --coordinator names another coordinator.
func (f *torchrunFlags) standaloneRdzv(fs *pflag.FlagSet, g *gangFlags, custom bool, hi int) error {
	for _, name := range []string{"rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf"} {
		if fs.Changed(name) {
			return fmt.Errorf("--standalone with --%s: a standalone rendezvous is its own (torchrun ignores yours); give one or the other", name)
		}
	}
	if custom {
		return fmt.Errorf("--standalone with --coordinator %s: give one or the other", g.coordinator)
	}
	if hi > 1 {
		return fmt.Errorf("--standalone with --nnodes %s: a standalone rendezvous has one node", g.nnodes)
	}
	g.coordinator = "embedded"
	if g.jobID == "" {
		g.jobID = newUUID() // torchrun's run id for --standalone
	}
	return nil
}

// staticRdzv is --rdzv-backend static (torchrun's default): across nodes (lo to hi,
// --nnodes's bounds, which must be equal) a static:// coordinator with the node rank
// and the master from the command line; on one node the embedded coordinator, whose
// master must be this machine. custom says --coordinator names another coordinator,
// which gives the ranks and the master itself.
func (f *torchrunFlags) staticRdzv(fs *pflag.FlagSet, g *gangFlags, custom bool, lo, hi int, getenv func(string) string) error {
	changed := fs.Changed
	if changed("rdzv-conf") {
		return fmt.Errorf("--rdzv-conf %s: the static rendezvous takes no settings (give --rdzv-backend c10d)", f.rdzvConf)
	}
	if custom {
		for _, name := range []string{"node-rank", "master-addr", "rdzv-endpoint"} {
			if changed(name) {
				return fmt.Errorf("--%s with --coordinator %s: the coordinator gives the node ranks and the master", name, g.coordinator)
			}
		}
		return nil
	}
	master := f.masterAddr
	if f.rdzvEndpoint != "" {
		host, port, err := splitEndpoint(f.rdzvEndpoint, -1)
		if err != nil {
			return err
		}
		master = host
		if port >= 0 {
			if changed("master-port") && g.masterPort != port {
				return fmt.Errorf("--rdzv-endpoint %s and --master-port %d: give one", f.rdzvEndpoint, g.masterPort)
			}
			g.masterPort = port
		}
	}
	if hi > 1 {
		// torchrun's static rendezvous across nodes: node ranks and the master from
		// the command lines, MASTER_PORT 29500 unless given.
		if lo != hi {
			return fmt.Errorf("--nnodes %s: torchrun's static rendezvous has a fixed number of nodes (give --rdzv-backend c10d for a range)", g.nnodes)
		}
		port := g.masterPort
		if !changed("master-port") && f.rdzvEndpoint == "" {
			port = rendezvous.TorchrunStaticPort
		}
		u := url.URL{Scheme: "static", Host: net.JoinHostPort(master, strconv.Itoa(port)), RawQuery: "node_rank=" + strconv.Itoa(f.nodeRank)}
		g.coordinator, g.masterPort = u.String(), port
		return nil
	}
	if f.nodeRank != 0 {
		return fmt.Errorf("--node-rank %d on one node: want 0", f.nodeRank)
	}
	if !rendezvous.IsLocalHost(master) {
		return fmt.Errorf("--master-addr %s on one node: not an address or name of this machine (node rank 0's is this one)", master)
	}
	if g.coordinator == "" && rendezvous.InSlurmStep(getenv) {
		return nil // under srun the slurm coordinator decides: the job's id is SLURM_JOB_ID
	}
	if g.jobID == "" && g.masterPort == 0 {
		g.jobID = newUUID() // torchrun's one-node default: c10d on localhost:0, a fresh run id
	} else if g.jobID == "" {
		g.jobID = rendezvous.C10dJobID // torchrun's static rendezvous: run id "none"
	}
	return nil
}

// c10dRdzv is --rdzv-backend c10d: a c10d:// coordinator at --rdzv-endpoint (port
// 29400 unless given) with --rdzv-conf's settings as its query. custom says
// --coordinator names another coordinator, which is refused.
func (f *torchrunFlags) c10dRdzv(fs *pflag.FlagSet, g *gangFlags, custom bool) error {
	if custom {
		return fmt.Errorf("--rdzv-backend c10d with --coordinator %s: give one (c10d serves the rendezvous from the node at --rdzv-endpoint)", g.coordinator)
	}
	if f.rdzvEndpoint == "" {
		return errors.New("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]")
	}
	for _, name := range []string{"node-rank", "master-addr"} {
		if fs.Changed(name) {
			return fmt.Errorf("--%s with --rdzv-backend c10d: the rendezvous gives the node ranks and the master (torchrun ignores it)", name)
		}
	}
	host, port, err := splitEndpoint(f.rdzvEndpoint, rendezvous.C10dDefaultPort)
	if err != nil {
		return err
	}
	u := url.URL{Scheme: "c10d", Host: net.JoinHostPort(host, strconv.Itoa(port))}
	if f.rdzvConf != "" {
		q := url.Values{}
		for _, kv := range strings.Split(f.rdzvConf, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("--rdzv-conf %q: want KEY=VALUE,...", f.rdzvConf)
			}
			q.Set(strings.TrimSpace(k), strings.TrimSpace(v))
		}
		u.RawQuery = q.Encode()
	}
	if _, err := rendezvous.ParseC10dURL(u.String()); err != nil {
		return err
	}
	g.coordinator = u.String()
	return nil
}

// streams builds the workers' streams from --redirects, --tee (torchrun's values),
// --local-ranks-filter and --log-line-prefix-template; nil when none is given in
// gangrun's form (LogDir and gangrun's --tee decide). In the torchrun form it always
// decides, as torchrun does: with no option, every stream on the console and no log
// file but the error files. A stream sent to a file without --log-dir goes under a new
// directory torchelastic_* in $TMPDIR, as torchrun's does, kept after the run.
func (f *torchrunFlags) streams(e *env, fs *pflag.FlagSet, t *trainFlags, torchrunForm bool) (*launcher.Streams, error) {
	prefix := f.logLinePrefix
	if prefix == "" && torchrunForm {
		prefix = e.getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
	}
	if !torchrunForm && t.teeStd == "" && f.redirects == "" && f.localRanksFilter == "" && prefix == "" {
		return nil, nil
	}
	s := &launcher.Streams{PrefixTemplate: prefix}
	var err error
	if f.redirects != "" {
		if s.Redirects, err = launcher.ParseStd(f.redirects); err != nil {
			return nil, fmt.Errorf("--redirects %w", err)
		}
	}
	switch {
	case t.teeStd != "":
		if s.Tee, err = launcher.ParseStd(t.teeStd); err != nil {
			return nil, fmt.Errorf("--tee %w", err)
		}
	case fs.Changed("tee") && t.tee:
		s.Tee, _ = launcher.ParseStd("3") // gangrun's --tee: every stream to its file and the console
	case fs.Changed("tee"):
		s.Redirects, _ = launcher.ParseStd("3") // --tee=false: files only
	case !torchrunForm && t.logDir != "":
		// gangrun's form keeps its rule: with --log-dir, files and the console.
		if s.Redirects.IsZero() {
			s.Tee, _ = launcher.ParseStd("3")
		}
	}
	if f.localRanksFilter != "" {
		if s.Filter, err = launcher.ParseRanks(f.localRanksFilter); err != nil {
			return nil, err
		}
	}
	if s.NeedsFiles() && t.logDir == "" {
		dir, err := os.MkdirTemp("", "torchelastic_")
		if err != nil {
			return nil, fmt.Errorf("--redirects/--tee without --log-dir: %w", err)
		}
		t.logDir = dir
		fmt.Fprintf(e.stderr, "gangrun run: worker logs in %s (--redirects/--tee without --log-dir, as torchrun)\n", dir)
	}
	return s, nil
}

// splitEndpoint splits HOST[:PORT] (IPv6 in brackets); port is def when left out.
func splitEndpoint(s string, def int) (string, int, error) {
	host, port := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	}
	if host == "" || strings.ContainsAny(host, "/?#@ ") {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: want HOST[:PORT]", s)
	}
	if port == "" {
		return host, def, nil
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: port %q: want 0..65535", s, port)
	}
	return host, n, nil
}

// checkRdzvID checks --rdzv-id: the job id, a key segment in a coordinator and a
// directory name.
func checkRdzvID(id string) error {
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("--rdzv-id %q: only letters, digits, '-', '_' and '.' are allowed (it names the job's keys and directories)", id)
		}
	}
	if id == "" || id == "." || id == ".." {
		return fmt.Errorf("--rdzv-id %q: want a name of letters, digits, '-', '_' and '.'", id)
	}
	return nil
}

// resolveAddr returns addr when it is an IP address, else the first address its name
// resolves to (an IPv4 one when there is one).
func resolveAddr(addr string) (string, error) {
	if net.ParseIP(addr) != nil {
		return addr, nil
	}
	ips, err := net.LookupIP(addr)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("--local-addr %s: not an address, and the name does not resolve", addr)
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip.String(), nil
		}
	}
	return ips[0].String(), nil
}

// newUUID returns a random (version 4) UUID, as torchrun's uuid.uuid4() run ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
