package job

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/rendezvous"
)

// Pre-emption (Slurm's PreemptType=preempt/partition_prio with PreemptMode=REQUEUE),
// done by the job controller, not the scheduler: the scheduler's pass and commit are
// unchanged, and it grants the pre-empting job as any other once the victims' GPUs are
// back.
//
//  1. A pending job whose request the scheduler could not place (reason Resources)
//     and whose partition's tier is higher than some running jobs' picks victims
//     among them (policy.SelectVictims, asking placement whether their release would
//     let it fit: allocator.FitCheck), none younger than the policy's exempt_time, and
//     only if their release is enough. Each victim goes PREEMPTED (Preemption
//     recorded, event.JobPreempted emitted: gangrun_preemptions_total, and the audit
//     log's hook).
//  2. Each victim's steps see it and give their workers the policy's signal, then
//     stop them after its grace (step.preempt).
//  3. Once its steps have stopped, the victim's grant and request go and it waits
//     PENDING with reason BeginTime (PreemptedBy) until the pre-empting job has
//     started, so its own new request cannot take the GPUs back.
//  4. Then its request is written again (reason Priority) and it resumes, when placed,
//     from its newest complete checkpoint, as any requeued job does. Failures of its
//     run the pre-emption caused do not count against --max-restarts.

// PreemptorWait bounds how long a pre-empted job waits for the job that pre-empted it
// to start before it queues its request anyway (the pre-empting job may have been
// cancelled, or held back by a limit meanwhile).
const PreemptorWait = 2 * time.Minute

// preempt makes at most one pre-emption per (ticked) pass: for the first pending job, highest
// tier first, whose placement waits for resources and that lower-tier running jobs'
// release would let fit. Nothing happens while an earlier pre-emption is under way
// (a victim still PREEMPTED), or without a policy that turns pre-emption on.
func (c *Controller) preempt(ctx context.Context, v view) error {
	var pending []Job
	for _, j := range v.jobs {
		st := j.State
		switch {
		case st.Status == Preempted:
			return nil // one at a time: the victims' GPUs are not back yet
		case st.Phase() != Phase{Status: Pending}:
			continue
		}
		r, requested := v.cluster.Requests[j.Spec.ID]
		g, granted := v.cluster.Grants[j.Spec.ID]
		if requested && r.Alive && (!granted || g.State == allocator.GrantPending) {
			pending = append(pending, j)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	pol, err := policy.Load(ctx, c.s)
	if err != nil || !pol.PreemptionOn() {
		return err
	}
	waiting := map[string]bool{} // pre-empting jobs whose victims wait for them still
	for _, j := range v.jobs {
		if j.State.Hold() == HoldPreempted {
			waiting[j.State.PreemptedBy] = true
		}
	}
	status, err := allocator.ReadStatus(ctx, c.s)
	if err != nil {
		return err
	}
	slices.SortStableFunc(pending, func(a, b Job) int { return pol.Tier(b.Spec.Partition) - pol.Tier(a.Spec.Partition) })
	now := c.now()
	for _, p := range pending {
		if waiting[p.Spec.ID] || !allocator.WaitsForResources(status.Pending[p.Spec.ID]) {
			continue
		}
		var cands []policy.Candidate
		for _, r := range v.jobs {
			if r.State.Status != Running || !pol.MayPreempt(p.Spec.Partition, r.Spec.Partition) {
				continue
			}
			if g, ok := v.cluster.Grants[r.Spec.ID]; !ok || g.State != allocator.GrantGranted {
				continue
			}
			since := r.State.placedAt()
			if now.Sub(since) < pol.ExemptTime() {
				continue
			}
			cands = append(cands, policy.Candidate{ID: r.Spec.ID, Tier: pol.Tier(r.Spec.Partition), Priority: r.Spec.Priority, Started: since})
		}
		if len(cands) == 0 {
			continue
		}
		fc, ok := allocator.NewFitCheck(ctx, c.s, v.cluster, pol, status.Reserved, p.Spec.ID)
		if !ok || fc.Fits(nil) {
			continue // it fits as it is: the scheduler's next pass places it
		}
		victims := policy.SelectVictims(cands, fc.Fits)
		if len(victims) == 0 {
			continue
		}
		return c.preemptFor(ctx, p, victims, pol)
	}
	return nil
}

// placedAt returns when the job's current placement started (its first start for a
// job that ran before PlacedAt was kept).
func (s *State) placedAt() time.Time {
	if !s.PlacedAt.IsZero() {
		return s.PlacedAt
	}
	return s.Started
}

// preemptFor pre-empts victims, each still RUNNING, for pending job p under pol.
func (c *Controller) preemptFor(ctx context.Context, p Job, victims []string, pol *policy.Policy) error {
	sig, grace := pol.PreemptSignal(), pol.GraceTime()
	for _, id := range victims {
		base := 0
		if info, ok, err := rendezvous.ReadRun(ctx, c.rdzv, id); err == nil && ok {
			base = info.Failures
		}
		now := c.now().UTC()
		rec := Preemption{By: p.Spec.ID, Partition: p.Spec.Partition, At: now, Signal: int(sig), Grace: grace, RunFailures: base}
		// The audit log records the pre-emption in the transaction that makes it: the
		// elected agent's controller did it, for job p.
		owner := ""
		if v, err := Read(ctx, c.s, id); err == nil {
			owner = v.Spec.User
		}
		partition := p.Spec.Partition
		if partition == "" {
			partition = "default"
		}
		entry := audit.Op(sealEntry(ctx, c.prover, audit.Entry{At: now, User: "gangrun", Token: "agent", Action: audit.ActionPreempt,
			Target: "job " + id, Owner: owner,
			Detail: fmt.Sprintf("for job %s (partition %s): %s, %s grace", p.Spec.ID, partition, signalName(sig), grace)}))
		j, changed, err := c.update(ctx, id, func(j *Job) bool {
			// Its attempt stays open until its steps have stopped (requeuePreempted): the
			// grace is time the job held its GPUs, and is charged.
			if j.State.apply(Transition{Event: EvPreempt, Words: rec.reason()}) != nil {
				return false
			}
			j.State.Preemptions = append(j.State.Preemptions, rec)
			return true
		}, entry)
		if err != nil {
			return err
		}
		if !changed {
			continue
		}
		c.log.Warn("job pre-empted", zap.String("job", id), zap.String("by", p.Spec.ID), zap.String("partition", j.Spec.Partition),
			zap.String("signal", signalName(sig)), zap.Duration("grace", grace))
		// The metrics count it from this event (gangrun_preemptions_total).
		c.events.Emit(event.Event{Time: now, Kind: event.JobPreempted, Job: id, Attempt: -1, Partition: j.Spec.Partition,
			Nodes: j.State.Nodes, Cause: p.Spec.ID})
	}
	return nil
}

// requeuePreempted moves pre-empted job j back to PENDING once its steps have all
// stopped: its grant and request go, the run failures the pre-emption caused are given
// back to its budget, and it waits (BeginTime) for the job that pre-empted it.
func (c *Controller) requeuePreempted(ctx context.Context, v view, j Job) error {
	id := j.Spec.ID
	if len(v.steps[id]) > 0 || len(j.State.Preemptions) == 0 {
		return nil
	}
	if err := allocator.ReleaseJobIn(ctx, c.s, v.cluster, id); err != nil {
		return err
	}
	last := j.State.Preemptions[len(j.State.Preemptions)-1]
	extra := 0
	if info, ok, err := rendezvous.ReadRun(ctx, c.rdzv, id); err == nil && ok {
		extra = max(info.Failures-last.RunFailures, 0)
	}
	_, changed, err := c.update(ctx, id, func(j *Job) bool {
		st := &j.State
		if st.apply(Transition{Event: EvPreemptStopped, PreemptedBy: last.By}) != nil {
			return false
		}
		now := c.now().UTC()
		st.Preemptions[len(st.Preemptions)-1].Requeued = now
		st.closeAttempts(now, failure.Preempted, last.reason())
		st.PreemptFailures += extra
		st.Nodes, st.Spares, st.StepsEnded = nil, nil, nil
		return true
	})
	if err != nil || !changed {
		return err
	}
	if extra > 0 {
		_, _ = rendezvous.AddRestarts(ctx, c.rdzv, id, extra)
	}
	c.log.Info("pre-empted job's steps stopped: requeued, waiting for the job that pre-empted it", zap.String("job", id), zap.String("by", last.By))
	return nil
}

// resumePreempted writes the request of pre-empted job j again once the job that
// pre-empted it has started (or ended, or is gone, or PreemptorWait has passed since j
// was requeued).
func (c *Controller) resumePreempted(ctx context.Context, v view, j Job) error {
	by := j.State.PreemptedBy
	i := slices.IndexFunc(v.jobs, func(x Job) bool { return x.Spec.ID == by })
	var since time.Time // when it was requeued
	if n := len(j.State.Preemptions); n > 0 {
		since = j.State.Preemptions[n-1].Requeued
	}
	if i >= 0 && v.jobs[i].State.Status == Pending && (since.IsZero() || c.now().Sub(since) < PreemptorWait) {
		return nil
	}
	var exclude []string
	for _, l := range j.State.LostNodes {
		if l.Exclude && !slices.Contains(exclude, l.Node) {
			exclude = append(exclude, l.Node)
		}
	}
	reqOps, err := allocator.JobRequestOps(request(j.Spec, true, exclude))
	if err != nil {
		return err
	}
	held := j.State.Held != "" // held while it ran: it stays held, with no request
	if held {
		reqOps = nil
	}
	_, changed, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
		if j.State.PreemptedBy != by || (j.State.Held != "") != held {
			return false
		}
		return j.State.apply(Transition{Event: EvResume}) == nil
	}, reqOps...)
	if changed {
		c.log.Info("pre-empted job queued again", zap.String("job", j.Spec.ID), zap.String("preempted_by", by))
	}
	return err
}

// preempt has the supervisor give the workers the pre-emption's signal and stops them
// after its grace (a second terminating signal kills them; a warning signal is followed
// by the stop: SIGTERM, --term-timeout, SIGKILL). It returns when the grace ends; the
// step's watch sends what follows.
func (st *step) preempt(p Preemption) (graceEnd <-chan time.Time) {
	st.mu.Lock()
	first := st.ending == ""
	if first {
		st.ending = Preempted
	}
	st.mu.Unlock()
	if !first {
		return nil
	}
	sig := syscall.Signal(p.Signal)
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	st.log.Warn("the job was pre-empted: signalling the workers", zap.String("by", p.By), zap.String("signal", signalName(sig)), zap.Duration("grace", p.Grace))
	st.stop <- sig
	return time.After(p.Grace)
}

// reason is the pre-emption as a pre-empted job's reason and its attempt's cause.
func (p Preemption) reason() string {
	return "preempted by job " + p.By + " (partition " + p.Partition + ")"
}

// SignalName returns the name of the signal the pre-emption sent first ("USR1", "TERM").
func (p Preemption) SignalName() string { return signalName(syscall.Signal(p.Signal)) }
