package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/reason"
)

// pendingReason classifies a pending job's reason for gangrun_pending_jobs: a bounded
// set of the reason package's codes (Slurm's names), not the scheduler's free-text
// explanation, which `gangrun queue` shows. reason.Priority: not yet looked at by the
// scheduler, or behind jobs of higher priority; reason.Resources: the scheduler found no
// placement for it now; reason.Requeued: it ran, lost a node it could not do without
// (or was pre-empted), and waits to be placed again; reason.JobHeldUser and
// reason.JobHeldAdmin: held (scontrol hold); reason.Dependency,
// DependencyNeverSatisfied, JobArrayTaskLimit: held back by its dependencies or its
// array's cap.
func pendingReason(j job.Job, schedulerReason string) reason.Code {
	switch h := j.State.Hold(); {
	case h == job.HoldUser:
		return reason.JobHeldUser
	case h == job.HoldAdmin:
		return reason.JobHeldAdmin
	case h == job.HoldDeferred:
		// Its dependencies or its array's cap: the reason the controller keeps.
		if c := j.State.ReasonCode(); c == reason.Dependency || c == reason.DependencyNeverSatisfied || c == reason.JobArrayTaskLimit {
			return c
		}
	case j.State.Hold() == job.HoldRequeue || j.State.Hold() == job.HoldPreempted || j.State.ReasonCode() == reason.Requeued:
		return reason.Requeued
	case schedulerReason != "":
		return reason.Resources
	}
	return reason.Priority
}

// SchedulerCollector exports the scheduler's and the queue's metrics. Every agent has
// one; the elected one (Lead runs while it leads) exports the queue's gauges, read from
// Consul when a scrape comes, and counts what its scheduler and job controller report
// (it is their event.Sink); the others export gangrun_scheduler_leader 0 and their
// counters as they were when they last led.
type SchedulerCollector struct {
	s      store.Store
	view   *View
	leader atomic.Bool

	grants  prometheus.Counter
	started *prometheus.CounterVec
	preempt *prometheus.CounterVec
	wait    *prometheus.HistogramVec
	pass    prometheus.Histogram

	leaderDesc, pending, jobs, nodes, idle, gpus, idleJob, reservations, reservedNodes *prometheus.Desc

	mu    sync.Mutex
	at    time.Time
	cache []job.Job
	st    allocator.SchedulerStatus
}

// NewSchedulerCollector returns the scheduler's collector, reading s (through view for
// the cluster's snapshot).
func NewSchedulerCollector(s store.Store, view *View) *SchedulerCollector {
	return &SchedulerCollector{s: s, view: view,
		grants: prometheus.NewCounter(prometheus.CounterOpts{Name: "gangrun_grants_total",
			Help: "Grants the scheduler made while this agent led (jobs' and allocations')."}),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gangrun_jobs_started_total",
			Help: "Cluster jobs that started running for the first time while this agent led."}, []string{"partition"}),
		preempt: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gangrun_preemptions_total",
			Help: "Running cluster jobs pre-empted by a job of a higher tier while this agent led, by the pre-empted job's partition."}, []string{"partition"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gangrun_job_wait_time_seconds",
			Help:    "How long cluster jobs waited from submission to their first start (Kueue's admission wait time).",
			Buckets: prometheus.ExponentialBuckets(1, 2.5, 14)}, []string{"partition"}),
		pass: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gangrun_scheduling_pass_duration_seconds",
			Help: "How long one pass of the scheduler over the pending requests took.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		leaderDesc: prometheus.NewDesc("gangrun_scheduler_leader", "1 on the agent elected the cluster's scheduler, 0 on the others.", nil, nil),
		pending: prometheus.NewDesc("gangrun_pending_jobs", "Cluster jobs waiting to run, by partition and reason (Priority, Resources, Requeued, JobHeldUser, JobHeldAdmin, Dependency, DependencyNeverSatisfied, JobArrayTaskLimit).",
			[]string{"partition", "reason"}, nil),
		jobs:  prometheus.NewDesc("gangrun_jobs", "Cluster jobs by state (Slurm's names) and partition, ended ones included.", []string{"state", "partition"}, nil),
		nodes: prometheus.NewDesc("gangrun_nodes", "Registered nodes by state (up, drained, down).", []string{"state"}, nil),
		idle:  prometheus.NewDesc("gangrun_idle_nodes", "Nodes up with nothing granted on them.", nil, nil),
		gpus: prometheus.NewDesc("gangrun_gpus", "The cluster's GPUs (or MIG devices): free (on up nodes, no grant), held (a grant holds them), unavailable (on down or drained nodes, not held).",
			[]string{"state"}, nil),
		reservations:  prometheus.NewDesc("gangrun_reservations", "Pending requests (jobs' or allocations') for which the scheduler keeps nodes free, so that smaller ones do not starve them (backfill).", nil, nil),
		reservedNodes: prometheus.NewDesc("gangrun_reserved_nodes", "Nodes the scheduler keeps free for reservations.", nil, nil),
		idleJob: prometheus.NewDesc("gangrun_job_idle_gpus", "A running job's GPUs its nodes found idle: under the agents' --waste-threshold for --waste-after (0 for running jobs without).",
			[]string{"hpc_job", "hpc_user", "hpc_job_name", "partition"}, nil),
	}
}

// Emit implements event.Sink: the scheduler's grants and passes, the controller's job
// starts and pre-emptions.
func (c *SchedulerCollector) Emit(e event.Event) {
	switch e.Kind {
	case event.Granted:
		c.grants.Inc()
	case event.Passed:
		c.pass.Observe(e.Duration.Seconds())
	case event.JobStarted:
		c.started.WithLabelValues(e.Partition).Inc()
		c.wait.WithLabelValues(e.Partition).Observe(max(e.Duration, 0).Seconds())
	case event.JobPreempted:
		c.preempt.WithLabelValues(e.Partition).Inc()
	}
}

// Lead marks this agent the leader until ctx ends: one of allocator.AgentConfig.Leader.
func (c *SchedulerCollector) Lead(ctx context.Context, _ store.Store, _ string) error {
	c.leader.Store(true)
	defer c.leader.Store(false)
	<-ctx.Done()
	return nil
}

// Describe implements prometheus.Collector.
func (c *SchedulerCollector) Describe(ch chan<- *prometheus.Desc) {
	c.grants.Describe(ch)
	c.started.Describe(ch)
	c.preempt.Describe(ch)
	c.wait.Describe(ch)
	c.pass.Describe(ch)
	for _, d := range []*prometheus.Desc{c.leaderDesc, c.pending, c.jobs, c.nodes, c.idle, c.gpus, c.idleJob, c.reservations, c.reservedNodes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *SchedulerCollector) Collect(ch chan<- prometheus.Metric) {
	leads := c.leader.Load()
	ch <- prometheus.MustNewConstMetric(c.leaderDesc, prometheus.GaugeValue, boolValue(leads))
	c.grants.Collect(ch)
	c.started.Collect(ch)
	c.preempt.Collect(ch)
	c.wait.Collect(ch)
	c.pass.Collect(ch)
	if !leads {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	if cl, err := c.view.Cluster(ctx); err == nil {
		c.collectNodes(ch, cl)
	}
	jobs, st, err := c.readJobs(ctx)
	if err != nil {
		return
	}
	type key struct{ a, b string }
	pending, byState := map[key]int{}, map[key]int{}
	for _, j := range jobs {
		byState[key{string(j.State.Status), j.Spec.Partition}]++
		if j.State.Status == job.Pending {
			pending[key{j.Spec.Partition, string(pendingReason(j, st.Pending[j.Spec.ID]))}]++
		}
		if j.State.Status == job.Running {
			n, _ := j.IdleGPUs()
			ch <- prometheus.MustNewConstMetric(c.idleJob, prometheus.GaugeValue, float64(n), j.Spec.ID, j.Spec.User, j.Spec.Name, j.Spec.Partition)
		}
	}
	for k, n := range pending {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n), k.a, k.b)
	}
	for k, n := range byState {
		ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(n), k.a, k.b)
	}
	kept := map[string]bool{}
	for _, nodes := range st.Reserved {
		for _, n := range nodes {
			kept[n] = true
		}
	}
	ch <- prometheus.MustNewConstMetric(c.reservations, prometheus.GaugeValue, float64(len(st.Reserved)))
	ch <- prometheus.MustNewConstMetric(c.reservedNodes, prometheus.GaugeValue, float64(len(kept)))
}

// collectNodes exports the cluster's node and GPU counts.
func (c *SchedulerCollector) collectNodes(ch chan<- prometheus.Metric, cl *allocator.Cluster) {
	states := map[allocator.NodeCondition]int{}
	idle := 0
	var free, held, unavailable int
	for _, n := range cl.NodeList() {
		states[n.State]++
		if n.State == allocator.NodeUp && n.GPUsUsed == 0 {
			idle++
		}
		free += n.GPUsFree
		held += n.GPUsUsed
		if n.State != allocator.NodeUp {
			unavailable += n.GPUsTotal - n.GPUsUsed
		}
	}
	for _, s := range nodeStates() {
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(states[s]), string(s))
	}
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(idle))
	ch <- prometheus.MustNewConstMetric(c.gpus, prometheus.GaugeValue, float64(free), "free")
	ch <- prometheus.MustNewConstMetric(c.gpus, prometheus.GaugeValue, float64(held), "held")
	ch <- prometheus.MustNewConstMetric(c.gpus, prometheus.GaugeValue, float64(unavailable), "unavailable")
}

// readJobs returns every job and the scheduler's status, read afresh when the last
// read is older than the view's TTL.
func (c *SchedulerCollector) readJobs(ctx context.Context) ([]job.Job, allocator.SchedulerStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cache != nil && time.Since(c.at) < c.view.ttl {
		return c.cache, c.st, nil
	}
	jobs, err := job.List(ctx, c.s)
	if err != nil {
		return nil, c.st, err
	}
	st, err := allocator.ReadStatus(ctx, c.s)
	if err != nil {
		return nil, c.st, err
	}
	if jobs == nil {
		jobs = []job.Job{}
	}
	c.cache, c.st, c.at = jobs, st, time.Now()
	return jobs, st, nil
}
