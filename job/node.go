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
	w := store.NewWatcher(cfg.Store, prefix)
	launched := map[string]int{} // job → the placement its step was started for
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
		placed := map[string]int{}
		for _, e := range entries {
			p, err := strconv.Atoi(string(e.Value))
			if id := strings.TrimPrefix(e.Key, prefix); err == nil && id != "" && !strings.Contains(id, "/") {
				placed[id] = p
			}
		}
		for id := range launched {
			if _, ok := placed[id]; !ok {
				delete(launched, id)
			}
		}
		for _, id := range slices.Sorted(maps.Keys(placed)) {
			if launched[id] == placed[id] {
				continue
			}
			j, err := Read(ctx, cfg.Store, id)
			if err != nil && !errors.Is(err, ErrNotFound) {
				retry = true
				continue
			}
			if err != nil || j.State.Status != Running || !slices.Contains(j.State.Nodes, cfg.Node) || j.State.Placement != placed[id] {
				continue // the index is ahead of or behind the state: the next change settles it
			}
			launched[id] = placed[id]
			if e, err := cfg.Store.Get(ctx, stepKey(id, cfg.Node)); err == nil && e != nil && e.Session != "" {
				continue // a step outlived this agent's restart, or started already
			}
			log.Info("starting the job's step", zap.String("job", id), zap.Int("placement", placed[id]))
			if err := cfg.Spawn(id); err != nil {
				log.Error("start the job's step", zap.String("job", id), zap.Error(err))
			}
		}
	}
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
