// Package runner runs `gangrun bench nccl` on this node: it prepares the gang through
// the launcher (the same path as `gangrun run`), chooses the backend, checks that the
// interpreter can import torch, writes the bundled script (scripts/bench) or the
// nccl-tests runner script, runs the gang and reads the results back (Run); or it takes
// this node's part in a pairwise sweep across nodes, each pair a gang of two
// (RunPairwise, over bench.NodeSweep).
//
// It lives beside package bench rather than in it because the bundled script's package
// (scripts/bench) imports bench. What it prints is the caller's: it returns results and
// typed errors (errors.go), and shows progress through a callback.
package runner

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/rendezvous"
)

// Engines: what times the collectives (--engine).
const (
	// EngineTorch is the bundled PyTorch script, on every worker of the gang.
	EngineTorch = "torch"
	// EngineNCCLTests is NVIDIA's nccl-tests binaries (all_reduce_perf …) on PATH, one
	// process driving every GPU of the node.
	EngineNCCLTests = "nccl-tests"
)

// Backends of torch.distributed the torch engine runs on (--backend).
const (
	// BackendNCCL runs the collectives on the GPUs, through NCCL.
	BackendNCCL = "nccl"
	// BackendGloo runs them on the CPUs, through gloo.
	BackendGloo = "gloo"
)

// DefaultPython is the interpreter of the torch engine when Config.Python is "".
const DefaultPython = "python3"

// Supervise runs a prepared gang's supervisor to its end and returns how it ended. It
// reports failures itself (a command not found, the root-cause worker), and its
// Result.ExitCode is gangrun's exit code for the run: 0 on success. The caller of Run
// gives it (gangrun's own, which also hands the signals over to the supervisor).
type Supervise func(ctx context.Context, p *launcher.Prepared) launcher.Result

// Config is one `gangrun bench nccl` on this node.
type Config struct {
	// Spec describes this node's gang as `gangrun run` takes it (the gang flags, the
	// worker output writers, Report, Log, Signals); Run sets its Command to the
	// engine's and its MaxRestarts to 0 (a benchmark never restarts), and prepares it
	// with launcher.Prepare. Spec.Stdout and Spec.Stderr receive the workers' output;
	// Spec.Report also receives a failed nccl-tests run's own output files.
	Spec launcher.Spec
	// Plan is what is timed; Check validates it.
	Plan bench.Plan
	// OpsFlag is --op as the user gave it, quoted in the error that refuses more than
	// one operation for a pairwise sweep.
	OpsFlag string
	// Engine is EngineTorch ("" is the same) or EngineNCCLTests.
	Engine string
	// Backend is BackendNCCL, BackendGloo, or "": nccl when the node has allocatable
	// GPUs, else gloo.
	Backend string
	// Python is the interpreter with torch for the torch engine; "" is DefaultPython.
	Python string

	// Pairwise runs a pairwise sweep across nodes (RunPairwise) instead of one gang.
	Pairwise bool
	// SlowThreshold is the fraction below the median at which the sweep's diagnosis
	// calls a node or pair slow, strictly between 0 and 1 (bench.DefaultSlowThreshold is
	// the command's default). Check refuses any other value even without Pairwise, as
	// the command always did.
	SlowThreshold float64
	// PairTimeout and JoinTimeout bound one pair on a node and the nodes' meeting
	// (bench.NodeSweep); both must be positive when Pairwise is set.
	PairTimeout, JoinTimeout time.Duration

	// Supervise runs each gang; it must be set.
	Supervise Supervise
	// HandOver, when non-nil, is called once the sweep is about to start (after every
	// check, before the first Consul write): it hands gangrun's signals over to the
	// sweep (RunPairwise then reads Spec.Signals itself). It returns false when a
	// terminating signal already stopped the command; RunPairwise then returns
	// ErrStopped, having started nothing. Run leaves the hand-over to Supervise.
	HandOver func() bool
	// Progress, when non-nil, receives the progress line, redrawn every
	// progressInterval while a gang runs (operation, size, step, pair, time elapsed
	// and left), and "" when the line is to be erased. It is called from other
	// goroutines. When nil, the bundled script writes no progress file.
	Progress func(line string)
}

// Check validates cfg before anything is prepared, in the order the command's flags
// are checked; every error is a *UsageError naming the flag to fix.
func (c *Config) Check() error {
	if err := c.check(); err != nil {
		return &UsageError{Err: err}
	}
	return nil
}

func (c *Config) check() error {
	if err := c.Plan.Validate(); err != nil {
		return err
	}
	if c.engine() != EngineTorch && c.engine() != EngineNCCLTests {
		return fmt.Errorf("--engine %q: want torch or nccl-tests", c.Engine)
	}
	if c.Backend != "" && c.Backend != BackendNCCL && c.Backend != BackendGloo {
		return fmt.Errorf("--backend %q: want nccl or gloo", c.Backend)
	}
	if !(c.SlowThreshold > 0 && c.SlowThreshold < 1) {
		return fmt.Errorf("--slow-threshold %g: want a fraction between 0 and 1 (0.2 is 20%%)", c.SlowThreshold)
	}
	nnodes := c.Spec.NNodes
	if nnodes == "" {
		nnodes = "1"
	}
	_, nmax, err := launcher.ParseNNodes(nnodes)
	if err != nil {
		return err
	}
	if c.Pairwise && nmax < 2 {
		return fmt.Errorf("--pairwise needs --nnodes >= 2 (got --nnodes %s): pairs are of nodes", nnodes)
	}
	if c.engine() == EngineNCCLTests && nmax > 1 {
		return fmt.Errorf("--engine nccl-tests runs on one node: across nodes nccl-tests needs MPI (use --engine torch)")
	}
	if c.Pairwise {
		return c.checkPairwise()
	}
	return nil
}

// checkPairwise returns why a pairwise sweep cannot run with cfg: it needs a Consul
// coordinator, one operation and positive timeouts.
func (c *Config) checkPairwise() error {
	coordinator := c.Spec.Coordinator
	getenv := c.Spec.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if coordinator == "" && rendezvous.InSlurmStep(getenv) {
		coordinator = "slurm"
	}
	if !strings.HasPrefix(coordinator, "consul://") {
		name := coordinator
		if name == "" {
			name = "embedded"
		}
		return fmt.Errorf("--pairwise needs --coordinator consul://HOST:PORT (got %s): the nodes publish every pair's result there, and %s has no shared place for them", name, name)
	}
	if len(c.Plan.Ops) != 1 {
		return fmt.Errorf("--pairwise measures one operation: --op %q lists %d", c.OpsFlag, len(c.Plan.Ops))
	}
	if c.PairTimeout <= 0 {
		return fmt.Errorf("--pair-timeout %s: must be positive", c.PairTimeout)
	}
	if c.JoinTimeout <= 0 {
		return fmt.Errorf("--join-timeout %s: must be positive", c.JoinTimeout)
	}
	return nil
}

func (c *Config) engine() string {
	if c.Engine == "" {
		return EngineTorch
	}
	return c.Engine
}

func (c *Config) python() string {
	if c.Python == "" {
		return DefaultPython
	}
	return c.Python
}

// prepare checks cfg, creates the run's scratch directory and prepares the gang with
// the engine's placeholder command (the interpreter, or /bin/sh for nccl-tests' runner
// script) and no restarts. The caller calls cleanup when done, which also closes the
// gang's rendezvous.
func (c *Config) prepare(ctx context.Context) (p *launcher.Prepared, dir string, cleanup func(), err error) {
	if err := c.Check(); err != nil {
		return nil, "", nil, err
	}
	if c.Supervise == nil {
		return nil, "", nil, &UsageError{Err: fmt.Errorf("bench runner: no Supervise function given")}
	}
	dir, err = os.MkdirTemp("", "gangrun-bench-")
	if err != nil {
		return nil, "", nil, fmt.Errorf("create a temporary directory: %w", err)
	}
	spec := c.Spec
	if c.engine() == EngineTorch {
		spec.Command = []string{c.python()}
	} else {
		spec.Command = []string{"/bin/sh"}
	}
	spec.MaxRestarts = 0
	p, err = launcher.Prepare(ctx, spec)
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", nil, &UsageError{Err: err}
	}
	return p, dir, func() {
		p.Close()
		os.RemoveAll(dir)
	}, nil
}

// backend returns the backend to run on a node with gpus allocatable GPUs: the one
// given, else nccl with GPUs and gloo without. nccl without GPUs is a *UsageError.
func (c *Config) backend(gpus int) (string, error) {
	backend := c.Backend
	if backend == "" {
		backend = BackendGloo
		if gpus > 0 {
			backend = BackendNCCL
		}
	}
	if backend == BackendNCCL && gpus == 0 {
		return "", &UsageError{Err: fmt.Errorf("--backend nccl needs GPUs, and this node has none allocatable (use --backend gloo)")}
	}
	return backend, nil
}
