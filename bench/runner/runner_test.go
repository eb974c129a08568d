package runner

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/launcher"
)

const inventories = "../../topology/testdata/inventories"

// valid is a configuration Check accepts: one node, the torch engine.
func valid() Config {
	return Config{
		Plan: bench.Plan{Ops: []bench.Op{bench.AllReduce}, MinBytes: 1024, MaxBytes: 4096, StepFactor: 2,
			Warmup: 1, Iters: 1, DType: "float"},
		OpsFlag: "all_reduce", SlowThreshold: bench.DefaultSlowThreshold,
		PairTimeout: time.Minute, JoinTimeout: time.Minute,
		Spec: launcher.Spec{Getenv: func(string) string { return "" }},
	}
}

// TestCheck: every refusal is a *UsageError naming the flag, in the command's order.
func TestCheck(t *testing.T) {
	pairwise := func(c *Config) {
		c.Pairwise, c.Spec.NNodes, c.Spec.Coordinator = true, "2", "consul://127.0.0.1:1"
	}
	cases := []struct {
		name string
		edit func(*Config)
		err  string // "" accepts
	}{
		{"valid", func(*Config) {}, ""},
		{"valid pairwise", pairwise, ""},
		{"plan", func(c *Config) { c.Plan.Iters = 0 }, "--iters 0"},
		{"engine", func(c *Config) { c.Engine = "mpi" }, `--engine "mpi": want torch or nccl-tests`},
		{"backend before threshold", func(c *Config) { c.Backend, c.SlowThreshold = "mpi", 2 }, `--backend "mpi"`},
		{"threshold without pairwise", func(c *Config) { c.SlowThreshold = 0 }, "--slow-threshold 0: want a fraction"},
		{"nnodes", func(c *Config) { c.Spec.NNodes = "x" }, `--nnodes "x": want N or MIN:MAX`},
		{"pairwise one node", func(c *Config) { c.Pairwise = true }, "--pairwise needs --nnodes >= 2 (got --nnodes 1)"},
		{"nccl-tests across nodes", func(c *Config) { c.Engine, c.Spec.NNodes = EngineNCCLTests, "2" }, "--engine nccl-tests runs on one node"},
		{"pairwise embedded", func(c *Config) { pairwise(c); c.Spec.Coordinator = "" }, "(got embedded)"},
		{"pairwise under srun", func(c *Config) {
			pairwise(c)
			c.Spec.Coordinator = ""
			c.Spec.Getenv = func(k string) string { return map[string]string{"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}[k] }
		}, "(got slurm)"},
		{"pairwise two ops", func(c *Config) {
			pairwise(c)
			c.Plan.Ops, c.OpsFlag = []bench.Op{bench.AllReduce, bench.Broadcast}, "AllReduce, broadcast"
		}, `--pairwise measures one operation: --op "AllReduce, broadcast" lists 2`},
		{"pair timeout", func(c *Config) { pairwise(c); c.PairTimeout = 0 }, "--pair-timeout 0s: must be positive"},
		{"join timeout", func(c *Config) { pairwise(c); c.JoinTimeout = -time.Second }, "--join-timeout -1s: must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := valid()
			c.edit(&cfg)
			err := cfg.Check()
			var ue *UsageError
			switch {
			case c.err == "" && err != nil:
				t.Errorf("Check: %v", err)
			case c.err != "" && (!errors.As(err, &ue) || !strings.Contains(err.Error(), c.err)):
				t.Errorf("Check = %v (%T), want a *UsageError with %q", err, err, c.err)
			}
		})
	}
}

func TestBackend(t *testing.T) {
	for _, c := range []struct {
		given string
		gpus  int
		want  string
	}{{"", 0, "gloo"}, {"", 8, "nccl"}, {"gloo", 8, "gloo"}, {"nccl", 1, "nccl"}} {
		cfg := Config{Backend: c.given}
		if got, err := cfg.backend(c.gpus); got != c.want || err != nil {
			t.Errorf("backend %q on %d GPUs = %q, %v; want %q", c.given, c.gpus, got, err, c.want)
		}
	}
	cfg := Config{Backend: BackendNCCL}
	var ue *UsageError
	if _, err := cfg.backend(0); !errors.As(err, &ue) || !strings.Contains(err.Error(), "--backend nccl needs GPUs") {
		t.Errorf("nccl without GPUs: %v", err)
	}
}

// TestNCCLTestsScript: one quoted command line per operation, each to its own file; a
// binary not on PATH is a *NotFoundError naming it.
func TestNCCLTestsScript(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"all_reduce_perf", "broadcast_perf"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	plan := valid().Plan
	plan.Ops = []bench.Op{bench.AllReduce, bench.Broadcast}
	dir := "/tmp/it's here"
	outs, script, err := ncclTestsScript(plan, 8, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := "set -e\n" +
		`'all_reduce_perf' '-b' '1024' '-e' '4096' '-f' '2' '-w' '1' '-n' '1' '-g' '8' '-d' 'float' '-c' '0' >'/tmp/it'\''s here/all_reduce_perf.out'` + "\n" +
		`'broadcast_perf' '-b' '1024' '-e' '4096' '-f' '2' '-w' '1' '-n' '1' '-g' '8' '-d' 'float' '-c' '0' >'/tmp/it'\''s here/broadcast_perf.out'` + "\n"
	if script != want || len(outs) != 2 || outs[1] != filepath.Join(dir, "broadcast_perf.out") {
		t.Errorf("script:\n%s\nwant:\n%s\nouts %q", script, want, outs)
	}
	plan.Ops = append(plan.Ops, bench.AllGather)
	var nf *NotFoundError
	if _, _, err := ncclTestsScript(plan, 8, dir); !errors.As(err, &nf) || nf.Program != "all_gather_perf" ||
		err.Error() != "--engine nccl-tests: all_gather_perf not found on PATH (build NVIDIA/nccl-tests and put its build/ directory on PATH)" {
		t.Errorf("missing binary: %v", err)
	}
}

// TestRunGangFails: a gang that fails is a *GangError carrying Supervise's Result, and
// the gang was given the bundled script, no restarts and the prepared workers.
func TestRunGangFails(t *testing.T) {
	cfg := valid()
	cfg.Python = "/nonexistent/python3" // not found: the check of torch leaves it to the supervisor
	cfg.Spec.NProcPerNode, cfg.Spec.TopologyFile = "2", filepath.Join(inventories, "cpu-only.json")
	cfg.Spec.MaxRestarts = 3
	var got launcher.Config
	cfg.Supervise = func(_ context.Context, p *launcher.Prepared) launcher.Result {
		got = p.Config
		return launcher.Result{ExitCode: 127, Err: launcher.ErrCommandNotFound}
	}
	results, err := Run(context.Background(), cfg)
	var ge *GangError
	if results != nil || !errors.As(err, &ge) || ge.Result.ExitCode != 127 || !errors.Is(err, launcher.ErrCommandNotFound) {
		t.Fatalf("Run = %v, %v; want a *GangError with exit code 127", results, err)
	}
	if len(got.Command) < 3 || got.Command[0] != cfg.Python || filepath.Base(got.Command[1]) != "collectives.py" ||
		got.Command[2] != "--ops" || got.MaxRestarts != 0 || got.NProcPerNode != 2 {
		t.Errorf("the gang ran %q, %d restarts, %d workers", got.Command, got.MaxRestarts, got.NProcPerNode)
	}
	if _, err := os.Stat(filepath.Dir(got.Command[1])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch directory left behind: %v", err)
	}
}

// TestRunMisuse: Run with Pairwise, RunPairwise without, and no Supervise are refused.
func TestRunMisuse(t *testing.T) {
	cfg := valid()
	cfg.Supervise = func(context.Context, *launcher.Prepared) launcher.Result { return launcher.Result{} }
	cfg.Pairwise, cfg.Spec.NNodes, cfg.Spec.Coordinator = true, "2", "consul://127.0.0.1:1"
	var ue *UsageError
	if _, err := Run(context.Background(), cfg); !errors.As(err, &ue) {
		t.Errorf("Run with Pairwise: %v", err)
	}
	if _, err := RunPairwise(context.Background(), valid()); !errors.As(err, &ue) {
		t.Errorf("RunPairwise without Pairwise: %v", err)
	}
	if _, err := Run(context.Background(), valid()); !errors.As(err, &ue) || !strings.Contains(err.Error(), "Supervise") {
		t.Errorf("Run without Supervise: %v", err)
	}
}
