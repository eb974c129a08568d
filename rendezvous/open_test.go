package rendezvous

import (
	"context"
	"strings"
	"testing"
)

func TestOpenChoosesTheBackend(t *testing.T) {
	slurmEnv := map[string]string{"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]",
		"SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4"}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name        string
		coordinator string
		cfg         Config
		env         map[string]string
		backend     string
		job, node   string
		nodes       int
		shared      bool
		gpus        int
		wantErr     string
	}{
		{name: "default is embedded", cfg: Config{NodeName: "a"}, backend: "embedded", node: "a", nodes: 1, gpus: -1},
		{name: "default under srun is slurm", env: slurmEnv, backend: "slurm", job: "77", node: "n2", nodes: 2, shared: true, gpus: 4},
		{name: "slurm with a job id of its own", coordinator: "slurm", cfg: Config{JobID: "mine"}, env: slurmEnv,
			backend: "slurm", job: "mine", node: "n2", nodes: 2, shared: true, gpus: 4},
		{name: "consul", coordinator: "consul://127.0.0.1:8500", cfg: Config{JobID: "j", NodeName: "a", MinNodes: 1, MaxNodes: 3},
			backend: "consul", job: "j", node: "a", nodes: 3, shared: true, gpus: -1},
		{name: "c10d on this machine", coordinator: "c10d://127.0.0.1:0", cfg: Config{NodeName: "a"},
			backend: "c10d", job: "none", node: "a", nodes: 1, gpus: -1},
		{name: "c10d with a job id", coordinator: "c10d://localhost:0", cfg: Config{JobID: "j7", NodeName: "a"},
			backend: "c10d", job: "j7", node: "a", nodes: 1, gpus: -1},
		{name: "c10d, a key torchrun's has and gangrun cannot honour", coordinator: "c10d://127.0.0.1:0?keep_alive_max_attempt=3",
			wantErr: "keep_alive_max_attempt: cannot be honoured"},
		{name: "embedded with two nodes", coordinator: "embedded", cfg: Config{MinNodes: 2, MaxNodes: 2}, wantErr: "--nnodes 2 needs a coordinator shared by the nodes"},
		{name: "consul without a job id", coordinator: "consul://127.0.0.1:8500", wantErr: "needs --job-id"},
		{name: "consul without a port", coordinator: "consul://127.0.0.1", cfg: Config{JobID: "j"}, wantErr: "want consul://HOST:PORT"},
		{name: "unknown coordinator", coordinator: "etcd://x:1", wantErr: `--coordinator "etcd://x:1": want embedded, slurm, consul://HOST:PORT, c10d://HOST:PORT or static://HOST:PORT?node_rank=N`},
		{name: "bad job id", cfg: Config{JobID: "a/b"}, wantErr: `--job-id "a/b"`},
		{name: "bad node name", cfg: Config{NodeName: "my node"}, wantErr: `--node-name "my node"`},
		{name: "slurm with --nnodes in conflict", coordinator: "slurm", cfg: Config{MinNodes: 3, MaxNodes: 3, NNodesGiven: true}, env: slurmEnv,
			wantErr: "--nnodes 3 conflicts with the Slurm allocation's 2 nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Getenv = env(tc.env)
			o, err := Open(context.Background(), tc.coordinator, cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !IsUsage(err) {
					t.Fatalf("err = %v, want a usage error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			if o.Backend != tc.backend || o.NodeName != tc.node || o.MaxNodes != tc.nodes || o.Shared != tc.shared || o.GPUsOnNode != tc.gpus {
				t.Errorf("opened %+v, want backend %s node %s nodes %d shared %v gpus %d", o, tc.backend, tc.node, tc.nodes, tc.shared, tc.gpus)
			}
			if tc.job != "" && o.JobID != tc.job {
				t.Errorf("job %q, want %q", o.JobID, tc.job)
			}
			if tc.job == "" && !strings.HasPrefix(o.JobID, "gr-") {
				t.Errorf("generated job id %q, want gr-…", o.JobID)
			}
			if (o.Store != nil) != (tc.backend == "consul" || tc.backend == "c10d") {
				t.Errorf("store %v for backend %s", o.Store, tc.backend)
			}
			if o.SetsDevices != (tc.backend == "slurm") {
				t.Errorf("SetsDevices %v for backend %s", o.SetsDevices, tc.backend)
			}
		})
	}
}
