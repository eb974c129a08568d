package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/rendezvous"
	benchscript "github.com/gangrun/gangrun/scripts/bench"
	"github.com/gangrun/gangrun/topology"
)

// pairwiseGrace is added to the supervisor's TermTimeout (--term-timeout) to make the
// round grace of a sweep (bench.NodeSweep.RoundGrace): a pair stopped at its timeout
// takes up to TermTimeout to stop its workers, then publishes its failure.
const pairwiseGrace = 30 * time.Second

// pairwiseLeaveTimeout bounds the wait, after the last round, for every node to report
// the sweep's rendezvous round done.
const pairwiseLeaveTimeout = time.Minute

// Sweep is what this node's part of a pairwise sweep found.
type Sweep struct {
	// Op is the operation measured (the plan's one operation).
	Op bench.Op
	// Fabric holds the sweep's nodes in node-rank order and the pairs this node read:
	// every pair on node rank 0, its own pairs on the others.
	Fabric *bench.Fabric
	// NodeRank is this node's rank in the sweep; node rank 0 reports the whole fabric.
	NodeRank int
	// Diagnosis is the fabric's diagnosis (bench.Diagnose with Config.SlowThreshold) on
	// node rank 0; nil on the other nodes.
	Diagnosis *bench.Diagnosis
}

// RunPairwise runs this node's part of a pairwise sweep (Config.Pairwise must be set)
// across nodes that all run it at the same time with one Consul coordinator and job
// id: the nodes meet in a rendezvous round of the job, which gives each its node rank;
// they sweep every pair (bench.NodeSweep), each pair a gang of two nodes started like
// Run's (the launcher, the bundled script, no restarts) through cfg.Supervise; node
// rank 0 then diagnoses the whole fabric, the others keep their own pairs.
//
// From cfg.HandOver on, RunPairwise reads the signals of cfg.Spec.Signals itself
// (proc.WatchSignals): it passes every one on to the running pair's supervisor, and
// the first SIGINT, SIGTERM, SIGHUP or SIGQUIT stops the sweep.
//
// Errors (errors.go): *UsageError for a bad configuration, a gang that cannot be
// prepared, nccl without GPUs, an interpreter that cannot import torch, or no Consul
// store; *NotFoundError when the interpreter is not on PATH; ErrStopped when HandOver
// returned false; *proc.SignalError when a signal stopped the sweep; any other error
// when the nodes did not meet, Consul failed or the sweep could not run. When the sweep
// ran but some pairs failed, RunPairwise returns the Sweep and a *PairsFailedError.
func RunPairwise(ctx context.Context, cfg Config) (*Sweep, error) {
	if !cfg.Pairwise {
		return nil, &UsageError{Err: errors.New("bench runner: RunPairwise without Pairwise set: use Run")}
	}
	p, dir, cleanup, err := cfg.prepare(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	pr, err := cfg.pairRunnerFor(ctx, p, dir)
	if err != nil {
		return nil, err
	}

	if cfg.HandOver != nil && !cfg.HandOver() {
		return nil, ErrStopped
	}
	ctx, watch := proc.WatchSignals(ctx, p.Config.Signals)
	defer watch.Stop()

	// 1. Meet: a rendezvous round of the job gives every node its node rank.
	since, round, err := cfg.meetPairwise(ctx, p, pr.store, watch)
	if err != nil {
		return nil, err
	}
	a := round.Assignment()

	// 2. Sweep: every round of pairs, each pair a gang of two.
	pr.cfg.Signals = watch.Forward()
	f, err := cfg.sweepPairs(ctx, pr, a, since, watch)
	if err != nil {
		return nil, err
	}
	// Every node reports its part of the rendezvous round done, so the job finishes.
	lctx, cancel := context.WithTimeout(ctx, pairwiseLeaveTimeout)
	if _, err := round.Succeed(lctx); err != nil {
		pr.log.Warn("pairwise sweep: waiting for the other nodes to finish", zap.Error(err))
	}
	cancel()

	// 3. Report.
	return cfg.pairwiseReport(f, a.NodeRank)
}

// pairRunnerFor checks what a sweep needs before it starts and returns the runner of
// its pairs (its progress and signals are set when the sweep starts): the backend for
// the node's GPUs, an interpreter on PATH that imports torch, the bundled script
// written into dir, and p's Consul store. Errors as RunPairwise's.
func (c *Config) pairRunnerFor(ctx context.Context, p *launcher.Prepared, dir string) (*pairRunner, error) {
	lc := p.Config
	backend, err := c.backend(len(p.Inventory.Allocatable()))
	if err != nil {
		return nil, err
	}
	python := c.python()
	if _, err := exec.LookPath(python); err != nil {
		return nil, &NotFoundError{Program: python, msg: fmt.Sprintf("--python %s: not found on PATH", python)}
	}
	if err := torchUsable(ctx, python); err != nil {
		return nil, err
	}
	script, err := benchscript.Write(dir)
	if err != nil {
		return nil, err
	}
	s := p.Opened.Store
	if s == nil {
		return nil, &UsageError{Err: errors.New("--pairwise needs --coordinator consul://HOST:PORT (the pairs meet in Consul)")}
	}
	log := lc.Log
	if log == nil {
		log = zap.NewNop()
	}
	host, _ := os.Hostname()
	return &pairRunner{cfg: lc, inventory: p.Inventory, supervise: c.Supervise, store: s, log: log,
		plan: c.Plan, backend: backend, python: python, script: script, dir: dir, host: host}, nil
}

// meetPairwise marks the sweep (bench.MarkSweep: since, its index) and joins the job's
// rendezvous round in s within --join-timeout; the round gives this node its rank. A
// signal that came meanwhile is watch's error.
func (c *Config) meetPairwise(ctx context.Context, p *launcher.Prepared, s store.Store, watch *proc.SignalWatch) (since uint64, round rendezvous.Round, err error) {
	lc := p.Config
	since, err = bench.MarkSweep(ctx, s, lc.JobID)
	if err != nil {
		return 0, nil, err
	}
	jctx, cancel := context.WithTimeout(ctx, c.JoinTimeout)
	round, err = p.Opened.Rendezvous.Join(jctx, rendezvous.JoinRequest{Node: lc.NodeName, Addr: lc.Addr,
		LocalWorldSize: lc.NProcPerNode, Switch: lc.Switch})
	cancel()
	if err := watch.Err(); err != nil {
		return 0, nil, err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return 0, nil, fmt.Errorf("pairwise sweep %s: the nodes did not meet within --join-timeout %s (--nnodes %d:%d)",
			lc.JobID, c.JoinTimeout, lc.NNodesMin, lc.NNodesMax)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("pairwise sweep %s: rendezvous: %w", lc.JobID, err)
	}
	return since, round, nil
}

// sweepPairs runs this node's part of every round of pairs (bench.NodeSweep) as node
// a.NodeRank of a.NNodes, each pair through pr, showing progress where Config.Progress
// is set, and returns the fabric it read. A signal that stopped it is watch's error.
func (c *Config) sweepPairs(ctx context.Context, pr *pairRunner, a rendezvous.Assignment, since uint64, watch *proc.SignalWatch) (*bench.Fabric, error) {
	prog := newProgress(c.Progress)
	pr.progress = prog
	lc := pr.cfg
	var nics []string
	for _, d := range pr.inventory.RDMADevices {
		nics = append(nics, d.Name)
	}
	ns := bench.NodeSweep{Store: pr.store, JobID: lc.JobID, Self: bench.Node{Name: lc.NodeName, NICs: nics},
		NodeRank: a.NodeRank, NNodes: a.NNodes, Since: since, RunPair: pr.run,
		PairTimeout: c.PairTimeout, JoinTimeout: c.JoinTimeout, RoundGrace: lc.TermTimeout + pairwiseGrace}
	if prog.on() {
		ns.OnRound = func(r, rounds int, pairs []bench.Pair, _ []bench.Node) { prog.round(r, rounds, len(pairs)) }
	}
	f, err := ns.Run(ctx)
	prog.clear()
	if err := watch.Err(); err != nil {
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

// pairwiseReport is the Sweep of fabric f as node nodeRank reports it: node rank 0
// diagnoses the whole fabric (bench.Diagnose with Config.SlowThreshold). The error is a
// *PairsFailedError when some pairs failed.
func (c *Config) pairwiseReport(f *bench.Fabric, nodeRank int) (*Sweep, error) {
	sw := &Sweep{Op: c.Plan.Ops[0], Fabric: f, NodeRank: nodeRank}
	var failed error
	if fp := f.FailedPairs(); len(fp) > 0 {
		failed = &PairsFailedError{Failed: fp, Pairs: len(f.Pairs)}
	}
	if nodeRank != 0 {
		return sw, failed
	}
	d, err := bench.Diagnose(f, c.SlowThreshold)
	if err != nil {
		return nil, err
	}
	sw.Diagnosis = &d
	return sw, failed
}

// pairRunner runs this node's side of each pair as a gang of two nodes, through the
// launcher like Run's gang: a Consul rendezvous of the pair's job id, the bundled
// script, no restarts.
type pairRunner struct {
	cfg       launcher.Config // the node's supervisor configuration; JobID and sizes are set per pair
	inventory *topology.Inventory
	supervise Supervise
	store     store.Store
	log       *zap.Logger
	plan      bench.Plan
	backend   string
	python    string
	script    string
	dir       string
	host      string
	progress  progress
}

// run implements bench.PairRunner.
func (r *pairRunner) run(ctx context.Context, t bench.PairTask) (*bench.Result, error) {
	dir, err := os.MkdirTemp(r.dir, fmt.Sprintf("round%d-", t.Round))
	if err != nil {
		return nil, fmt.Errorf("pair %s–%s: %w", t.Self.Name, t.Partner.Name, err)
	}
	out := filepath.Join(dir, ResultsFile)
	progressFile := ""
	if r.progress.on() {
		progressFile = filepath.Join(dir, ProgressFile)
	}
	rc, err := rendezvous.NewDynamic(r.store, rendezvous.DynamicConfig{JobID: t.JobID, MinNodes: 2, MaxNodes: 2,
		Host: r.host, Log: r.log.Named("rendezvous")})
	if err != nil {
		return nil, fmt.Errorf("pair %s–%s: %w", t.Self.Name, t.Partner.Name, err)
	}
	defer rc.Close(context.Background())
	lc := r.cfg
	lc.JobID, lc.NNodesMin, lc.NNodesMax, lc.MaxRestarts = t.JobID, 2, 2, 0
	lc.Command = append([]string{r.python, r.script}, benchscript.Args(r.plan, r.backend, out, progressFile)...)
	g := &launcher.Prepared{Config: lc, Opened: &rendezvous.Opened{Rendezvous: rc}, Inventory: r.inventory}

	stop := r.progress.follow(ctx, progressFile, fmt.Sprintf("%s–%s (round %d)", t.Self.Name, t.Partner.Name, t.Round))
	res := r.supervise(ctx, g)
	stop()
	if res.ExitCode != 0 {
		switch {
		case res.Failure != nil:
			return nil, errors.New(res.Failure.String())
		case res.Err != nil:
			return nil, res.Err
		}
		return nil, fmt.Errorf("the pair's gang on %s exited with code %d", t.Self.Name, res.ExitCode)
	}
	fh, err := os.Open(out)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // the partner ran the pair's rank 0, which holds the result
	}
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	results, err := bench.DecodeScript(fh)
	if err != nil {
		return nil, err
	}
	for i := range results {
		if results[i].Op == r.plan.Ops[0] {
			return &results[i], nil
		}
	}
	return nil, fmt.Errorf("the benchmark's results hold no %s", r.plan.Ops[0])
}
