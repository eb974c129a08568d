package job

import (
	"context"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// NodeUsage is what a batch job's processes have used on one node so far, read from
// the job's cgroup there (cgroup.Usage): what sstat shows. The job's step on the node
// writes it at gangrun/batch/usage/<id>/<node>, held by the step's session, at
// UsageInterval, and while the step runs only (a key no session holds is a step that
// ended). Every process of the job on the node (the batch script, every srun step's
// tasks) is in that one cgroup: the figures are the job's on the node, not one step's.
type NodeUsage struct {
	Node string `json:"node"`
	cgroup.Usage
	// MaxBytes is the most memory the cgroup held: PeakBytes, or where the kernel keeps
	// no peak, the highest CurrentBytes the step saw at its samples.
	MaxBytes int64 `json:"max_bytes"`
	// Sampled is when the figures were read.
	Sampled time.Time `json:"sampled"`
}

// Timing of the usage a step records.
const (
	// UsageInterval is how often a batch job's step writes its node's usage: Slurm's
	// JobAcctGatherFrequency default (task=30, slurm.conf(5)).
	UsageInterval = 30 * time.Second
	// usageSample is how often it reads the cgroup between writes (the highest
	// memory seen, where the kernel keeps no peak); in the step's first usageEarly it
	// writes at every sample that changed (a short job's usage is seen at all).
	usageSample = 2 * time.Second
	usageEarly  = 10 * time.Second
)

// usagePrefix is where job id's usage records are: outside jobsPrefix, so that their
// writes every UsageInterval do not wake the controller, which follows jobsPrefix.
// They go with the step's session (store.DeleteKeys), and closeSession deletes them.
func usagePrefix(id string) string    { return batchPrefix + "usage/" + id + "/" }
func usageKey(id, node string) string { return usagePrefix(id) + node }

// gatherUsage writes this node's usage of the job's cgroup (NodeUsage) until ctx ends:
// at each usageSample that changed it for usageEarly, then every UsageInterval when
// it changed. Nothing without a
// cgroup (the job runs unconfined) or a session.
func (bs *batchStep) gatherUsage(ctx context.Context) {
	if bs.cg == nil || bs.st.sess == "" {
		return
	}
	t := time.NewTicker(usageSample)
	defer t.Stop()
	var last NodeUsage
	var peak int64
	var written time.Time
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		u := bs.cg.Usage()
		peak = max(peak, u.PeakBytes, u.CurrentBytes)
		now := time.Now()
		if !written.IsZero() && now.Sub(written) < UsageInterval && now.Sub(start) > usageEarly {
			continue
		}
		nu := NodeUsage{Node: bs.st.cfg.Node, Usage: u, MaxBytes: peak, Sampled: now.UTC()}
		if !written.IsZero() && nu.Usage == last.Usage && nu.MaxBytes == last.MaxBytes {
			continue // nothing new: no write, no watcher woken
		}
		if err := writeUsage(ctx, bs.st.cfg.Store, bs.st.sess, bs.st.cfg.Job, nu); err != nil {
			bs.log.Debug("record the job's usage on this node", zap.Error(err))
			continue
		}
		last, written = nu, now
	}
}

// writeUsage writes node usage u of job id, held by session.
func writeUsage(ctx context.Context, s store.Store, session, id string, u NodeUsage) error {
	b, err := schema.Marshal(schema.StepUsage, u)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, store.CallTimeout)
	defer cancel()
	_, err = s.Txn(cctx, []store.Op{{Verb: store.Lock, Key: usageKey(id, u.Node), Value: b, Session: session}})
	return err
}

// NodeUsages returns the usage each node's step of job id last recorded (NodeUsage), by
// node: the steps that run now alone (their key is held). Records a newer gangrun wrote
// are left out.
func NodeUsages(ctx context.Context, s store.Store, id string) (map[string]NodeUsage, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	entries, _, err := s.List(ctx, usagePrefix(id))
	if err != nil {
		return nil, err
	}
	out := map[string]NodeUsage{}
	for _, e := range entries {
		node := strings.TrimPrefix(e.Key, usagePrefix(id))
		var u NodeUsage
		if e.Session == "" || schema.Unmarshal(schema.StepUsage, e.Value, &u) != nil {
			continue
		}
		u.Node = node
		out[node] = u
	}
	return out, nil
}
