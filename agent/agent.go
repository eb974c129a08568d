// Package agent is a node's gangrun agent for its whole life (`gangrun agent`): its
// registration and the scheduler election (allocator.Agent), what runs while it leads
// (the job controller, accounting, the request box, the audit log's retention), the
// node's part of cluster jobs (job.RunLauncher starting their steps), its metrics and
// status page, dcgm-exporter's job mapping and the GPU waste watch; and their shutdown.
// cmd/gangrun parses the flags, calls New and Run, and prints.
package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/gangrun/gangrun"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/metrics"
	"github.com/gangrun/gangrun/topology"
)

// How an agent knows who submits jobs (agent --auth, allocator.NodeRecord.Auth;
// docs/acl.md).
const (
	// AuthMunge is MUNGE credentials, checked before any job runs.
	AuthMunge = "munge"
	// AuthACL is Consul's ACL tokens, where munged does not answer.
	AuthACL = "acl"
	// AuthNone checks nothing: anyone may run jobs as anyone.
	AuthNone = "none"
)

// Config is what an agent needs, each field a flag of `gangrun agent` (docs/operations.md)
// once cmd/gangrun has checked it. The error messages name the flags.
type Config struct {
	// Store is the cluster's coordination store; the caller closes it after Run.
	Store store.Store
	// Node is this node's name, a key segment (store.CheckNodeName); Addr the address
	// the other nodes use for it (--advertise-addr); Labels its labels (--labels).
	Node, Addr string
	Labels     map[string]string
	// Inventory is the node's topology, its Node set to Node.
	Inventory *topology.Inventory
	// Recorded says Inventory was read from a file (--topology-file), not probed: there
	// is no driver to watch (GPU health) or read (the GPU metrics) then.
	Recorded bool
	// Auth is how the agent knows who submits jobs: AuthMunge, AuthACL or AuthNone.
	Auth string
	// Munge is the MUNGE client when Auth is AuthMunge (nil otherwise): the prover of
	// the job controller and the request box.
	Munge *identity.Munge
	// ACLsOff says Consul's ACLs are off (the token's role is acl.RoleOpen), which the
	// agent warns of beside MUNGE.
	ACLsOff bool
	// NoScheduler keeps this agent out of the scheduler election (--no-scheduler).
	NoScheduler bool
	// HealthEvents, when set, is a file of GPU health changes (JSON lines) replayed
	// instead of watching NVML (--health-events).
	HealthEvents string
	// Log receives the agent's messages; nil discards them.
	Log *zap.Logger
	// MetricsAddr and HTTPAddr are the HOST:PORT the metrics and the status page are
	// served on ("": off). The status page's server serves /metrics too, so the same
	// address in both is one server.
	MetricsAddr, HTTPAddr string
	// JobMapDir, when set, is where dcgm-exporter's job-mapping files are written.
	JobMapDir string
	// WasteThreshold (a utilisation in %, above 0 and at most 100) and WasteAfter are
	// the GPU waste watch's (metrics.WasteConfig).
	WasteThreshold float64
	WasteAfter     time.Duration
	// AcctRetention and AcctFold are the accounting's retention and fold interval
	// (job.KeepAccounts); AuditRetention the audit log's (audit.Keep); MinJobAge how
	// long an ended job's records stay (job.Control; 0: always).
	AcctRetention, AcctFold, AuditRetention, MinJobAge time.Duration
	// StateDir is where the node keeps what must outlive Consul's data (its steps'
	// outcomes); Run creates it (mode 0700).
	StateDir string
	// StepArgv is the command that runs job id's step on this node (this binary's
	// hidden step command): its argv, argv[0] the program's path.
	StepArgv func(id string) ([]string, error)
}

// ConfigError is New's error for settings allocator.NewAgent refuses: a usage error to
// the command line, where New's other errors are failures.
type ConfigError struct{ Err error }

// Error is the refusal's message, as NewAgent gave it.
func (e *ConfigError) Error() string { return e.Err.Error() }

// Unwrap returns NewAgent's error.
func (e *ConfigError) Unwrap() error { return e.Err }

// Agent is a node's agent between New and Close: its allocator agent, its metrics'
// collectors and the listeners of its HTTP servers.
type Agent struct {
	cfg   Config
	log   *zap.Logger
	alloc *allocator.Agent
	view  *metrics.View
	gpus  *metrics.GPUCollector
	sched *metrics.SchedulerCollector
	lib   nvml.Interface // nil unless NVML was opened (a probed inventory with GPUs)

	metricsLn, httpLn net.Listener // nil when off
	steps             atomic.Int64 // the steps this agent started that still run
}

// New sets an agent up without starting it: NVML (a probed inventory with GPUs), the
// metrics' collectors, the allocator agent, the listeners and the job-mapping
// directory; it logs the inventory's notes, the release and how jobs' users are told
// apart. Errors: a *ConfigError for settings the allocator refuses, else a failure
// (a listen address in use, a directory not made). Close what New returns after Run.
func New(cfg Config) (*Agent, error) {
	if cfg.HTTPAddr != "" && cfg.HTTPAddr == cfg.MetricsAddr {
		cfg.MetricsAddr = "" // the status page's server serves /metrics too
	}
	a := &Agent{cfg: cfg, log: cfg.Log}
	if a.log == nil {
		a.log = zap.NewNop()
	}
	health := a.healthSource()
	a.openNVML()
	a.view = metrics.NewView(cfg.Store, 0)
	a.gpus = metrics.NewGPUCollector(metrics.GPUConfig{NVML: a.lib, Node: cfg.Node, Inventory: a.inventory,
		Holders: func(ctx context.Context) (map[int]metrics.JobLabels, error) { return a.view.Holders(ctx, cfg.Node) }})
	a.sched = metrics.NewSchedulerCollector(cfg.Store, a.view)
	if health != nil {
		health = tapHealth(health, a.gpus.NoteHealth)
	}
	if err := a.newAllocator(health); err != nil {
		a.Close()
		return nil, &ConfigError{err}
	}
	if err := a.listen(); err != nil {
		a.Close()
		return nil, err
	}
	a.logStart()
	return a, nil
}

// inventory is the node's inventory as the allocator agent publishes it (GPU health
// changes included).
func (a *Agent) inventory() *topology.Inventory { return a.alloc.Inventory() }

// healthSource is where the node's GPU health changes come from: the replayed file,
// NVML for a probed inventory with GPUs, else nil (a recorded inventory has no driver
// to watch).
func (a *Agent) healthSource() allocator.HealthSource {
	switch {
	case a.cfg.HealthEvents != "":
		return allocator.RecordedHealth(a.cfg.HealthEvents, func(line string, err error) {
			a.log.Warn("--health-events: line skipped", zap.String("line", line), zap.Error(err))
		})
	case !a.cfg.Recorded && len(a.cfg.Inventory.GPUs) > 0:
		return allocator.NVMLHealth
	}
	return nil
}

// openNVML opens NVML for the GPU metrics when the inventory was probed and has GPUs;
// a.lib stays nil where it does not open.
func (a *Agent) openNVML() {
	if a.cfg.Recorded || len(a.cfg.Inventory.GPUs) == 0 {
		return
	}
	if l := nvml.New(); l.Init() == nvml.SUCCESS {
		a.lib = l
	}
}

// newAllocator makes the allocator agent, with what runs while it leads: the job
// controller, the scheduler's metrics, accounting, the request box and the audit
// log's retention.
func (a *Agent) newAllocator(health allocator.HealthSource) error {
	cfg, log := a.cfg, a.log
	var prover job.Prover // nil unless MUNGE: a nil *identity.Munge is no nil Prover
	if cfg.Munge != nil {
		prover = cfg.Munge
	}
	var err error
	a.alloc, err = allocator.NewAgent(cfg.Store, allocator.AgentConfig{Node: cfg.Node, Addr: cfg.Addr, Labels: cfg.Labels,
		Inventory: cfg.Inventory, Auth: cfg.Auth, Release: gangrun.Version(), NoScheduler: cfg.NoScheduler, Log: log,
		Health: health, Events: a.sched,
		Leader: []func(context.Context, store.Store, string) error{job.Control(log.Named("jobs"), a.sched, cfg.MinJobAge, prover),
			a.sched.Lead, job.KeepAccounts(log.Named("acct"), cfg.AcctRetention, cfg.AcctFold),
			job.ServeRequests(log.Named("requests"), prover), audit.Keep(log.Named("audit"), cfg.AuditRetention, 0)}})
	return err
}

// listen opens the metrics' and the status page's listeners (those given) and makes
// the job-mapping directory (when given). Errors name the flag.
func (a *Agent) listen() error {
	var err error
	if a.cfg.MetricsAddr != "" {
		if a.metricsLn, err = net.Listen("tcp", a.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	if a.cfg.HTTPAddr != "" {
		if a.httpLn, err = net.Listen("tcp", a.cfg.HTTPAddr); err != nil {
			return fmt.Errorf("--http-addr: %w", err)
		}
	}
	if a.cfg.JobMapDir != "" {
		if err := os.MkdirAll(a.cfg.JobMapDir, 0o755); err != nil {
			return fmt.Errorf("--dcgm-job-mapping-dir: %w", err)
		}
	}
	return nil
}

// logStart logs the inventory's notes, the release and how the users of jobs are told
// apart.
func (a *Agent) logStart() {
	log := a.log
	for _, n := range a.cfg.Inventory.Notes {
		log.Info("topology", zap.String("note", n))
	}
	log.Info("gangrun", zap.String("version", gangrun.Version()), zap.String("commit", gangrun.Commit()))
	switch a.cfg.Auth {
	case AuthMunge:
		log.Info("who submits jobs: MUNGE credentials, checked before any job runs", zap.String("munge_socket", a.cfg.Munge.Socket()))
		if a.cfg.ACLsOff {
			log.Warn("Consul's ACLs are off: a local user can still write gangrun's records in Consul directly (stop or delete jobs, drain nodes), though never run anything as another user; turn them on to stop that too (docs/acl.md)")
		}
	case AuthACL:
		log.Info("who submits jobs: Consul's ACL tokens (munged does not answer here)")
	case AuthNone:
		log.Warn("--auth none: no credential is checked: any local user who reaches Consul can run jobs as any user, root included")
	}
}

// Close closes the listeners, the GPU collector and NVML, in that order (the
// collector reads NVML). Call it once Run has returned, or after New's error (New
// closes what it opened itself then). It does not close the store.
func (a *Agent) Close() {
	for _, ln := range []net.Listener{a.httpLn, a.metricsLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
	if a.gpus != nil {
		a.gpus.Close()
	}
	if a.lib != nil {
		_ = a.lib.Shutdown()
	}
}
