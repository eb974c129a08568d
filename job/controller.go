package job

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/store"
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
//     grant and request go.
type Controller struct {
	s       store.Store
	session string
	log     *zap.Logger
	events  event.Sink
	now     func() time.Time
}

// controllerRetry is how often the controller passes again without a change (a step
// that did not start, a release that must wait for a step to give its GPUs back).
const controllerRetry = 2 * time.Second

// Control runs the controller until ctx ends, as the leader whose session is session:
// the signature allocator.AgentConfig.Leader takes (with the log and the sink bound).
// events receives event.JobStarted when a job first runs (nil discards it).
func Control(log *zap.Logger, events event.Sink) func(ctx context.Context, s store.Store, session string) error {
	return func(ctx context.Context, s store.Store, session string) error {
		c := &Controller{s: s, session: session, log: log, events: event.Or(events), now: time.Now}
		if c.log == nil {
			c.log = zap.NewNop()
		}
		return c.Run(ctx)
	}
}

// Run passes over the jobs on every change of the cluster's keys or the jobs', and
// every controllerRetry, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	// The cluster's keys (nodes, requests, grants) and the jobs' (states, steps).
	for _, prefix := range []string{allocator.ClusterPrefix, jobsPrefix} {
		w := store.NewWatcher(c.s, prefix)
		go func() {
			for {
				if _, err := w.Next(ctx); err != nil {
					return
				}
				select {
				case changed <- struct{}{}:
				default:
				}
			}
		}()
	}
	tick := time.NewTicker(controllerRetry)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
		if err := c.Pass(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, store.ErrNotLockHolder) {
				return err // no longer the leader
			}
			c.log.Warn("job controller pass", zap.Error(err))
		}
	}
}

// Pass makes one pass over every job not yet ended.
func (c *Controller) Pass(ctx context.Context) error {
	cl, err := allocator.Snapshot(ctx, c.s)
	if err != nil {
		return err
	}
	jobs, err := List(ctx, c.s)
	if err != nil {
		return err
	}
	var firstErr error
	for _, j := range jobs {
		if err := c.job(ctx, cl, j); err != nil {
			if errors.Is(err, store.ErrNotLockHolder) {
				return err
			}
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}

// job is one job's part of the pass.
func (c *Controller) job(ctx context.Context, cl *allocator.Cluster, j Job) error {
	id := j.Spec.ID
	g, granted := cl.Grants[id]
	_, requested := cl.Requests[id]
	switch st := j.State; {
	case st.Status.Final():
		if granted || requested {
			return c.release(ctx, id)
		}
	case st.Status == Pending && st.Requeue:
		// Requeued: once its steps have stopped, the old grant goes and a new request is
		// made, away from the nodes it lost.
		steps, err := Steps(ctx, c.s, id)
		if err != nil || len(steps) > 0 {
			return err
		}
		if granted || requested {
			if err := allocator.ReleaseJob(ctx, c.s, id); err != nil {
				return err
			}
		}
		var exclude []string
		for _, l := range st.LostNodes {
			if l.Exclude && !slices.Contains(exclude, l.Node) {
				exclude = append(exclude, l.Node)
			}
		}
		reqOps, err := allocator.JobRequestOps(request(j.Spec, true, exclude))
		if err != nil {
			return err
		}
		_, _, err = c.update(ctx, id, func(j *Job) bool {
			if j.State.Status != Pending || !j.State.Requeue {
				return false
			}
			j.State.Requeue, j.State.Reason = false, "Resources"
			return true
		}, reqOps...)
		return err
	case st.Status == Pending && granted && g.State == allocator.GrantGranted:
		return c.start(ctx, j, g)
	case st.Status == Completing:
		steps, err := Steps(ctx, c.s, id)
		if err != nil || len(steps) > 0 {
			return err
		}
		var silent []string
		for _, n := range st.Nodes {
			if !slices.Contains(st.StepsEnded, n) {
				silent = append(silent, n)
			}
		}
		if st.End == Failed && len(silent) > 0 {
			// The gang failed, and a node's step ended without a word: the node died or
			// was cut off, and its peers' failure followed. That is the node's failure,
			// not the job's: it is placed again, away from the node, its budget intact.
			return c.requeueSilent(ctx, cl, id, silent)
		}
		if err := allocator.ReleaseJob(ctx, c.s, id); err != nil {
			return err
		}
		_, _, err = c.update(ctx, id, func(j *Job) bool {
			if j.State.Status != Completing {
				return false
			}
			j.State.Status, j.State.Ended = j.State.End, c.now().UTC()
			j.State.closeAttempts(j.State.Ended, strings.ToLower(string(j.State.End))) // cancelled, timeout: the supervisor said nothing
			c.countRestarts(ctx, j)
			return true
		})
		return err
	case st.Status == Running:
		return c.watchNodes(ctx, cl, j, g)
	}
	return nil
}

// start makes a pending job whose request was granted run: its first nodes run it (in
// the grant's node-rank order), the rest are its spares.
func (c *Controller) start(ctx context.Context, j Job, g allocator.Grant) error {
	var names []string
	for _, gn := range g.Nodes {
		names = append(names, gn.Name)
	}
	spares := min(j.Spec.SpareNodes, max(len(names)-j.Spec.MinNodes, 0))
	first := false
	_, changed, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
		if j.State.Status != Pending || j.State.Requeue {
			return false
		}
		now := c.now().UTC()
		first = j.State.Started.IsZero()
		j.State.Status, j.State.Reason = Running, ""
		j.State.Nodes, j.State.Spares = names[:len(names)-spares], names[len(names)-spares:]
		j.State.NodesSince = now
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
		now := c.now().UTC()
		for _, n := range silent {
			st.LostNodes = append(st.LostNodes, LostNode{Node: n, Why: "the job's step on node " + n + " ended without a word (the node died or was cut off)",
				At: now, Exclude: healthy(cl, n)})
			st.NodeFailures++
		}
		st.Status, st.End, st.ExitCode, st.Requeue = Pending, "", 0, true
		st.Reason = "requeued: lost " + strings.Join(silent, ", ")
		st.closeAttempts(now, st.Reason)
		st.Nodes, st.Spares, st.StepsEnded = nil, nil, nil
		return true
	})
	if changed {
		c.log.Warn("job failed after it lost nodes: requeued (a node failure, not the job's)", zap.String("job", id), zap.Strings("lost", silent))
	}
	return err
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

// lostWhy says why node n of running job j is lost ("" when it is not), at now: down,
// drained for a failed GPU, its step gone after it had taken the node's GPUs over, or
// no step StepStartTimeout after the node joined the job.
func lostWhy(cl *allocator.Cluster, g allocator.Grant, j Job, n string, steps map[string]StepRecord, now time.Time) string {
	ns, ok := cl.Nodes[n]
	switch {
	case !ok || !ns.Up:
		return "node " + n + " is down (its agent's session ended)"
	case ns.Drain != nil:
		return "node " + n + " was drained: " + ns.Drain.Reason
	}
	i := slices.IndexFunc(g.Nodes, func(gn allocator.GrantNode) bool { return gn.Name == n })
	if i < 0 {
		return "node " + n + " left the job's grant"
	}
	_, running := steps[n]
	switch {
	case running || slices.Contains(j.State.StepsEnded, n):
	case g.Nodes[i].Session != ns.AliveSession:
		// The step had taken the GPUs over (they are no longer its agent's) and is gone.
		return "the job's step on node " + n + " ended"
	case !j.State.NodesSince.IsZero() && now.Sub(j.State.NodesSince) > StepStartTimeout:
		return "the job's step did not start on node " + n + " within " + StepStartTimeout.String()
	}
	return ""
}

// watchNodes handles a running job's lost nodes.
func (c *Controller) watchNodes(ctx context.Context, cl *allocator.Cluster, j Job, g allocator.Grant) error {
	steps, err := Steps(ctx, c.s, j.Spec.ID)
	if err != nil {
		return err
	}
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
	if len(lost) == 0 && len(spareLost) == 0 {
		c.syncRestarts(ctx, j)
		return nil
	}
	var recorded []string // the lost nodes this update records (it may run more than once)
	_, changed, err := c.update(ctx, j.Spec.ID, func(jj *Job) bool {
		recorded = recorded[:0]
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
			st.LostNodes = append(st.LostNodes, LostNode{Node: n, Why: lost[n], At: now, Exclude: healthy(cl, n)})
			st.NodeFailures++
			recorded = append(recorded, n)
			st.Nodes = slices.DeleteFunc(st.Nodes, func(x string) bool { return x == n })
			switch {
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
				st.Status, st.Reason, st.Requeue = Pending, "requeued: "+lost[n], true
				st.Nodes, st.Spares, st.StepsEnded = nil, nil, nil
				st.closeAttempts(now, st.Reason)
				return true
			}
		}
		return true
	})
	if err != nil || !changed {
		return err
	}
	// Once the loss is recorded (and only then: a pass that fails before it must not give
	// the restart back twice), the gang's failure that a lost node caused is no failure
	// of the job's: the run's budget gets it back. And the survivors (and a spare) need
	// not wait for the lost node's rendezvous session to expire before they meet again.
	refunded := 0
	for _, n := range recorded {
		if ok, err := rendezvous.AddRestarts(ctx, c.s, j.Spec.ID, 1); err == nil && ok {
			refunded++
		}
		if ok, err := rendezvous.Evict(ctx, c.s, j.Spec.ID, n); err == nil && ok {
			c.log.Info("lost node evicted from the job's rendezvous", zap.String("job", j.Spec.ID), zap.String("node", n))
		}
	}
	if refunded > 0 {
		c.log.Info("node failures do not count against --max-restarts: the restarts they cost were given back", zap.String("job", j.Spec.ID), zap.Int("restarts", refunded))
	}
	return nil
}

// syncRestarts keeps a running job's count of its own restarts (the run's failures
// less those its lost nodes caused) in its state, for queue and show.
func (c *Controller) syncRestarts(ctx context.Context, j Job) {
	info, ok, err := rendezvous.ReadRun(ctx, c.s, j.Spec.ID)
	if err != nil || !ok {
		return
	}
	own := max(info.Failures-j.State.NodeFailures, 0)
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
	if info, ok, err := rendezvous.ReadRun(ctx, c.s, j.Spec.ID); err == nil && ok {
		j.State.Restarts = max(info.Failures-j.State.NodeFailures, 0)
	}
}

// release removes an ended job's grant and request (a cancelled pending job granted
// meanwhile; a final job whose removal was cut short).
func (c *Controller) release(ctx context.Context, id string) error {
	steps, err := Steps(ctx, c.s, id)
	if err != nil || len(steps) > 0 {
		return err
	}
	return allocator.ReleaseJob(ctx, c.s, id)
}

// update is the package's update, fenced by the controller's leadership.
func (c *Controller) update(ctx context.Context, id string, change func(j *Job) bool, extra ...store.Op) (*Job, bool, error) {
	return update(ctx, c.s, id, change, append([]store.Op{allocator.LeaderFence(c.session)}, extra...)...)
}
