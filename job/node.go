package job

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/store"
)

// launch is a job's step the launcher started: its placement, the job's submission
// (which names its ledger entry), and whether its outcome was recorded again from the
// ledger.
type launch struct {
	placement int
	submitted time.Time
	recorded  bool
}

// LauncherConfig configures a node's launcher of job steps.
type LauncherConfig struct {
	// Store is the cluster's Consul; Node this node's name.
	Store store.Store
	Node  string
	// Spawn starts job's step on this node as a process of its own, which must outlive
	// the caller (the agent): `gangrun __step`, in a session of its own (setsid).
	Spawn func(job string) error
	// Log receives the launcher's messages; nil discards them.
	Log *zap.Logger
	// StateDir is the agent's state directory, where the node's ledger of its steps'
	// outcomes is (ledger.go): a placement whose step ended here is never started
	// again, its outcome recorded instead. "" keeps none.
	StateDir string
}

// launcherRetry is how soon a launcher reads again a job whose state it could not read.
const launcherRetry = time.Second

// RunLauncher starts, on its node, the step of every job that runs there, as the
// node's agent (slurmd starting slurmstepd), until ctx ends. It watches the node's own
// entries of the launchers' index (gangrun/batch/placed/<node>/, anchored: store.Anchor),
// so what it reads does not grow with the cluster's jobs, and confirms each against the
// job's state. It starts
// each job's step once per placement: a step that dies is not started again by it (the
// controller handles the node as lost); a restarted agent finds the steps that outlived
// it by their keys and leaves them be.
func RunLauncher(ctx context.Context, cfg LauncherConfig) error {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	prefix := placedPrefix + cfg.Node + "/"
	// The node's index is empty whenever it runs nothing: its anchor keeps the watch
	// from waking at every write to the store (store.Anchor).
	anchored := false
	anchor := func() {
		if err := store.Anchor(ctx, cfg.Store, prefix); err != nil {
			log.Warn("anchor the node's index of jobs (tried again at its next change)", zap.String("key", prefix), zap.Error(err))
			return
		}
		anchored = true
	}
	anchor()
	pruneLedger(cfg.StateDir, time.Now())
	w := store.NewWatcher(cfg.Store, prefix)
	nl := &nodeLauncher{cfg: cfg, log: log, launched: map[string]launch{}}
	var entries []store.Entry
	retry := false
	for {
		if retry {
			// A job's state could not be read: the same entries again in a moment (the
			// watch wakes on changes only).
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(launcherRetry):
			}
		} else {
			var err error
			if entries, err = w.Next(ctx); err != nil {
				return nil
			}
		}
		retry = false
		if !anchored {
			anchor()
		}
		placed := placedIn(entries, prefix)
		for id := range nl.launched {
			if _, ok := placed[id]; !ok {
				delete(nl.launched, id)
			}
		}
		for _, id := range slices.Sorted(maps.Keys(placed)) {
			if l, ok := nl.launched[id]; ok && l.placement == placed[id] {
				retry = nl.recheck(ctx, id, l) || retry
			} else {
				retry = nl.launch(ctx, id, placed[id]) || retry
			}
		}
	}
}

// placedIn parses the node's index entries (under prefix): job id → placement.
func placedIn(entries []store.Entry, prefix string) map[string]int {
	placed := map[string]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(string(e.Value))
		if id := strings.TrimPrefix(e.Key, prefix); err == nil && id != "" && !strings.Contains(id, "/") {
			placed[id] = p
		}
	}
	return placed
}

// nodeLauncher is RunLauncher's state: the steps it started.
type nodeLauncher struct {
	cfg      LauncherConfig
	log      *zap.Logger
	launched map[string]launch // job → the placement its step was started for
}

// recheck looks again at job id, whose step for placement l it started already: Consul
// restored from a snapshot may show it running though its step ended since, and the
// node's ledger says so. It reports whether to try again in a moment.
func (nl *nodeLauncher) recheck(ctx context.Context, id string, l launch) (retry bool) {
	if l.recorded {
		return false
	}
	done, err := readLedger(nl.cfg.StateDir, id, l.placement, l.submitted)
	if err != nil || done == nil {
		return false
	}
	if err := recordStepEnd(ctx, nl.cfg.Store, id, nl.cfg.Node, done.Placement, done.End, done.ExitCode, done.Why); err != nil {
		return true
	}
	nl.log.Warn("the job's step ended here already, after the state Consul shows: its outcome recorded again",
		zap.String("job", id), zap.Int("placement", done.Placement), zap.String("end", string(done.End)))
	l.recorded = true
	nl.launched[id] = l
	return false
}

// launch starts the step of job id's placement on the node, once its state confirms
// the index, unless the node's ledger has its outcome already (recorded again then) or
// a step of it runs. It reports whether to try again in a moment.
func (nl *nodeLauncher) launch(ctx context.Context, id string, placement int) (retry bool) {
	cfg, log := nl.cfg, nl.log
	j, err := Read(ctx, cfg.Store, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return true
	}
	if err != nil || j.State.Status != Running || !slices.Contains(j.State.Nodes, cfg.Node) || j.State.Placement != placement {
		return false // the index is ahead of or behind the state: the next change settles it
	}
	if done, err := readLedger(cfg.StateDir, id, placement, j.Spec.Submitted); err != nil {
		log.Warn("the node's ledger", zap.String("job", id), zap.Error(err))
	} else if done != nil {
		// This placement's step ended here already: Consul forgot it (restored from a
		// snapshot taken before). Its outcome, not a second run.
		if err := recordStepEnd(ctx, cfg.Store, id, cfg.Node, done.Placement, done.End, done.ExitCode, done.Why); err != nil {
			return true
		}
		log.Warn("the job's step ended here already: its outcome recorded again, the step not started again",
			zap.String("job", id), zap.Int("placement", done.Placement), zap.String("end", string(done.End)))
		nl.launched[id] = launch{placement: placement, submitted: j.Spec.Submitted, recorded: true}
		return false
	}
	nl.launched[id] = launch{placement: placement, submitted: j.Spec.Submitted}
	if e, err := cfg.Store.Get(ctx, stepKey(id, cfg.Node)); err == nil && e != nil && e.Session != "" {
		return false // a step outlived this agent's restart, or started already
	}
	log.Info("starting the job's step", zap.String("job", id), zap.Int("placement", placement))
	if err := cfg.Spawn(id); err != nil {
		log.Error("start the job's step", zap.String("job", id), zap.Error(err))
	}
	return false
}

// PlacedOn returns the ids of the jobs running on node, as the launchers' index
// (gangrun/batch/placed/<node>/) has them: what the node's agent reads, not every job.
func PlacedOn(ctx context.Context, s store.Store, node string) ([]string, error) {
	prefix := placedPrefix + node + "/"
	entries, _, err := s.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if id := strings.TrimPrefix(e.Key, prefix); id != "" && !strings.Contains(id, "/") {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
