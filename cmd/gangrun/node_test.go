package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/topology"
)

// TestTopoNCCLEnvRankGolden: `gangrun topo --nccl-env --rank N` on the recorded
// inventories prints every local rank's NCCL settings, device (MIG) and CPU share,
// compared with testdata/topo-rank/<inventory>.rank<N> (-update rewrites them).
func TestTopoNCCLEnvRankGolden(t *testing.T) {
	for _, c := range []struct {
		fixture string
		ranks   []string
	}{
		{"dgx-h100", []string{"0", "3", "4", "7"}},
		{"dgx-a100", []string{"0", "1", "6"}},
		{"dgx-a100-mig", []string{"0", "1", "2", "8"}},
		{"pcie-2socket", []string{"0", "1", "2", "3"}},
	} {
		for _, r := range c.ranks {
			t.Run(c.fixture+".rank"+r, func(t *testing.T) {
				stdout, stderr, code := runCLI(t, "topo", "--topology-file", filepath.Join(inventories, c.fixture+".json"),
					"--nccl-env", "--rank", r, "--master-addr", "127.0.0.1")
				if code != exitOK || stderr != "" {
					t.Fatalf("exit %d, stderr %q", code, stderr)
				}
				golden := filepath.Join("testdata", "topo-rank", c.fixture+".rank"+r)
				if *update {
					if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatal(err)
				}
				if stdout != string(want) {
					t.Errorf("differs from %s:\n%s", golden, stdout)
				}
			})
		}
	}
}

// TestNodeFlagErrors: bad --cpu-bind, --nccl-topo and --rank values are one-line usage
// errors naming the value (exit 2).
func TestNodeFlagErrors(t *testing.T) {
	h100 := filepath.Join(inventories, "dgx-h100.json")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"topo", "--topology-file", h100, "--nccl-env", "--rank", "8"}, `gangrun topo: --rank 8: want 0..7 (the node runs 8 workers)`},
		{[]string{"topo", "--topology-file", h100, "--nccl-env", "--rank", "0", "--cpu-bind", "socket"}, `gangrun topo: --cpu-bind "socket": want numa or none`},
		{[]string{"topo", "--topology-file", h100, "--rank", "0"}, `gangrun topo: --rank 0 needs --nccl-env`},
		{[]string{"run", "--topology-file", h100, "--cpu-bind", "cores", "--", "true"}, `gangrun run: --cpu-bind "cores": want numa or none`},
		{[]string{"run", "--topology-file", h100, "--nccl-topo", "yes", "--", "true"}, `gangrun run: --nccl-topo "yes": want auto, always or never`},
	} {
		_, stderr, code := runCLI(t, c.args...)
		if code != exitUsage || strings.TrimSpace(stderr) != c.want {
			t.Errorf("%v: exit %d, stderr %q; want 2, %q", c.args, code, stderr, c.want)
		}
	}
}

// twoCPUInventory writes an inventory shaped like a 2-CPU test machine: one NUMA node
// with CPUs 0-1 and two GPUs on it, so two workers share the node one CPU each.
func twoCPUInventory(t *testing.T) string {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join(inventories, "cpu-only.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv.NUMANodes = []topology.NUMANode{{ID: 0, Socket: 0, CPUs: "0-1"}}
	inv.CPU.LogicalCPUs = 2
	for i, bus := range []string{"0000:00:05.0", "0000:00:06.0"} {
		inv.GPUs = append(inv.GPUs, topology.GPU{Index: i, UUID: "GPU-0000000" + string(rune('0'+i)) + "-0000-0000-0000-000000000000",
			Name: "Test GPU", PCIBusID: bus, NUMANode: 0, CPUAffinity: "0-1", ComputeCapability: "9.0",
			Health: topology.Health{State: topology.Healthy}, NICs: []string{}})
	}
	inv.GPULinks = []topology.GPULink{{A: 0, B: 1, Level: topology.LevelPHB}}
	b, err := inv.JSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "two-cpu.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunBindsWorkersToCPUs runs two workers on an inventory shaped like this machine
// and reads each worker's Cpus_allowed_list from /proc/self/status: one CPU each with
// --cpu-bind numa (the default), both with --cpu-bind none.
func TestRunBindsWorkersToCPUs(t *testing.T) {
	var allowed unixCPUs
	if !allowed.twoOrMore() {
		t.Skip("needs CPUs 0 and 1")
	}
	inv := twoCPUInventory(t)
	worker := `grep Cpus_allowed_list /proc/self/status; echo "omp=$OMP_NUM_THREADS cpus=$GANGRUN_CPUS"`
	re := regexp.MustCompile(`\[rank(\d)\]: (Cpus_allowed_list:\s*(\S+)|omp=(\S*) cpus=(\S*))`)
	for _, c := range []struct {
		bind string
		want map[string]string // rank → allowed, omp, cpus
	}{
		{"numa", map[string]string{"0": "0 1 0", "1": "1 1 1"}},
		{"none", map[string]string{"0": "0-1 1 ", "1": "0-1 1 "}},
	} {
		t.Run(c.bind, func(t *testing.T) {
			mark := testMark(t)
			res := runGangrun(t, []string{mark}, "run", "--topology-file", inv, "--cpu-bind", c.bind, "--", "sh", "-c", worker)
			if res.code != 0 {
				t.Fatalf("exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
			}
			got := map[string][]string{}
			for _, m := range re.FindAllStringSubmatch(res.stdout+res.stderr, -1) {
				if m[3] != "" {
					got[m[1]] = append([]string{m[3]}, got[m[1]]...)
				} else {
					got[m[1]] = append(got[m[1]], m[4], m[5])
				}
			}
			for r, w := range c.want {
				if g := strings.Join(got[r], " "); g != w {
					t.Errorf("rank %s: allowed, OMP_NUM_THREADS, GANGRUN_CPUS = %q, want %q\n%s%s", r, g, w, res.stdout, res.stderr)
				}
			}
		})
	}
}

// unixCPUs checks the test process may use CPUs 0 and 1.
type unixCPUs struct{}

func (unixCPUs) twoOrMore() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	m := regexp.MustCompile(`Cpus_allowed_list:\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		return false
	}
	cpus, _ := topology.ParseCPUList(string(m[1]))
	return len(cpus) >= 2 && cpus[0] == 0 && cpus[1] == 1
}

// TestRunBindsWorkersMemory runs two workers on an inventory shaped like this machine
// (its one NUMA node, 0) and reads each worker's memory policy from the first line of
// its own /proc/self/numa_maps: numactl's preferred on node 0 with --mem-bind local (the
// default), bind with strict, the default policy with none or when the worker is not
// bound to CPUs (--cpu-bind none).
func TestRunBindsWorkersMemory(t *testing.T) {
	inv := twoCPUInventory(t)
	re := regexp.MustCompile(`\[rank(\d)\]: \S+ (\S+) `)
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{nil, "prefer:0"},
		{[]string{"--mem-bind", "strict"}, "bind:0"},
		{[]string{"--mem-bind", "none"}, "default"},
		{[]string{"--cpu-bind", "none"}, "default"},
	} {
		t.Run(strings.Join(append([]string{"flags"}, c.flags...), " "), func(t *testing.T) {
			mark := testMark(t)
			args := append(append([]string{"run", "--topology-file", inv, "--nproc-per-node", "2"}, c.flags...), "--", "head", "-n", "1", "/proc/self/numa_maps")
			res := runGangrun(t, []string{mark}, args...)
			if res.code != 0 {
				t.Fatalf("exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
			}
			got := map[string]string{}
			for _, m := range re.FindAllStringSubmatch(res.stdout, -1) {
				got[m[1]] = m[2]
			}
			if got["0"] != c.want || got["1"] != c.want {
				t.Errorf("memory policy by rank %v, want %s for both\n%s%s", got, c.want, res.stdout, res.stderr)
			}
		})
	}
}

// TestWarmStartedRankIsBound: a rank started from a warm standby (attempt 1; the
// standby was started before its rank was known) runs bound as a cold one does: every
// one of its threads on its CPU (the standby's own threads, torch's pools among them,
// bound at activation), and its memory policy numactl's preferred on node 0.
func TestWarmStartedRankIsBound(t *testing.T) {
	var allowed unixCPUs
	if !allowed.twoOrMore() {
		t.Skip("needs CPUs 0 and 1")
	}
	inv := twoCPUInventory(t)
	script := filepath.Join(t.TempDir(), "w.py")
	if err := os.WriteFile(script, []byte(`import os, sys
tasks = sorted(os.listdir("/proc/self/task"))
cpus = set()
for t in tasks:
    for line in open("/proc/self/task/%s/status" % t):
        if line.startswith("Cpus_allowed_list:"):
            cpus.add(line.split()[1])
policy = open("/proc/self/numa_maps").readline().split()[1]
print("attempt", os.environ["GANGRUN_ATTEMPT"], "threads", len(tasks), "cpus", ",".join(sorted(cpus)), "policy", policy, flush=True)
sys.exit(3 if os.environ["GANGRUN_ATTEMPT"] == "0" else 0)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := testMark(t)
	res := runGangrun(t, []string{mark}, "run", "--topology-file", inv, "--nproc-per-node", "2", "--max-restarts", "1",
		"--restart-backoff", "0s", "--warm-delay", "0s", "--", python(t), script)
	if res.code != 0 || !strings.Contains(res.stderr, `"attempt": 1, "warm": 2, "cold": 0`) {
		t.Fatalf("exit %d, or attempt 1 not warm\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	re := regexp.MustCompile(`\[rank(\d)\]: attempt (\d) threads (\d+) cpus (\S+) policy (\S+)`)
	warm := 0 // attempt 0's lines may be cut short by the other rank's failure
	for _, m := range re.FindAllStringSubmatch(res.stdout, -1) {
		if m[2] == "1" {
			warm++
		}
		if m[4] != m[1] || m[5] != "prefer:0" {
			t.Errorf("rank %s, attempt %s (%s threads): CPUs %s, policy %s; want CPU %s and prefer:0", m[1], m[2], m[3], m[4], m[5], m[1])
		}
	}
	if warm != 2 {
		t.Errorf("%d lines from attempt 1's ranks, want 2\n%s", warm, res.stdout)
	}
}
