package job

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/reason"
	"github.com/gangrun/gangrun/rendezvous"
)

// Controller moves cluster jobs through their states. It runs on the elected agent,
// beside the scheduler (allocator.AgentConfig.Leader), and each of its writes is fenced
// by the leader's session, so a deposed controller changes nothing. On every change of
// the cluster's keys it makes one pass over the jobs:
//
//   - a pending job whose request was granted starts running: its first nodes run it,
//     the others (--spare-nodes) are kept idle;
//   - a running job that lost a node — down, drained (a GPU failed), or its step gone
//     — records it, gives the gang back the restart the loss cost (the rendezvous'
//     budget: node failures do not use up --max-restarts), and replaces the node with a
//     spare, else shrinks within --nodes MIN:MAX, else stops and waits PENDING to be
//     placed again (away from the node);
//   - a job whose steps have all stopped after its end (COMPLETING) ends, and its
//     grant and request go;
//   - a pending job of a higher tier that does not fit may pre-empt running jobs of
//     lower tiers, when the policy says so (preempt.go).
type Controller struct {
	s store.Store
	// rdzv is s as the jobs' rendezvous keys are read and written through: sealed with
	// MUNGE (sealedRendezvous), s itself without.
	rdzv    store.Store
	session string
	log     *zap.Logger
	events  event.Sink
	now     func() time.Time
	// written is the highest store index of this controller's own writes of a job's
	// state, under jobsPrefix: a pass works only from a view of the jobs at least that
	// new, so that it never acts again on a state it has already moved on (a requeued
	// job's release repeated after its new request was written would delete that
	// request).
	written store.OwnWrites
	// minJobAge is how long an ended job's records stay; 0: for ever.
	minJobAge time.Duration
	// prover checks who submitted each job before it runs (auth.go); nil: nothing is
	// checked (agent --auth none).
	prover Prover
	// attested caches the attestations checked before a start: the content they were
	// checked against → the outcome, so a job placed again is not checked twice.
	attested sync.Map
	// seenPurged is when the expired replay markers were last deleted (purgeSeen).
	seenPurged time.Time
}

// controllerRetry is how often the controller passes again without a change (a step
// that did not start, a release that must wait for a step to give its GPUs back).
const controllerRetry = 2 * time.Second

// staleWait bounds how long the controller waits for its watch of the jobs to show its
// own last write before it reads the jobs afresh.
const staleWait = 500 * time.Millisecond

// Control runs the controller until ctx ends, as the leader whose session is session:
// the signature allocator.AgentConfig.Leader takes (with the log and the sink bound).
// events receives event.JobStarted when a job first runs (nil discards it). An ended
// job's records are removed minJobAge after its end (0: never; see DefaultMinJobAge).
// prover, when not nil, checks every pending job's MUNGE credential before it may run
// (auth.go); nil checks nothing (agent --auth none).
func Control(log *zap.Logger, events event.Sink, minJobAge time.Duration, prover Prover) func(ctx context.Context, s store.Store, session string) error {
	return func(ctx context.Context, s store.Store, session string) error {
		c := &Controller{s: s, rdzv: s, session: session, log: log, events: event.Or(events), now: time.Now, minJobAge: minJobAge, prover: prover}
		if prover != nil {
			// The jobs' rendezvous as their steps write it: sealed (sealedRendezvous).
			c.rdzv = identity.Sealed(s, prover, trustedMaker, rendezvous.Prefixes()...)
		}
		if c.log == nil {
			c.log = zap.NewNop()
		}
		return c.Run(ctx)
	}
}

// watchGap is the shortest time between two answers of one of the controller's watches
// (see Run).
const watchGap = 100 * time.Millisecond

// Run passes over the jobs on every change of the cluster's keys or the jobs', and
// every controllerRetry, until ctx ends. Each pass works from what the two watches last
// returned (decoding only the records that changed), so a change costs no further reads
// of the cluster or of the jobs; every write re-reads what it changes (update) or is
// guarded by the holder it expects, so a view a little old changes nothing wrongly.
func (c *Controller) Run(ctx context.Context) error {
	f := store.Follow(ctx, c.s, watchGap, allocator.ClusterPrefix, jobsPrefix)
	snap, jobs := allocator.NewSnapshotter(), newJobCache()
	var staleSince time.Time
	tick := time.NewTicker(controllerRetry)
	defer tick.Stop()
	for {
		ticked := false
		select {
		case <-ctx.Done():
			return nil
		case <-f.Changed():
		case <-tick.C:
			ticked = true
		}
		cur, ready := f.Latest()
		if !ready {
			continue
		}
		jobEntries := cur[1].Entries
		if !c.written.Covers(jobsPrefix, cur[1].Index) {
			// The jobs' watch has not yet seen this controller's last write: wait for
			// it, and should it lag over staleWait, read the jobs afresh.
			if staleSince.IsZero() {
				staleSince = time.Now()
			}
			if time.Since(staleSince) < staleWait {
				continue
			}
			fresh, idx, back, err := c.written.Reread(ctx, c.s, jobsPrefix)
			if err != nil {
				continue
			}
			if back {
				// A read of the leader's own data, older than this controller's last
				// write: the store went back in time (Consul restored from a snapshot).
				// What it holds now is what there is (a restored job never ended).
				c.log.Info("the jobs' index went back (Consul restored?): taking the store as it is now", zap.Uint64("index", idx))
			}
			jobEntries = fresh
		}
		staleSince = time.Time{}
		v := view{cluster: snap.Parse(cur[0].Entries, cur[0].Index), ticked: ticked}
		v.jobs, v.steps = jobs.parse(jobEntries)
		if err := c.pass(ctx, v); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if allocator.LostLeadership(err) {
				return err // no longer the leader
			}
			if errors.Is(err, allocator.ErrNotHolder) {
				// A grant whose steps have not let go of its GPUs yet, at a job's end:
				// the next pass releases it. Not an operator's concern.
				c.log.Debug("job controller pass", zap.Error(err))
				continue
			}
			c.log.Warn("job controller pass", zap.Error(err))
		}
	}
}

// view is what a pass works from: the cluster, every job (oldest first) and each job's
// running steps (job → node → its step's key).
type view struct {
	cluster *allocator.Cluster
	jobs    []Job
	steps   map[string]map[string]StepRecord
	// confirmed is true for a view read afresh for one job (freshView), or by Pass.
	confirmed bool
	// ticked is true for a pass on controllerRetry's tick rather than on a change: it
	// also brings the running jobs' restart counts up to date (a read of each's run).
	ticked bool
	// deps finds the jobs the deferred jobs' dependencies name; nil when no job is
	// deferred (pass builds it).
	deps *depIndex
}

// Pass reads the cluster and the jobs afresh and makes one pass over every job not yet
// ended.
func (c *Controller) Pass(ctx context.Context) error {
	cl, err := allocator.Snapshot(ctx, c.s)
	if err != nil {
		return err
	}
	entries, _, err := c.s.List(ctx, jobsPrefix)
	if err != nil {
		return err
	}
	v := view{cluster: cl, ticked: true, confirmed: true}
	v.jobs, v.steps = newJobCache().parse(entries)
	return c.pass(ctx, v)
}

// pass makes one pass over v's jobs.
//
// Jobs are independent (each write is a check-and-set of the job's own state, or guarded
// by the holders it expects), so up to passWorkers of them are handled at once: a job's
// part is a few Consul round trips, and one after another they bound how many jobs a
// second start. Jobs waiting on dependencies are handled in order, by the pass itself:
// an array's concurrency cap counts its tasks as the pass lets them through.
func (c *Controller) pass(ctx context.Context, v view) error {
	if slices.ContainsFunc(v.jobs, func(j Job) bool { return j.State.Hold() == HoldDeferred }) {
		v.deps = newDepIndex(v.jobs)
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	note := func(err error) {
		if err == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil || allocator.LostLeadership(err) && !allocator.LostLeadership(firstErr) {
			firstErr = err
		}
	}
	work := make(chan Job)
	for range passWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				note(c.job(ctx, v, j))
			}
		}()
	}
	var needed map[string]bool // jobs a waiting job's dependency names
	for _, j := range v.jobs {
		if j.State.Status == Pending && j.State.Deferred { // held back, or held
			if needed == nil {
				needed = map[string]bool{}
			}
			for _, d := range j.Spec.Dependency {
				for _, id := range d.IDs {
					needed[id] = true
				}
			}
		}
	}
	for _, j := range v.jobs {
		switch {
		case j.State.Status.Final() && !v.holds(j.Spec.ID):
			// Ended and let go of: its records go MinJobAge after its end (its accounting
			// record stays), unless a waiting job's dependency names it.
			if v.ticked && c.minJobAge > 0 && !j.State.Ended.IsZero() && c.now().Sub(j.State.Ended) > c.minJobAge &&
				!needed[j.Spec.ID] && !needed[arrayOf(j.Spec.ID)] {
				note(c.purge(ctx, j.Spec.ID))
			}
		case j.State.Hold() == HoldDeferred:
			note(c.job(ctx, v, j))
		default:
			work <- j
		}
	}
	close(work)
	wg.Wait()
	if v.ticked {
		// Pre-emption reads the policy and the scheduler's status: once per tick
		// (controllerRetry), not on every change.
		note(c.preempt(ctx, v))
		if now := c.now(); now.Sub(c.seenPurged) > seenPurgeInterval {
			c.seenPurged = now
			note(c.purgeSeen(ctx, now))
		}
	}
	return firstErr
}

// DefaultMinJobAge is how long an ended job's records stay (show, logs, queue --all)
// before the controller removes them, as Slurm's MinJobAge (its default is 300 s):
// every pass reads every job that is kept, so a cluster that runs many jobs must not
// keep them all. The job's accounting record (gangrun acct) is kept for the accounting
// retention instead.
const DefaultMinJobAge = 5 * time.Minute

// arrayOf returns the array job id of task id ("7" for "7_3"), or "" for a job in no array.
func arrayOf(id string) string {
	a, _, ok := strings.Cut(id, "_")
	if !ok {
		return ""
	}
	return a
}

// purge removes ended job id's records and its rendezvous' keys, fenced by the
// controller's leadership.
func (c *Controller) purge(ctx context.Context, id string) error {
	ops := []store.Op{allocator.LeaderFence(c.session), {Verb: store.DeleteTree, Key: jobsPrefix + id + "/"}}
	for _, p := range rendezvous.JobPrefixes(id) {
		ops = append(ops, store.Op{Verb: store.DeleteTree, Key: p})
	}
	if _, err := c.s.Txn(ctx, ops); err != nil {
		return err
	}
	c.log.Info("ended job's records removed (MinJobAge)", zap.String("job", id))
	return nil
}

// passWorkers is how many jobs a pass handles at once.
const passWorkers = 8

// freshView reads the cluster, job id and its steps afresh, in the order their writers
// write them (a step takes its key before the node's GPUs, and notes its end in the
// job's state before it gives them back).
func (c *Controller) freshView(ctx context.Context, id string) (view, Job, error) {
	cl, err := allocator.Snapshot(ctx, c.s)
	if err != nil {
		return view{}, Job{}, err
	}
	j, err := Read(ctx, c.s, id)
	if err != nil {
		return view{}, Job{}, err
	}
	steps, err := Steps(ctx, c.s, id)
	if err != nil {
		return view{}, Job{}, err
	}
	return view{cluster: cl, steps: map[string]map[string]StepRecord{id: steps}, confirmed: true}, *j, nil
}

// holds reports whether the cluster still has job id's grant or request.
func (v view) holds(id string) bool {
	_, granted := v.cluster.Grants[id]
	_, requested := v.cluster.Requests[id]
	return granted || requested
}

// jobCache decodes the jobs' keys (every key under gangrun/batch/jobs/), decoding a job
// again only when one of its keys changed. Not safe for concurrent use.
type jobCache struct{ m map[string]cachedJob }

type cachedJob struct {
	sig string // the job's keys and their ModifyIndexes
	job Job
	ok  bool
}

func newJobCache() *jobCache { return &jobCache{m: map[string]cachedJob{}} }

// parse returns the jobs in entries, oldest first (jobs being written or removed left
// out), and each job's running steps (keys held by a session).
func (jc *jobCache) parse(entries []store.Entry) ([]Job, map[string]map[string]StepRecord) {
	byID := map[string][]store.Entry{}
	var order []string
	for _, e := range entries {
		id, _, ok := strings.Cut(e.Key[len(jobsPrefix):], "/")
		if !ok {
			continue
		}
		if _, seen := byID[id]; !seen {
			order = append(order, id)
		}
		byID[id] = append(byID[id], e)
	}
	seen := make(map[string]cachedJob, len(byID))
	steps := map[string]map[string]StepRecord{}
	var out []Job
	var sig strings.Builder
	for _, id := range order {
		es := byID[id]
		sig.Reset()
		for _, e := range es {
			sig.WriteString(e.Key)
			sig.WriteByte(' ')
			sig.WriteString(strconv.FormatUint(e.ModifyIndex, 10))
			sig.WriteByte(' ')
			if node, ok := strings.CutPrefix(e.Key, stepsPrefix(id)); ok {
				if r, ok := stepOf(e, node); ok {
					if steps[id] == nil {
						steps[id] = map[string]StepRecord{}
					}
					steps[id][node] = r
				}
			}
		}
		cj, ok := jc.m[id]
		if !ok || cj.sig != sig.String() {
			j, err := decode(id, es)
			cj = cachedJob{sig: sig.String(), ok: err == nil}
			if err == nil {
				cj.job = *j
			}
		}
		seen[id] = cj
		if cj.ok {
			out = append(out, cj.job)
		}
	}
	jc.m = seen
	sortJobs(out)
	return out, steps
}

// job is one job's part of the pass.
func (c *Controller) job(ctx context.Context, v view, j Job) error {
	if c.prover != nil && j.State.Status == Pending && (j.Auth == nil || j.Auth.Attestation == "") {
		return c.acceptJob(ctx, j) // nothing else until it is accepted, or refused
	}
	id, cl := j.Spec.ID, v.cluster
	g, granted := cl.Grants[id]
	_, requested := cl.Requests[id]
	switch st := j.State; {
	case st.Status.Final():
		if (granted || requested) && len(v.steps[id]) == 0 {
			return allocator.ReleaseJobIn(ctx, c.s, cl, id)
		}
	case st.Hold() == HoldUser || st.Hold() == HoldAdmin:
		// Held (hold.go): no request until it is released.
	case st.Hold() == HoldDeferred:
		if v.deps != nil {
			return c.deferred(ctx, v.deps, j)
		}
	case st.Hold() == HoldRequeue:
		// Requeued: once its steps have stopped, the old grant goes and a new request is
		// made, away from the nodes it lost.
		if len(v.steps[id]) > 0 {
			return nil
		}
		if granted || requested {
			if err := allocator.ReleaseJobIn(ctx, c.s, cl, id); err != nil {
				return err
			}
		}
		var exclude []string
		sessions := map[string]string{}
		for _, l := range st.LostNodes {
			if l.Exclude && !slices.Contains(exclude, l.Node) {
				exclude = append(exclude, l.Node)
			}
			if l.Exclude && l.AgentSession != "" {
				sessions[l.Node] = l.AgentSession // the latest loss's
			} else if l.Exclude {
				delete(sessions, l.Node)
			}
		}
		req := request(j.Spec, true, exclude)
		if len(sessions) > 0 {
			req.ExcludeSession = sessions
		}
		reqOps, err := allocator.JobRequestOps(req)
		if err != nil {
			return err
		}
		held := st.Held != "" // held while it ran: it stays held, with no request
		if held {
			reqOps = nil
		}
		_, _, err = c.update(ctx, id, func(j *Job) bool {
			return (j.State.Held != "") == held && j.State.apply(Transition{Event: EvRequestAgain}) == nil
		}, reqOps...)
		return err
	case st.Status == Preempted:
		return c.requeuePreempted(ctx, v, j)
	case st.Hold() == HoldPreempted:
		return c.resumePreempted(ctx, v, j)
	case st.Status == Pending && granted && g.State == allocator.GrantGranted:
		// The grant as it is now: the view's may be older than the job's state (a grant
		// of the placement before a requeue).
		e, err := c.s.Get(ctx, allocator.GrantKey(id))
		if err != nil || e == nil {
			return err
		}
		var fg allocator.Grant
		if err := schema.Unmarshal(schema.Grant, e.Value, &fg); err != nil || fg.State != allocator.GrantGranted {
			return nil // a newer gangrun's grant: left to one that reads it
		}
		return c.start(ctx, j, fg)
	case st.Status == Completing:
		return c.completing(ctx, v, j)
	case st.Status == Running:
		return c.watchNodes(ctx, v, j, g)
	}
	return nil
}

// deferred writes the request of job j, held back by its dependencies, its --begin or
// its array's cap, once they allow, in the transaction that clears State.Deferred; else it keeps the
// job's pending reason up to date (Dependency, DependencyNeverSatisfied, BeginTime,
// JobArrayTaskLimit); a job whose dependencies can never hold is cancelled with
// --kill-on-invalid-dep. x's counts of each array's tasks let through grow with the tasks
// this pass lets through; a view older than the jobs' states only lets fewer through (a
// task it shows deferred that is not is counted once the update finds it so).
func (c *Controller) deferred(ctx context.Context, x *depIndex, j Job) error {
	met, never := x.check(&j, c.now())
	if never && j.Spec.KillInvalidDep {
		_, _, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
			if j.State.apply(Transition{Event: EvCancelPending, Code: reason.DependencyNeverSatisfied,
				Words: "cancelled: its dependencies can never be satisfied (--kill-on-invalid-dep)"}) != nil {
				return false
			}
			j.State.Ended = c.now().UTC()
			return true
		})
		return err
	}
	a := j.Spec.Array
	var code reason.Code
	switch {
	case never:
		code = reason.DependencyNeverSatisfied
	case !met:
		code = reason.Dependency
	case j.Spec.Begin.After(c.now()):
		code = reason.BeginTime // after its dependencies, as slurmctld's job_independent
	case a != nil && a.Limit > 0 && x.active[a.JobID] >= a.Limit:
		code = reason.JobArrayTaskLimit
	}
	if code != "" {
		if j.State.ReasonCode() == code {
			return nil
		}
		_, _, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
			if j.State.ReasonCode() == code {
				return false
			}
			return j.State.apply(Transition{Event: EvStillHeld, Code: code}) == nil
		})
		return err
	}
	reqOps, err := allocator.JobRequestOps(request(j.Spec, false, nil))
	if err != nil {
		return err
	}
	viewed := jobContent(j.Spec)
	after, changed, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
		// A spec changed since the view (scontrol update) waits for the next pass,
		// which writes the request from it.
		return bytes.Equal(jobContent(j.Spec), viewed) && j.State.apply(Transition{Event: EvRelease}) == nil
	}, reqOps...)
	if err != nil {
		return err
	}
	if a != nil && (changed || !after.State.Status.Final()) {
		x.active[a.JobID]++
	}
	if changed {
		c.log.Info("job's dependencies hold: its request is written", zap.String("job", j.Spec.ID))
	}
	return nil
}

// completing ends job j, COMPLETING in view v, once its steps have stopped: requeued
// when a node's step died without a word, else with its outcome.
func (c *Controller) completing(ctx context.Context, v view, j Job) error {
	id, cl, st := j.Spec.ID, v.cluster, j.State
	g, granted := cl.Grants[id]
	if len(v.steps[id]) > 0 {
		return nil
	}
	var silent []string
	for _, n := range st.Nodes {
		if !slices.Contains(st.StepsEnded, n) && stepDied(cl, g, granted, n) {
			silent = append(silent, n)
		}
	}
	if st.End == Failed && len(silent) > 0 {
		// The gang failed, and a node's step ended without a word: the node died or
		// was cut off, and its peers' failure followed. That is the node's failure,
		// not the job's: it is placed again, away from the node, its budget intact.
		if !v.confirmed {
			fv, fj, err := c.freshView(ctx, id)
			if err != nil || fj.State.Status != Completing {
				return err
			}
			return c.completing(ctx, fv, fj)
		}
		return c.requeueSilent(ctx, cl, id, silent)
	}
	if err := allocator.ReleaseJobIn(ctx, c.s, cl, id); err != nil {
		return err
	}
	after, changed, err := c.update(ctx, id, func(j *Job) bool {
		if j.State.apply(Transition{Event: EvFinish}) != nil {
			return false
		}
		j.State.Ended = c.now().UTC()
		j.State.closeAttempts(j.State.Ended, "", strings.ToLower(string(j.State.End))) // cancelled, timeout: the supervisor said nothing
		c.countRestarts(ctx, j)
		return true
	})
	if changed {
		c.logMail(*after, "END")
		if after.Spec.Batch != nil {
			// Its srun steps end with it: one srun killed with the job said nothing.
			err = EndOpenSrunSteps(ctx, c.s, id, after.State.Ended)
		}
	}
	return err
}

// logMail logs the mail Slurm would send for job j's event (BEGIN, END) when its
// --mail-type asks for it: gangrun has no mailer, and sends none.
func (c *Controller) logMail(j Job, event string) {
	b := j.Spec.Batch
	if b == nil || b.MailType == "" {
		return
	}
	for _, t := range strings.Split(b.MailType, ",") {
		if t == event || t == "ALL" || event == "END" && t == "FAIL" && j.State.Status != Completed {
			c.log.Info("no mail sent (gangrun has no mailer)", zap.String("job", j.Spec.ID), zap.String("mail_type", event),
				zap.String("mail_user", cmp.Or(b.MailUser, j.Spec.User)), zap.String("state", string(j.State.Status)))
			return
		}
	}
}

// start makes a pending job whose request was granted run: its first nodes run it (in
// the grant's node-rank order), the rest are its spares.
func (c *Controller) start(ctx context.Context, j Job, g allocator.Grant) error {
	if c.prover != nil {
		if ok, err := c.checkStart(ctx, j); !ok || err != nil {
			return err
		}
	}
	var names []string
	for _, gn := range g.Nodes {
		names = append(names, gn.Name)
	}
	spares := min(j.Spec.SpareNodes, max(len(names)-j.Spec.MinNodes, 0))
	first := false
	_, changed, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
		if j.State.apply(Transition{Event: EvPlace}) != nil {
			return false
		}
		now := c.now().UTC()
		first = j.State.Started.IsZero()
		j.State.Nodes, j.State.Spares = names[:len(names)-spares], names[len(names)-spares:]
		// Each node's agent session as the job is placed there (stayedUp).
		j.State.AgentSessions = map[string]string{}
		for _, gn := range g.Nodes {
			if gn.Session != "" { // the node's agent's, until its step takes the GPUs over
				j.State.AgentSessions[gn.Name] = gn.Session
			}
		}
		j.State.NodesSince, j.State.PlacedAt = now, now
		j.State.Placement++
		j.State.StepsEnded = nil
		if j.State.Started.IsZero() {
			j.State.Started = now
		}
		return true
	})
	if changed {
		c.log.Info("job running", zap.String("job", j.Spec.ID), zap.Strings("nodes", names[:len(names)-spares]), zap.Int("spares", spares))
		if first {
			c.logMail(j, "BEGIN")
		}
		if first {
			now := c.now()
			c.events.Emit(event.Event{Time: now, Kind: event.JobStarted, Job: j.Spec.ID, Attempt: -1, Nodes: names[:len(names)-spares],
				Partition: j.Spec.Partition, Duration: now.Sub(j.Spec.Submitted)})
		}
	}
	return err
}

// requeueSilent places a failed job again after the nodes silent lost their steps
// without a word: they count as node failures, and the job waits PENDING (Requeue) for
// the old grant to go and a new request away from them.
func (c *Controller) requeueSilent(ctx context.Context, cl *allocator.Cluster, id string, silent []string) error {
	_, changed, err := c.update(ctx, id, func(j *Job) bool {
		st := &j.State
		if st.Status != Completing || st.End != Failed {
			return false
		}
		if st.apply(Transition{Event: EvRequeueSilent, Words: "requeued: lost " + strings.Join(silent, ", ")}) != nil {
			return false
		}
		now := c.now().UTC()
		for _, n := range silent {
			st.LostNodes = append(st.LostNodes, LostNode{Node: n, Why: "the job's step on node " + n + " ended without a word (the node died or was cut off)",
				Kind: failure.NodeLost, At: now, Exclude: stayedUp(cl, *st, n), AgentSession: agentSession(cl, n)})
			st.NodeFailures++
		}
		st.ExitCode = 0
		st.closeAttempts(now, failure.NodeLost, st.Reason)
		st.Nodes, st.Spares, st.StepsEnded = nil, nil, nil
		return true
	})
	if changed {
		c.log.Warn("job failed after it lost nodes: requeued (a node failure, not the job's)", zap.String("job", id), zap.Strings("lost", silent))
	}
	return err
}

// stepDied reports whether node n's step of a completing job, gone without saying it
// ended, had started and died with its node (or its session): the node is down, or the
// node's GPUs had been handed over from its agent (they are no longer held by the agent's
// session). A step that never started is not silent: its node was still to begin when
// the gang ended, and its step will find the job ended (step.run says so itself).
func stepDied(cl *allocator.Cluster, g allocator.Grant, granted bool, n string) bool {
	ns, ok := cl.Nodes[n]
	if !ok || !ns.Up {
		return true
	}
	if !granted {
		return false
	}
	gn, ok := grantNode(g, n)
	return ok && handedOver(gn, ns)
}

// grantNode returns node n of grant g.
func grantNode(g allocator.Grant, n string) (allocator.GrantNode, bool) {
	i := slices.IndexFunc(g.Nodes, func(gn allocator.GrantNode) bool { return gn.Name == n })
	if i < 0 {
		return allocator.GrantNode{}, false
	}
	return g.Nodes[i], true
}

// handedOver reports whether gn's GPUs have left the agent of its node ns: a step took
// them over (they are held by its session, or went with it).
func handedOver(gn allocator.GrantNode, ns *allocator.NodeState) bool {
	return gn.Session != ns.AliveSession
}

// agentSession returns node n's agent session in cl ("" when it is down or unknown).
func agentSession(cl *allocator.Cluster, n string) string {
	if ns, ok := cl.Nodes[n]; ok && ns.Up {
		return ns.AliveSession
	}
	return ""
}

// stayedUp reports whether node n, which lost job state st's step, is up and healthy
// and its agent has held the same session since the job was placed there: then the
// step's loss is the step's own, and the job's later placements avoid the node. A node
// whose agent registered again meanwhile went through an outage of its own (Consul
// unreachable from it, its agent restarted) that explains the loss: it is not excluded,
// and the job may run there again (no node stays excluded by its own fenced step).
func stayedUp(cl *allocator.Cluster, st State, n string) bool {
	if !healthy(cl, n) {
		return false
	}
	was, known := st.AgentSessions[n]
	return !known || was == agentSession(cl, n)
}

// healthy reports whether node n is up and not drained in cl.
func healthy(cl *allocator.Cluster, n string) bool {
	ns, ok := cl.Nodes[n]
	return ok && ns.Up && ns.Drain == nil
}

// StepStartTimeout bounds how long a running job's node may go without its step: one
// that has not taken the node's GPUs over that long after the node joined the job (its
// agent could not start it) is handled as lost. It outlasts a step's wait for Consul's
// lock-delay (twice allocator.GrantLockDelay).
const StepStartTimeout = 30 * time.Second

// lostWhy says why node n of running job j is lost ("" when it is not), at now: down
// with no step of the job running there, drained for a failed GPU, its step gone after
// it had taken the node's GPUs over, or no step StepStartTimeout after the node joined
// the job.
//
// A node whose agent is down while the job's step there runs is not lost: the agent is
// restarting (an upgrade, a crash its unit restarts), and the step outlives it as
// slurmstepd outlives slurmd. A node that died takes its step's session with it
// (Consul's serfHealth check, else the session's TTL), and then it is lost.
func lostWhy(cl *allocator.Cluster, g allocator.Grant, j Job, n string, steps map[string]StepRecord, now time.Time) string {
	ns, ok := cl.Nodes[n]
	_, running := steps[n]
	switch {
	case (!ok || !ns.Up) && !running:
		return "node " + n + " is down (its agent's session ended)"
	case !ok || !ns.Up:
		return ""
	case ns.Drain != nil:
		return "node " + n + " was drained: " + ns.Drain.Reason
	}
	gn, ok := grantNode(g, n)
	if !ok {
		return "node " + n + " left the job's grant"
	}
	switch {
	case running || slices.Contains(j.State.StepsEnded, n):
	case handedOver(gn, ns):
		// The step had taken the GPUs over (they are no longer its agent's) and is gone.
		return "the job's step on node " + n + " ended"
	case !j.State.NodesSince.IsZero() && now.Sub(j.State.NodesSince) > StepStartTimeout:
		return "the job's step did not start on node " + n + " within " + StepStartTimeout.String()
	}
	return ""
}

// lostKind is the kind of node n's loss once lostWhy found it lost: failure.GPUHealth
// when it is up and drained because one of its GPUs failed (the drain's kind), else
// failure.NodeLost.
func lostKind(cl *allocator.Cluster, n string) failure.Kind {
	if ns, ok := cl.Nodes[n]; ok && ns.Up && ns.Drain != nil && drainKind(*ns.Drain) == failure.GPUHealth {
		return failure.GPUHealth
	}
	return failure.NodeLost
}

// watchNodes handles a running job's lost nodes.
func (c *Controller) watchNodes(ctx context.Context, v view, j Job, g allocator.Grant) error {
	cl, steps := v.cluster, v.steps[j.Spec.ID]
	lost, spareLost := c.lostNodes(cl, g, j, steps)
	if len(lost) == 0 && len(spareLost) == 0 {
		if v.ticked {
			c.syncRestarts(ctx, j)
		}
		return nil
	}
	if !v.confirmed {
		// A loss is acted on only as fresh reads show it: the watches' views of the
		// cluster and of the jobs may be of different moments (a step's key newer than
		// its GPUs' hand-over, say).
		fv, fj, err := c.freshView(ctx, j.Spec.ID)
		if err != nil || fj.State.Status != Running {
			return err
		}
		fg, ok := fv.cluster.Grants[j.Spec.ID]
		if !ok {
			return nil
		}
		return c.watchNodes(ctx, fv, fj, fg)
	}
	var recorded []string // the lost nodes this update records (it may run more than once)
	_, changed, err := c.update(ctx, j.Spec.ID, func(jj *Job) bool {
		recorded = recorded[:0]
		return c.recordLoss(jj, cl, lost, spareLost, &recorded)
	})
	if err != nil || !changed {
		return err
	}
	c.refund(ctx, j.Spec.ID, recorded)
	return nil
}

// refund gives job id's run back the restarts that the lost nodes recorded cost, and
// evicts them from its rendezvous.
func (c *Controller) refund(ctx context.Context, id string, recorded []string) {
	// Once the loss is recorded (and only then: a pass that fails before it must not give
	// the restart back twice), the gang's failure that a lost node caused is no failure
	// of the job's: the run's budget gets it back. And the survivors (and a spare) need
	// not wait for the lost node's rendezvous session to expire before they meet again.
	refunded := 0
	for _, n := range recorded {
		if ok, err := rendezvous.AddRestarts(ctx, c.rdzv, id, 1); err == nil && ok {
			refunded++
		}
		if ok, err := rendezvous.Evict(ctx, c.rdzv, id, n); err == nil && ok {
			c.log.Info("lost node evicted from the job's rendezvous", zap.String("job", id), zap.String("node", n))
		}
	}
	if refunded > 0 {
		c.log.Info("node failures do not count against --max-restarts: the restarts they cost were given back", zap.String("job", id), zap.Int("restarts", refunded))
	}
}

// lostNodes are job j's nodes that are lost (node → why, lostWhy) and its spares that
// are not healthy.
func (c *Controller) lostNodes(cl *allocator.Cluster, g allocator.Grant, j Job, steps map[string]StepRecord) (map[string]string, []string) {
	lost := map[string]string{}
	for _, n := range j.State.Nodes {
		if why := lostWhy(cl, g, j, n, steps, c.now()); why != "" {
			lost[n] = why
		}
	}
	var spareLost []string
	for _, n := range j.State.Spares {
		if !healthy(cl, n) {
			spareLost = append(spareLost, n)
		}
	}
	return lost, spareLost
}

// recordLoss records in running job jj's state the nodes it lost (lost: node → why) and
// its spares lost, appending each node recorded to recorded: a spare takes a lost node's
// place, else the job goes on with fewer nodes within --nodes N:M, else it is requeued
// (a batch job always, or it ends NODE_FAIL with --no-requeue). It returns false to
// leave the state as it is.
func (c *Controller) recordLoss(jj *Job, cl *allocator.Cluster, lost map[string]string, spareLost []string, recorded *[]string) bool {
	st := &jj.State
	if st.Status != Running {
		return false
	}
	now := c.now().UTC()
	st.Spares = slices.DeleteFunc(st.Spares, func(n string) bool { return slices.Contains(spareLost, n) })
	for _, n := range slices.Sorted(maps.Keys(lost)) {
		if !slices.Contains(st.Nodes, n) {
			continue
		}
		kind := lostKind(cl, n)
		st.LostNodes = append(st.LostNodes, LostNode{Node: n, Why: lost[n], Kind: kind, At: now, Exclude: stayedUp(cl, *st, n), AgentSession: agentSession(cl, n)})
		st.NodeFailures++
		*recorded = append(*recorded, n)
		st.Nodes = slices.DeleteFunc(st.Nodes, func(x string) bool { return x == n })
		switch {
		case jj.Spec.Batch != nil && jj.Spec.Batch.NoRequeue:
			// A Slurm batch job with --no-requeue ends NODE_FAIL with its node.
			c.log.Warn("batch job lost a node: it ends (--no-requeue)", zap.String("job", jj.Spec.ID), zap.String("lost", n), zap.String("why", lost[n]))
			if st.apply(Transition{Event: EvEnd, End: NodeFail, Words: "node " + n + " lost: " + lost[n]}) != nil {
				return false
			}
			st.closeAttempts(now, kind, st.Reason)
			return true
		case jj.Spec.Batch != nil:
			// A Slurm batch job's script ran on the nodes it had: it is requeued whole
			// (Slurm's --requeue), a spare among its next nodes when it has one.
			c.log.Warn("batch job lost a node: requeued", zap.String("job", jj.Spec.ID), zap.String("lost", n), zap.String("why", lost[n]))
			return st.requeueLost(now, kind, lost[n])
		case len(st.Spares) > 0:
			st.Nodes = append(st.Nodes, st.Spares[0])
			st.NodesSince = now
			st.Spares = st.Spares[1:]
			c.log.Warn("job lost a node: a spare takes its place", zap.String("job", jj.Spec.ID), zap.String("lost", n), zap.String("why", lost[n]), zap.String("spare", st.Nodes[len(st.Nodes)-1]))
		case len(st.Nodes) >= jj.Spec.MinNodes:
			c.log.Warn("job lost a node: it goes on without it", zap.String("job", jj.Spec.ID), zap.String("lost", n), zap.String("why", lost[n]), zap.Int("nodes", len(st.Nodes)))
		default:
			// Not enough nodes left: every step stops, and the job waits to be placed
			// again, away from the nodes it lost.
			c.log.Warn("job lost a node it cannot do without: requeued", zap.String("job", jj.Spec.ID), zap.String("lost", n), zap.String("why", lost[n]))
			return st.requeueLost(now, kind, lost[n])
		}
	}
	return true
}

// requeueLost requeues the running job after a lost node (why, of kind): every step
// stops, its attempt ends, and it waits PENDING (HoldRequeue) to be placed again. It
// reports whether the state changed.
func (s *State) requeueLost(now time.Time, kind failure.Kind, why string) bool {
	if s.apply(Transition{Event: EvRequeue, Words: "requeued: " + why}) != nil {
		return false
	}
	s.Nodes, s.Spares, s.StepsEnded = nil, nil, nil
	s.closeAttempts(now, kind, s.Reason)
	return true
}

// syncRestarts keeps a running job's count of its own restarts (the run's failures
// less those its lost nodes caused) in its state, for queue and show.
func (c *Controller) syncRestarts(ctx context.Context, j Job) {
	info, ok, err := rendezvous.ReadRun(ctx, c.rdzv, j.Spec.ID)
	if err != nil || !ok {
		return
	}
	own := ownRestarts(info, j.State)
	if own == j.State.Restarts {
		return
	}
	_, _, _ = c.update(ctx, j.Spec.ID, func(jj *Job) bool {
		if jj.State.Restarts == own {
			return false
		}
		jj.State.Restarts = own
		return true
	})
}

// countRestarts sets j's own restarts from its run, as it ends.
func (c *Controller) countRestarts(ctx context.Context, j *Job) {
	if info, ok, err := rendezvous.ReadRun(ctx, c.rdzv, j.Spec.ID); err == nil && ok {
		j.State.Restarts = ownRestarts(info, j.State)
	}
}

// ownRestarts is the restarts the run made for the job's own failures: its failed
// rounds less those its lost nodes and pre-emptions caused. A failure past the run's
// budget (info.MaxRestarts, when recorded) ended the run and restarted nothing, so it
// is not one (a job of --max-restarts 3 that failed four times showed Restarts=4).
func ownRestarts(info rendezvous.RunInfo, st State) int {
	failures := info.Failures
	if info.MaxRestarts >= 0 {
		failures = min(failures, info.MaxRestarts)
	}
	return max(failures-st.NodeFailures-st.PreemptFailures, 0)
}

// update is the package's update, fenced by the controller's leadership.
func (c *Controller) update(ctx context.Context, id string, change func(j *Job) bool, extra ...store.Op) (*Job, bool, error) {
	j, changed, err := update(ctx, c.s, id, change, append([]store.Op{allocator.LeaderFence(c.session)}, extra...)...)
	if changed && err == nil {
		c.written.Wrote(jobsPrefix, j.Index)
	}
	return j, changed, err
}
