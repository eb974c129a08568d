package launcher

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/topology"
)

func loadInventory(t *testing.T, name string) *topology.Inventory {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestPrepareResolvesASpec: the workers per node follow the devices seen (all of an
// 8-GPU node; a grant's, in its order), a wrapped torchrun is parsed once into the
// Config, and the embedded coordinator gives a one-node run with a fresh log directory.
func TestPrepareResolvesASpec(t *testing.T) {
	h100 := loadInventory(t, "dgx-h100")
	for _, tc := range []struct {
		name        string
		spec        Spec
		nproc       int
		visible     []string
		torchrun    bool
		wantErr     string
		wantFresh   bool
		wantBackoff string
	}{
		{name: "whole node", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a"},
			nproc: 8, wantFresh: true, wantBackoff: "exponential 1s..30s"},
		{name: "a grant", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a", Devices: []string{"5", "2"}, Backoff: "0s"},
			nproc: 2, visible: []string{"5", "2"}, wantFresh: true, wantBackoff: "none"},
		{name: "torchrun", spec: Spec{Command: []string{"torchrun", "--nproc_per_node=4", "train.py"}, Inventory: h100, NodeName: "a"},
			nproc: 4, torchrun: true, wantFresh: true, wantBackoff: "exponential 1s..30s"},
		{name: "a device not on the node", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a", Devices: []string{"9"}},
			wantErr: `granted device "9" is not an allocatable device of this node`},
		{name: "restart budget", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, MaxRestarts: -1},
			wantErr: "--max-restarts -1: want 0 to 10000"},
		{name: "no command", spec: Spec{Inventory: h100}, wantErr: "no command to run"},
		{name: "resume arg alone", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, ResumeArg: "--resume"},
			wantErr: "--resume-arg --resume needs --checkpoint-dir"},
		{name: "two nodes on the embedded coordinator", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, NNodes: "2"},
			wantErr: "--nnodes 2 needs a coordinator shared by the nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Prepare(context.Background(), tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			c := p.Config
			if c.NProcPerNode != tc.nproc {
				t.Errorf("nproc %d, want %d", c.NProcPerNode, tc.nproc)
			}
			if strings.Join(c.Env.CUDAVisibleDevices, ",") != strings.Join(tc.visible, ",") {
				t.Errorf("CUDA_VISIBLE_DEVICES %v, want %v", c.Env.CUDAVisibleDevices, tc.visible)
			}
			if (c.Torchrun != nil) != tc.torchrun {
				t.Errorf("Config.Torchrun = %v, want parsed: %v", c.Torchrun, tc.torchrun)
			}
			if c.FreshLogDir != tc.wantFresh || c.Backoff.String() != tc.wantBackoff || c.TermTimeout != DefaultTermTimeout {
				t.Errorf("fresh %v backoff %s term %s", c.FreshLogDir, c.Backoff, c.TermTimeout)
			}
			if p.Opened.Backend != "embedded" || c.JobID != p.Opened.JobID || c.NodeName != "a" {
				t.Errorf("backend %s job %s node %s", p.Opened.Backend, c.JobID, c.NodeName)
			}
			if _, err := p.Supervisor(); tc.torchrun && err != nil && !strings.Contains(err.Error(), "torchrun") {
				t.Errorf("Supervisor: %v", err)
			}
		})
	}
}

// TestPrepareCountsTheGPUsCUDAVisibleDevicesShows: on a recorded 8-GPU node, the user's
// own CUDA_VISIBLE_DEVICES narrows what `--nproc-per-node auto` counts, as torchrun's
// auto (torch.cuda.device_count()) does: by index or UUID, up to the first entry that
// names no device (CUDA ignores it and the rest; "-1" hides every GPU). The user's
// variable reaches the workers unchanged, unless it names a GPU gangrun does not hand
// out (failed): then gangrun names the rest. A grant's devices, Slurm's (which sets the
// variable itself) and a node without GPUs are not narrowed this way.
func TestPrepareCountsTheGPUsCUDAVisibleDevicesShows(t *testing.T) {
	h100 := loadInventory(t, "dgx-h100")
	failed := loadInventory(t, "dgx-h100")
	failed.GPUs[1].Health.State = topology.Failed
	cpu := loadInventory(t, "cpu-only")
	slurm := map[string]string{"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "a",
		"SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURMD_NODENAME": "a", "SLURM_TASKS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "4"}
	for _, tc := range []struct {
		name    string
		inv     *topology.Inventory
		env     map[string]string
		devices []string
		nproc   int
		visible []string
	}{
		{name: "unset: every GPU", inv: h100, nproc: 8},
		{name: "two indices", inv: h100, env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}, nproc: 2},
		{name: "a UUID, with and without GPU-", inv: h100, env: map[string]string{"CUDA_VISIBLE_DEVICES": h100.GPUs[5].UUID + "," + strings.TrimPrefix(h100.GPUs[6].UUID, "GPU-")}, nproc: 2},
		{name: "an unknown entry ends the list", inv: h100, env: map[string]string{"CUDA_VISIBLE_DEVICES": "3,9,4"}, nproc: 1},
		{name: "-1 hides every GPU", inv: h100, env: map[string]string{"CUDA_VISIBLE_DEVICES": "-1"}, nproc: 1},
		{name: "a failed GPU is left out", inv: failed, env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2"}, nproc: 2, visible: []string{"0", "2"}},
		{name: "a grant is not narrowed here", inv: h100, env: map[string]string{"CUDA_VISIBLE_DEVICES": "0"}, devices: []string{"4", "5"}, nproc: 2, visible: []string{"4", "5"}},
		{name: "no GPUs: nothing to narrow", inv: cpu, env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}, nproc: 1},
		{name: "Slurm counts its own", inv: h100, env: mergeEnv(slurm, map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}), nproc: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := Spec{Command: []string{"/bin/true"}, Inventory: tc.inv, NodeName: "a", Devices: tc.devices,
				Getenv: func(k string) string { return tc.env[k] }}
			p, err := Prepare(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.Config.NProcPerNode != tc.nproc {
				t.Errorf("nproc %d, want %d", p.Config.NProcPerNode, tc.nproc)
			}
			if got := strings.Join(p.Config.Env.CUDAVisibleDevices, ","); got != strings.Join(tc.visible, ",") || (tc.visible == nil) != (p.Config.Env.CUDAVisibleDevices == nil) {
				t.Errorf("gangrun's CUDA_VISIBLE_DEVICES %q (nil %v), want %q", got, p.Config.Env.CUDAVisibleDevices == nil, tc.visible)
			}
		})
	}
}

func mergeEnv(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}
