package launcher

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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
		{name: "a grant", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a", Devices: []string{"5", "2"}, Supervision: Supervision{Backoff: "0s"}},
			nproc: 2, visible: []string{"5", "2"}, wantFresh: true, wantBackoff: "none"},
		{name: "torchrun", spec: Spec{Command: []string{"torchrun", "--nproc_per_node=4", "train.py"}, Inventory: h100, NodeName: "a"},
			nproc: 4, torchrun: true, wantFresh: true, wantBackoff: "exponential 1s..30s"},
		{name: "a device not on the node", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a", Devices: []string{"9"}},
			wantErr: `granted device "9" is not an allocatable device of this node`},
		{name: "restart budget", spec: Spec{Command: []string{"/bin/true"}, Inventory: h100, Supervision: Supervision{MaxRestarts: -1}},
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

// TestPrepareConfinement: the step's cgroup a spec gets from Prepare — a grant's other
// GPUs denied by their minor numbers, the cpuset the union of the bound ranks' CPUs
// that this process may use (else all it may use), --mem and --pids-limit as given,
// none under --cgroup off — and the spec errors of --mem and --pids-limit.
func TestPrepareConfinement(t *testing.T) {
	h100 := loadInventory(t, "dgx-h100")
	mine := ownCPUs(t)
	p, err := Prepare(context.Background(), Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a",
		Devices: []string{"0", "5"}, Mem: 4 << 30, PidsLimit: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := p.Config.Confine
	var denied []string
	for _, r := range c.Limits.Devices {
		denied = append(denied, r.String())
	}
	if c.Mode != "auto" || c.Limits.MemoryBytes != 4<<30 || c.Limits.PidsLimit != 100 ||
		strings.Join(denied, ",") != "deny c 195:1 rwm,deny c 195:2 rwm,deny c 195:3 rwm,deny c 195:4 rwm,deny c 195:6 rwm,deny c 195:7 rwm" {
		t.Errorf("confinement %+v, devices %v", c, denied)
	}
	// GPUs 0 and 5 sit on NUMA nodes 0 (CPUs 0-55,112-167) and 1 (56-111,168-223): the
	// ranks' shares, narrowed to this process's CPUs; all of those when none is left.
	var want []int
	for _, cpu := range mine {
		if cpu < 224 {
			want = append(want, cpu)
		}
	}
	if len(want) == 0 {
		want = mine
	}
	if topology.FormatCPUList(c.Limits.CPUs) != topology.FormatCPUList(want) {
		t.Errorf("cpuset %v, want %v", c.Limits.CPUs, want)
	}
	p2, err := Prepare(context.Background(), Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a", Cgroup: "off"})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if p2.Config.Confine.Mode != "off" || len(p2.Config.Confine.Limits.CPUs) != 0 {
		t.Errorf("--cgroup off: %+v", p2.Config.Confine)
	}
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Cgroup: "yes"}, `--cgroup "yes": want off, auto or required`},
		{Spec{Mem: -1}, "--mem -1 bytes: want 0 (no limit) to 1P"},
		{Spec{Mem: 1 << 30, Cgroup: "off"}, "--mem 1G needs the step's cgroup, and --cgroup is off"},
		{Spec{PidsLimit: 3}, "--pids-limit 3: a Python worker alone starts more threads than that"},
	} {
		tc.spec.Command, tc.spec.Inventory = []string{"/bin/true"}, h100
		if _, err := Prepare(context.Background(), tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// ownCPUs returns the CPUs this process may run on.
func ownCPUs(t *testing.T) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var out []int
	for cpu := range len(set) * 64 {
		if set.IsSet(cpu) {
			out = append(out, cpu)
		}
	}
	return out
}
