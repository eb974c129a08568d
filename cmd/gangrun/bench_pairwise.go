package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/rendezvous"
	benchscript "github.com/gangrun/gangrun/scripts/bench"
)

// pairwiseGrace is added to --term-timeout to make the round grace of a sweep
// (bench.NodeSweep.RoundGrace): a pair stopped at its timeout takes up to
// --term-timeout to stop its workers, then publishes its failure.
const pairwiseGrace = 30 * time.Second

// pairwiseLeaveTimeout bounds the wait, after the last round, for every node to report
// the sweep's rendezvous round done.
const pairwiseLeaveTimeout = time.Minute

// checkPairwise returns why --pairwise cannot run with these flags ("" when it can):
// it needs a Consul coordinator, one operation and positive timeouts.
func (b *benchFlags) checkPairwise(e *env, coordinator string, plan bench.Plan) string {
	if coordinator == "" && rendezvous.InSlurmStep(e.getenv) {
		coordinator = "slurm"
	}
	if !strings.HasPrefix(coordinator, "consul://") {
		name := coordinator
		if name == "" {
			name = "embedded"
		}
		return fmt.Sprintf("--pairwise needs --coordinator consul://HOST:PORT (got %s): the nodes publish every pair's result there, and %s has no shared place for them", name, name)
	}
	if len(plan.Ops) != 1 {
		return fmt.Sprintf("--pairwise measures one operation: --op %q lists %d", b.ops, len(plan.Ops))
	}
	if b.pairTimeout <= 0 {
		return fmt.Sprintf("--pair-timeout %s: must be positive", b.pairTimeout)
	}
	if b.joinTimeout <= 0 {
		return fmt.Sprintf("--join-timeout %s: must be positive", b.joinTimeout)
	}
	return ""
}

// runPairwise runs this node's part of `gangrun bench nccl --pairwise` across nodes
// that all run the same command with --coordinator consul://… and one --job-id: the
// nodes meet in a rendezvous round of the job, sweep every pair (bench.NodeSweep), each
// pair as a gang of two nodes started like any `bench nccl` run, and node rank 0 prints
// the node × node matrix and the diagnosis. The other nodes print a one-line summary of
// their own pairs on stderr.
//
// Exit codes: 0 when every pair (on node rank 0) or every pair of this node's (on the
// others) gave a figure, slow ones included; 1 when a pair failed or the sweep could
// not run; 2 usage; 127 no interpreter; 128+N when stopped by signal N.
func runPairwise(ctx context.Context, e *env, g *launcher.Prepared, b *benchFlags, plan bench.Plan, format bench.Format, dir string, log *zap.Logger) int {
	cfg := g.Config
	gpus := len(g.Inventory.Allocatable())
	backend := b.backend
	if backend == "" {
		backend = "gloo"
		if gpus > 0 {
			backend = "nccl"
		}
	}
	if backend == "nccl" && gpus == 0 {
		return usageErr(e, benchCmd, "--backend nccl needs GPUs, and this node has none allocatable (use --backend gloo)")
	}
	if _, err := exec.LookPath(b.python); err != nil {
		fmt.Fprintf(e.stderr, "gangrun %s: --python %s: not found on PATH\n", benchCmd, b.python)
		return exitNotFound
	}
	if code := torchUsable(ctx, e, b.python); code != exitOK {
		return code
	}
	script, err := benchscript.Write(dir)
	if err != nil {
		return failErr(e, benchCmd, err)
	}
	s := g.Opened.Store
	if s == nil {
		return usageErr(e, benchCmd, "--pairwise needs --coordinator consul://HOST:PORT (the pairs meet in Consul)")
	}

	if !e.startup.handOver() {
		return exitFailure // stopped by a signal: main says so
	}
	ctx, stopped, release := watchSignals(ctx, e.signals)
	defer release()

	// 1. Meet: a rendezvous round of the job gives every node its node rank.
	since, err := bench.MarkSweep(ctx, s, cfg.JobID)
	if err != nil {
		return failErr(e, benchCmd, err)
	}
	jctx, cancel := context.WithTimeout(ctx, b.joinTimeout)
	round, err := g.Opened.Rendezvous.Join(jctx, rendezvous.JoinRequest{Node: cfg.NodeName, Addr: cfg.Addr,
		LocalWorldSize: cfg.NProcPerNode, Switch: cfg.Switch})
	cancel()
	if sig := stopped.signal(); sig != 0 {
		return 128 + int(sig)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return failErr(e, benchCmd, fmt.Errorf("pairwise sweep %s: the nodes did not meet within --join-timeout %s (--nnodes %d:%d)",
			cfg.JobID, b.joinTimeout, cfg.NNodesMin, cfg.NNodesMax))
	}
	if err != nil {
		return failErr(e, benchCmd, fmt.Errorf("pairwise sweep %s: rendezvous: %w", cfg.JobID, err))
	}
	a := round.Assignment()

	// 2. Sweep: every round of pairs, each pair a gang of two.
	wcfg := cfg
	wcfg.Stdout, wcfg.Stderr = e.stderr, e.stderr // stdout carries the results only
	var pl *progressLine
	if isTerminal(e.stdout) {
		pl = &progressLine{w: e.stderr, start: time.Now()}
		wcfg.Stdout, wcfg.Stderr = pl, pl
	}
	wcfg.Signals = stopped.fwd
	host, _ := os.Hostname()
	pr := &pairRunner{e: e, cfg: wcfg, g: g, store: s, log: log, plan: plan, backend: backend,
		python: b.python, script: script, dir: dir, host: host, progress: pl}
	var nics []string
	for _, d := range g.Inventory.RDMADevices {
		nics = append(nics, d.Name)
	}
	ns := bench.NodeSweep{Store: s, JobID: cfg.JobID, Self: bench.Node{Name: cfg.NodeName, NICs: nics},
		NodeRank: a.NodeRank, NNodes: a.NNodes, Since: since, RunPair: pr.run,
		PairTimeout: b.pairTimeout, JoinTimeout: b.joinTimeout, RoundGrace: cfg.TermTimeout + pairwiseGrace}
	if pl != nil {
		ns.OnRound = func(r, rounds int, pairs []bench.Pair, nodes []bench.Node) {
			pl.set(fmt.Sprintf("round %d/%d of the pairwise sweep: %d pairs · %s elapsed", r, rounds, len(pairs), time.Since(pl.start).Round(time.Second)))
		}
	}
	f, err := ns.Run(ctx)
	if pl != nil {
		pl.done()
	}
	if sig := stopped.signal(); sig != 0 {
		return 128 + int(sig)
	}
	if err != nil {
		return failErr(e, benchCmd, err)
	}
	// Every node reports its part of the rendezvous round done, so the job finishes.
	lctx, cancel := context.WithTimeout(ctx, pairwiseLeaveTimeout)
	if _, err := round.Succeed(lctx); err != nil {
		log.Warn("pairwise sweep: waiting for the other nodes to finish", zap.Error(err))
	}
	cancel()

	// 3. Report.
	failed := failedPairs(f)
	if a.NodeRank != 0 {
		fmt.Fprintf(e.stderr, "gangrun %s: %s\n", benchCmd, ownSummary(f, a.NodeRank))
		if len(failed) > 0 {
			return exitFailure
		}
		return exitOK
	}
	d, err := bench.Diagnose(f, b.slowThreshold)
	if err != nil {
		return failErr(e, benchCmd, err)
	}
	if err := bench.WriteFabric(e.stdout, format, plan.Ops[0], f, d); err != nil {
		return failErr(e, benchCmd, err)
	}
	if len(failed) > 0 {
		return failErr(e, benchCmd, fmt.Errorf("%d of %d pairs failed: %s", len(failed), len(f.Pairs), strings.Join(failed, "; ")))
	}
	return exitOK
}

// failedPairs describes the failed pairs of f, "a–b: why" each.
func failedPairs(f *bench.Fabric) []string {
	var out []string
	for _, pr := range f.Pairs {
		if pr.Err != nil {
			out = append(out, fmt.Sprintf("%s–%s: %v", f.Nodes[pr.Pair.A].Name, f.Nodes[pr.Pair.B].Name, pr.Err))
		}
	}
	return out
}

// ownSummary is the line a node other than node rank 0 prints: its pairs' figures.
func ownSummary(f *bench.Fabric, rank int) string {
	var parts []string
	for _, pr := range f.Pairs {
		other := pr.Pair.A
		if other == rank {
			other = pr.Pair.B
		}
		if pr.Err != nil {
			parts = append(parts, fmt.Sprintf("%s failed (%v)", f.Nodes[other].Name, pr.Err))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f GB/s", f.Nodes[other].Name, pr.Figure()))
	}
	return fmt.Sprintf("pairwise sweep of %d nodes done; %s (node rank %d), busbw with %s; node rank 0 (%s) prints the matrix",
		len(f.Nodes), f.Nodes[rank].Name, rank, strings.Join(parts, ", "), f.Nodes[0].Name)
}

// pairRunner runs this node's side of each pair as a gang of two nodes, through the
// launcher like any `bench nccl` run: a Consul rendezvous of the pair's job id, the
// bundled script, no restarts.
type pairRunner struct {
	e        *env
	cfg      launcher.Config // the node's launcher configuration; JobID and sizes are set per pair
	g        *launcher.Prepared
	store    store.Store
	log      *zap.Logger
	plan     bench.Plan
	backend  string
	python   string
	script   string
	dir      string
	host     string
	progress *progressLine // nil when stdout is not a terminal
}

// run implements bench.PairRunner.
func (p *pairRunner) run(ctx context.Context, t bench.PairTask) (*bench.Result, error) {
	dir, err := os.MkdirTemp(p.dir, fmt.Sprintf("round%d-", t.Round))
	if err != nil {
		return nil, fmt.Errorf("pair %s–%s: %w", t.Self.Name, t.Partner.Name, err)
	}
	out := filepath.Join(dir, "results.json")
	progress := ""
	if p.progress != nil {
		progress = filepath.Join(dir, "progress.jsonl")
	}
	rc, err := rendezvous.NewDynamic(p.store, rendezvous.DynamicConfig{JobID: t.JobID, MinNodes: 2, MaxNodes: 2,
		Host: p.host, Log: p.log.Named("rendezvous")})
	if err != nil {
		return nil, fmt.Errorf("pair %s–%s: %w", t.Self.Name, t.Partner.Name, err)
	}
	defer rc.Close(context.Background())
	cfg := p.cfg
	cfg.JobID, cfg.NNodesMin, cfg.NNodesMax, cfg.MaxRestarts = t.JobID, 2, 2, 0
	cfg.Command = append([]string{p.python, p.script}, benchscript.Args(p.plan, p.backend, out, progress)...)
	g := &launcher.Prepared{Config: cfg, Opened: &rendezvous.Opened{Rendezvous: rc}, Inventory: p.g.Inventory}

	stop := func() {}
	if p.progress != nil {
		p.progress.setPair(fmt.Sprintf("%s–%s (round %d)", t.Self.Name, t.Partner.Name, t.Round))
		stop = p.progress.follow(ctx, progress)
	}
	code, res := supervise(ctx, p.e, benchCmd, g)
	stop()
	if code != exitOK {
		switch {
		case res.Failure != nil:
			return nil, errors.New(res.Failure.String())
		case res.Err != nil:
			return nil, res.Err
		}
		return nil, fmt.Errorf("the pair's gang on %s exited with code %d", t.Self.Name, code)
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
		if results[i].Op == p.plan.Ops[0] {
			return &results[i], nil
		}
	}
	return nil, fmt.Errorf("the benchmark's results hold no %s", p.plan.Ops[0])
}

// sweepSignals reads gangrun's signals during a sweep, when no supervisor may be
// running to read them.
type sweepSignals struct {
	// fwd receives every signal, for the supervisor of the pair being run (it forwards
	// them to its workers); one left unread is dropped when fwd is full.
	fwd chan os.Signal
	mu  sync.Mutex
	sig syscall.Signal // the first terminating signal
}

// watchSignals starts reading in: every signal is passed on to the returned fwd, and
// SIGINT, SIGTERM or SIGHUP also ends the returned context. release stops reading.
func watchSignals(ctx context.Context, in <-chan os.Signal) (context.Context, *sweepSignals, func()) {
	ctx, cancel := context.WithCancel(ctx)
	s := &sweepSignals{fwd: make(chan os.Signal, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-in:
				select {
				case s.fwd <- sig:
				default:
				}
				if ss, ok := sig.(syscall.Signal); ok && (ss == syscall.SIGINT || ss == syscall.SIGTERM || ss == syscall.SIGHUP) {
					s.mu.Lock()
					if s.sig == 0 {
						s.sig = ss
					}
					s.mu.Unlock()
					cancel()
				}
			}
		}
	}()
	return ctx, s, func() {
		cancel()
		<-done
	}
}

// signal returns the terminating signal received, 0 when none.
func (s *sweepSignals) signal() syscall.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sig
}
