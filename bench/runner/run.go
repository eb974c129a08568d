package runner

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/launcher"
	benchscript "github.com/gangrun/gangrun/scripts/bench"
)

// ResultsFile and ProgressFile are the names of the bundled script's results file
// (bench.DecodeScript) and progress file (bench.ParseStep) in the run's scratch
// directory.
const (
	// ResultsFile is written by the script's rank 0 once every operation has run.
	ResultsFile = "results.json"
	// ProgressFile gets one JSON line per step, only when Config.Progress is set.
	ProgressFile = "progress.jsonl"
)

// Run runs the benchmark once on this node's gang (Config.Pairwise must be false): it
// checks cfg, prepares the gang in a scratch directory it removes afterwards, runs the
// engine (torch or nccl-tests) through cfg.Supervise and returns one bench.Result per
// operation, as the bundled script or nccl-tests timed them.
//
// Errors (errors.go): *UsageError for a bad configuration, a gang that cannot be
// prepared, --backend nccl or nccl-tests without GPUs, or an interpreter that cannot
// import torch; *NotFoundError for an nccl-tests binary not on PATH; *GangError for a
// gang that failed (cfg.Supervise reported it); any other error when the results cannot
// be written or read. When some halves had wrong elements, Run returns the results and
// a *WrongElementsError.
func Run(ctx context.Context, cfg Config) ([]bench.Result, error) {
	if cfg.Pairwise {
		return nil, &UsageError{Err: errors.New("bench runner: Run with Pairwise set: use RunPairwise")}
	}
	p, dir, cleanup, err := cfg.prepare(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	g := gang{cfg: &cfg, prepared: p, dir: dir, progress: newProgress(cfg.Progress)}
	var results []bench.Result
	if cfg.engine() == EngineNCCLTests {
		results, err = g.ncclTests(ctx)
	} else {
		results, err = g.torch(ctx)
	}
	if err != nil {
		return nil, err
	}
	if n := wrongHalves(results); n > 0 {
		return results, &WrongElementsError{Halves: n}
	}
	return results, nil
}

// gang is one Run on this node's prepared gang.
type gang struct {
	cfg      *Config
	prepared *launcher.Prepared
	dir      string // scratch directory for the script, results and progress
	progress progress
}

// supervise runs the prepared gang with its Config replaced by lc.
func (g gang) supervise(ctx context.Context, lc launcher.Config) error {
	p := *g.prepared
	p.Config = lc
	if res := g.cfg.Supervise(ctx, &p); res.ExitCode != 0 {
		return &GangError{Result: res}
	}
	return nil
}

// gpus is the number of allocatable GPUs on this node.
func (g gang) gpus() int { return len(g.prepared.Inventory.Allocatable()) }

// torch runs the bundled script on the gang and decodes what its rank 0 wrote.
func (g gang) torch(ctx context.Context) ([]bench.Result, error) {
	backend, err := g.cfg.backend(g.gpus())
	if err != nil {
		return nil, err
	}
	python := g.cfg.python()
	if err := torchUsable(ctx, python); err != nil {
		return nil, err
	}
	script, err := benchscript.Write(g.dir)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(g.dir, ResultsFile)
	progressFile := ""
	if g.progress.on() {
		progressFile = filepath.Join(g.dir, ProgressFile)
	}
	lc := g.prepared.Config
	lc.Command = append([]string{python, script}, benchscript.Args(g.cfg.Plan, backend, out, progressFile)...)
	stop := g.progress.follow(ctx, progressFile, "")
	err = g.supervise(ctx, lc)
	stop()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(out)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errors.New("no results: rank 0 wrote none (it runs on node rank 0; see that node's output)")
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return bench.DecodeScript(f)
}

// wrongHalves counts the rows with wrong elements.
func wrongHalves(results []bench.Result) int {
	n := 0
	for _, r := range results {
		for _, row := range r.Rows {
			if row.Wrong != nil && *row.Wrong > 0 {
				n++
			}
		}
	}
	return n
}
