package launcher

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/gangrun/gangrun/rendezvous"
	"github.com/gangrun/gangrun/topology"
)

// envOf turns "KEY=VALUE" entries into a map, failing on duplicates.
func envOf(t *testing.T, entries []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range entries {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("malformed entry %q", kv)
		}
		if _, dup := m[k]; dup {
			t.Fatalf("duplicate variable %s", k)
		}
		m[k] = v
	}
	return m
}

func TestWorkerEnvOneWorker(t *testing.T) {
	a := rendezvous.Assignment{
		JobID: "job-1", Round: 0, RestartCount: 0, NodeRank: 0,
		NNodes: 1, LocalWorldSize: 1, WorldSize: 1, RankOffset: 0,
		MasterAddr: "127.0.0.1", MasterPort: 29500,
	}
	c := EnvConfig{Base: []string{"PATH=/usr/bin", "HOME=/root"}, MaxRestarts: 3, NodeName: "n0", AgentStore: true}
	got := envOf(t, WorkerEnv(c, a, 0, "/tmp/e/error.json"))
	want := map[string]string{
		"PATH": "/usr/bin", "HOME": "/root",
		"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0", "ROLE_NAME": "default",
		"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "1",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
		"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3",
		"TORCHELASTIC_RUN_ID": "job-1", "TORCHELASTIC_USE_AGENT_STORE": "True",
		"TORCHELASTIC_ERROR_FILE":         "/tmp/e/error.json",
		"TORCHELASTIC_SIGNALS_TO_HANDLE":  "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		"NCCL_ASYNC_ERROR_HANDLING":       "1", // torch 1.x's name
		"GANGRUN_JOB_ID":                  "job-1", "GANGRUN_NODE_NAME": "n0", "GANGRUN_ATTEMPT": "0",
		// One worker: OMP_NUM_THREADS stays unset (torch/distributed/run.py sets it only
		// for nproc_per_node > 1).
	}
	assertEnv(t, got, want)
}

func TestWorkerEnvFourWorkersSecondNode(t *testing.T) {
	// Node rank 1 of two nodes with 4 workers each, third attempt after two failures,
	// resuming, with topology NCCL settings of which the user overrides one.
	a := rendezvous.Assign([]rendezvous.Member{
		{Node: "a", Addr: "10.0.0.1", LocalWorldSize: 4},
		{Node: "b", Addr: "10.0.0.2", LocalWorldSize: 4},
	}, 1)
	a.JobID, a.Round, a.RestartCount = "llm", 3, 2
	a.MasterAddr, a.MasterPort, a.ResumeFrom = "10.0.0.1", 41000, "/ckpt/step-120"
	c := EnvConfig{
		Base: []string{"PATH=/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3", "NCCL_SOCKET_IFNAME=eth9",
			"RANK=99", "GANGRUN_RESUME_FROM=/stale"},
		Extra:              []string{"FOO=bar", "NCCL_DEBUG=WARN"},
		NCCL:               []string{"NCCL_IB_HCA==mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME=^lo,docker", "NCCL_DEBUG=INFO"},
		CUDAVisibleDevices: []string{"4", "5", "6", "7"},
		MaxRestarts:        5, NodeName: "b", CheckpointDir: "/ckpt",
		Role: "trainer", SignalsToHandle: "SIGTERM", // the torchrun form's --role and --signals-to-handle
	}
	for lr := 0; lr < 4; lr++ {
		got := envOf(t, WorkerEnv(c, a, lr, "/logs/err.json"))
		rank := 4 + lr
		want := map[string]string{
			"PATH": "/bin", "FOO": "bar",
			"RANK": strconv.Itoa(rank), "LOCAL_RANK": strconv.Itoa(lr), "GROUP_RANK": "1", "ROLE_RANK": strconv.Itoa(rank),
			"ROLE_NAME": "trainer", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
			"GROUP_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "8",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "41000",
			"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "5",
			"TORCHELASTIC_RUN_ID": "llm", "TORCHELASTIC_USE_AGENT_STORE": "False",
			"TORCHELASTIC_ERROR_FILE":         "/logs/err.json",
			"TORCHELASTIC_SIGNALS_TO_HANDLE":  "SIGTERM",
			"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", // kept
			"NCCL_ASYNC_ERROR_HANDLING":       "3", // torch 1.x's name follows it
			"OMP_NUM_THREADS":                 "1",
			"CUDA_VISIBLE_DEVICES":            "4,5,6,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
			"NCCL_IB_HCA":        "=mlx5_0:1,mlx5_1:1", // from topology
			"NCCL_SOCKET_IFNAME": "eth9",               // the user's wins over topology
			"NCCL_DEBUG":         "WARN",               // --env wins over topology
			"GANGRUN_JOB_ID":     "llm", "GANGRUN_NODE_NAME": "b", "GANGRUN_ATTEMPT": "3",
			"GANGRUN_CHECKPOINT_DIR": "/ckpt", "GANGRUN_RESUME_FROM": "/ckpt/step-120",
		}
		assertEnv(t, got, want)
	}
}

func TestWorkerEnvKeepsUserOMPAndDropsStaleResume(t *testing.T) {
	a := rendezvous.Assignment{JobID: "j", NNodes: 1, LocalWorldSize: 2, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1}
	c := EnvConfig{Base: []string{"OMP_NUM_THREADS=8", "GANGRUN_RESUME_FROM=/old", "GANGRUN_CHECKPOINT_DIR=/old"}}
	got := envOf(t, WorkerEnv(c, a, 1, "e"))
	if got["OMP_NUM_THREADS"] != "8" {
		t.Errorf("OMP_NUM_THREADS = %q, want the user's 8", got["OMP_NUM_THREADS"])
	}
	for _, k := range []string{"GANGRUN_RESUME_FROM", "GANGRUN_CHECKPOINT_DIR", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s = %q, want unset", k, v)
		}
	}
}

func TestTorchrunEnvLeavesPerWorkerVariablesToTorchrun(t *testing.T) {
	a := rendezvous.Assignment{JobID: "j", Round: 1, NNodes: 1, LocalWorldSize: 4, WorldSize: 4, MasterAddr: "127.0.0.1", MasterPort: 5}
	c := EnvConfig{Base: []string{"RANK=3", "WORLD_SIZE=9", "PATH=/bin"}, NCCL: []string{"NCCL_DEBUG=INFO"}, NodeName: "n"}
	got := envOf(t, TorchrunEnv(c, a, "/e.json"))
	want := map[string]string{"PATH": "/bin", "NCCL_DEBUG": "INFO", "TORCHELASTIC_ERROR_FILE": "/e.json",
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "1",
		"GANGRUN_JOB_ID": "j", "GANGRUN_NODE_NAME": "n", "GANGRUN_ATTEMPT": "1"}
	assertEnv(t, got, want)
}

func TestParseEnvFlag(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantErr string
	}{
		{"FOO=bar", ""},
		{"FOO=", ""},
		{"FOO=a=b", ""},
		{"NCCL_DEBUG=INFO", ""},
		{"FOO", "want KEY=VALUE"},
		{"=x", "not a valid variable name"},
		{"1FOO=x", "not a valid variable name"},
		{"FO-O=x", "not a valid variable name"},
		{"RANK=3", "RANK is set by gangrun"},
		{"MASTER_PORT=1", "MASTER_PORT is set by gangrun"},
		{"GANGRUN_ATTEMPT=1", "GANGRUN_ATTEMPT is set by gangrun"},
	} {
		_, err := ParseEnvFlag(tc.in)
		if tc.wantErr == "" && err != nil {
			t.Errorf("ParseEnvFlag(%q) = %v, want ok", tc.in, err)
		}
		if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("ParseEnvFlag(%q) = %v, want error containing %q", tc.in, err, tc.wantErr)
		}
	}
}

func assertEnv(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected variable %s=%q", k, v)
		}
	}
}

// TestConsulCredentialsStayOut: the Consul client's credentials gangrun inherited do
// not reach workers or a wrapped torchrun, unless --env gives them; the variables that
// only say where Consul is are kept. The names are checked against consul/api's own.
func TestConsulCredentialsStayOut(t *testing.T) {
	credentials := []string{api.HTTPTokenEnvName, api.HTTPTokenFileEnvName, api.HTTPAuthEnvName, api.HTTPClientCert, api.HTTPClientKey}
	kept := []string{api.HTTPAddrEnvName, api.HTTPSSLEnvName, api.HTTPSSLVerifyEnvName, api.HTTPCAFile, api.HTTPCAPath,
		api.HTTPTLSServerName, api.HTTPNamespaceEnvName, api.HTTPPartitionEnvName, api.GRPCAddrEnvName}
	var base []string
	for _, k := range append(append([]string{}, credentials...), kept...) {
		base = append(base, k+"=inherited")
	}
	a := rendezvous.Assignment{JobID: "j", NNodes: 1, LocalWorldSize: 1, WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 1}
	for _, tc := range []struct {
		name  string
		extra []string
		want  map[string]string // credential -> value; absent: not in the environment
	}{
		{"inherited", nil, map[string]string{}},
		{"given with --env", []string{"CONSUL_HTTP_TOKEN=given"}, map[string]string{"CONSUL_HTTP_TOKEN": "given"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := EnvConfig{Base: base, Extra: tc.extra}
			for what, env := range map[string]map[string]string{
				"worker":   envOf(t, WorkerEnv(c, a, 0, "/e")),
				"torchrun": envOf(t, TorchrunEnv(c, a, "/e")),
			} {
				for _, k := range credentials {
					v, ok := env[k]
					want, wantOK := tc.want[k]
					if ok != wantOK || v != want {
						t.Errorf("%s: %s = %q (set %v), want %q (set %v)", what, k, v, ok, want, wantOK)
					}
				}
				for _, k := range kept {
					if env[k] != "inherited" {
						t.Errorf("%s: %s = %q, want it kept", what, k, env[k])
					}
				}
			}
		})
	}
}

// TestWorkerEnvRankPlan: a rank's plan gives its NCCL settings (the user's still win),
// its own MIG device, OMP_NUM_THREADS from its CPU share unless set, GANGRUN_CPUS, and
// NCCL_SOCKET_IFNAME from the route to the attempt's master.
func TestWorkerEnvRankPlan(t *testing.T) {
	a := rendezvous.Assignment{JobID: "j", NNodes: 1, LocalWorldSize: 2, WorldSize: 2, MasterAddr: "10.1.2.3", MasterPort: 1}
	mig := topology.Device{ID: "MIG-aaaa", GPU: 0, MIGProfile: "3g.40gb"}
	c := EnvConfig{
		Base:               []string{"NCCL_IB_HCA=mlx5_9"},
		CUDAVisibleDevices: []string{"MIG-aaaa", "1"},
		PerRankDevice:      true,
		Ranks: []topology.RankPlan{
			{LocalRank: 0, Device: &mig, CPUs: []int{0, 1, 4},
				NCCL: []topology.EnvVar{{Name: "NCCL_IB_HCA", Value: "=mlx5_0:1"}, {Name: "NCCL_SOCKET_IFNAME", Value: topology.SocketIfnameExclude}}},
			{LocalRank: 1, Device: &topology.Device{ID: "1", GPU: 1},
				NCCL: []topology.EnvVar{{Name: "NCCL_TOPO_FILE", Value: "/t.xml"}, {Name: "NCCL_SOCKET_IFNAME", Value: topology.SocketIfnameExclude}}},
		},
		SocketIfname: func(m string) string {
			if m != "10.1.2.3" {
				t.Errorf("SocketIfname(%q)", m)
			}
			return "ens7"
		},
	}
	r0 := envOf(t, WorkerEnv(c, a, 0, "e"))
	assertSome(t, r0, map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-aaaa", "OMP_NUM_THREADS": "3", "GANGRUN_CPUS": "0-1,4",
		"NCCL_IB_HCA": "mlx5_9", "NCCL_SOCKET_IFNAME": "=ens7"})
	r1 := envOf(t, WorkerEnv(c, a, 1, "e"))
	assertSome(t, r1, map[string]string{"CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "1", "NCCL_TOPO_FILE": "/t.xml", "NCCL_SOCKET_IFNAME": "=ens7"})
	if v, ok := r1["GANGRUN_CPUS"]; ok {
		t.Errorf("unbound rank has GANGRUN_CPUS=%s", v)
	}
}

func assertSome(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

// BenchmarkNodePlan8 is the launch cost this node layer adds for 8 ranks on the
// recorded DGX H100: the ranks' plan (CPU shares, NCCL settings) and their 8
// environments (os.Environ() as the base).
func BenchmarkNodePlan8(b *testing.B) {
	inv, err := topology.LoadFile("../topology/testdata/inventories/dgx-h100.json")
	if err != nil {
		b.Fatal(err)
	}
	a := rendezvous.Assignment{JobID: "j", NNodes: 1, LocalWorldSize: 8, WorldSize: 8, MasterAddr: "127.0.0.1", MasterPort: 1}
	devices := inv.Allocatable()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plans, _ := inv.PlanRanks(topology.PlanOptions{Devices: devices, NProc: 8})
		c := EnvConfig{Base: os.Environ(), Ranks: plans, SocketIfname: func(string) string { return "eth0" }}
		for lr := 0; lr < 8; lr++ {
			WorkerEnv(c, a, lr, "e")
		}
	}
}
