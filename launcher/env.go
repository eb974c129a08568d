package launcher

import (
	"cmp"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/rendezvous"
	"github.com/gangrun/gangrun/topology"
)

// RoleName is the worker role gangrun reports (ROLE_NAME) unless the torchrun form's
// --role names another: torchrun's default role, "default" (torch/distributed/run.py,
// --role).
const RoleName = "default"

// DefaultSignalsToHandle is TORCHELASTIC_SIGNALS_TO_HANDLE: the signals on which the
// launcher stops the workers, which torchrun 2.x puts in its own environment and so in
// every worker's (torch/distributed/launcher/api.py; its --signals-to-handle default).
// gangrun stops the gang on the same four (SIGUSR1 and SIGUSR2 it forwards only).
const DefaultSignalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

// DisableAgentStoreEnv, set to 1 in the workers' environment, makes node rank 0's
// worker of rank 0 host the gang's store instead of gangrun (TORCHELASTIC_USE_AGENT_STORE
// False): torch's own opt-out of torchrun's agent store
// (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, use_agent_store).
const DisableAgentStoreEnv = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

// EnvConfig is the node-wide input of the worker environment.
type EnvConfig struct {
	// Base is the environment gangrun inherited, as "KEY=VALUE" entries (os.Environ()).
	Base []string
	// Extra holds the --env KEY=VALUE entries; they override Base.
	Extra []string
	// NCCL holds this node's NCCL_* settings from its topology ("KEY=VALUE"). Each is
	// applied only when neither Base nor Extra sets that variable: the user's own
	// NCCL_* always win.
	NCCL []string
	// CUDAVisibleDevices lists the GPUs gangrun chose for this node (indices or UUIDs),
	// in local-rank order; nil when gangrun did not choose (every GPU is visible).
	CUDAVisibleDevices []string
	// Ranks holds, per local rank, what the node's topology gives the worker
	// (topology.PlanRanks): its NCCL_* defaults (used instead of NCCL), its device and
	// its CPU set. Nil for a wrapped torchrun, which starts the workers itself.
	Ranks []topology.RankPlan
	// PerRankDevice gives each worker CUDA_VISIBLE_DEVICES naming its own device only
	// (Ranks[i].Device): set on a node with MIG devices, since CUDA lets one process
	// use one MIG device.
	PerRankDevice bool
	// SocketIfname, when set, returns the interface for NCCL_SOCKET_IFNAME ("=name")
	// given an attempt's MASTER_ADDR; "" keeps the topology's value.
	SocketIfname func(masterAddr string) string
	// MaxRestarts is the restart budget (TORCHELASTIC_MAX_RESTARTS).
	MaxRestarts int
	// NodeName is this node's name (GANGRUN_NODE_NAME).
	NodeName string
	// CheckpointDir is --checkpoint-dir (GANGRUN_CHECKPOINT_DIR); "" when not given.
	CheckpointDir string
	// AgentStore is TORCHELASTIC_USE_AGENT_STORE: node rank 0's gangrun serves the gang's
	// TCPStore at MASTER_ADDR:MASTER_PORT, as torchrun 2.x's agent does, and every
	// worker is its client. The supervisor sets it (UsesAgentStore).
	AgentStore bool
	// Role is ROLE_NAME; "" is RoleName.
	Role string
	// SignalsToHandle is TORCHELASTIC_SIGNALS_TO_HANDLE; "" is DefaultSignalsToHandle.
	SignalsToHandle string
	// VirtualLocalRank is torchrun's --virtual-local-rank: every worker gets LOCAL_RANK 0
	// and CUDA_VISIBLE_DEVICES naming its own device only, the local-rank-th of the
	// devices the node's workers see, else the local rank itself
	// (torch/distributed/elastic/agent/server/local_elastic_agent.py,
	// _set_local_rank_env).
	VirtualLocalRank bool
}

// UsesAgentStore reports whether gangrun serves the workers' store
// (TORCHELASTIC_USE_AGENT_STORE True): unless the workers' environment sets
// DisableAgentStoreEnv to 1, as torch's dynamic rendezvous reads it.
func (c EnvConfig) UsesAgentStore() bool {
	return newEnvMap(c.Base, c.Extra)[DisableAgentStoreEnv] != "1"
}

// reservedVar reports whether name is set by gangrun for every worker, so --env may not
// set it: torchrun's worker contract (torch/distributed/elastic/agent/server/
// local_elastic_agent.py, _start_workers) plus gangrun's own GANGRUN_* variables.
func reservedVar(name string) bool {
	switch name {
	case "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
		"WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
		"MASTER_ADDR", "MASTER_PORT",
		"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
		"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE":
		return true
	}
	return strings.HasPrefix(name, "GANGRUN_")
}

// ParseEnvFlag checks one --env KEY=VALUE entry: KEY must be a valid variable name and
// not one gangrun sets per worker. It returns the entry unchanged.
func ParseEnvFlag(kv string) (string, error) {
	name, _, ok := strings.Cut(kv, "=")
	if !ok {
		return "", fmt.Errorf("--env %q: want KEY=VALUE", kv)
	}
	if !validName(name) {
		return "", fmt.Errorf("--env %q: %q is not a valid variable name", kv, name)
	}
	if reservedVar(name) {
		return "", fmt.Errorf("--env %q: %s is set by gangrun for every worker", kv, name)
	}
	return kv, nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// consulCredential reports whether name is one of the Consul client's credentials that
// consul/api reads from the environment (api.go: HTTPTokenEnvName, HTTPTokenFileEnvName,
// HTTPAuthEnvName, HTTPClientCert, HTTPClientKey): an ACL token, a file holding one,
// HTTP basic-auth user:password, and the client certificate and key of mutual TLS.
// gangrun removes them from every worker's environment: training code has no business
// with the cluster's credentials. The rest of CONSUL_* (CONSUL_HTTP_ADDR,
// CONSUL_HTTP_SSL, CONSUL_HTTP_SSL_VERIFY, CONSUL_CACERT, CONSUL_CAPATH,
// CONSUL_TLS_SERVER_NAME, CONSUL_NAMESPACE, CONSUL_PARTITION, CONSUL_GRPC_*) says where
// Consul is and which CA to trust, grants nothing, and is kept.
func consulCredential(name string) bool {
	switch name {
	case "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_AUTH", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY":
		return true
	}
	return false
}

// envMap is an environment under construction.
type envMap map[string]string

func newEnvMap(entries ...[]string) envMap {
	m := envMap{}
	for _, list := range entries {
		for _, kv := range list {
			if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
				m[k] = v
			}
		}
	}
	return m
}

func (m envMap) setDefault(k, v string) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

// list returns the environment as sorted "KEY=VALUE" entries.
func (m envMap) list() []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// nodeEnv sets what every process gangrun starts on this node gets, worker or torchrun.
// The Consul credentials inherited from gangrun's environment are left out; one given
// with --env (Extra) is kept.
func nodeEnv(c EnvConfig, a rendezvous.Assignment, nccl []string) envMap {
	m := newEnvMap(c.Base)
	for k := range m {
		if consulCredential(k) {
			delete(m, k)
		}
	}
	for k, v := range newEnvMap(c.Extra) {
		m[k] = v
	}
	ifname := ""
	if c.SocketIfname != nil {
		ifname = c.SocketIfname(a.MasterAddr)
	}
	for _, kv := range nccl {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if k == "NCCL_SOCKET_IFNAME" && ifname != "" {
				v = "=" + ifname
			}
			m.setDefault(k, v)
		}
	}
	// torch 2.x reads TORCH_NCCL_ASYNC_ERROR_HANDLING, torch 1.x NCCL_ASYNC_ERROR_HANDLING:
	// both get the user's value of either, else "1".
	asyncEH := "1"
	if v, ok := m["NCCL_ASYNC_ERROR_HANDLING"]; ok {
		asyncEH = v
	}
	if v, ok := m["TORCH_NCCL_ASYNC_ERROR_HANDLING"]; ok {
		asyncEH = v
	}
	m.setDefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", asyncEH)
	m.setDefault("NCCL_ASYNC_ERROR_HANDLING", asyncEH)
	if c.CUDAVisibleDevices != nil {
		m["CUDA_VISIBLE_DEVICES"] = strings.Join(c.CUDAVisibleDevices, ",")
		m["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
	}
	m["GANGRUN_JOB_ID"] = a.JobID
	m["GANGRUN_NODE_NAME"] = c.NodeName
	m["GANGRUN_ATTEMPT"] = strconv.Itoa(a.Round)
	delete(m, "GANGRUN_CHECKPOINT_DIR")
	if c.CheckpointDir != "" {
		m["GANGRUN_CHECKPOINT_DIR"] = c.CheckpointDir
	}
	delete(m, "GANGRUN_RESUME_FROM")
	if a.ResumeFrom != "" {
		m["GANGRUN_RESUME_FROM"] = a.ResumeFrom
	}
	return m
}

// pythonBool writes b as Python's str(bool) does, which torch compares against
// (torch/distributed/rendezvous.py: == str(True)).
func pythonBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// WorkerEnv returns the complete environment of the worker at localRank on this node,
// as sorted "KEY=VALUE" entries: torchrun's worker contract exactly (the variables and
// values of torch/distributed/elastic/agent/server/local_elastic_agent.py and
// torch/distributed/run.py) plus GANGRUN_JOB_ID, GANGRUN_NODE_NAME, GANGRUN_ATTEMPT,
// GANGRUN_CHECKPOINT_DIR and GANGRUN_RESUME_FROM (the last two only when set), over the
// inherited environment less the Consul credentials (CONSUL_HTTP_TOKEN,
// CONSUL_HTTP_TOKEN_FILE, CONSUL_HTTP_AUTH, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY) unless
// --env gives them.
//
//   - TORCHELASTIC_USE_AGENT_STORE is "True" when gangrun serves the store (AgentStore),
//     as torchrun 2.x's agent does, else "False"; TORCHELASTIC_SIGNALS_TO_HANDLE is
//     torchrun 2.x's list (SignalsToHandle), ROLE_NAME its role (Role);
//   - TORCH_NCCL_ASYNC_ERROR_HANDLING and torch 1.x's NCCL_ASYNC_ERROR_HANDLING keep an
//     inherited value of either, else "1";
//   - OMP_NUM_THREADS, when unset, is the size of the worker's CPU share when it is
//     bound (GANGRUN_CPUS then names the share), else "1" when the node runs more than
//     one worker;
//   - NCCL_* come from the rank's plan (else the node's topology) unless the user set
//     them; NCCL_SOCKET_IFNAME is "=" + the interface SocketIfname finds for the
//     attempt's MASTER_ADDR;
//   - CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID only when gangrun chose
//     the GPUs; with PerRankDevice (MIG) it names the worker's own device only.
//
// errorFile is the worker's TORCHELASTIC_ERROR_FILE.
func WorkerEnv(c EnvConfig, a rendezvous.Assignment, localRank int, errorFile string) []string {
	nccl := c.NCCL
	var plan *topology.RankPlan
	if localRank >= 0 && localRank < len(c.Ranks) {
		plan = &c.Ranks[localRank]
		nccl = make([]string, len(plan.NCCL))
		for i, v := range plan.NCCL {
			nccl[i] = v.String()
		}
	}
	m := nodeEnv(c, a, nccl)
	delete(m, "GANGRUN_CPUS")
	if plan != nil {
		if c.PerRankDevice && plan.Device != nil && c.CUDAVisibleDevices != nil {
			m["CUDA_VISIBLE_DEVICES"] = plan.Device.ID
		}
		if plan.CPUs != nil {
			m.setDefault("OMP_NUM_THREADS", strconv.Itoa(len(plan.CPUs)))
			m["GANGRUN_CPUS"] = topology.FormatCPUList(plan.CPUs)
		}
	}
	lws := a.LocalWorldSize
	rank := a.RankOffset + localRank
	world := a.WorldSize
	m["RANK"] = strconv.Itoa(rank)
	m["LOCAL_RANK"] = strconv.Itoa(localRank)
	m["GROUP_RANK"] = strconv.Itoa(a.NodeRank)
	m["ROLE_RANK"] = strconv.Itoa(rank)
	m["ROLE_NAME"] = cmp.Or(c.Role, RoleName)
	m["LOCAL_WORLD_SIZE"] = strconv.Itoa(lws)
	m["WORLD_SIZE"] = strconv.Itoa(world)
	m["GROUP_WORLD_SIZE"] = strconv.Itoa(a.NNodes)
	m["ROLE_WORLD_SIZE"] = strconv.Itoa(world)
	if c.VirtualLocalRank {
		m["LOCAL_RANK"] = "0"
		device := strconv.Itoa(localRank)
		if list, ok := m["CUDA_VISIBLE_DEVICES"]; ok {
			if ids := strings.Split(list, ","); localRank < len(ids) {
				device = strings.TrimSpace(ids[localRank])
			}
		}
		m["CUDA_VISIBLE_DEVICES"] = device
	}
	m["MASTER_ADDR"] = a.MasterAddr
	m["MASTER_PORT"] = strconv.Itoa(a.MasterPort)
	m["TORCHELASTIC_RESTART_COUNT"] = strconv.Itoa(a.RestartCount)
	m["TORCHELASTIC_MAX_RESTARTS"] = strconv.Itoa(c.MaxRestarts)
	m["TORCHELASTIC_RUN_ID"] = a.JobID
	m["TORCHELASTIC_USE_AGENT_STORE"] = pythonBool(c.AgentStore)
	m["TORCHELASTIC_ERROR_FILE"] = errorFile
	m["TORCHELASTIC_SIGNALS_TO_HANDLE"] = cmp.Or(c.SignalsToHandle, DefaultSignalsToHandle)
	if lws > 1 {
		m.setDefault("OMP_NUM_THREADS", "1")
	}
	return m.list()
}

// TorchrunEnv returns the environment of a wrapped torchrun process: the node-wide part
// of WorkerEnv (NCCL_*, CUDA_*, GANGRUN_*, no Consul credentials unless --env gives
// them) and TORCHELASTIC_ERROR_FILE, into which
// torchrun's @record main copies its root-cause worker's error. The per-worker variables
// are left to torchrun, which sets them for its own workers; any inherited from
// gangrun's environment are removed so they cannot confuse it.
func TorchrunEnv(c EnvConfig, a rendezvous.Assignment, errorFile string) []string {
	m := nodeEnv(c, a, c.NCCL)
	for _, k := range []string{"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
		"WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
		"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
		"TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
		"TORCHELASTIC_SIGNALS_TO_HANDLE"} {
		delete(m, k)
	}
	m["TORCHELASTIC_ERROR_FILE"] = errorFile
	return m.list()
}
