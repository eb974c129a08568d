package metrics

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// The defaults of agent --waste-threshold and --waste-after: a job whose GPUs on a
// node all stay under 5 % utilisation for 30 minutes is flagged (a job that loads data
// or checkpoints for minutes is not; one hung or forgotten for half an hour is).
const (
	DefaultWasteThreshold = 5.0
	DefaultWasteAfter     = 30 * time.Minute
	// maxWasteCheck bounds how long the watcher waits between two looks.
	maxWasteCheck = 30 * time.Second
)

// WasteConfig configures WatchWaste.
type WasteConfig struct {
	Store store.Store
	// Node is this node's name.
	Node string
	// Session returns the agent's session ("" while unregistered): it holds the marks.
	Session func() string
	// GPUs reads the GPUs' utilisation; View says which job holds each.
	GPUs *GPUCollector
	View *View
	// Threshold (in %) and After: a job whose GPUs here all stay under Threshold for
	// After is marked idle (job.IdleMark).
	Threshold float64
	After     time.Duration
	Log       *zap.Logger
}

// wasteCheckEvery is how often the watcher looks: a tenth of after, between a second
// and maxWasteCheck.
func wasteCheckEvery(after time.Duration) time.Duration {
	return min(max(after/10, time.Second), maxWasteCheck)
}

// WatchWaste looks at the utilisation of the node's GPUs held by cluster jobs until ctx
// ends, and marks a job idle on this node (job.MarkIdle) once all its GPUs here have
// stayed under cfg.Threshold for cfg.After; the mark goes when one of them works again
// or the job leaves the node. Without NVML (a recorded inventory) it returns at once:
// there is no utilisation to look at.
func WatchWaste(ctx context.Context, cfg WasteConfig) error {
	if _, ok := cfg.GPUs.Utilization(ctx); !ok {
		return nil
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	w := &wasteWatcher{cfg: cfg, log: log, under: map[string]time.Time{}, marked: map[string]bool{}}
	tick := time.NewTicker(wasteCheckEvery(cfg.After))
	defer tick.Stop()
	for {
		if err := w.look(ctx, time.Now()); err != nil && ctx.Err() == nil {
			log.Warn("gpu waste: look", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

type wasteWatcher struct {
	cfg    WasteConfig
	log    *zap.Logger
	under  map[string]time.Time // job → since when all its GPUs here are under the threshold
	marked map[string]bool      // jobs marked idle here
}

// look is one look at the GPUs at now.
func (w *wasteWatcher) look(ctx context.Context, now time.Time) error {
	util, _ := w.cfg.GPUs.Utilization(ctx)
	holders, err := w.cfg.View.Holders(ctx, w.cfg.Node)
	if err != nil {
		return err
	}
	gpus := map[string][]int{}
	for gpu, j := range holders {
		if j.IsJob {
			gpus[j.ID] = append(gpus[j.ID], gpu)
		}
	}
	var firstErr error
	keep := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for id, list := range gpus {
		slices.Sort(list)
		top := -1.0
		for _, g := range list {
			u, ok := util[g]
			if !ok {
				u = 100 // unknown: not idle
			}
			top = max(top, u)
		}
		if top >= w.cfg.Threshold {
			delete(w.under, id)
			if w.marked[id] {
				keep(job.ClearIdle(ctx, w.cfg.Store, id, w.cfg.Node))
				delete(w.marked, id)
				w.log.Info("gpu waste: job works again", zap.String("job", id), zap.Float64("util_percent", top))
			}
			continue
		}
		since, ok := w.under[id]
		if !ok {
			since = now
			w.under[id] = since
		}
		if now.Sub(since) < w.cfg.After {
			continue
		}
		sess := w.cfg.Session()
		if sess == "" || w.marked[id] {
			continue
		}
		m := job.IdleMark{Node: w.cfg.Node, GPUs: list, Since: since.UTC(), MaxUtil: top, Threshold: w.cfg.Threshold}
		if err := job.MarkIdle(ctx, w.cfg.Store, sess, id, m); err != nil {
			keep(fmt.Errorf("mark job %s idle: %w", id, err))
			continue
		}
		w.log.Warn("gpu waste: job's GPUs idle", zap.String("job", id), zap.Ints("gpus", list),
			zap.Float64("threshold_percent", w.cfg.Threshold), zap.Duration("for", now.Sub(since)))
		w.marked[id] = true
	}
	for id := range w.under {
		if _, ok := gpus[id]; !ok {
			delete(w.under, id)
		}
	}
	for id := range w.marked {
		if _, ok := gpus[id]; !ok {
			keep(job.ClearIdle(ctx, w.cfg.Store, id, w.cfg.Node))
			delete(w.marked, id)
		}
	}
	return firstErr
}
