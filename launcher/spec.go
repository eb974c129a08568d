package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/rendezvous"
	"github.com/gangrun/gangrun/topology"
)

// Spec is one node's run of a training command as a user describes it — the flags of
// `gangrun run` — or as a cluster job's step is given it: what to run, on how many
// workers and nodes, where the gang meets, how failures are handled. Prepare turns it
// into the supervisor's Config and the node's rendezvous; it is the one path from a
// description to a running gang, for the CLI and the node agent alike.
type Spec struct {
	// Command is the training command; a wrapped torchrun is recognised and parsed here.
	Command []string
	// NProcPerNode is --nproc-per-node: "N", "auto" (the allocatable GPUs seen, narrowed
	// by the user's CUDA_VISIBLE_DEVICES: visibleDevices; else 1),
	// "gpu" or "cpu"; "" is "auto". NProcGiven says the user gave it (a wrapped
	// torchrun's own --nproc_per_node counts otherwise).
	NProcPerNode string
	NProcGiven   bool
	// AutoIsCPUs makes NProcPerNode "auto" count the CPUs on a node without GPUs, as
	// torchrun 2.x's auto does (torch/distributed/run.py, determine_local_world_size),
	// instead of 1: the torchrun form of `gangrun run`.
	AutoIsCPUs bool
	// NNodes is --nnodes, "N" or "MIN:MAX"; "" is "1". NNodesGiven says the user gave it.
	NNodes      string
	NNodesGiven bool
	// Coordinator is --coordinator (rendezvous.Open); "" is the default. FollowRun
	// joins the job's run as it stands (a cluster job's step: rendezvous.Config).
	Coordinator string
	FollowRun   bool
	// JobID, NodeName and AdvertiseAddr: "" lets the coordinator decide.
	JobID, NodeName, AdvertiseAddr string
	// MasterPort is MASTER_PORT, 0..65535 (0: a free port for every attempt).
	MasterPort int
	// Inventory is the node's topology; nil reads TopologyFile, or probes this machine
	// when that is "" too.
	Inventory    *topology.Inventory
	TopologyFile string
	// Devices, when set, are the only devices (topology.Device IDs) the run may use: a
	// grant's. CUDA_VISIBLE_DEVICES then names exactly them, in this order.
	Devices []string
	// Grant, when set, names the grant of `gangrun alloc` that Devices come from (for
	// messages). An inherited CUDA_VISIBLE_DEVICES must then name granted devices
	// only (by index, MIG UUID or GPU UUID): it narrows the run to them, and one
	// outside the grant is an error.
	Grant string
	// CPUBind is --cpu-bind (topology.ParseCPUBind: "numa", the default, or "none");
	// MemBind is --mem-bind (topology.ParseMemBind: "local", the default, "strict" or
	// "none"); NCCLTopo is --nccl-topo (topology.ParseNCCLTopo: "auto", the default,
	// "always" or "never").
	CPUBind, MemBind, NCCLTopo string
	// Cgroup is --cgroup (cgroup.ParseMode: "auto", the default, "off" or "required");
	// Mem is --mem, the step's memory limit on this node in bytes (0: none; parsed by
	// cgroup.ParseMem); PidsLimit is --pids-limit (0: none; the CLI's default is
	// cgroup.DefaultPidsLimit). See Confinement.
	Cgroup         string
	Mem, PidsLimit int64
	// Env holds the --env KEY=VALUE entries.
	Env []string
	// Environ is the environment inherited (os.Environ() when nil); Getenv reads it for
	// the coordinator and the user's CUDA_VISIBLE_DEVICES (os.Getenv when nil).
	Environ []string
	Getenv  func(string) string
	// Supervision is how failures are handled: restarts, their backoff, the hang
	// timeout, warm standbys (the same for `gangrun run` and a cluster job's step).
	Supervision
	// TermTimeout is --term-timeout (0: DefaultTermTimeout).
	TermTimeout time.Duration
	// CheckpointDir, ResumeArg, LogDir, Tee and LocalRankArg are the flags of the same
	// names; see Config.
	CheckpointDir, ResumeArg, LogDir string
	Tee, LocalRankArg                bool
	// NoRestart is Config.NoRestart.
	NoRestart func() string
	// Streams is Config.Streams (nil: LogDir and Tee decide); LogDirPerRun is Config's.
	Streams      *Streams
	LogDirPerRun bool
	// Role, SignalsToHandle and VirtualLocalRank are EnvConfig's: torchrun's --role,
	// --signals-to-handle and --virtual-local-rank.
	Role, SignalsToHandle string
	VirtualLocalRank      bool
	// User is Config.User.
	User *proc.User
	// RendezvousStore, when set, wraps the store a Consul rendezvous runs on
	// (rendezvous.Config.WrapStore): a cluster job's step seals what it writes there.
	RendezvousStore func(store.Store) store.Store
	// Stdout, Stderr, Report, Log, GuardianArgv, Signals, Subreaper and Events are
	// handed to the supervisor's Config as they are.
	Stdout, Stderr, Report io.Writer
	Log                    *zap.Logger
	GuardianArgv           []string
	Signals                <-chan os.Signal
	Subreaper              bool
	Events                 event.Sink
}

// Prepared is a Spec resolved: the supervisor's Config, the node's rendezvous (opened:
// Close it when the run ends) and the node's inventory.
type Prepared struct {
	Config    Config
	Opened    *rendezvous.Opened
	Inventory *topology.Inventory
}

// Close leaves the rendezvous and releases what it holds (a Consul session).
func (p *Prepared) Close() {
	if p != nil && p.Opened != nil {
		p.Opened.Close()
	}
}

// Supervisor returns the supervisor of the prepared run (New with its Config and
// rendezvous); its errors are New's.
func (p *Prepared) Supervisor() (*Supervisor, error) {
	return New(p.Config, p.Opened.Rendezvous)
}

// Prepare checks spec and resolves it: it parses --nnodes, --restart-backoff and a
// wrapped torchrun (once: the Config carries it), reads or probes the node's topology,
// works out the workers per node and the devices they see, and opens the rendezvous on
// the coordinator. Every error is the user's to fix (gangrun exits 2 for it) and leaves
// nothing held.
func Prepare(ctx context.Context, spec Spec) (*Prepared, error) {
	ps, err := checkSpec(spec)
	if err != nil {
		return nil, err
	}
	getenv := getenvOf(spec)
	inv, devices, err := nodeDevices(ctx, spec, getenv)
	if err != nil {
		return nil, err
	}
	opened, err := rendezvous.Open(ctx, spec.Coordinator, rendezvous.Config{
		JobID: spec.JobID, NodeName: spec.NodeName, MinNodes: ps.nmin, MaxNodes: ps.nmax, NNodesGiven: spec.NNodesGiven,
		MaxRestarts: spec.MaxRestarts, AdvertiseAddr: spec.AdvertiseAddr, Getenv: getenv, Log: spec.logger(), Events: spec.Events,
		FollowRun: spec.FollowRun, WrapStore: spec.RendezvousStore,
	})
	if err != nil {
		return nil, err
	}
	p, err := resolve(ctx, spec, opened, inv, devices, ps.torch, ps.backoff, ps.cgMode)
	if err != nil {
		opened.Close()
		return nil, err
	}
	return p, nil
}

// parsedSpec holds what checkSpec parses from a Spec's flags.
type parsedSpec struct {
	backoff    Backoff     // --restart-backoff
	cgMode     cgroup.Mode // --cgroup
	nmin, nmax int         // --nnodes MIN[:MAX]
	torch      *Torchrun   // the wrapped torchrun; nil when the command is not one
}

// checkSpec checks spec's flags before anything is read or opened, in the order
// Prepare has always refused them (the first error is the one reported), and returns
// what it parsed.
func checkSpec(spec Spec) (ps parsedSpec, err error) {
	if err := checkSpecNames(spec); err != nil {
		return ps, err
	}
	if ps.backoff, err = ParseBackoff(spec.Backoff); err != nil {
		return ps, err
	}
	if _, err := topology.ParseCPUBind(spec.CPUBind); err != nil {
		return ps, err
	}
	if _, err := topology.ParseMemBind(spec.MemBind); err != nil {
		return ps, err
	}
	if _, err := topology.ParseNCCLTopo(spec.NCCLTopo); err != nil {
		return ps, err
	}
	if ps.cgMode, err = checkLimits(spec); err != nil {
		return ps, err
	}
	nnodes := spec.NNodes
	if nnodes == "" {
		nnodes = "1"
	}
	if ps.nmin, ps.nmax, err = ParseNNodes(nnodes); err != nil {
		return ps, err
	}
	if err := checkEndpoints(spec); err != nil {
		return ps, err
	}
	torch, isTorchrun, err := ParseTorchrun(spec.Command)
	if err != nil {
		return ps, err
	}
	if isTorchrun {
		ps.torch = torch
	}
	return ps, nil
}

// checkSpecNames refuses a Spec without a command, with a supervision the supervisor
// cannot honour, with a job id or node name that cannot name a file (a job id becomes
// a scratch directory's and a cgroup's name, so a bad one is refused before either is
// made), a negative --term-timeout, or --resume-arg without --checkpoint-dir.
func checkSpecNames(spec Spec) error {
	if len(spec.Command) == 0 {
		return errors.New("no command to run: give it after --, as in gangrun run -- python train.py")
	}
	if err := spec.Supervision.Check(); err != nil {
		return err
	}
	if spec.JobID != "" {
		if err := store.CheckSegment("--job-id", spec.JobID); err != nil {
			return err
		}
	}
	if spec.NodeName != "" {
		if err := store.CheckNodeName("--node-name", spec.NodeName); err != nil {
			return err
		}
	}
	if spec.TermTimeout < 0 {
		return fmt.Errorf("--term-timeout %s: must not be negative", spec.TermTimeout)
	}
	if spec.ResumeArg != "" && spec.CheckpointDir == "" {
		return fmt.Errorf("--resume-arg %s needs --checkpoint-dir (where gangrun finds the checkpoint to resume from)", spec.ResumeArg)
	}
	return nil
}

// checkLimits parses --cgroup and refuses a --mem or --pids-limit out of range, or a
// --mem without the cgroup that enforces it.
func checkLimits(spec Spec) (cgroup.Mode, error) {
	cgMode, err := cgroup.ParseMode(spec.Cgroup)
	if err != nil {
		return cgMode, err
	}
	switch {
	case spec.Mem < 0 || spec.Mem > cgroup.MaxMem:
		return cgMode, fmt.Errorf("--mem %d bytes: want 0 (no limit) to 1P", spec.Mem)
	case spec.PidsLimit < 0:
		return cgMode, fmt.Errorf("--pids-limit %d: want 0 (no limit) or more", spec.PidsLimit)
	case spec.PidsLimit > 0 && spec.PidsLimit < 16:
		return cgMode, fmt.Errorf("--pids-limit %d: a Python worker alone starts more threads than that; want 0 (no limit) or at least 16", spec.PidsLimit)
	case cgMode == cgroup.Off && spec.Mem > 0:
		return cgMode, fmt.Errorf("--mem %s needs the step's cgroup, and --cgroup is off", cgroup.FormatMem(spec.Mem))
	}
	return cgMode, nil
}

// checkEndpoints refuses a --master-port outside 0..65535, an --env entry that is
// malformed or names a variable given before, and an --advertise-addr that is not an
// IP address.
func checkEndpoints(spec Spec) error {
	if spec.MasterPort < 0 || spec.MasterPort > 65535 {
		return fmt.Errorf("--master-port %d: want 0..65535", spec.MasterPort)
	}
	given := map[string]string{}
	for _, kv := range spec.Env {
		if _, err := ParseEnvFlag(kv); err != nil {
			return err
		}
		name, _, _ := strings.Cut(kv, "=")
		if first, dup := given[name]; dup {
			return fmt.Errorf("--env %s given twice (%q and %q): give each variable once", name, first, kv)
		}
		given[name] = kv
	}
	if spec.AdvertiseAddr != "" && net.ParseIP(spec.AdvertiseAddr) == nil {
		return fmt.Errorf("--advertise-addr %q: want an IP address (the other nodes connect to it)", spec.AdvertiseAddr)
	}
	return nil
}

// nodeDevices reads the node's inventory (Spec.Inventory, else its topology file or a
// probe) and returns it with the devices the workers may be given: the allocatable
// ones, narrowed to a job step's (Spec.Devices) or a grant's (Spec.Grant, checked
// against the CUDA_VISIBLE_DEVICES getenv reads).
func nodeDevices(ctx context.Context, spec Spec, getenv func(string) string) (*topology.Inventory, []topology.Device, error) {
	inv := spec.Inventory
	if inv == nil {
		var err error
		if inv, err = topology.ForNode(ctx, spec.TopologyFile, spec.NodeName); err != nil {
			return nil, nil, err
		}
	}
	devices := inv.Allocatable()
	var err error
	if spec.Devices != nil {
		if devices, err = grantedDevices(devices, spec.Devices); err != nil {
			return nil, nil, err
		}
	}
	if spec.Grant != "" {
		if devices, err = inheritedDevices(devices, getenv("CUDA_VISIBLE_DEVICES"), spec.Grant); err != nil {
			return nil, nil, err
		}
	}
	return inv, devices, nil
}

// resolve completes Prepare once the rendezvous is open: workers per node, the devices
// they see, and the supervisor's Config.
func resolve(ctx context.Context, spec Spec, o *rendezvous.Opened, inv *topology.Inventory, devices []topology.Device,
	torch *Torchrun, backoff Backoff, cgMode cgroup.Mode) (*Prepared, error) {
	devices, userVisible := userDevices(spec, o, inv, devices)
	nproc, err := nprocOf(spec, o, devices, torch)
	if err != nil {
		return nil, err
	}
	var nccl []string
	for _, v := range inv.NCCLEnv() {
		nccl = append(nccl, v.String())
	}
	visible, err := visibleOf(spec, o, inv, devices, userVisible)
	if err != nil {
		return nil, err
	}
	environ := spec.Environ
	if environ == nil {
		environ = os.Environ()
	}
	if err := checkVirtualLocalRank(spec, environ, visible, nproc); err != nil {
		return nil, err
	}
	ranks, perRank, notes, err := planRanks(spec, o, inv, devices, nproc, torch != nil, visible != nil)
	if err != nil {
		return nil, err
	}
	if tf := topoFileOf(ranks); tf != "" {
		nccl = append(nccl, "NCCL_TOPO_FILE="+tf)
	}
	confine := confinement(spec, o, inv, devices, ranks, cgMode)
	if torch != nil {
		ranks = nil // torchrun starts the workers: node-wide settings only
	}
	warmDelay := spec.WarmDelay
	switch {
	case warmDelay == 0:
		warmDelay = DefaultWarmDelay
	case warmDelay < 0:
		warmDelay = 0
	}
	term := spec.TermTimeout
	if term == 0 {
		term = DefaultTermTimeout
	}
	cfg := Config{
		Command: spec.Command, Torchrun: torch, NProcPerNode: nproc, NNodesMin: o.MinNodes, NNodesMax: o.MaxNodes,
		MaxRestarts: spec.MaxRestarts, Backoff: backoff, NoRestartExitCode: spec.exitCode(), CheckpointDir: spec.CheckpointDir, ResumeArg: spec.ResumeArg,
		LogDir: spec.LogDir, Tee: spec.Tee, TermTimeout: term, HangTimeout: spec.HangTimeout,
		LocalRankArg: spec.LocalRankArg, MasterPort: spec.MasterPort, JobID: o.JobID,
		WarmRestarts: !spec.ColdRestarts, WarmImports: spec.WarmImports, WarmDelay: warmDelay, NoRestart: spec.NoRestart,
		NodeName: o.NodeName, Addr: o.Addr,
		// One node alone in its log directory: a rerun into it is refused before
		// anything starts. The nodes of a job (Consul, Slurm) share one.
		FreshLogDir: !o.Shared,
		Notes:       notes,
		Confine:     confine,
		Env: EnvConfig{Base: environ, Extra: spec.Env, NCCL: nccl, CUDAVisibleDevices: visible,
			Ranks: ranks, PerRankDevice: perRank, SocketIfname: socketIfname(spec),
			Role: spec.Role, SignalsToHandle: spec.SignalsToHandle, VirtualLocalRank: spec.VirtualLocalRank},
		Streams: spec.Streams, LogDirPerRun: spec.LogDirPerRun,
		Stdout: spec.Stdout, Stderr: spec.Stderr, Log: spec.Log, Report: spec.Report,
		GuardianArgv: spec.GuardianArgv, Subreaper: spec.Subreaper, Signals: spec.Signals, Events: spec.Events,
		User: spec.User,
	}
	if o.Store != nil {
		// The node's switch label, from its agent's registration, orders node ranks.
		if labels, err := allocator.NodeLabels(ctx, o.Store, o.NodeName); err == nil {
			cfg.Switch = labels[allocator.LabelSwitch]
		}
	}
	return &Prepared{Config: cfg, Opened: o, Inventory: inv}, nil
}

// userDevices narrows devices to those the user's own CUDA_VISIBLE_DEVICES shows, as
// it narrows what torchrun's workers see, and reports whether it did; not a grant's or
// a job step's devices (checked against the grant in Prepare), nor Slurm's, which sets
// the variable itself, nor on a node without GPUs, where it has nothing to narrow.
func userDevices(spec Spec, o *rendezvous.Opened, inv *topology.Inventory, devices []topology.Device) ([]topology.Device, bool) {
	value := getenvOf(spec)("CUDA_VISIBLE_DEVICES")
	if spec.Devices != nil || o.SetsDevices || len(inv.GPUs) == 0 || strings.TrimSpace(value) == "" {
		return devices, false
	}
	devices, userVisible, notes := visibleDevices(inv, devices, value)
	for _, n := range notes {
		spec.logger().Warn("CUDA_VISIBLE_DEVICES: "+n, zap.String("CUDA_VISIBLE_DEVICES", value))
	}
	spec.logger().Info("counting the devices CUDA_VISIBLE_DEVICES shows", zap.String("CUDA_VISIBLE_DEVICES", value), zap.Int("devices", len(devices)))
	return devices, userVisible
}

// nprocOf resolves the workers per node: --nproc-per-node (auto by default, cpu when
// Spec.AutoIsCPUs and no GPU is seen), or a wrapped torchrun's own --nproc_per_node
// when gangrun's was not given, counting the devices seen (the coordinator's count
// for this node when it gives one).
func nprocOf(spec Spec, o *rendezvous.Opened, devices []topology.Device, torch *Torchrun) (int, error) {
	gpusSeen := len(devices)
	if o.GPUsOnNode >= 0 && !spec.NProcGiven {
		gpusSeen = o.GPUsOnNode // what the coordinator gave this node (Slurm sets CUDA_VISIBLE_DEVICES)
	}
	nprocFlag := spec.NProcPerNode
	if nprocFlag == "" {
		nprocFlag = "auto"
	}
	if nprocFlag == "auto" && spec.AutoIsCPUs && gpusSeen == 0 {
		nprocFlag = "cpu"
	}
	nproc, err := ResolveNProcPerNode(nprocFlag, gpusSeen, runtime.NumCPU())
	if err != nil {
		return 0, err
	}
	if torch != nil {
		// A wrapped torchrun's own --nproc_per_node counts when gangrun's was not given.
		if v, given := torch.NProcPerNode(); given && !spec.NProcGiven {
			n, err := ResolveNProcPerNode(v, gpusSeen, runtime.NumCPU())
			if err != nil {
				return 0, fmt.Errorf("torchrun --nproc_per_node: %w", err)
			}
			nproc = n
		}
	}
	return nproc, nil
}

// visibleOf is the CUDA_VISIBLE_DEVICES gangrun sets on this node (chosenDevices), nil
// when the coordinator sets it for the step itself or the user's own names exactly the
// devices counted. An --env entry that sets it too is refused.
func visibleOf(spec Spec, o *rendezvous.Opened, inv *topology.Inventory, devices []topology.Device, userVisible bool) ([]string, error) {
	visible := chosenDevices(inv, devices, spec.Devices != nil)
	if o.SetsDevices || userVisible {
		return nil, nil
	}
	if visible != nil {
		for _, kv := range spec.Env {
			if strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
				return nil, fmt.Errorf("--env %s: gangrun sets CUDA_VISIBLE_DEVICES=%s on this node (the devices it can allocate: MIG instances, or the GPUs not failed); drop it",
					kv, strings.Join(visible, ","))
			}
		}
	}
	return visible, nil
}

// checkVirtualLocalRank refuses --virtual-local-rank with more workers (nproc) than
// the devices they see (visible, else CUDA_VISIBLE_DEVICES of the environment the
// workers get): torch refuses a local rank beyond them.
func checkVirtualLocalRank(spec Spec, environ, visible []string, nproc int) error {
	if !spec.VirtualLocalRank {
		return nil
	}
	list := visible
	if list == nil {
		if v := newEnvMap(environ, spec.Env)["CUDA_VISIBLE_DEVICES"]; v != "" {
			list = strings.Split(v, ",")
		}
	}
	if list != nil && nproc > len(list) {
		return fmt.Errorf("--virtual-local-rank with %d workers: CUDA_VISIBLE_DEVICES names %d devices, one for each local rank is needed", nproc, len(list))
	}
	return nil
}

// confinement is the step's cgroup (Config.Confine): its cpuset is the union of the
// ranks' CPU sets when every rank is bound, else every CPU gangrun may use; its
// devices rules deny the node's GPUs the workers are not given. Under Slurm (the
// coordinator sets the devices) and with --cgroup off there is none: Slurm's
// task/cgroup confines its steps itself.
func confinement(spec Spec, o *rendezvous.Opened, inv *topology.Inventory, devices []topology.Device,
	ranks []topology.RankPlan, mode cgroup.Mode) Confinement {
	c := Confinement{Mode: mode}
	if mode == cgroup.Off {
		return c
	}
	if o.SetsDevices && mode == cgroup.Auto {
		c.Mode, c.Why = cgroup.Off, "no cgroup of gangrun's: the coordinator runs the step (Slurm's task/cgroup confines it)"
		return c
	}
	var mine unix.CPUSet
	allowed := func(cpu int) bool { return true }
	if unix.SchedGetaffinity(0, &mine) == nil {
		allowed = func(cpu int) bool { return cpu >= 0 && cpu < len(mine)*64 && mine.IsSet(cpu) }
	}
	union := map[int]bool{}
	bound := len(ranks) > 0
	for _, r := range ranks {
		bound = bound && len(r.CPUs) > 0
		for _, cpu := range r.CPUs {
			if allowed(cpu) {
				union[cpu] = true
			}
		}
	}
	if !bound || len(union) == 0 {
		union = map[int]bool{}
		for cpu := range len(mine) * 64 {
			if mine.IsSet(cpu) {
				union[cpu] = true
			}
		}
	}
	c.Limits = cgroup.Limits{CPUs: slices.Sorted(maps.Keys(union)), MemoryBytes: spec.Mem, PidsLimit: spec.PidsLimit,
		Devices: cgroup.GPUDeviceRules(inv, devices)}
	return c
}

// getenvOf is spec's Getenv, os.Getenv when it has none.
func getenvOf(spec Spec) func(string) string {
	if spec.Getenv != nil {
		return spec.Getenv
	}
	return os.Getenv
}

// logger is spec's Log, a no-op logger when it has none.
func (spec Spec) logger() *zap.Logger {
	if spec.Log != nil {
		return spec.Log
	}
	return zap.NewNop()
}

// checkMaxRestarts is the one check of a restart budget: 0..MaxRestartsLimit.
func checkMaxRestarts(n int) error {
	if n < 0 || n > MaxRestartsLimit {
		return fmt.Errorf("--max-restarts %d: want 0 to %d", n, MaxRestartsLimit)
	}
	return nil
}

// grantedDevices narrows the node's allocatable devices to ids (a grant's), in ids'
// order; a device that is not allocatable here is an error naming it.
func grantedDevices(all []topology.Device, ids []string) ([]topology.Device, error) {
	byID := map[string]topology.Device{}
	for _, d := range all {
		byID[d.ID] = d
	}
	out := make([]topology.Device, 0, len(ids))
	for _, id := range ids {
		d, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("granted device %q is not an allocatable device of this node", id)
		}
		out = append(out, d)
	}
	return out, nil
}

// inheritedDevices narrows granted, the devices of grant, to those an inherited
// CUDA_VISIBLE_DEVICES names (by ID, or by UUID as CUDA takes it), in its order; unset
// or empty keeps them all. A device that is not granted is an error naming it.
func inheritedDevices(granted []topology.Device, visible, grant string) ([]topology.Device, error) {
	if strings.TrimSpace(visible) == "" {
		return granted, nil
	}
	ids := make([]string, len(granted))
	for i, d := range granted {
		ids[i] = d.ID
	}
	var out []topology.Device
	for _, v := range strings.Split(visible, ",") {
		v = strings.TrimSpace(v)
		i := slices.IndexFunc(granted, func(d topology.Device) bool {
			return v == d.ID || (d.UUID != "" && (v == d.UUID || "GPU-"+v == d.UUID))
		})
		if i < 0 {
			return nil, fmt.Errorf("CUDA_VISIBLE_DEVICES=%s: device %q is not granted to this node by grant %s (its devices: %s)",
				visible, v, grant, strings.Join(ids, ","))
		}
		if !slices.ContainsFunc(out, func(d topology.Device) bool { return d.ID == granted[i].ID }) {
			out = append(out, granted[i])
		}
	}
	return out, nil
}

// chosenDevices returns CUDA_VISIBLE_DEVICES when gangrun narrows what the workers see:
// a grant's devices (granted), or, when some GPU is failed or runs MIG, the allocatable
// devices in local-rank order; nil when every GPU is allocatable as a whole and nothing
// was granted (the workers see them all).
func chosenDevices(inv *topology.Inventory, devices []topology.Device, granted bool) []string {
	whole := true
	for _, d := range devices {
		whole = whole && d.MIGProfile == ""
	}
	if !granted && whole && len(devices) == len(inv.GPUs) {
		return nil
	}
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = d.ID
	}
	return ids
}

// planRanks works out what each local rank gets from the node's topology
// (topology.PlanRanks), with notes for the log: why ranks are not bound to CPUs, the
// NCCL_TOPO_FILE written. perRank is set
// when every worker gets its own CUDA_VISIBLE_DEVICES: gangrun chose the devices
// (chosen) and some is a MIG device; more workers than devices is then an error.
func planRanks(spec Spec, o *rendezvous.Opened, inv *topology.Inventory, devices []topology.Device, nproc int,
	torchrun, chosen bool) (ranks []topology.RankPlan, perRank bool, notes []string, err error) {
	bind, _ := topology.ParseCPUBind(spec.CPUBind)
	memBind, _ := topology.ParseMemBind(spec.MemBind)
	mode, _ := topology.ParseNCCLTopo(spec.NCCLTopo)
	perRank = chosen && topology.HasMIG(devices)
	if perRank && nproc > len(devices) {
		return nil, false, nil, fmt.Errorf("--nproc-per-node %d: this node has %d devices with MIG among them, and CUDA lets a process use one MIG device: run at most %d workers",
			nproc, len(devices), len(devices))
	}
	var note string
	switch {
	case bind == topology.CPUBindNone:
	case torchrun:
		bind, note = topology.CPUBindNone, "no CPU binding: the wrapped torchrun starts the workers (torch 2.9's torchrun has --numa-binding)"
	case o.SetsDevices:
		bind, note = topology.CPUBindNone, "no CPU binding: the coordinator chose the node's devices (Slurm binds with task/affinity)"
	}
	if note != "" {
		notes = append(notes, note)
	}
	topoFile := ""
	if len(inv.GPUs) > 0 && (mode == topology.NCCLTopoAlways || (mode == topology.NCCLTopoAuto && inv.FlatPCIe())) {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("gangrun-%d", os.Getuid()))
		if topoFile, err = inv.WriteNCCLTopoFile(dir); err != nil {
			notes = append(notes, "no NCCL_TOPO_FILE: "+err.Error())
			topoFile, err = "", nil
		} else {
			notes = append(notes, fmt.Sprintf("workers get NCCL_TOPO_FILE=%s (flat PCIe tree: %v)", topoFile, inv.FlatPCIe()))
		}
	}
	ranks, pn := inv.PlanRanks(topology.PlanOptions{Devices: devices, NProc: nproc, CPUBind: bind, MemBind: memBind, TopoFile: topoFile})
	return ranks, perRank, append(notes, pn...), nil
}

// topoFileOf returns the NCCL_TOPO_FILE of the plans; "" when none.
func topoFileOf(ranks []topology.RankPlan) string {
	for _, r := range ranks {
		for _, v := range r.NCCL {
			if v.Name == "NCCL_TOPO_FILE" {
				return v.Value
			}
		}
	}
	return ""
}

// socketIfname returns EnvConfig.SocketIfname: the interface holding --advertise-addr
// when given, else the one carrying the route to each attempt's MASTER_ADDR (cached per
// address); "" (NCCL_SOCKET_IFNAME keeps topology.SocketIfnameExclude) with one warning
// when none is found.
func socketIfname(spec Spec) func(string) string {
	var mu sync.Mutex
	cache := map[string]string{}
	return func(master string) string {
		target := master
		if spec.AdvertiseAddr != "" {
			target = spec.AdvertiseAddr
		}
		mu.Lock()
		defer mu.Unlock()
		if name, ok := cache[target]; ok {
			return name
		}
		name, err := topology.InterfaceFor(target)
		if err != nil {
			spec.logger().Warn("NCCL_SOCKET_IFNAME keeps " + topology.SocketIfnameExclude + ": " + err.Error())
		}
		cache[target] = name
		return name
	}
}

// RankEnvQuery is what `gangrun topo --nccl-env --rank N` asks about.
type RankEnvQuery struct {
	// LocalRank is the worker's local rank on the node.
	LocalRank int
	// NProcPerNode is --nproc-per-node ("" is "auto"), CPUBind --cpu-bind and
	// NCCLTopo --nccl-topo, as `gangrun run` reads them.
	NProcPerNode, CPUBind, NCCLTopo string
	// MasterAddr is the address NCCL_SOCKET_IFNAME is routed to; "" keeps
	// topology.SocketIfnameExclude.
	MasterAddr string
}

// RankEnv returns the variables `gangrun run` would give local rank q.LocalRank on the
// node of inv from its topology, as "NAME=value" lines: the NCCL settings, torch's
// async error handling, CUDA_VISIBLE_DEVICES when each worker gets its own (MIG), and
// OMP_NUM_THREADS and GANGRUN_CPUS when the rank is bound; notes say why it is not.
// Errors name the bad value.
func RankEnv(inv *topology.Inventory, q RankEnvQuery) (lines, notes []string, err error) {
	bind, err := topology.ParseCPUBind(q.CPUBind)
	if err != nil {
		return nil, nil, err
	}
	mode, err := topology.ParseNCCLTopo(q.NCCLTopo)
	if err != nil {
		return nil, nil, err
	}
	devices := inv.Allocatable()
	nprocFlag := q.NProcPerNode
	if nprocFlag == "" {
		nprocFlag = "auto"
	}
	nproc, err := ResolveNProcPerNode(nprocFlag, len(devices), runtime.NumCPU())
	if err != nil {
		return nil, nil, err
	}
	if q.LocalRank < 0 || q.LocalRank >= nproc {
		return nil, nil, fmt.Errorf("--rank %d: want 0..%d (the node runs %d workers)", q.LocalRank, nproc-1, nproc)
	}
	perRank := topology.HasMIG(devices) && chosenDevices(inv, devices, false) != nil
	topoFile := ""
	if len(inv.GPUs) > 0 && (mode == topology.NCCLTopoAlways || (mode == topology.NCCLTopoAuto && inv.FlatPCIe())) {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("gangrun-%d", os.Getuid()))
		if topoFile, err = inv.WriteNCCLTopoFile(dir); err != nil {
			return nil, nil, err
		}
	}
	ifname := ""
	if q.MasterAddr != "" {
		if ifname, err = topology.InterfaceFor(q.MasterAddr); err != nil {
			notes = append(notes, "NCCL_SOCKET_IFNAME keeps "+topology.SocketIfnameExclude+": "+err.Error())
		}
	}
	plans, pn := inv.PlanRanks(topology.PlanOptions{Devices: devices, NProc: nproc, CPUBind: bind, SocketIfname: ifname, TopoFile: topoFile})
	notes = append(notes, pn...)
	lines = plans[q.LocalRank].FormatRankEnv(perRank)
	lines = append(lines, "NCCL_ASYNC_ERROR_HANDLING=1", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1")
	return lines, notes, nil
}
