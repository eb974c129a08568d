package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gangrun/gangrun/checkpoint"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// DefaultCheckpointCacheTTL is how long one look into a job's checkpoint directory
// serves the scrapes that follow: finding the newest complete checkpoint reads the
// directory (often on a shared file system), and checkpoints come minutes apart.
const DefaultCheckpointCacheTTL = 30 * time.Second

// JobCollector exports the supervision of the cluster jobs whose node rank 0 runs on
// this agent's node (job.State.RankZeroNode): each job is exported by one agent, and
// moves with its rank 0. Every value comes from the job's record in Consul (its
// attempts, restarts by cause), which the job's steps keep, except the checkpoint's age,
// read from the job's checkpoint directory when a scrape comes (cached,
// DefaultCheckpointCacheTTL) and noted in the record when a newer one appears.
type JobCollector struct {
	s        store.Store
	node     string
	ttl      time.Duration
	ckptTTL  time.Duration
	restarts *prometheus.Desc
	recovery *prometheus.Desc
	ckptAge  *prometheus.Desc
	ettr     *prometheus.Desc

	mu    sync.Mutex
	at    time.Time
	jobs  []job.Job
	ckpts map[string]ckptLook // job id → the last look into its checkpoint directory
}

// ckptLook is one look into a job's checkpoint directory.
type ckptLook struct {
	dir  string
	at   time.Time
	ok   bool // a complete checkpoint was found
	path string
	mod  time.Time
}

// NewJobCollector returns the collector of the supervision of the jobs whose node rank
// 0 runs on node, reading s at most once per ttl (0: DefaultCacheTTL) and each job's
// checkpoint directory at most once per ckptTTL (0: DefaultCheckpointCacheTTL).
func NewJobCollector(s store.Store, node string, ttl, ckptTTL time.Duration) *JobCollector {
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	if ckptTTL <= 0 {
		ckptTTL = DefaultCheckpointCacheTTL
	}
	l := []string{"hpc_job", "hpc_user", "hpc_job_name"}
	return &JobCollector{s: s, node: node, ttl: ttl, ckptTTL: ckptTTL, ckpts: map[string]ckptLook{},
		restarts: prometheus.NewDesc("gangrun_job_restarts_total",
			"Restarts of a running job's gang by the cause of the failure before each (worker_exit, signal, hang, node_lost, gpu_health, preempted, other); exported by the agent of the job's node rank 0.",
			append(l, "cause"), nil),
		recovery: prometheus.NewDesc("gangrun_job_failure_to_workers_started_seconds",
			"A running job's last restart: from the failure to the next attempt's workers started (the first node's; the trainer's first step is not seen by gangrun).", l, nil),
		ckptAge: prometheus.NewDesc("gangrun_job_checkpoint_age_seconds",
			"Age of the newest complete checkpoint in a running job's checkpoint directory (from its modification time; the directory is read through a cache of 30 s by default).", l, nil),
		ettr: prometheus.NewDesc("gangrun_job_effective_training_time_ratio",
			"A running job's effective training time ratio: its workers' time that a checkpoint kept (or that runs now) over the wall time since it first started.", l, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *JobCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.restarts, c.recovery, c.ckptAge, c.ettr} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *JobCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	jobs, err := c.read(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for _, j := range jobs {
		st := &j.State
		l := []string{j.Spec.ID, j.Spec.User, j.Spec.Name}
		for _, cause := range job.RestartCauses() {
			ch <- prometheus.MustNewConstMetric(c.restarts, prometheus.CounterValue, float64(st.RestartsByCause[cause]), append(l, cause)...)
		}
		if d, ok := st.Recovery(); ok {
			ch <- prometheus.MustNewConstMetric(c.recovery, prometheus.GaugeValue, d.Seconds(), l...)
		}
		if r, ok := st.ETTR(j.Spec.CheckpointDir, now); ok {
			ch <- prometheus.MustNewConstMetric(c.ettr, prometheus.GaugeValue, r, l...)
		}
		if look := c.checkpoint(ctx, j, now); look.ok {
			ch <- prometheus.MustNewConstMetric(c.ckptAge, prometheus.GaugeValue, max(now.Sub(look.mod), 0).Seconds(), l...)
		}
	}
}

// read returns the running jobs whose node rank 0 is this node, read afresh when the
// last read is older than the TTL.
func (c *JobCollector) read(ctx context.Context) ([]job.Job, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.jobs != nil && time.Since(c.at) < c.ttl {
		return c.jobs, nil
	}
	ids, err := job.PlacedOn(ctx, c.s, c.node)
	if err != nil {
		return nil, err
	}
	jobs := []job.Job{}
	for _, id := range ids {
		j, err := job.Read(ctx, c.s, id)
		switch {
		case errors.Is(err, job.ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		if j.State.RankZeroNode() == c.node {
			jobs = append(jobs, *j)
		}
	}
	for id := range c.ckpts {
		if !containsJob(jobs, id) {
			delete(c.ckpts, id)
		}
	}
	c.jobs, c.at = jobs, time.Now()
	return jobs, nil
}

func containsJob(jobs []job.Job, id string) bool {
	for _, j := range jobs {
		if j.Spec.ID == id {
			return true
		}
	}
	return false
}

// checkpoint returns the last look into j's checkpoint directory, looking again when it
// is older than the checkpoint TTL; a newer checkpoint than the job's record has is
// noted there (job.NoteCheckpoint).
func (c *JobCollector) checkpoint(ctx context.Context, j job.Job, now time.Time) ckptLook {
	dir := j.Spec.CheckpointPath()
	if dir == "" {
		return ckptLook{}
	}
	c.mu.Lock()
	look, ok := c.ckpts[j.Spec.ID]
	c.mu.Unlock()
	if ok && look.dir == dir && now.Sub(look.at) < c.ckptTTL {
		return look
	}
	look = ckptLook{dir: dir, at: now}
	if cp, err := checkpoint.Latest(dir, checkpoint.Options{}); err == nil && !cp.ModTime.IsZero() {
		look.ok, look.path, look.mod = true, cp.Path, cp.ModTime
	}
	c.mu.Lock()
	c.ckpts[j.Spec.ID] = look
	c.mu.Unlock()
	if seen := j.State.Checkpoint; look.ok && (seen == nil || seen.Path != look.path) {
		_ = job.NoteCheckpoint(ctx, c.s, j.Spec.ID, job.CheckpointSeen{Path: look.path, Time: look.mod.UTC(), Seen: now.UTC()})
	}
	return look
}
