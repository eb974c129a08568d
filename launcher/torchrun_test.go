package launcher

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseTorchrunRecognises(t *testing.T) {
	for _, tc := range []struct {
		argv     []string
		ok       bool
		optStart int
		script   int
	}{
		{[]string{"torchrun", "train.py"}, true, 1, 1},
		{[]string{"/usr/bin/torchrun", "--nproc_per_node", "2", "train.py", "--lr", "1"}, true, 1, 3},
		{[]string{"python", "-m", "torch.distributed.run", "--standalone", "t.py"}, true, 3, 4},
		{[]string{"python3.11", "-u", "-m", "torch.distributed.run", "t.py"}, true, 4, 4},
		{[]string{"/usr/bin/python3", "-mtorch.distributed.run", "t.py"}, true, 2, 2},
		{[]string{"python", "-X", "dev", "-m", "torch.distributed.run", "t.py"}, true, 5, 5},
		{[]string{"torchrun", "--nnodes=1", "-m", "pkg.train", "--x"}, true, 1, 3},
		{[]string{"torchrun", "--no-python", "--", "/bin/echo", "hi"}, true, 1, 3},
		{[]string{"python", "train.py", "-m", "torch.distributed.run"}, false, 0, 0},
		{[]string{"python", "-m", "torch.distributed.launch", "t.py"}, false, 0, 0},
		{[]string{"/bin/true"}, false, 0, 0},
		{[]string{"torchrun.sh"}, false, 0, 0},
	} {
		tr, ok, err := ParseTorchrun(tc.argv)
		if err != nil {
			t.Errorf("%v: %v", tc.argv, err)
			continue
		}
		if ok != tc.ok {
			t.Errorf("%v: torchrun = %v, want %v", tc.argv, ok, tc.ok)
			continue
		}
		if ok && (tr.OptStart != tc.optStart || tr.Script != tc.script) {
			t.Errorf("%v: options at %d, script at %d; want %d, %d", tc.argv, tr.OptStart, tr.Script, tc.optStart, tc.script)
		}
	}
}

func TestParseTorchrunSpellings(t *testing.T) {
	// torch 1.x spells options with underscores, torch 2.x accepts dashes as well, and
	// argparse takes unique prefixes: all name the same option.
	for _, argv := range [][]string{
		{"torchrun", "--nproc_per_node", "4", "t.py"},
		{"torchrun", "--nproc-per-node", "4", "t.py"},
		{"torchrun", "--nproc_per_node=4", "t.py"},
		{"torchrun", "--nproc-per-node=4", "t.py"},
		{"torchrun", "--nproc=4", "t.py"},
	} {
		tr, _, err := ParseTorchrun(argv)
		if err != nil {
			t.Fatalf("%v: %v", argv, err)
		}
		if v, ok := tr.NProcPerNode(); !ok || v != "4" {
			t.Errorf("%v: nproc_per_node = %q, %v; want 4", argv, v, ok)
		}
		if tr.Script != len(argv)-1 {
			t.Errorf("%v: script at %d", argv, tr.Script)
		}
	}
	if _, _, err := ParseTorchrun([]string{"torchrun", "--ma=1", "t.py"}); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("--ma (master_addr or master_port or max_restarts): err = %v, want ambiguous", err)
	}
	if _, _, err := ParseTorchrun([]string{"torchrun", "--nnodes"}); err == nil || !strings.Contains(err.Error(), "needs a value") {
		t.Errorf("--nnodes without value: err = %v", err)
	}
}

func TestTorchrunCommandInjectsStaticRendezvous(t *testing.T) {
	v := TorchrunValues{NNodes: 2, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 29400, NProcPerNode: 4}
	inject := []string{"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29400", "--nproc_per_node=4", "--max_restarts=0"}
	for _, tc := range []struct {
		argv []string
		want []string
	}{
		{
			[]string{"torchrun", "train.py", "--lr", "0.1"},
			append(append([]string{"torchrun"}, inject...), "train.py", "--lr", "0.1"),
		},
		{
			// Identical user values are accepted and replaced by gangrun's (both spellings).
			[]string{"torchrun", "--nproc-per-node", "4", "--nnodes=2", "--max_restarts", "0", "--rdzv-backend", "static", "--role", "trainer", "train.py"},
			append(append([]string{"torchrun"}, inject...), "--role", "trainer", "train.py"),
		},
		{
			[]string{"python3", "-u", "-m", "torch.distributed.run", "--master-port=29400", "--node-rank", "1", "-m", "pkg.train"},
			append(append([]string{"python3", "-u", "-m", "torch.distributed.run"}, inject...), "-m", "pkg.train"),
		},
		{
			// The script's own flags that look like torchrun's are the script's.
			[]string{"torchrun", "t.py", "--nnodes", "7"},
			append(append([]string{"torchrun"}, inject...), "t.py", "--nnodes", "7"),
		},
	} {
		tr, ok, err := ParseTorchrun(tc.argv)
		if err != nil || !ok {
			t.Fatalf("%v: ok=%v err=%v", tc.argv, ok, err)
		}
		if err := tr.CheckStatic(2, 2, 4, 29400); err != nil {
			t.Errorf("%v: CheckStatic: %v", tc.argv, err)
		}
		if err := tr.CheckRound(v); err != nil {
			t.Errorf("%v: CheckRound: %v", tc.argv, err)
		}
		if got := tr.Command(v); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v:\n got %q\nwant %q", tc.argv, got, tc.want)
		}
	}
}

func TestTorchrunConflicts(t *testing.T) {
	for _, tc := range []struct {
		argv       []string
		masterPort int
		want       string // both values must be named
	}{
		{[]string{"torchrun", "--nproc_per_node=8", "t.py"}, 0, "--nproc_per_node=8 conflicts with gangrun's --nproc-per-node 4"},
		{[]string{"torchrun", "--nproc-per-node", "2", "t.py"}, 0, "--nproc-per-node 2 conflicts with gangrun's --nproc-per-node 4"},
		{[]string{"torchrun", "--nnodes=1:4", "t.py"}, 0, "--nnodes=1:4 conflicts with gangrun's --nnodes 2"},
		{[]string{"torchrun", "--max_restarts=3", "t.py"}, 0, "--max_restarts=3 conflicts with gangrun's --max_restarts=0"},
		{[]string{"torchrun", "--standalone", "t.py"}, 0, "--standalone conflicts"},
		{[]string{"torchrun", "--rdzv_endpoint=h:1", "t.py"}, 0, "--rdzv_endpoint=h:1 conflicts"},
		{[]string{"torchrun", "--rdzv-backend", "c10d", "t.py"}, 0, "--rdzv-backend c10d conflicts with gangrun's --rdzv_backend static"},
		{[]string{"torchrun", "--master_port=1234", "t.py"}, 0, "--master_port=1234 conflicts with gangrun's master port, picked afresh"},
		{[]string{"torchrun", "--master_port=1234", "t.py"}, 29400, "--master_port=1234 conflicts with gangrun's --master-port 29400"},
	} {
		tr, _, err := ParseTorchrun(tc.argv)
		if err != nil {
			t.Fatal(err)
		}
		err = tr.CheckStatic(2, 2, 4, tc.masterPort)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.argv, err, tc.want)
		}
	}
	// On one node the node rank is known before any round: 0.
	one, _, _ := ParseTorchrun([]string{"torchrun", "--node_rank", "1", "t.py"})
	if err := one.CheckStatic(1, 1, 4, 0); err == nil || !strings.Contains(err.Error(), "--node_rank 1 conflicts with gangrun's --node_rank=0") {
		t.Errorf("node rank on one node: %v", err)
	}
	tr, _, _ := ParseTorchrun([]string{"torchrun", "--node_rank=0", "--master_addr=10.0.0.9", "t.py"})
	err := tr.CheckRound(TorchrunValues{NodeRank: 1, MasterAddr: "10.0.0.9"})
	if err == nil || !strings.Contains(err.Error(), "--node_rank=0 conflicts with gangrun's --node_rank=1") {
		t.Errorf("node rank: %v", err)
	}
	err = tr.CheckRound(TorchrunValues{NodeRank: 0, MasterAddr: "10.0.0.1"})
	if err == nil || !strings.Contains(err.Error(), "--master_addr=10.0.0.9 conflicts with gangrun's --master_addr=10.0.0.1") {
		t.Errorf("master addr: %v", err)
	}
}

func TestParseNNodes(t *testing.T) {
	for _, tc := range []struct {
		in       string
		min, max int
		ok       bool
	}{
		{"1", 1, 1, true}, {"4", 4, 4, true}, {"1:2", 1, 2, true}, {"3:3", 3, 3, true},
		{"0", 0, 0, false}, {"-1", 0, 0, false}, {"2:1", 0, 0, false}, {"a", 0, 0, false},
		{"1:", 0, 0, false}, {":2", 0, 0, false}, {"", 0, 0, false},
	} {
		min, max, err := ParseNNodes(tc.in)
		if (err == nil) != tc.ok || (tc.ok && (min != tc.min || max != tc.max)) {
			t.Errorf("ParseNNodes(%q) = %d, %d, %v", tc.in, min, max, err)
		}
	}
}

func TestResolveNProcPerNode(t *testing.T) {
	for _, tc := range []struct {
		in         string
		gpus, cpus int
		want       int
		ok         bool
	}{
		{"4", 0, 2, 4, true}, {"auto", 8, 2, 8, true}, {"auto", 0, 2, 1, true},
		{"gpu", 8, 2, 8, true}, {"gpu", 0, 2, 0, false}, {"cpu", 0, 6, 6, true},
		{"0", 0, 2, 0, false}, {"-2", 0, 2, 0, false}, {"two", 0, 2, 0, false}, {"", 0, 2, 0, false},
	} {
		got, err := ResolveNProcPerNode(tc.in, tc.gpus, tc.cpus)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ResolveNProcPerNode(%q, %d, %d) = %d, %v", tc.in, tc.gpus, tc.cpus, got, err)
		}
	}
}

func TestBackoff(t *testing.T) {
	exp, err := ParseBackoff("exp")
	if err != nil {
		t.Fatal(err)
	}
	wants := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for k, want := range wants {
		if got := exp.Delay(k + 1); got != want {
			t.Errorf("exp.Delay(%d) = %s, want %s", k+1, got, want)
		}
	}
	none, _ := ParseBackoff("0s")
	if none.Delay(5) != 0 || none.String() != "none" {
		t.Errorf("0s: %s %s", none.Delay(5), none)
	}
	fixed, _ := ParseBackoff("2s")
	if fixed.Delay(1) != 2*time.Second || fixed.Delay(9) != 2*time.Second {
		t.Errorf("2s: %s %s", fixed.Delay(1), fixed.Delay(9))
	}
	for _, bad := range []string{"soon", "-1s", "5", "25h", "2000000h", "9999999h"} {
		if _, err := ParseBackoff(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseBackoff(%q) = %v, want an error naming it", bad, err)
		}
	}
}
