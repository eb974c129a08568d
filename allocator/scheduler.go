package allocator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/topology"
)

// ErrNotLeader means the scheduler lost its leadership (its fencing check failed).
var ErrNotLeader = errors.New("no longer the scheduler")

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// Session is the agent session that holds the leader key (gangrun/scheduler/leader);
	// every transaction the scheduler makes checks that it still does.
	Session string
	// Name identifies the scheduler in the published status (the agent's node name).
	Name string
	// Log receives the scheduler's messages; nil discards them.
	Log *zap.Logger
	// Events receives the grants it makes (event.Granted: Job the request id, Nodes, GPUs
	// in all), every pending reason when it changes (event.Pending: Cause the reason, as
	// `gangrun queue` shows it) and the releases it sees (event.Released: Cause
	// "released" when a grant's keys went away, which its holder's release, `gangrun
	// cancel` and its session's expiry look alike in; "expired" when the scheduler
	// removed a grant whose request is no longer held), and each pass it makes
	// (event.Passed: Duration how long it took). Events are emitted from the
	// scheduler's loop; nil discards them.
	Events event.Sink
}

// Scheduler places pending requests. Only the agent holding gangrun/scheduler/leader
// runs one; every transaction it makes checks that it still holds that key (fencing),
// so a deposed scheduler cannot grant anything. This file holds its loop: placement is
// the pipeline (pipeline.go), the writes are commit.go's, the reservations reserve.go's.
type Scheduler struct {
	s       store.Store
	session string // the agent session that holds the leader key
	name    string
	log     *zap.Logger
	events  event.Sink
	now     func() time.Time
	pipe    pipeline
	invs    *inventories

	// written holds, per watched prefix, the highest store index this scheduler wrote
	// under it; the next pass must read a view at least that new, or it could grant a
	// request twice. unknown is set when a write's index is not known (deletes, and writes
	// that got no answer): the next pass then reads a fresh consistent snapshot.
	written  store.OwnWrites
	unknown  bool
	delayed  map[string]time.Time // GPU key → end of its lock-delay
	reserved map[string][]string  // request → nodes kept for it
	status   SchedulerStatus
	// granted are the grants seen granted after the last pass (id → grant), so the next
	// one tells which went away; told are the pending reasons last emitted.
	granted map[string]Grant
	told    map[string]string
	// pol is the operator's policy (nil: none; policy.go); usage the decayed usage it
	// keeps (nil until the first pass under a policy reads it), written at usageSaved.
	pol        *policy.Policy
	usage      *policy.Usage
	usageSaved time.Time
	// usageNewer is why the stored usage could not be read (a newer gangrun wrote it):
	// the passes then rank with the usage of this leadership only, and never write it.
	usageNewer error
}

// NewScheduler returns a scheduler acting under cfg.Session, which must hold the leader
// key (see Agent).
func NewScheduler(s store.Store, cfg SchedulerConfig) *Scheduler {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Scheduler{s: s, session: cfg.Session, name: cfg.Name, log: log, events: event.Or(cfg.Events), now: time.Now,
		pipe: defaultPipeline(), invs: newInventories(s),
		delayed: map[string]time.Time{}, reserved: map[string][]string{},
		granted: map[string]Grant{}, told: map[string]string{}}
}

// The scheduler's waits: staleWait for its blocking queries to catch up with its own
// writes before it reads the cluster afresh; storeErrorRetry before it tries again
// after a store error; raceRetry before it places again a request whose placement
// raced with another change.
const (
	staleWait       = 500 * time.Millisecond
	storeErrorRetry = time.Second
	raceRetry       = 100 * time.Millisecond
)

// watchGap is the shortest time between two answers of one of the scheduler's watches:
// under a deep, busy queue a pass takes in every change of the last watchGap at once
// instead of decoding every request and GPU key again for each.
const watchGap = 50 * time.Millisecond

// watchedPrefixes are the parts of gangrun/cluster/ the scheduler follows with separate
// blocking queries, so that a new request does not make it read every node record again.
var watchedPrefixes = [...]string{nodesPrefix, alivePrefix, drainPrefix, requestsPrefix, grantsPrefix, gpusPrefix}

// Run schedules until ctx ends (nil) or leadership is lost (ErrNotLeader): one pass at
// start, then one after every change under gangrun/cluster/ (blocking queries) or when a
// lock-delay or a request's wait runs out.
func (sc *Scheduler) Run(ctx context.Context) error {
	// The cluster's parts and, last, the policy (the latest that parses: a bad one is
	// logged and the one before kept).
	f := store.Follow(ctx, sc.s, watchGap, append(watchedPrefixes[:], policy.Key)...)
	var pol *policy.Policy
	var polIndex uint64
	cache := newDecodeCache()
	var timer <-chan time.Time
	var staleSince time.Time // when the watched view first lagged our own writes
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.Changed():
		case <-timer:
		}
		answers, ready := f.Latest()
		if !ready {
			continue
		}
		if pa := answers[len(watchedPrefixes)]; pa.Index != polIndex {
			polIndex = pa.Index
			pol = nil
			for _, e := range pa.Entries {
				if e.Key != policy.Key {
					continue
				}
				p, err := policy.Parse(e.Value)
				if err != nil {
					sc.log.Warn("the policy does not parse: keeping the one before", zap.String("key", policy.Key), zap.Error(err))
					p = sc.pol
				}
				pol = p
			}
		}
		sc.pol = pol
		fresh := true
		var all []store.Entry
		var index uint64
		for i, a := range answers[:len(watchedPrefixes)] {
			fresh = fresh && sc.written.Covers(watchedPrefixes[i], a.Index)
			all = append(all, a.Entries...)
			index = max(index, a.Index)
		}
		var snap *Cluster
		switch {
		case sc.unknown:
			entries, idx, err := sc.s.List(ctx, ClusterPrefix)
			if err != nil {
				sc.log.Warn("read the cluster", zap.Error(err))
				timer = time.After(storeErrorRetry)
				continue
			}
			snap, sc.unknown = cache.parse(entries, idx), false
		case !fresh:
			// A view from before our own last write: wait for a newer one, and should
			// none come within half a second, read the cluster afresh.
			if staleSince.IsZero() {
				staleSince = time.Now()
			}
			if wait := staleWait - time.Since(staleSince); wait > 0 {
				timer = time.After(wait)
				continue
			}
			// Older than a write of ours, the store went back in time (restored from a
			// snapshot): its index counts from there now.
			entries, idx, _, err := sc.written.Reread(ctx, sc.s, ClusterPrefix)
			if err != nil {
				sc.log.Warn("read the cluster", zap.Error(err))
				timer = time.After(storeErrorRetry)
				continue
			}
			snap = cache.parse(entries, idx)
		default:
			snap = cache.parse(all, index)
		}
		staleSince = time.Time{}
		next, err := sc.Pass(ctx, snap)
		if err != nil {
			if errors.Is(err, ErrNotLeader) || ctx.Err() != nil {
				return err
			}
			sc.log.Warn("scheduling pass", zap.Error(err))
			next = storeErrorRetry
		}
		timer = nil
		if next > 0 {
			timer = time.After(next)
		}
	}
}

// Pass schedules once on snapshot c and returns when the next pass is due regardless of
// changes (0: only on a change). A pass runs in phases, each a method of pass:
//
//  1. prepare: end what has ended (expired requests and grants, lock-delays over),
//     list the free devices of the nodes that are up, and order the requests (by the
//     policy's priorities, its usage accounted first, or by arrival);
//  2. for each request in that order:
//     admit (granted already; its --wait over: refused; a policy limit: held back,
//     with Slurm's reason), place (the placement pipeline: filter, then rank; a
//     request that does not fit waits and may keep nodes, reserve), take (its devices
//     taken for the rest of the pass, its grant queued in the batch, commit);
//  3. finish: commit the batch, forget what is gone, publish why each request waits.
//
// A new phase is a method of pass called here; what it needs of the pass's state is a
// field of pass.
func (sc *Scheduler) Pass(ctx context.Context, c *Cluster) (time.Duration, error) {
	now, began := sc.now(), time.Now()
	defer func() {
		sc.events.Emit(event.Event{Time: now, Kind: event.Passed, Attempt: -1, Duration: time.Since(began)})
	}()
	p, err := sc.prepare(ctx, c, now)
	if err != nil {
		return 0, err
	}
	for _, r := range p.requests {
		if ok, err := p.admit(ctx, &r); err != nil || !ok {
			if err != nil {
				return 0, err
			}
			continue
		}
		nodes := p.place(ctx, r)
		if nodes == nil {
			continue
		}
		if err := p.take(ctx, r, nodes); err != nil {
			return 0, err
		}
	}
	return p.finish(ctx)
}

// pass is one scheduling pass's working state, which its phases (Pass) read and change
// in turn.
type pass struct {
	sc  *Scheduler
	c   *Cluster
	now time.Time
	// requests are the requests in the order they are considered.
	requests []PendingRequest
	// held is what the policy's limits count (nil without a policy).
	held *policy.Held
	// free is each node's devices free and not in lock-delay; a grant takes its own
	// for the rest of the pass, whether its commit lands or races.
	free map[string][]topology.Device
	// reserved is node → the request it is kept for.
	reserved map[string]string
	// unplaced is request shape (shapeKey) → why it did not fit, and with what free
	// and kept: a request shaped like one that did not fit does not fit either while
	// free devices have only shrunk and kept nodes only grown since (place checks it).
	unplaced map[string]misfit
	// nfree counts the devices in free.
	nfree int
	// starts and granted are what backfill reads (reservationStart): each reservation's
	// expected start, and the requests granted in this pass on each node.
	starts  map[string]time.Time
	granted map[string][]Request
	// live are the requests seen, so that what is kept for the others is forgotten.
	live   map[string]bool
	status SchedulerStatus
	batch  grantBatch
	// next is when the next pass is due regardless of changes (0: only on a change).
	next time.Duration
}

// misfit is why a request shape did not fit (pass.unplaced), and the pass's free
// devices and kept nodes then.
type misfit struct {
	why         string
	nfree, kept int
}

// soon makes the next pass due within d (d > 0), unless one is due sooner.
func (p *pass) soon(d time.Duration) {
	if d > 0 && (p.next == 0 || d < p.next) {
		p.next = d
	}
}

// prepare is the pass's first phase, at now: the requests and grants that ended are
// cleaned up, lock-delays that are over forgotten, the free devices of the nodes that
// are up listed, and the requests ordered.
func (sc *Scheduler) prepare(ctx context.Context, c *Cluster, now time.Time) (*pass, error) {
	p := &pass{sc: sc, c: c, now: now, free: map[string][]topology.Device{}, reserved: map[string]string{},
		unplaced: map[string]misfit{}, starts: map[string]time.Time{}, granted: map[string][]Request{}, live: map[string]bool{},
		status: SchedulerStatus{Pending: map[string]string{}, Reserved: map[string][]string{}, Leader: sc.name}}
	expired, err := sc.cleanup(ctx, c)
	if err != nil {
		return nil, err
	}
	sc.noteReleases(p.now, c, expired)
	for k, until := range sc.delayed {
		if !until.After(p.now) {
			delete(sc.delayed, k)
		}
	}
	c.countUsage() // afresh: take adds this pass's grants
	for name, n := range c.Nodes {
		if n.State() != NodeUp {
			continue
		}
		for _, d := range n.Free() {
			if _, delayed := sc.delayed[gpuKey(name, d.ID)]; !delayed {
				p.free[name] = append(p.free[name], d)
				p.nfree++
			}
		}
	}
	p.requests = c.ordered()
	if sc.pol != nil {
		if err := sc.account(ctx, p.now, c); err != nil {
			return nil, err
		}
		p.requests = c.orderedBy(Priorities(sc.pol, sc.usage, c, p.now))
		p.held = heldBy(c, sc.pol)
		p.soon(PolicyRecalc)
	}
	sc.pipe.occupied = occupants(c)
	sc.pipe.backfill = func(r Request, owner string) bool {
		st, ok := p.starts[owner]
		return ok && r.TimeLimit > 0 && !p.now.Add(r.TimeLimit).After(st)
	}
	return p, nil
}

// admit is the phase that decides whether request r is placed in this pass: not when
// it is granted or refused already, nor when its --wait is over (it is refused, with
// why it waited), nor when a policy limit holds it back (with Slurm's reason; it keeps
// no nodes: others may use what it cannot). It sets r's partition's nodes.
func (p *pass) admit(ctx context.Context, r *PendingRequest) (bool, error) {
	sc := p.sc
	p.live[r.ID] = true
	if g, ok := p.c.Grants[r.ID]; ok && g.State != GrantPending {
		return false, nil
	}
	if r.Wait > 0 {
		left := r.Submitted.Add(r.Wait).Sub(p.now)
		if left <= 0 {
			why := sc.status.Pending[r.ID]
			if why == "" {
				why = "no placement"
			}
			return false, sc.refuse(ctx, *r, fmt.Sprintf("waited %s (--wait): %s", r.Wait, why))
		}
		p.soon(left)
	}
	if sc.pol != nil {
		if sel, ok := sc.pol.PartitionNodes(r.Partition); ok {
			r.PartitionNodes = sel
		}
		if why := sc.pol.Check(PolicyJob(r.Request), p.held, sc.usage); why != "" {
			p.status.Pending[r.ID] = why
			return false, nil
		}
	}
	return true, nil
}

// place is the phase that finds r's nodes and devices (the placement pipeline), or,
// when it does not fit, records why it waits and may keep nodes for it (reserve) so
// that what comes after it cannot take what it waits for. nil: it waits.
func (p *pass) place(ctx context.Context, r PendingRequest) []GrantNode {
	sc := p.sc
	shape := shapeKey(r.Request)
	var nodes []GrantNode
	m, known := p.unplaced[shape]
	why := m.why
	if !known || p.nfree > m.nfree || len(p.reserved) < m.kept {
		nodes, why = sc.pipe.place(r.Request, p.c.Nodes, p.free, p.reserved,
			func(n *NodeState) (*topology.Inventory, error) { return sc.invs.get(ctx, n) })
		if nodes == nil {
			p.unplaced[shape] = misfit{why: why, nfree: p.nfree, kept: len(p.reserved)}
		}
	}
	if nodes != nil {
		return nodes
	}
	if n := len(sc.delayed); n > 0 {
		why += fmt.Sprintf("; %d GPUs in lock-delay after their holder died (lockable again within %s)", n, GrantLockDelay)
	}
	p.status.Pending[r.ID] = why
	if len(p.reserved) == 0 || sc.hasReservation(r.ID) {
		if kept := sc.reserve(p.c, r, p.reserved); len(kept) > 0 {
			p.status.Reserved[r.ID] = kept
			for _, n := range kept {
				p.reserved[n] = r.ID
			}
			if st, ok := reservationStart(p.c, kept, p.granted, p.now); ok {
				p.starts[r.ID] = st
			}
		}
	}
	return nil
}

// take is the phase that grants r its nodes: what the grant takes is taken for the rest
// of the pass (and counted against the policy's limits), and its write joins the batch
// (committed when the batch is full, and at the pass's end), or, too large for one
// transaction, is committed alone in pieces.
func (p *pass) take(ctx context.Context, r PendingRequest, nodes []GrantNode) error {
	sc := p.sc
	if r.Durable() {
		// A job's GPU keys are held, node by node, by the node's agent until the job's
		// step there takes them over.
		for i := range nodes {
			nodes[i].Session = p.c.Nodes[nodes[i].Name].AliveSession
		}
	}
	for _, gn := range nodes {
		if n, ok := p.c.Nodes[gn.Name]; ok {
			n.hold(gn) // its CPUs and memory, for the rest of the pass
		}
		left := without(p.free[gn.Name], gn.Devices)
		p.nfree -= len(p.free[gn.Name]) - len(left)
		p.free[gn.Name] = left
		p.granted[gn.Name] = append(p.granted[gn.Name], r.Request)
		sc.pipe.occupied[gn.Name] = append(sc.pipe.occupied[gn.Name], occupant{id: r.ID, user: r.User, exclusive: r.Exclusive})
	}
	if p.held != nil {
		j := PolicyJob(r.Request)
		j.GPUs = Grant{Nodes: nodes}.DeviceCount()
		p.held.Add(j)
	}
	w := newGrantWrite(r, nodes)
	ops := w.oneTxn(sc.fence(), p.now.UTC())
	if ops == nil {
		return p.settled(batchResult{r: r, nodes: nodes, err: sc.commit(ctx, r, nodes)})
	}
	if !p.batch.fits(ops[1:]) {
		if err := p.flush(ctx); err != nil {
			return err
		}
	}
	if len(p.batch.ops) == 0 {
		p.batch.ops = []store.Op{sc.fence()}
	}
	p.batch.items = append(p.batch.items, batched{w: w, nodes: nodes, ops: ops[1:]})
	p.batch.ops = append(p.batch.ops, ops[1:]...)
	return nil
}

// flush commits the batch's grants (grantBatch) and records each outcome.
func (p *pass) flush(ctx context.Context) error {
	results, err := p.sc.flush(ctx, &p.batch)
	if err != nil {
		return err
	}
	for _, res := range results {
		if err := p.settled(res); err != nil {
			return err
		}
	}
	return nil
}

// settled records how one grant's commit ended; an error ends the pass.
func (p *pass) settled(res batchResult) error {
	sc := p.sc
	var te *store.TxnError
	switch err := res.err; {
	case err == nil:
		delete(sc.reserved, res.r.ID)
		sc.log.Info("granted", zap.String("id", res.r.ID), zap.Int("nodes", len(res.nodes)), zap.Int("gpus_per_node", res.r.GPUsPerNode))
		g := Grant{ID: res.r.ID, State: GrantGranted, Nodes: res.nodes, Session: res.r.Session}
		sc.granted[res.r.ID] = g
		sc.emit(p.now, event.Granted, g, "")
	case errors.Is(err, ErrNotLeader):
		return err
	case errors.As(err, &te):
		// The view was stale (a GPU locked meanwhile, or in lock-delay, or the requester
		// gone): note it and look again on the next change.
		for _, k := range te.LockDelayed() {
			sc.delayed[k] = p.now.Add(GrantLockDelay)
		}
		if len(te.LockDelayed()) > 0 {
			p.soon(GrantLockDelay)
		}
		p.status.Pending[res.r.ID] = "placement raced with another change; retrying"
		p.soon(raceRetry)
		sc.unknown = true // read the cluster afresh: this view was wrong
	default:
		return err
	}
	return nil
}

// finish is the pass's last phase: the batch committed, the nodes kept for requests
// that are gone forgotten, the next pass due when a lock-delay ends, and why each
// request waits published.
func (p *pass) finish(ctx context.Context) (time.Duration, error) {
	sc := p.sc
	if err := p.flush(ctx); err != nil {
		return 0, err
	}
	for id := range sc.reserved {
		if !p.live[id] {
			delete(sc.reserved, id)
		}
	}
	for _, until := range sc.delayed {
		p.soon(until.Sub(p.now))
	}
	sc.notePending(p.now, p.status.Pending)
	if err := sc.publish(ctx, p.status); err != nil {
		return 0, err
	}
	return p.next, nil
}

// without returns devs minus the IDs in ids.
func without(devs []topology.Device, ids []string) []topology.Device {
	drop := map[string]bool{}
	for _, id := range ids {
		drop[id] = true
	}
	var out []topology.Device
	for _, d := range devs {
		if !drop[d.ID] {
			out = append(out, d)
		}
	}
	return out
}

// noteReleases emits event.Released for each grant granted after the last pass that c
// (after cleanup) no longer holds as granted: "expired" for those cleanup removed
// (expired), "released" for the others. It then remembers c's granted grants.
func (sc *Scheduler) noteReleases(now time.Time, c *Cluster, expired []string) {
	for _, id := range slices.Sorted(maps.Keys(sc.granted)) {
		if g, ok := c.Grants[id]; ok && g.State == GrantGranted {
			continue
		}
		cause := "released"
		if slices.Contains(expired, id) {
			cause = "expired"
		}
		sc.emit(now, event.Released, sc.granted[id], cause)
		delete(sc.granted, id)
	}
	for id, g := range c.Grants {
		if g.State == GrantGranted {
			sc.granted[id] = g
		}
	}
}

// notePending emits event.Pending for each request whose pending reason is new or
// changed since the last pass, in request id order, and remembers pending.
func (sc *Scheduler) notePending(now time.Time, pending map[string]string) {
	for _, id := range slices.Sorted(maps.Keys(pending)) {
		if why := pending[id]; sc.told[id] != why {
			sc.events.Emit(event.Event{Time: now, Kind: event.Pending, Job: id, Attempt: -1, Cause: why})
		}
	}
	sc.told = pending
}

// emit sends a grant's event (Granted or Released) with its nodes and device count.
func (sc *Scheduler) emit(now time.Time, kind event.Kind, g Grant, cause string) {
	names := make([]string, len(g.Nodes))
	for i, gn := range g.Nodes {
		names[i] = gn.Name
	}
	sc.events.Emit(event.Event{Time: now, Kind: kind, Job: g.ID, Attempt: -1, Cause: cause, Nodes: names, GPUs: g.DeviceCount()})
}

// publish writes the status when it changed.
func (sc *Scheduler) publish(ctx context.Context, st SchedulerStatus) error {
	if reflect.DeepEqual(st.Pending, sc.status.Pending) && maps.EqualFunc(st.Reserved, sc.status.Reserved, func(a, b []string) bool { return reflect.DeepEqual(a, b) }) && sc.status.Leader == st.Leader {
		return nil
	}
	st.Updated = sc.now().UTC()
	b, err := schema.Marshal(schema.Status, st)
	if err != nil {
		return err
	}
	if err := sc.txn(ctx, []store.Op{{Verb: store.Set, Key: statusKey, Value: b}}); err != nil {
		return fmt.Errorf("publish status: %w", err)
	}
	sc.status = st
	return nil
}
