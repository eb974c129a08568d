package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/gangrun/gangrun/internal/consultest"
)

// smiRecordings are nvidia-smi outputs collected from public issues and guides
// (topology/testdata/nvidia-smi/README.md names each source).
const smiRecordings = "../../topology/testdata/nvidia-smi"

// TestTopoNvidiaSMIRecording: `gangrun topo --topology-file` on what nvidia-smi topo -m
// printed on an HGX H100 (8 GPUs, NV18, 12 NICs; kvcache-ai/Mooncake#2039) and a DGX
// A100-like node (stas00/ml-engineering): the matrix, the JSON, the node's NCCL
// environment and a rank's, compared with testdata/topo-smi/ (-update rewrites them).
func TestTopoNvidiaSMIRecording(t *testing.T) {
	for _, c := range []struct {
		file string
		rank string
	}{
		{"hgx-h100-12nic-sglang-spaces.txt", "5"},
		{"a100-8gpu-numa-spaces.txt", "6"},
	} {
		path := filepath.Join(smiRecordings, c.file)
		for _, m := range []struct {
			ext  string
			args []string
		}{
			{"txt", nil},
			{"json", []string{"--json"}},
			{"env", []string{"--nccl-env"}},
			{"rank" + c.rank, []string{"--nccl-env", "--rank", c.rank, "--master-addr", "127.0.0.1"}},
		} {
			t.Run(c.file+"."+m.ext, func(t *testing.T) {
				stdout, stderr, code := runCLI(t, append([]string{"topo", "--topology-file", path}, m.args...)...)
				if code != exitOK || stderr != "" {
					t.Fatalf("exit %d, stderr %q", code, stderr)
				}
				golden := filepath.Join("testdata", "topo-smi", strings.TrimSuffix(c.file, ".txt")+"."+m.ext)
				if *update {
					if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (go test ./cmd/gangrun -run TestTopoNvidiaSMIRecording -update)", err)
				}
				if stdout != string(want) {
					t.Errorf("differs from %s:\n%s", golden, stdout)
				}
			})
		}
	}
	// What the text lacks, said where it matters: no NCCL_IB_HCA without port state, a
	// rank bound to its GPU's NUMA node's CPUs, no NCCL topology file without bus ids.
	h100 := filepath.Join(smiRecordings, "hgx-h100-12nic-sglang-spaces.txt")
	env, _, _ := runCLI(t, "topo", "--topology-file", h100, "--nccl-env")
	if strings.Contains(env, "NCCL_IB_HCA") || !strings.Contains(env, "NCCL_SOCKET_IFNAME=") {
		t.Errorf("--nccl-env:\n%s", env)
	}
	rank, _, _ := runCLI(t, "topo", "--topology-file", h100, "--nccl-env", "--rank", "5", "--master-addr", "127.0.0.1")
	// GPU5 sits on NUMA node 1, whose CPUs the recording lists as 1,3,5,7,9,11: four
	// GPUs share them, the second of them gets the second share.
	if !strings.Contains(rank, "GANGRUN_CPUS=3,5\n") {
		t.Errorf("--rank 5:\n%s", rank)
	}
	stdout, stderr, code := runCLI(t, "topo", "--topology-file", h100, "--nccl-topo-xml", "-")
	if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "PCI bus id is not recorded") &&
		!strings.Contains(stderr, "CPU architecture is not recorded") {
		t.Errorf("--nccl-topo-xml: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// The --json of a recording reads back as itself.
	js, _, _ := runCLI(t, "topo", "--topology-file", h100, "--json")
	tmp := filepath.Join(t.TempDir(), "h100.json")
	if err := os.WriteFile(tmp, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	again, _, code := runCLI(t, "topo", "--topology-file", tmp, "--json")
	if code != exitOK || again != js {
		t.Errorf("--json of the recording's --json differs (exit %d)", code)
	}
	// A file that is neither is a usage error naming it.
	bad := filepath.Join(t.TempDir(), "node.txt")
	if err := os.WriteFile(bad, []byte("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNVL\t0-7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runCLI(t, "topo", "--topology-file", bad)
	if code != exitUsage || !strings.HasPrefix(stderr, "gangrun topo: --topology-file "+bad+": not a gangrun inventory (JSON) nor nvidia-smi output that reads: line 2: row GPU0, column GPU1: \"NVL\"") {
		t.Errorf("bad recording: exit %d, stderr %q", code, stderr)
	}
}

// TestAgentOnNvidiaSMIRecording: an agent whose --topology-file is what nvidia-smi
// topo -m printed on a DGX-1 (NVIDIA/nccl-tests#37) registers the node under its
// --node-name with its 8 GPUs, and a 4-GPU grant there is one of the DGX-1's two fully
// NVLink-connected quads (0-3, 4-7), as on a probed DGX-1.
func TestAgentOnNvidiaSMIRecording(t *testing.T) {
	consul := consultest.Start(t).Addr
	rec, err := filepath.Abs(filepath.Join(smiRecordings, "dgx1-v100-tabs-cpu-affinity-only.txt"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gangrunBin, "agent", "--consul", consul, "--node-name", "dgx1-a", "--advertise-addr", "127.0.0.1",
		"--topology-file", rec)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", log.String())
		}
	})
	waitUntil(t, func() bool {
		nodes := nodesJSON(t, consul)
		return len(nodes) == 1 && nodes[0].Name == "dgx1-a" && nodes[0].State == "up" && nodes[0].GPUsTotal == 8
	}, "the DGX-1 agent up with 8 GPUs")
	_, raw := startHolder(t, consul, 1, 4)
	var grant struct {
		Nodes []struct {
			Name string `json:"name"`
			GPUs []int  `json:"gpus"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &grant); err != nil || len(grant.Nodes) != 1 {
		t.Fatalf("alloc --json: %v %s", err, raw)
	}
	got := append([]int(nil), grant.Nodes[0].GPUs...)
	sort.Ints(got)
	if s := fmt.Sprint(got); s != "[0 1 2 3]" && s != "[4 5 6 7]" {
		t.Errorf("4 GPUs on the DGX-1: %v, want a fully NVLink-connected quad", got)
	}
}
