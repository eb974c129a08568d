package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// ErrNotLeader means the scheduler lost its leadership (its fencing check failed).
var ErrNotLeader = errors.New("no longer the scheduler")

// Scheduler places pending requests. Only the agent holding gangrun/scheduler/leader
// runs one; every transaction it makes checks that it still holds that key (fencing),
// so a deposed scheduler cannot grant anything.
type Scheduler struct {
	s       store.Store
	session string // the agent session that holds the leader key
	name    string
	log     *zap.Logger
	now     func() time.Time

	invs map[string]cachedInventory
	// written holds, per watched prefix, the highest store index this scheduler wrote
	// under it; the next pass must read a view at least that new, or it could grant a
	// request twice. unknown is set when a write's index is not known (deletes only):
	// the next pass then reads a fresh consistent snapshot.
	written  map[string]uint64
	unknown  bool
	delayed  map[string]time.Time // GPU key → end of its lock-delay
	reserved map[string][]string  // request → nodes kept for it
	status   SchedulerStatus
}

type cachedInventory struct {
	hash string
	inv  *topology.Inventory
}

// NewScheduler returns a scheduler acting under session, which must hold the leader key
// (see Agent). name identifies it in the published status.
func NewScheduler(s store.Store, session, name string, log *zap.Logger) *Scheduler {
	if log == nil {
		log = zap.NewNop()
	}
	return &Scheduler{s: s, session: session, name: name, log: log, now: time.Now,
		invs: map[string]cachedInventory{}, delayed: map[string]time.Time{}, reserved: map[string][]string{},
		written: map[string]uint64{}}
}

// staleWait is how long the scheduler waits for its blocking queries to catch up with
// its own writes before it reads the cluster afresh.
const staleWait = 500 * time.Millisecond

// watchedPrefixes are the parts of gangrun/cluster/ the scheduler follows with separate
// blocking queries, so that a new request does not make it read every node record again.
var watchedPrefixes = [...]string{nodesPrefix, alivePrefix, drainPrefix, requestsPrefix, grantsPrefix, gpusPrefix}

// Run schedules until ctx ends (nil) or leadership is lost (ErrNotLeader): one pass at
// start, then one after every change under gangrun/cluster/ (blocking queries) or when a
// lock-delay or a request's wait runs out.
func (sc *Scheduler) Run(ctx context.Context) error {
	type slot struct {
		entries []store.Entry
		index   uint64
		ok      bool
	}
	var mu sync.Mutex
	var slots [len(watchedPrefixes)]slot
	updates := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, prefix := range watchedPrefixes {
		go func(i int, prefix string) {
			w := store.NewWatcher(sc.s, prefix)
			for {
				entries, err := w.Next(wctx)
				if err != nil {
					return // ctx ended
				}
				mu.Lock()
				slots[i] = slot{entries, w.Index(), true}
				mu.Unlock()
				select {
				case updates <- struct{}{}:
				default:
				}
			}
		}(i, prefix)
	}
	cache := newDecodeCache()
	var timer <-chan time.Time
	var staleSince time.Time // when the watched view first lagged our own writes
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-updates:
		case <-timer:
		}
		mu.Lock()
		cur := slots
		mu.Unlock()
		ready, fresh := true, true
		var all []store.Entry
		var index uint64
		for i, sl := range cur {
			ready = ready && sl.ok
			fresh = fresh && sl.index >= sc.written[watchedPrefixes[i]]
			all = append(all, sl.entries...)
			index = max(index, sl.index)
		}
		if !ready {
			continue
		}
		var snap *Cluster
		switch {
		case sc.unknown:
			entries, idx, err := sc.s.List(ctx, clusterPrefix)
			if err != nil {
				sc.log.Warn("read the cluster", zap.Error(err))
				timer = time.After(time.Second)
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
			entries, idx, err := sc.s.List(ctx, clusterPrefix)
			if err != nil {
				sc.log.Warn("read the cluster", zap.Error(err))
				timer = time.After(time.Second)
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
			next = time.Second
		}
		timer = nil
		if next > 0 {
			timer = time.After(next)
		}
	}
}

// Pass schedules once on snapshot c and returns when the next pass is due regardless of
// changes (0: only on a change).
func (sc *Scheduler) Pass(ctx context.Context, c *Cluster) (time.Duration, error) {
	now := sc.now()
	if err := sc.cleanup(ctx, c); err != nil {
		return 0, err
	}
	for k, until := range sc.delayed {
		if !until.After(now) {
			delete(sc.delayed, k)
		}
	}
	free := map[string][]topology.Device{}
	for name, n := range c.Nodes {
		if n.State() != NodeUp {
			continue
		}
		for _, d := range n.Free() {
			if _, delayed := sc.delayed[gpuKey(name, d.ID)]; !delayed {
				free[name] = append(free[name], d)
			}
		}
	}
	status := SchedulerStatus{Pending: map[string]string{}, Reserved: map[string][]string{}, Leader: sc.name}
	reservedNodes := map[string]string{} // node → request it is kept for
	var next time.Duration
	soon := func(d time.Duration) {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	live := map[string]bool{}
	for _, r := range c.ordered() {
		live[r.ID] = true
		if g, ok := c.Grants[r.ID]; ok && g.State != GrantPending {
			continue // granted or refused already
		}
		if r.Wait > 0 {
			if left := r.Submitted.Add(r.Wait).Sub(now); left <= 0 {
				why := sc.status.Pending[r.ID]
				if why == "" {
					why = "no placement"
				}
				if err := sc.refuse(ctx, r, fmt.Sprintf("waited %s (--wait): %s", r.Wait, why)); err != nil {
					return 0, err
				}
				continue
			} else {
				soon(left)
			}
		}
		nodes, why := sc.place(ctx, c, r, free, reservedNodes)
		if nodes == nil {
			if n := len(sc.delayed); n > 0 {
				why += fmt.Sprintf("; %d GPUs in lock-delay after their holder died (lockable again within %s)", n, GrantLockDelay)
			}
			status.Pending[r.ID] = why
			if len(reservedNodes) == 0 || sc.hasReservation(r.ID) {
				if kept := sc.reserve(c, r, reservedNodes); len(kept) > 0 {
					status.Reserved[r.ID] = kept
					for _, n := range kept {
						reservedNodes[n] = r.ID
					}
				}
			}
			continue
		}
		err := sc.commit(ctx, r, nodes)
		var te *store.TxnError
		switch {
		case err == nil:
			delete(sc.reserved, r.ID)
			sc.log.Info("granted", zap.String("id", r.ID), zap.Int("nodes", len(nodes)), zap.Int("gpus_per_node", r.GPUsPerNode))
			for _, gn := range nodes {
				free[gn.Name] = without(free[gn.Name], gn.Devices)
			}
		case errors.Is(err, ErrNotLeader):
			return 0, err
		case errors.As(err, &te):
			// The view was stale (a GPU locked meanwhile, or in lock-delay, or the
			// requester gone): note it and look again on the next change.
			for _, k := range te.LockDelayed() {
				sc.delayed[k] = now.Add(GrantLockDelay)
			}
			if len(te.LockDelayed()) > 0 {
				soon(GrantLockDelay)
			}
			status.Pending[r.ID] = "placement raced with another change; retrying"
			soon(100 * time.Millisecond)
			for _, gn := range nodes {
				free[gn.Name] = without(free[gn.Name], gn.Devices)
			}
		default:
			return 0, err
		}
	}
	for id := range sc.reserved {
		if !live[id] {
			delete(sc.reserved, id)
		}
	}
	for _, until := range sc.delayed {
		soon(until.Sub(now))
	}
	if err := sc.publish(ctx, status); err != nil {
		return 0, err
	}
	return next, nil
}

func (sc *Scheduler) hasReservation(id string) bool {
	_, ok := sc.reserved[id]
	return ok
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

// fence is the check every scheduler transaction carries: it still leads.
func (sc *Scheduler) fence() store.Op {
	return store.Op{Verb: store.CheckSession, Key: schedulerKey, Session: sc.session}
}

// txn runs ops with the fencing check, mapping a failed fence to ErrNotLeader, and
// records the index it wrote at.
func (sc *Scheduler) txn(ctx context.Context, ops []store.Op) error {
	res, err := sc.s.Txn(ctx, append([]store.Op{sc.fence()}, ops...))
	if err == nil {
		for _, op := range ops {
			for _, p := range watchedPrefixes {
				if !strings.HasPrefix(op.Key, p) {
					continue
				}
				switch op.Verb {
				case store.Set, store.CAS, store.Lock, store.Unlock:
					if res.Index > 0 {
						sc.written[p] = max(sc.written[p], res.Index)
					} else {
						sc.unknown = true
					}
				case store.Delete, store.DeleteCAS, store.DeleteTree:
					// A delete's index is not reported (and deleting what is already gone
					// changes nothing): read afresh next time.
					sc.unknown = true
				}
			}
		}
	}
	var te *store.TxnError
	if errors.As(err, &te) {
		for _, oe := range te.Errors {
			if oe.Op == 0 {
				return ErrNotLeader
			}
		}
	}
	return err
}

// cleanup rolls back what a dead scheduler or an interrupted release left: pending
// grants (no commit is in progress outside Pass), grants and GPU keys of requests that
// are gone, and GPU keys without a grant.
func (sc *Scheduler) cleanup(ctx context.Context, c *Cluster) error {
	var dels []store.Op
	for id, g := range c.Grants {
		r, ok := c.Requests[id]
		if g.State == GrantPending || !ok || !r.Alive {
			dels = append(dels, store.Op{Verb: store.Delete, Key: grantsPrefix + id})
			for _, gn := range g.Nodes {
				for _, d := range gn.Devices {
					dels = append(dels, store.Op{Verb: store.Delete, Key: gpuKey(gn.Name, d)})
				}
			}
			delete(c.Grants, id)
		}
	}
	for key := range c.Orphans {
		dels = append(dels, store.Op{Verb: store.Delete, Key: key})
		if n, d, ok := parseGPUKey(key); ok {
			if ns, ok := c.Nodes[n]; ok {
				delete(ns.Held, d)
			}
		}
	}
	for id, r := range c.Requests {
		if !r.Alive {
			dels = append(dels, store.Op{Verb: store.Delete, Key: requestsPrefix + id})
			delete(c.Requests, id)
		}
	}
	if len(dels) > 0 {
		sc.log.Info("cleaning up", zap.Int("keys", len(dels)))
	}
	for len(dels) > 0 {
		n := min(len(dels), store.MaxTxnOps-1)
		if err := sc.txn(ctx, dels[:n]); err != nil {
			return fmt.Errorf("clean up: %w", err)
		}
		dels = dels[n:]
	}
	return nil
}

// feasible says whether node n can ever take r (ignoring what is in use), and why not.
func feasible(r Request, n *NodeState) (bool, string) {
	switch n.State() {
	case NodeDown:
		return false, "down"
	case NodeDrained:
		return false, "drained"
	}
	if r.Partition != "" && n.Record.Labels[LabelPartition] != r.Partition {
		return false, "other partition"
	}
	for k, v := range r.Labels {
		if n.Record.Labels[k] != v {
			return false, "labels"
		}
	}
	if len(matching(n.Record.Devices, r.GPUModel)) < r.GPUsPerNode {
		return false, "too few GPUs"
	}
	return true, ""
}

// matching returns the devices whose model contains model (case-insensitive).
func matching(devs []topology.Device, model string) []topology.Device {
	if model == "" {
		return devs
	}
	m := strings.ToLower(model)
	var out []topology.Device
	for _, d := range devs {
		if strings.Contains(strings.ToLower(d.Model), m) {
			out = append(out, d)
		}
	}
	return out
}

// place chooses nodes and devices for r from the free devices, leaving out nodes kept
// for earlier requests. It returns nil and the reason when r does not fit now.
func (sc *Scheduler) place(ctx context.Context, c *Cluster, r PendingRequest, free map[string][]topology.Device, reserved map[string]string) ([]GrantNode, string) {
	var cands []NodeCandidate
	counts := map[string]int{}
	for name, n := range c.Nodes {
		ok, why := feasible(r.Request, n)
		if !ok {
			counts[why]++
			continue
		}
		if owner, kept := reserved[name]; kept && owner != r.ID {
			counts["reserved for a request ahead"]++
			continue
		}
		f := len(matching(free[name], r.GPUModel))
		cands = append(cands, NodeCandidate{Name: name, Switch: n.Record.Labels[LabelSwitch],
			Spine: n.Record.Labels[LabelSpine], FreeGPUs: f, TotalGPUs: len(matching(n.Record.Devices, r.GPUModel))})
	}
	chosen, err := ChooseNodes(cands, r.Nodes, r.GPUsPerNode)
	if err != nil {
		return nil, waitReason(r.Request, cands, counts)
	}
	out := make([]GrantNode, 0, len(chosen))
	for _, cn := range chosen {
		n := c.Nodes[cn.Name]
		devs, err := sc.chooseDevices(ctx, n, matching(free[cn.Name], r.GPUModel), r.GPUsPerNode)
		if err != nil {
			return nil, fmt.Sprintf("node %s: %v", cn.Name, err)
		}
		gn := GrantNode{Name: cn.Name, Addr: n.Record.Addr}
		for _, d := range devs {
			gn.Devices = append(gn.Devices, d.ID)
			gn.GPUs = append(gn.GPUs, d.GPU)
		}
		out = append(out, gn)
	}
	return out, ""
}

// waitReason explains why r does not fit, in one line.
func waitReason(r Request, cands []NodeCandidate, excluded map[string]int) string {
	ready := 0
	for _, c := range cands {
		if c.FreeGPUs >= r.GPUsPerNode {
			ready++
		}
	}
	s := fmt.Sprintf("Resources: needs %s with %s", plural(r.Nodes, "node"), plural(r.GPUsPerNode, "free GPU"))
	if r.GPUModel != "" {
		s += " (" + r.GPUModel + ")"
	}
	verb := "have"
	if len(cands) == 1 {
		verb = "has"
	}
	s += fmt.Sprintf("; %d of %s %s them now", ready, plural(len(cands), "eligible node"), verb)
	keys := make([]string, 0, len(excluded))
	for k := range excluded {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s += fmt.Sprintf("; %d %s", excluded[k], k)
	}
	return s
}

// chooseDevices picks k of free on node n with the best interconnect, using the node's
// inventory (fetched again only when its hash changed).
func (sc *Scheduler) chooseDevices(ctx context.Context, n *NodeState, free []topology.Device, k int) ([]topology.Device, error) {
	name := n.Record.Name
	ci, ok := sc.invs[name]
	if !ok || ci.hash != n.Record.InventoryHash {
		e, err := sc.s.Get(ctx, inventoryPrefix+name)
		if err != nil {
			return nil, err
		}
		if e == nil {
			return nil, fmt.Errorf("no inventory stored")
		}
		inv, err := topology.Decode(e.Value)
		if err != nil {
			return nil, fmt.Errorf("stored inventory: %w", err)
		}
		ci = cachedInventory{hash: n.Record.InventoryHash, inv: inv}
		sc.invs[name] = ci
	}
	return ChooseDevices(ci.inv, free, k)
}

// reserve keeps nodes for r, the first request that does not fit, so that requests
// behind it cannot take what it waits for (backfill only what does not delay it). It
// keeps the reservation of an earlier pass while its nodes stay eligible; otherwise it
// picks the eligible nodes with the most free GPUs. It returns the kept nodes.
func (sc *Scheduler) reserve(c *Cluster, r PendingRequest, taken map[string]string) []string {
	eligible := func(name string) bool {
		n, ok := c.Nodes[name]
		if !ok {
			return false
		}
		if _, other := taken[name]; other {
			return false
		}
		ok, _ = feasible(r.Request, n)
		return ok
	}
	if prev, ok := sc.reserved[r.ID]; ok {
		all := true
		for _, name := range prev {
			all = all && eligible(name)
		}
		if all {
			return prev
		}
	}
	type cand struct {
		name string
		free int
	}
	var cands []cand
	for name, n := range c.Nodes {
		if eligible(name) {
			cands = append(cands, cand{name, len(matching(n.Free(), r.GPUModel))})
		}
	}
	if len(cands) < r.Nodes {
		delete(sc.reserved, r.ID)
		return nil // it can never fit as things are: keep nothing
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].free != cands[j].free {
			return cands[i].free > cands[j].free
		}
		return cands[i].name < cands[j].name
	})
	kept := make([]string, r.Nodes)
	for i := range kept {
		kept[i] = cands[i].name
	}
	sort.Strings(kept)
	sc.reserved[r.ID] = kept
	return kept
}

// commit grants r the chosen nodes: the pending grant and the GPU locks in chunks of at
// most chunkOps, then the flip to "granted". Any rejection rolls back what was locked.
func (sc *Scheduler) commit(ctx context.Context, r PendingRequest, nodes []GrantNode) error {
	grantKey := grantsPrefix + r.ID
	g := Grant{ID: r.ID, State: GrantPending, Nodes: nodes, Session: r.Session}
	var locks []store.Op
	for _, gn := range nodes {
		for _, d := range gn.Devices {
			locks = append(locks, store.Op{Verb: store.Lock, Key: gpuKey(gn.Name, d), Value: []byte(r.ID), Session: r.Session})
		}
	}
	holds := []store.Op{{Verb: store.CheckSession, Key: requestsPrefix + r.ID, Session: r.Session}}
	var done []store.Op
	first := true
	for first || len(locks) > 0 {
		n := min(len(locks), chunkOps)
		ops := append([]store.Op{}, holds...)
		if first {
			ops = append(ops, store.Op{Verb: store.CheckNotExists, Key: grantKey},
				store.Op{Verb: store.Lock, Key: grantKey, Value: mustJSON(g), Session: r.Session})
		} else {
			ops = append(ops, store.Op{Verb: store.CheckSession, Key: grantKey, Session: r.Session})
		}
		ops = append(ops, locks[:n]...)
		if err := sc.txn(ctx, ops); err != nil {
			sc.rollback(ctx, grantKey, done, !first)
			return err
		}
		done = append(done, locks[:n]...)
		locks = locks[n:]
		first = false
	}
	g.State, g.Granted = GrantGranted, sc.now().UTC()
	err := sc.txn(ctx, append(holds, store.Op{Verb: store.Lock, Key: grantKey, Value: mustJSON(g), Session: r.Session}))
	if err != nil {
		sc.rollback(ctx, grantKey, done, true)
		return err
	}
	return nil
}

// rollback deletes the GPU keys a failed commit locked and its pending grant.
func (sc *Scheduler) rollback(ctx context.Context, grantKey string, locked []store.Op, grantWritten bool) {
	var dels []store.Op
	if grantWritten {
		dels = append(dels, store.Op{Verb: store.Delete, Key: grantKey})
	}
	for _, op := range locked {
		dels = append(dels, store.Op{Verb: store.Delete, Key: op.Key})
	}
	for len(dels) > 0 {
		n := min(len(dels), store.MaxTxnOps-1)
		if err := sc.txn(ctx, dels[:n]); err != nil {
			// The next pass's cleanup removes what is left (a pending grant, or GPU keys
			// whose grant is gone).
			sc.log.Warn("roll back a failed grant", zap.String("grant", grantKey), zap.Error(err))
			return
		}
		dels = dels[n:]
	}
}

// refuse answers r with a refusal the requester reads.
func (sc *Scheduler) refuse(ctx context.Context, r PendingRequest, reason string) error {
	g := Grant{ID: r.ID, State: GrantRefused, Reason: reason, Session: r.Session}
	err := sc.txn(ctx, []store.Op{
		{Verb: store.CheckSession, Key: requestsPrefix + r.ID, Session: r.Session},
		{Verb: store.Lock, Key: grantsPrefix + r.ID, Value: mustJSON(g), Session: r.Session},
	})
	if errors.Is(err, store.ErrTxnRejected) {
		return nil // the requester left meanwhile
	}
	if err == nil {
		sc.log.Info("refused", zap.String("id", r.ID), zap.String("reason", reason))
	}
	return err
}

// publish writes the status when it changed.
func (sc *Scheduler) publish(ctx context.Context, st SchedulerStatus) error {
	if reflect.DeepEqual(st.Pending, sc.status.Pending) && maps.EqualFunc(st.Reserved, sc.status.Reserved, func(a, b []string) bool { return reflect.DeepEqual(a, b) }) && sc.status.Leader == st.Leader {
		return nil
	}
	st.Updated = sc.now().UTC()
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := sc.txn(ctx, []store.Op{{Verb: store.Set, Key: statusKey, Value: b}}); err != nil {
		return fmt.Errorf("publish status: %w", err)
	}
	sc.status = st
	return nil
}
