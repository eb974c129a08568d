package rendezvous

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/gangrun/gangrun/hostlist"
)

// Slurm master ports: MASTER_PORT is derived from the job id so that every node of an
// allocation computes the same one without talking: SlurmPortBase + (job id mod
// SlurmPortRange). Ports 20000..29999 sit below the usual Linux ephemeral range
// (32768..60999), so a client socket rarely holds one.
const (
	SlurmPortBase  = 20000
	SlurmPortRange = 10000
)

// SlurmEnv is what gangrun reads of the environment srun gives each task (Slurm's
// sbatch/srun "OUTPUT ENVIRONMENT VARIABLES").
type SlurmEnv struct {
	// JobID is SLURM_JOB_ID.
	JobID string
	// Nodes are SLURM_JOB_NODELIST expanded, in Slurm's order (node rank order).
	Nodes []string
	// NodeID is SLURM_NODEID: this node's index in Nodes.
	NodeID int
	// TasksPerNode is SLURM_TASKS_PER_NODE expanded per node ("2(x3),1" → 2,2,2,1).
	TasksPerNode []int
	// GPUsOnNode is SLURM_GPUS_ON_NODE, or the number of ids in SLURM_STEP_GPUS; -1 when
	// neither is set.
	GPUsOnNode int
	// StepID is SLURM_STEP_ID ("" outside srun).
	StepID string
}

// InSlurmStep reports whether getenv shows a task launched by srun: SLURM_JOB_ID and
// SLURM_STEP_ID are both set (an sbatch script alone sets only the job's variables).
func InSlurmStep(getenv func(string) string) bool {
	return getenv("SLURM_JOB_ID") != "" && getenv("SLURM_STEP_ID") != ""
}

// ReadSlurmEnv parses the Slurm variables. Errors name the variable and its value.
func ReadSlurmEnv(getenv func(string) string) (SlurmEnv, error) {
	var e SlurmEnv
	e.JobID = getenv("SLURM_JOB_ID")
	if e.JobID == "" {
		return e, fmt.Errorf("SLURM_JOB_ID is not set: run gangrun under srun, or use another --coordinator")
	}
	list := getenv("SLURM_JOB_NODELIST")
	if list == "" {
		list = getenv("SLURM_NODELIST")
	}
	nodes, err := hostlist.Expand(list)
	if err != nil {
		return e, fmt.Errorf("SLURM_JOB_NODELIST=%q: %w", list, err)
	}
	if len(nodes) == 0 {
		return e, fmt.Errorf("SLURM_JOB_NODELIST is empty")
	}
	e.Nodes = nodes
	if n := getenv("SLURM_NNODES"); n != "" {
		if v, err := strconv.Atoi(n); err != nil || v != len(nodes) {
			return e, fmt.Errorf("SLURM_NNODES=%q does not match SLURM_JOB_NODELIST (%d hosts)", n, len(nodes))
		}
	}
	id := getenv("SLURM_NODEID")
	e.NodeID, err = strconv.Atoi(id)
	if err != nil || e.NodeID < 0 || e.NodeID >= len(nodes) {
		return e, fmt.Errorf("SLURM_NODEID=%q: want 0..%d", id, len(nodes)-1)
	}
	if t := getenv("SLURM_TASKS_PER_NODE"); t != "" {
		e.TasksPerNode, err = ParseTasksPerNode(t)
		if err != nil {
			return e, err
		}
	}
	e.GPUsOnNode = -1
	if g := getenv("SLURM_GPUS_ON_NODE"); g != "" {
		if e.GPUsOnNode, err = strconv.Atoi(g); err != nil || e.GPUsOnNode < 0 {
			return e, fmt.Errorf("SLURM_GPUS_ON_NODE=%q: want a count", g)
		}
	} else if g := getenv("SLURM_STEP_GPUS"); g != "" {
		e.GPUsOnNode = len(strings.Split(g, ","))
	}
	e.StepID = getenv("SLURM_STEP_ID")
	return e, nil
}

// ParseTasksPerNode expands SLURM_TASKS_PER_NODE: comma-separated counts, each
// optionally repeated with "(xN)": "2(x3),1" → [2 2 2 1].
func ParseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		count, rep := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			count, rep = part[:i], part[i+2:len(part)-1]
		}
		c, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 0 || r < 1 || r > 1<<20 {
			return nil, fmt.Errorf("SLURM_TASKS_PER_NODE=%q: bad part %q (want N or N(xM))", s, part)
		}
		for i := 0; i < r; i++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// SlurmMasterPort derives MASTER_PORT from the Slurm job id (any string id hashes).
func SlurmMasterPort(jobID string) int {
	if n, err := strconv.ParseUint(jobID, 10, 64); err == nil {
		return SlurmPortBase + int(n%SlurmPortRange)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(jobID))
	return SlurmPortBase + int(h.Sum32()%SlurmPortRange)
}

// Static is the rendezvous of a Slurm allocation without any shared service: the layout
// is fixed by the SLURM_* variables, identical on every node. MASTER_ADDR is the first
// host of the nodelist, MASTER_PORT is derived from the job id (or given), node rank is
// SLURM_NODEID, and every node runs the same number of workers.
//
// Without a shared service there is no gang-wide agreement after a failure: each node
// restarts on its own when its workers fail, and the others follow because their
// workers fail too when a peer's collective connections drop (gloo at once; NCCL after
// its timeout, with TORCH_NCCL_ASYNC_ERROR_HANDLING=1). Restart counts are per node,
// membership is fixed (no elasticity), and the resume checkpoint is chosen by each node
// from the shared checkpoint directory. Use the Consul coordinator for gang-wide
// restarts within seconds, elasticity, and one resume choice for all.
type Static struct {
	env         SlurmEnv
	jobID       string
	maxRestarts int
	// master is MASTER_ADDR: "" is the first node of the nodelist.
	master   string
	mu       sync.Mutex
	round    int
	failures int
	// storeRound is node rank 0's restart count read from its store for this node's
	// last attempt (JoinRequest.StoreRound), -1 before the first.
	storeRound int
}

// NewStatic returns the static rendezvous for a Slurm step; jobID is the gangrun job id
// (TORCHELASTIC_RUN_ID), typically the Slurm job id; maxRestarts is this node's restart
// budget (each node counts its own failures).
func NewStatic(env SlurmEnv, jobID string, maxRestarts int) *Static {
	return &Static{env: env, jobID: jobID, maxRestarts: maxRestarts, storeRound: -1}
}

// Join returns this node's fixed part. The master port is req.MasterPort, else derived
// from the Slurm job id. On a node other than node rank 0, with req.StoreRound, it
// first waits for node rank 0's store of a newer attempt than this node's last, and
// the restart count is node rank 0's (JoinRequest.StoreRound).
func (s *Static) Join(ctx context.Context, req JoinRequest) (Round, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.LocalWorldSize < 1 {
		return nil, fmt.Errorf("join: local world size %d: must be at least 1", req.LocalWorldSize)
	}
	members := make([]Member, len(s.env.Nodes))
	for i, n := range s.env.Nodes {
		members[i] = Member{Node: n, Addr: n, LocalWorldSize: req.LocalWorldSize}
	}
	port := req.MasterPort
	if port == 0 {
		port = SlurmMasterPort(s.env.JobID)
	}
	master := s.master
	if master == "" {
		master = s.env.Nodes[0]
	}
	restarts := -1
	if s.env.NodeID != 0 && req.StoreRound != nil {
		s.mu.Lock()
		after := s.storeRound
		s.mu.Unlock()
		n, err := req.StoreRound(ctx, net.JoinHostPort(master, strconv.Itoa(port)), after)
		if err != nil {
			return nil, err
		}
		restarts = n
	}
	resume, err := req.chooseResume(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := Assign(members, s.env.NodeID)
	a.JobID, a.Round, a.RestartCount, a.Nodes = s.jobID, s.round, s.failures, members
	if restarts >= 0 {
		a.RestartCount, s.storeRound = restarts, restarts
	}
	a.MasterAddr, a.MasterPort, a.ResumeFrom = master, port, resume
	s.round++
	return newSoloRound(a, s.countFailure), nil
}

// countFailure counts a local failure; the other nodes learn of it only through their
// workers.
func (s *Static) countFailure() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures++
	return s.failures > s.maxRestarts
}

// slurm is the static rendezvous of a Slurm job step (Static).
type slurm struct{}

func (slurm) name() string { return "slurm" }

func (slurm) claims(c string) bool { return c == "slurm" }

func (slurm) open(_ context.Context, _ string, cfg Config) (*Opened, error) {
	env, err := ReadSlurmEnv(cfg.Getenv)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	if len(env.TasksPerNode) > env.NodeID && env.TasksPerNode[env.NodeID] > 1 {
		return nil, usage("SLURM_TASKS_PER_NODE=%s: run one gangrun per node (srun --ntasks-per-node=1); gangrun starts the workers", cfg.Getenv("SLURM_TASKS_PER_NODE"))
	}
	n := len(env.Nodes)
	if cfg.NNodesGiven && (cfg.MinNodes != n || cfg.MaxNodes != n) {
		return nil, usage("--nnodes %s conflicts with the Slurm allocation's %d nodes (SLURM_JOB_NODELIST)", nnodesString(cfg.MinNodes, cfg.MaxNodes), n)
	}
	job := cfg.JobID
	if job == "" {
		job = env.JobID
	}
	name := cfg.NodeName
	if name == "" {
		name = env.Nodes[env.NodeID]
	}
	node, err := nodeName(name)
	if err != nil {
		return nil, err
	}
	return &Opened{Rendezvous: NewStatic(env, job, cfg.MaxRestarts), JobID: job, NodeName: node, MinNodes: n, MaxNodes: n,
		Addr: cfg.AdvertiseAddr, Shared: true, GPUsOnNode: env.GPUsOnNode, SetsDevices: true}, nil
}

// TorchrunStaticPort is MASTER_PORT of torchrun's static rendezvous when --master-port
// is not given (torch/distributed/run.py: 29500).
const TorchrunStaticPort = 29500

// torchrunStatic is torchrun's static rendezvous (its default backend, with --nnodes N,
// --node-rank R, --master-addr and --master-port): "static://MASTER_ADDR:PORT?node_rank=R"
// with --nnodes N. The layout is fixed by the command lines, as under Slurm (Static):
// node rank R, MASTER_ADDR:PORT where node rank 0 (which must be that machine) serves
// the workers' store, no shared service, each node restarting on its own.
type torchrunStatic struct{}

func (torchrunStatic) name() string { return "static" }

func (torchrunStatic) claims(c string) bool { return strings.HasPrefix(c, "static://") }

func (torchrunStatic) open(_ context.Context, coordinator string, cfg Config) (*Opened, error) {
	u, err := url.Parse(coordinator)
	if err != nil || u.Hostname() == "" || u.Path != "" && u.Path != "/" || u.User != nil {
		return nil, usage("coordinator %q: want static://MASTER_ADDR:PORT?node_rank=N", coordinator)
	}
	port := TorchrunStaticPort
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return nil, usage("coordinator %q: port %q: want 1..65535", coordinator, p)
		}
	}
	if cfg.MinNodes != cfg.MaxNodes {
		return nil, usage("--nnodes %s: torchrun's static rendezvous has a fixed number of nodes", nnodesString(cfg.MinNodes, cfg.MaxNodes))
	}
	rank, err := strconv.Atoi(u.Query().Get("node_rank"))
	if err != nil || rank < 0 || rank >= cfg.MaxNodes {
		return nil, usage("--node-rank %s: want 0..%d (--nnodes %d)", u.Query().Get("node_rank"), cfg.MaxNodes-1, cfg.MaxNodes)
	}
	master := u.Hostname()
	if rank == 0 && !IsLocalHost(master) {
		return nil, usage("--master-addr %s with --node-rank 0: node rank 0 serves the workers' store at the master address, and %s is not this machine", master, master)
	}
	job := cfg.JobID
	if job == "" {
		job = C10dJobID // torchrun's run id of the static rendezvous: "none"
	}
	node, err := nodeName(cfg.NodeName)
	if err != nil {
		return nil, err
	}
	nodes := make([]string, cfg.MaxNodes)
	for i := range nodes {
		nodes[i] = "node" + strconv.Itoa(i)
	}
	nodes[0], nodes[rank] = master, node
	if rank == 0 {
		nodes[0] = master
	}
	env := SlurmEnv{JobID: job, Nodes: nodes, NodeID: rank, GPUsOnNode: -1}
	st := NewStatic(env, job, cfg.MaxRestarts)
	st.master = master
	return &Opened{Rendezvous: &masterAt{s: st, port: port}, JobID: job, NodeName: node,
		MinNodes: cfg.MaxNodes, MaxNodes: cfg.MaxNodes, Addr: cfg.AdvertiseAddr, Shared: true, GPUsOnNode: -1}, nil
}

// masterAt is a Static whose master is a given address and port (torchrun's
// --master-addr and --master-port: the Static's master, and port) rather than the
// first node's name and a port of the job id.
type masterAt struct {
	s    *Static
	port int
}

// Join implements Rendezvous.
func (m *masterAt) Join(ctx context.Context, req JoinRequest) (Round, error) {
	if req.MasterPort == 0 {
		req.MasterPort = m.port
	}
	return m.s.Join(ctx, req)
}
