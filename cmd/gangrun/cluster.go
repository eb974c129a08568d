package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/agent"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/flagfile"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/metrics"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/topology"
)

// consulFlag registers --consul on fs.
func consulFlag(fs *pflag.FlagSet) *string {
	return fs.String("consul", "", "Consul HTTP address HOST:PORT (default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500)")
}

// openStore connects to Consul (the API client dials on first use). The caller defers
// Close, which drops idle connections.
func openStore(e *env, cmd, addr string) (store.ConsulClient, int) {
	if addr != "" {
		if err := store.CheckConsulAddr("--consul", addr); err != nil {
			return nil, usageErr(e, cmd, "%v", err)
		}
	}
	s, err := store.NewConsulFrom(addr, "--consul")
	if err != nil {
		return nil, usageErr(e, cmd, "%v", err)
	}
	return s, exitOK
}

// parseLabels reads "k=v,k2=v2" (repeatable flag values joined).
func parseLabels(values []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		for _, kv := range strings.Split(v, ",") {
			kv = strings.TrimSpace(kv)
			if kv == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--labels %q: want KEY=VALUE[,KEY=VALUE...]", kv)
			}
			if first, dup := out[k]; dup {
				return nil, fmt.Errorf("--labels: label %q given twice (%q and %q)", k, k+"="+first, kv)
			}
			out[k] = val
		}
	}
	if err := allocator.CheckLabels(out); err != nil {
		return nil, err
	}
	return out, nil
}

// agentFlags are gangrun agent's flags: the command line's, and the keys of the file
// --config names (flagfile; docs/operations.md).
type agentFlags struct {
	consul, node, addr, topoFile        *string
	labels                              *[]string
	noSched                             *bool
	healthEvents, logFormat, authMode   *string
	stateDir                            *string
	metricsAddr, httpAddr, jobMapDir    *string
	wasteThreshold                      *float64
	wasteAfter, acctRetention, acctFold time.Duration
	auditRetention, minJobAge           time.Duration
	config                              *string
}

// configFlag is the agent's flag naming its settings file: the one key that file may
// not hold.
const configFlag = "config"

// newAgentFlags registers gangrun agent's flags on a new flag set for command name
// (agent, or doctor, which checks a node as the agent with those flags would run).
func newAgentFlags(e *env, name, synopsis string) (*pflag.FlagSet, *agentFlags) {
	fs := newFlagSet(e, name, synopsis)
	f := &agentFlags{}
	f.config = fs.String(configFlag, "", "read flags from FILE, one KEY = VALUE a line, KEY a flag's name without its dashes (docs/operations.md); flags given here win over it")
	f.consul = consulFlag(fs)
	f.node = fs.String("node-name", "", "this node's name (default: hostname)")
	f.addr = fs.String("advertise-addr", "", "address the other nodes use for this one")
	f.topoFile = fs.String("topology-file", "", "use a recorded inventory instead of probing: gangrun topo --json, or nvidia-smi topo -m and/or -q -x output")
	f.labels = fs.StringArray("labels", nil, "node labels KEY=VALUE[,...]: partition, switch, spine, anything (repeatable)")
	f.noSched = fs.Bool("no-scheduler", false, "never act as the cluster's scheduler")
	f.healthEvents = fs.String("health-events", "", "replay GPU health changes appended to FILE (JSON lines) instead of watching NVML: drills and tests")
	f.logFormat = fs.String("log-format", "text", "log lines: text or json")
	f.stateDir = fs.String("state-dir", "", "where the node keeps what must outlive Consul's data (its steps' outcomes, docs/operations.md); default: $STATE_DIRECTORY (systemd's: /var/lib/gangrun under the packaged unit), else TMPDIR/gangrun-state-NODE")
	f.authMode = fs.String("auth", "", "how users are told apart: munge (MUNGE credentials, checked before any job runs) or none (nothing checked: anyone may run jobs as anyone); default: munge where munged answers, else Consul's ACLs when on, else the agent refuses to start")
	f.metricsAddr = fs.String("metrics-addr", "", fmt.Sprintf("serve Prometheus metrics on HOST:PORT/metrics (off unless given; suggested port %d)", metrics.DefaultPort))
	f.httpAddr = fs.String("http-addr", "", "serve the cluster's status page on HOST:PORT/ (and /metrics; off unless given)")
	f.jobMapDir = fs.String("dcgm-job-mapping-dir", "", "write dcgm-exporter's HPC job-mapping files (one per GPU index, the job ids holding it) into DIR, for its --hpc-job-mapping-dir (off unless given)")
	f.wasteThreshold = fs.Float64("waste-threshold", metrics.DefaultWasteThreshold, "GPU waste: a running job whose GPUs on this node all stay under this utilisation (in %)...")
	durationVar(fs, &f.wasteAfter, "waste-after", metrics.DefaultWasteAfter, durationFlag{min: time.Second, max: maxWait},
		"...for this long is flagged idle (queue, show, metrics; needs NVML)")
	durationVar(fs, &f.acctRetention, "acct-retention", job.DefaultAcctRetention, durationFlag{min: time.Second, max: job.RollupRetention},
		"accounting: while elected, fold job records older than this into the daily rollups and delete them (at most the rollups' 400 days)")
	durationVar(fs, &f.acctFold, "acct-fold-interval", job.DefaultAcctFoldInterval, durationFlag{min: time.Second, max: maxWait},
		"accounting: how often the elected agent looks for records past --acct-retention")
	durationVar(fs, &f.auditRetention, "audit-retention", audit.DefaultRetention, durationFlag{min: time.Hour, max: 10 * audit.DefaultRetention},
		"audit log: while elected, delete the days of entries older than this (hourly)")
	durationVar(fs, &f.minJobAge, "min-job-age", job.DefaultMinJobAge, durationFlag{max: job.RollupRetention, zeroOK: true},
		"while elected, remove an ended job's records this long after its end, as Slurm's MinJobAge (0: never; its accounting record stays for --acct-retention)")
	return fs, f
}

// check checks the agent's flags that need more than their own parsing, as the agent
// does before it starts (and doctor, which must refuse what the agent would): the
// listen addresses, --waste-threshold, --labels, --log-format, the node's name (the
// hostname when --node-name is not given) and --advertise-addr. It returns the labels
// and the node's name; an error is the usage error to print.
func (f *agentFlags) check() (map[string]string, string, error) {
	if err := checkListenAddr("--metrics-addr", *f.metricsAddr); err != nil {
		return nil, "", err
	}
	if err := checkListenAddr("--http-addr", *f.httpAddr); err != nil {
		return nil, "", err
	}
	if t := *f.wasteThreshold; t <= 0 || t > 100 || t != t {
		return nil, "", fmt.Errorf("--waste-threshold %v: want a utilisation in %% above 0 and at most 100", t)
	}
	lbl, err := parseLabels(*f.labels)
	if err != nil {
		return nil, "", err
	}
	if _, err := newLogger(*f.logFormat, io.Discard); err != nil {
		return nil, "", err
	}
	name := *f.node
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return nil, "", fmt.Errorf("--node-name not given and the hostname is unknown: %w", err)
		}
	}
	// The node name is a key segment in Consul and a name the other nodes see.
	if err := store.CheckNodeName("--node-name", name); err != nil {
		return nil, "", err
	}
	if *f.addr != "" && net.ParseIP(*f.addr) == nil {
		return nil, "", fmt.Errorf("--advertise-addr %q: want an IP address (the other nodes connect to it)", *f.addr)
	}
	return lbl, name, nil
}

// parseAgentFlags parses args and then the file --config names (the command line
// wins). It returns done=true with the exit code when the command must stop: --help,
// or a usage error (one line, exit 2) in either.
func parseAgentFlags(e *env, cmd string, fs *pflag.FlagSet, f *agentFlags, args []string) (done bool, code int) {
	if done, code := parseFlags(e, fs, args); done {
		return done, code
	}
	if *f.config == "" {
		return false, exitOK
	}
	settings, err := flagfile.Read(*f.config)
	if err == nil {
		err = flagfile.Apply(fs, *f.config, settings, configFlag)
	}
	if err != nil {
		return true, usageErr(e, cmd, "--config %v", err)
	}
	return false, exitOK
}

// runAgent is `gangrun agent`: it checks the flags, the Consul token and how jobs'
// users are told apart, then runs the node's agent (package agent) until a
// terminating signal.
func runAgent(ctx context.Context, e *env, args []string) int {
	fs, f := newAgentFlags(e, "agent", "[--config FILE] [FLAGS]")
	if done, code := parseAgentFlags(e, "agent", fs, f, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "agent", "unexpected argument %q", fs.Arg(0))
	}
	lbl, name, err := f.check()
	if err != nil {
		return usageErr(e, "agent", "%v", err)
	}
	log, err := newLogger(*f.logFormat, e.stderr)
	if err != nil {
		return usageErr(e, "agent", "%v", err)
	}
	inv, err := topology.ForNode(ctx, *f.topoFile, name)
	if err != nil {
		return usageErr(e, "agent", "%v", err)
	}
	inv.Node = name
	if inv.MemoryMiB == 0 {
		// A recording without the node's memory (made before the field, or by
		// nvidia-smi): the jobs run on this machine, so its memory is what they share.
		inv.MemoryMiB = topology.HostMemoryMiB()
	}
	s, code := openStore(e, "agent", *f.consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	aclsOff, aclOn, code := agentToken(ctx, e, s)
	if code != exitOK {
		return code
	}
	munge, auth, code := agentAuth(ctx, e, *f.authMode, aclOn)
	if code != exitOK {
		return code
	}
	cfg := f.agentConfig(e, s, name, lbl, inv, log)
	cfg.Auth, cfg.Munge, cfg.ACLsOff = auth, munge, aclsOff
	cfg.StepArgv = func(id string) ([]string, error) {
		return stepArgv(e, *f.consul, *f.topoFile, name, auth, cfg.StateDir, id)
	}
	a, err := agent.New(cfg)
	var confErr *agent.ConfigError
	switch {
	case errors.As(err, &confErr):
		return usageErr(e, "agent", "%v", err)
	case err != nil:
		return failErr(e, "agent", err)
	}
	defer a.Close()
	if !e.startup.handOver() {
		return exitFailure // stopped by a signal while starting: main says so
	}
	actx, watch := proc.WatchSignals(ctx, e.signals)
	defer watch.Stop()
	if err := a.Run(actx, watch); err != nil {
		return failErr(e, "agent", err)
	}
	return exitOK
}

// agentToken checks the agent's Consul token: with Consul's ACLs on, an agent holds
// the agents' token (docs/acl.md). A Consul that does not answer yet is no refusal:
// the agent waits for it, as it always has. It returns whether the ACLs are known to
// be off, whether they are known to be on, and an exit code (exitOK to go on).
func agentToken(ctx context.Context, e *env, s store.Store) (off, on bool, code int) {
	who, err := acl.Whoami(ctx, s)
	switch {
	case errors.Is(err, store.ErrUnavailable):
	case errors.Is(err, acl.ErrNoToken):
		return false, false, usageErr(e, "agent", "no valid Consul ACL token: set CONSUL_HTTP_TOKEN_FILE to the agents' token (agent.token from gangrun acl bootstrap)")
	case errors.Is(err, acl.ErrForeignToken):
		return false, false, usageErr(e, "agent", "%v", err)
	case err != nil:
		return false, false, failErr(e, "agent", err)
	case who.Role == acl.RoleUser:
		return false, false, usageErr(e, "agent", "permission denied: an agent takes the agents' token from gangrun acl bootstrap (your token is %s)", who.Name())
	}
	return err == nil && who.Role == acl.RoleOpen, err == nil && who.Role != acl.RoleOpen, exitOK
}

// agentConfig is the agent's settings from its checked flags, but for how jobs' users
// are told apart (Auth, Munge, ACLsOff). The state directory defaults to systemd's
// StateDirectory= (the packaged unit's: /var/lib/gangrun), else one of this node's
// under TMPDIR.
func (f *agentFlags) agentConfig(e *env, s store.Store, name string, lbl map[string]string, inv *topology.Inventory, log *zap.Logger) agent.Config {
	stateDir := *f.stateDir
	if stateDir == "" {
		if stateDir = e.getenv("STATE_DIRECTORY"); stateDir == "" {
			stateDir = filepath.Join(os.TempDir(), "gangrun-state-"+name)
		}
	}
	cfg := agent.Config{Store: s, Node: name, Addr: *f.addr, Labels: lbl, Inventory: inv, Recorded: *f.topoFile != "",
		NoScheduler: *f.noSched, HealthEvents: *f.healthEvents, Log: log, MetricsAddr: *f.metricsAddr, HTTPAddr: *f.httpAddr,
		JobMapDir: *f.jobMapDir, WasteThreshold: *f.wasteThreshold, WasteAfter: f.wasteAfter, AcctRetention: f.acctRetention,
		AcctFold: f.acctFold, AuditRetention: f.auditRetention, MinJobAge: f.minJobAge, StateDir: stateDir}
	return cfg
}

func runNodes(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "nodes", "[--json]")
	consul := consulFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "nodes", "unexpected argument %q: nodes takes flags only", fs.Arg(0))
	}
	s, code := openReader(ctx, e, "nodes", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		return failErr(e, "nodes", err)
	}
	nodes := c.NodeList()
	if *asJSON {
		return printJSON(e, nodes)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGPUS\tUSED\tFREE\tMODEL\tLABELS\tJOBS\tAUTH\tVERSION\tREASON")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.State, n.GPUsTotal, n.GPUsUsed, n.GPUsFree, orDash(n.Model),
			orDash(labelString(n.Labels)), orDash(strings.Join(n.Grants, ",")), orDash(n.Auth), orDash(n.Version), orDash(n.Reason))
	}
	tw.Flush()
	return exitOK
}

func labelString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// allocFlags are gangrun alloc's flags: the request's own fields, and those parsed
// into it (request).
type allocFlags struct {
	r      allocator.Request
	consul *string
	gpus   *string
	labels *[]string
	asJSON *bool
}

// newAllocFlags registers gangrun alloc's flags on a new flag set.
func newAllocFlags(e *env) (*pflag.FlagSet, *allocFlags) {
	fs := newFlagSet(e, "alloc", "--nodes N --gpus-per-node G [FLAGS] [-- COMMAND...]")
	fs.SetInterspersed(false)
	f := &allocFlags{consul: consulFlag(fs)}
	r := &f.r
	fs.IntVar(&r.Nodes, "nodes", 1, "number of nodes")
	f.gpus = fs.String("gpus-per-node", "1", "[TYPE:]COUNT devices on each node: 8, h100:8 (a GPU model), 3g.40gb:2 (MIG devices of that profile)")
	fs.StringVar(&r.GPUModel, "gpu-model", "", "GPU model, matched in the device name (H100, A100-SXM4-80GB)")
	fs.StringVar(&r.Partition, "partition", "", "only nodes labelled partition=P")
	fs.StringVar(&r.Account, "account", "", "the account the GPUs are charged to, for the policy's limits and fair-share (default: your default account in the policy, else your user name)")
	f.labels = fs.StringArray("labels", nil, "only nodes with these labels KEY=VALUE[,...] (repeatable)")
	fs.IntVar(&r.Priority, "priority", 0, "higher goes first")
	durationVar(fs, &r.Wait, "wait", 0, durationFlag{max: maxWait, zeroOK: true},
		"give up when not granted within this long (0: wait forever; at most 10000h)")
	f.asJSON = fs.Bool("json", false, "print the grant as JSON")
	return fs, f
}

// request completes and checks the request from the parsed flags (labels, devices,
// model, account, holder) and checks that command, when given, can be found. It
// returns exitOK, or the exit code after printing why not.
func (f *allocFlags) request(e *env, command []string) int {
	r := &f.r
	lbl, err := parseLabels(*f.labels)
	if err != nil {
		return usageErr(e, "alloc", "%v", err)
	}
	if len(lbl) > 0 {
		r.Labels = lbl
	}
	n, profile, model, err := allocator.ParseGPUs(*f.gpus)
	if err != nil {
		return usageErr(e, "alloc", "%v", err)
	}
	r.GPUsPerNode, r.MIGProfile = n, profile
	if model != "" {
		if r.GPUModel != "" && !strings.EqualFold(r.GPUModel, model) {
			return usageErr(e, "alloc", "--gpus-per-node %s and --gpu-model %s name different GPU models", *f.gpus, r.GPUModel)
		}
		r.GPUModel = model
	}
	if err := r.Validate(); err != nil {
		return usageErr(e, "alloc", "%v", err)
	}
	if len(command) > 0 {
		if _, err := launcher.LookCommand(command[0]); err != nil {
			fmt.Fprintf(e.stderr, "gangrun alloc: %s\n", oneLine(err.Error()))
			return commandExitCode(err)
		}
	}
	if r.Account != "" {
		if err := store.CheckSegment("--account", r.Account); err != nil {
			return usageErr(e, "alloc", "%v", err)
		}
	}
	r.Holder = holder()
	return exitOK
}

// runAlloc is `gangrun alloc`: it submits a request for GPUs, waits for the grant and
// holds it until a signal, or runs the command given under it (salloc's part).
func runAlloc(ctx context.Context, e *env, args []string) int {
	fs, f := newAllocFlags(e)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	command := fs.Args()
	if code := f.request(e, command); code != exitOK {
		return code
	}
	s, code := openStore(e, "alloc", *f.consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	// From here a signal withdraws the request: Submit (which may wait on Consul) and
	// Wait end with wctx.
	if !e.startup.handOver() {
		return exitFailure // stopped by a signal while starting: main says so
	}
	wctx, watch := proc.WatchSignals(ctx, e.signals)
	defer watch.Stop()
	tk, code := submitAlloc(wctx, e, s, f.r, watch)
	if tk == nil {
		return code
	}
	id := tk.Request().ID
	defer tk.Release(context.WithoutCancel(ctx)) //nolint:errcheck // reported below where it matters
	g, code := waitGrant(wctx, e, tk, watch, *f.asJSON)
	if code != exitOK {
		return code
	}
	if len(command) == 0 {
		return holdGrant(ctx, e, tk, id, watch)
	}
	var guardian []string
	if e.self != "" {
		guardian = []string{e.self, guardianCommand}
	}
	exit, err := tk.Run(g, command, allocator.RunOptions{Stdin: os.Stdin, Stdout: rawWriter(e.stdout), Stderr: rawWriter(e.stderr),
		GuardianArgv: guardian, Stopped: watch, Notify: func(msg string) { fmt.Fprintf(e.stderr, "gangrun alloc: %s\n", msg) }})
	if err != nil {
		return failErr(e, "alloc", err)
	}
	return exit
}

// submitAlloc submits r as the current user, charged to the policy's default account
// for them when r names none, and says so on stderr. It returns the ticket, or nil and
// the exit code after printing why not (128+N when signal N stopped it).
func submitAlloc(ctx context.Context, e *env, s store.Store, r allocator.Request, watch *proc.SignalWatch) (*allocator.Ticket, int) {
	// The policy's limits and fair-share count an allocation as its user's, as they
	// count a job (sbatch and salloc alike charge the submitting user).
	r.User = currentUser()
	var err error
	if r.Account == "" {
		var pol *policy.Policy
		pol, err = policy.Load(ctx, s)
		if err == nil && pol != nil {
			r.Account = pol.DefaultAccount(r.User)
		}
	}
	var tk *allocator.Ticket
	if err == nil {
		tk, err = allocator.Submit(ctx, s, r)
	}
	if err != nil {
		if sig := watch.Signal(); sig != 0 {
			// Submit destroys the session of a request it could not finish writing.
			fmt.Fprintf(e.stderr, "gangrun alloc: stopped by %s before the request was submitted\n", proc.SignalName(sig))
			return nil, 128 + int(sig)
		}
		if errors.Is(err, allocator.ErrInfeasible) {
			return nil, usageErr(e, "alloc", "%v", err)
		}
		return nil, failErr(e, "alloc", err)
	}
	kind := "GPU(s)"
	if r.MIGProfile != "" {
		kind = r.MIGProfile + " MIG device(s)"
	}
	fmt.Fprintf(e.stderr, "gangrun alloc: request %s submitted, waiting for %d node(s) × %d %s\n", tk.Request().ID, r.Nodes, r.GPUsPerNode, kind)
	return tk, exitOK
}

// waitGrant waits for tk's grant, saying on stderr why it is pending, and prints it on
// stdout (as JSON with asJSON). The exit code is exitOK, or 128+N when signal N
// withdrew the request, or 1 on an error (printed).
func waitGrant(ctx context.Context, e *env, tk *allocator.Ticket, watch *proc.SignalWatch, asJSON bool) (allocator.Grant, int) {
	id := tk.Request().ID
	g, err := tk.Wait(ctx, func(why string) { fmt.Fprintf(e.stderr, "gangrun alloc: %s pending: %s\n", id, why) })
	if err != nil {
		if sig := watch.Signal(); sig != 0 {
			fmt.Fprintf(e.stderr, "gangrun alloc: %s withdrawn on %s\n", id, proc.SignalName(sig))
			return g, 128 + int(sig)
		}
		return g, failErr(e, "alloc", err)
	}
	if asJSON {
		writeJSON(e.stdout, g.Summary())
	} else {
		fmt.Fprintf(e.stdout, "granted %s: %s\n", g.ID, grantSummary(g))
	}
	return g, exitOK
}

// holdGrant holds grant id until a terminating signal (then releases it) or until the
// grant is lost; it returns the exit code.
func holdGrant(ctx context.Context, e *env, tk *allocator.Ticket, id string, watch *proc.SignalWatch) int {
	fmt.Fprintf(e.stderr, "gangrun alloc: holding %s; Ctrl-C, SIGTERM or `gangrun cancel %s` releases it\n", id, id)
	select {
	case <-watch.Stopped():
		if err := tk.Release(context.WithoutCancel(ctx)); err != nil {
			return failErr(e, "alloc", err)
		}
		fmt.Fprintf(e.stderr, "gangrun alloc: released %s on %s\n", id, proc.SignalName(watch.Signal()))
		return exitOK
	case <-tk.Lost():
		return failErr(e, "alloc", fmt.Errorf("grant %s was cancelled or its session expired", id))
	}
}

func grantSummary(g allocator.Grant) string {
	parts := make([]string, len(g.Nodes))
	for i, n := range g.Nodes {
		parts[i] = fmt.Sprintf("%s [%s]", n.Name, strings.Join(n.Devices, ","))
	}
	return strings.Join(parts, ", ")
}

func holder() string {
	h, _ := os.Hostname()
	u := "unknown"
	if cur, err := user.Current(); err == nil {
		u = cur.Username
	}
	return fmt.Sprintf("%s@%s pid %d", u, h, os.Getpid())
}

func runQueue(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "queue", "[--all] [--priority] [--json]")
	consul := consulFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "also list jobs that ended (squeue --states=all)")
	prio := fs.Bool("priority", false, "list pending jobs by priority with each factor of it (like sprio)")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "queue", "unexpected argument %q: queue takes flags only (gangrun show ID shows one)", fs.Arg(0))
	}
	s, code := openReader(ctx, e, "queue", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	if *prio {
		p, err := job.Priorities(ctx, s)
		if err != nil {
			return failErr(e, "queue", err)
		}
		if *asJSON {
			return printJSON(e, p)
		}
		printPriorities(e, p)
		return exitOK
	}
	q, err := job.Queue(ctx, s, *all)
	if err != nil {
		return failErr(e, "queue", err)
	}
	if *asJSON {
		return printJSON(e, q)
	}
	printJobs(e, q)
	return exitOK
}

func runShow(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "show", "ID [--json]")
	consul := consulFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(e, "show", "want exactly one request or grant id")
	}
	if err := store.CheckSegment("id", fs.Arg(0)); err != nil {
		return usageErr(e, "show", "%v", err)
	}
	s, code := openReader(ctx, e, "show", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	// Under Consul's ACLs a user sees only the outline of another user's job, as
	// Slurm's PrivateData=jobs.
	who, _ := acl.Whoami(ctx, s)
	private := func(j *job.Job) {
		if who.Role == acl.RoleUser && j.Spec.User != who.User {
			j.Spec = j.Spec.Redacted()
		}
	}
	if j, err := job.Read(ctx, s, fs.Arg(0)); err == nil {
		private(j)
		if st := j.State; st.Phase() == (job.Phase{Status: job.Pending}) || st.Hold() == job.HoldPreempted {
			// The scheduler's reason, as queue shows it (a limit's, say).
			if status, err := allocator.ReadStatus(ctx, s); err == nil && status.Pending[j.Spec.ID] != "" {
				j.State.Reason = status.Pending[j.Spec.ID]
			}
		}
		return showJob(e, j, *asJSON)
	} else if !errors.Is(err, job.ErrNotFound) {
		return failErr(e, "show", err)
	}
	if tasks, err := job.Tasks(ctx, s, fs.Arg(0)); err != nil {
		return failErr(e, "show", err)
	} else if len(tasks) > 0 {
		for i := range tasks {
			private(&tasks[i])
		}
		return showArray(e, tasks, *asJSON)
	}
	r, g, err := allocator.Show(ctx, s, fs.Arg(0))
	if errors.Is(err, allocator.ErrNotFound) {
		return usageErr(e, "show", "%s", unknownID(fs.Arg(0)))
	}
	if err != nil {
		return failErr(e, "show", err)
	}
	if *asJSON {
		return printJSON(e, struct {
			Request *allocator.PendingRequest `json:"request,omitempty"`
			Grant   *allocator.Grant          `json:"grant,omitempty"`
		}{r, g})
	}
	if r != nil {
		fmt.Fprintf(e.stdout, "Request %s: %d node(s) × %d GPU(s), priority %d, holder %s, submitted %s",
			r.ID, r.Nodes, r.GPUsPerNode, r.Priority, r.Holder, r.Submitted.UTC().Format(time.RFC3339))
		if r.GPUModel != "" {
			fmt.Fprintf(e.stdout, ", model %s", r.GPUModel)
		}
		if r.Partition != "" {
			fmt.Fprintf(e.stdout, ", partition %s", r.Partition)
		}
		if r.Wait > 0 {
			fmt.Fprintf(e.stdout, ", wait %s", r.Wait)
		}
		fmt.Fprintln(e.stdout)
	}
	if g == nil {
		st, _ := allocator.ReadStatus(ctx, s)
		fmt.Fprintf(e.stdout, "State: pending (%s)\n", orDash(st.Pending[fs.Arg(0)]))
		return exitOK
	}
	fmt.Fprintf(e.stdout, "State: %s", g.State)
	if g.Reason != "" {
		fmt.Fprintf(e.stdout, " (%s)", g.Reason)
	}
	fmt.Fprintln(e.stdout)
	for _, n := range g.Nodes {
		fmt.Fprintf(e.stdout, "  %s %s devices %s\n", n.Name, orDash(n.Addr), strings.Join(n.Devices, ","))
	}
	return exitOK
}

func runCancel(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "cancel", "ID...")
	consul := consulFlag(fs)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() == 0 {
		return usageErr(e, "cancel", "want one or more request or grant ids")
	}
	for _, id := range fs.Args() {
		if err := store.CheckSegment("id", id); err != nil {
			return usageErr(e, "cancel", "%v", err)
		}
	}
	s, code := openStore(e, "cancel", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	who, code := identify(ctx, e, "cancel", s)
	if code != exitOK {
		return code
	}
	munge, err := clusterSealer(ctx, e, s)
	if err != nil {
		return sealerErr(e, "cancel", err)
	}
	switch {
	case who.Role == acl.RoleUser:
		as := job.Asker{User: who.User, Wait: job.DefaultRequestWait}
		if munge != nil {
			as.Prover = munge
		}
		return cancelAs(ctx, e, s, as, fs.Args())
	case who.Role == acl.RoleOpen && munge != nil:
		// No ACLs, but MUNGE: the elected agent cancels what the credential's user may
		// (their own jobs; root's, any). An id that is no job may be a grant of
		// `gangrun alloc`, cancelled here as before (docs/acl.md, "Limits").
		return cancelAs(ctx, e, s, asker(munge), fs.Args())
	}
	if !who.Admin() {
		return usageErr(e, "cancel", "permission denied: cancelling takes a user's token (for the user's own jobs) or the operator's (your token is %s)", who.Name())
	}
	// Each id is cancelled in turn; the exit code is 1 if any failed, else 2 if any
	// was unknown (a usage error, as for show and drain), else 0.
	unknown, failed := false, false
	for _, id := range fs.Args() {
		if n, array, err := actorOf(who).Cancel(ctx, s, id); !errors.Is(err, job.ErrNotFound) {
			switch {
			case err != nil:
				failErr(e, "cancel", err)
				failed = true
			case array:
				fmt.Fprintf(e.stdout, "cancelled %d task(s) of job array %s\n", n, id)
			case n > 0:
				fmt.Fprintf(e.stdout, "cancelled job %s\n", id)
			default:
				fmt.Fprintf(e.stdout, "job %s had ended or is ending already\n", id)
			}
			continue
		}
		err := allocator.Cancel(ctx, s, id)
		switch {
		case errors.Is(err, allocator.ErrNotFound):
			usageErr(e, "cancel", "%s", unknownID(id))
			unknown = true
		case err != nil:
			failErr(e, "cancel", err)
			failed = true
		default:
			fmt.Fprintf(e.stdout, "cancelled %s\n", id)
		}
	}
	switch {
	case failed:
		return exitFailure
	case unknown:
		return exitUsage
	}
	return exitOK
}

// cancelAs is `gangrun cancel` through the asker's request box, under a user's token
// or with MUNGE credentials: each job is cancelled by the elected agent, and only if it
// is the asker's (root's: any). The exit code is 1 if any failed, else 2 if any was
// unknown or another's, else 0.
func cancelAs(ctx context.Context, e *env, s store.Store, as job.Asker, ids []string) int {
	refused, failed := false, false
	for _, id := range ids {
		n, array, err := as.Cancel(ctx, s, id)
		switch {
		case errors.Is(err, job.ErrNotYours), errors.Is(err, job.ErrDenied):
			usageErr(e, "cancel", "%s: %v", id, err)
			refused = true
		case errors.Is(err, job.ErrNotFound):
			// No job: a request or grant of `gangrun alloc`, which holds GPUs but runs
			// nothing as anyone, is cancelled directly (with Consul's ACLs, only the
			// operator's token may).
			switch err := allocator.Cancel(ctx, s, id); {
			case errors.Is(err, allocator.ErrNotFound):
				usageErr(e, "cancel", "%s", unknownID(id))
				refused = true
			case err != nil:
				failErr(e, "cancel", err)
				failed = true
			default:
				fmt.Fprintf(e.stdout, "cancelled %s\n", id)
			}
		case errors.Is(err, identity.ErrNoDaemon) || errors.Is(err, identity.ErrNoMunge):
			sealerErr(e, "cancel", err)
			failed = true
		case err != nil:
			failErr(e, "cancel", err)
			failed = true
		case array:
			fmt.Fprintf(e.stdout, "cancelled %d task(s) of job array %s\n", n, id)
		case n > 0:
			fmt.Fprintf(e.stdout, "cancelled job %s\n", id)
		default:
			fmt.Fprintf(e.stdout, "job %s had ended or is ending already\n", id)
		}
	}
	switch {
	case failed:
		return exitFailure
	case refused:
		return exitUsage
	}
	return exitOK
}

// unknownID says that id names no request or grant.
func unknownID(id string) string {
	return fmt.Sprintf("no job, request or grant %q (gangrun queue lists them)", id)
}

func runDrain(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "drain", "NODE --reason TEXT")
	consul := consulFlag(fs)
	reason := fs.String("reason", "", "why the node is drained (required)")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(e, "drain", "want exactly one node name")
	}
	if err := allocator.CheckReason(*reason); err != nil {
		return usageErr(e, "drain", "%v", err)
	}
	return setDrain(ctx, e, "drain", *consul, fs.Arg(0), *reason)
}

func runResume(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "resume", "NODE")
	consul := consulFlag(fs)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(e, "resume", "want exactly one node name")
	}
	return setDrain(ctx, e, "resume", *consul, fs.Arg(0), "")
}

func setDrain(ctx context.Context, e *env, cmd, consul, node, reason string) int {
	if err := store.CheckNodeName("node", node); err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	s, code := openStore(e, cmd, consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	who, code := identify(ctx, e, cmd, s)
	if code != exitOK {
		return code
	}
	action, what := audit.ActionDrain, "draining a node"
	if reason == "" {
		action, what = audit.ActionResume, "resuming a node"
	}
	if who.Role == acl.RoleOpen {
		munge, err := clusterSealer(ctx, e, s)
		if err != nil {
			return sealerErr(e, cmd, err)
		}
		if munge != nil {
			// No ACLs, but MUNGE: the elected agent drains for root only.
			err := asker(munge).Drain(ctx, s, node, reason)
			switch {
			case errors.Is(err, job.ErrDenied), errors.Is(err, allocator.ErrNotFound):
				return usageErr(e, cmd, "%v", err)
			case err != nil:
				return failErr(e, cmd, err)
			}
			return drained(e, node, reason)
		}
	}
	if code := needAdmin(e, cmd, what, who); code != exitOK {
		return code
	}
	if err := allocator.SetDrain(ctx, s, node, reason, auditOp(who, action, "node "+node, "", reason)); err != nil {
		if errors.Is(err, allocator.ErrNotFound) {
			return usageErr(e, cmd, "%v", err)
		}
		return failErr(e, cmd, err)
	}
	return drained(e, node, reason)
}

// drained says node was drained for reason, or resumed ("").
func drained(e *env, node, reason string) int {
	if reason == "" {
		fmt.Fprintf(e.stdout, "resumed %s\n", node)
	} else {
		fmt.Fprintf(e.stdout, "drained %s: %s\n", node, reason)
	}
	return exitOK
}

// printJSON writes v as indented JSON to stdout and returns exit code 0.
func printJSON(e *env, v any) int {
	writeJSON(e.stdout, v)
	return exitOK
}

// actorOf is who as a job.Actor: this process's user, an operator when who is root's
// (ACLs off) or the operator's or management token, and its audit entries.
func actorOf(who acl.Identity) job.Actor {
	admin := who.Role == acl.RoleOperator || who.Role == acl.RoleManagement || (who.Role == acl.RoleOpen && os.Geteuid() == 0)
	return job.Actor{User: currentUser(), Admin: admin, Entry: func(action, target, owner, detail string) audit.Entry {
		return auditEntry(who, action, target, owner, detail)
	}}
}
