package allocator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// The scheduler's writes. Every transaction it makes begins with the fence (a
// check-session on the leader key), so a deposed scheduler cannot write anything; a
// list of operations too long for one transaction is cut by store.SplitTxn, each piece
// fenced again. A grant is committed in pieces without ever being visible half-granted
// (commit), and a commit that fails is rolled back (rollback), or else by the next
// pass's cleanup.

// fence is the check every scheduler transaction begins with: it still leads.
func (sc *Scheduler) fence() store.Op {
	return store.Op{Verb: store.CheckSession, Key: schedulerKey, Session: sc.session}
}

// txn runs ops after the fence in one transaction (see apply).
func (sc *Scheduler) txn(ctx context.Context, ops []store.Op) error {
	return sc.apply(ctx, append([]store.Op{sc.fence()}, ops...))
}

// txnChunks runs ops after the fence in as many transactions as store.SplitTxn cuts
// them into, in order, and stops at the first that fails (those before it stay
// applied). Errors: store.ErrTxnTooLarge for an operation too large for any
// transaction; apply's.
func (sc *Scheduler) txnChunks(ctx context.Context, ops []store.Op) error {
	txns, err := store.SplitTxn([]store.Op{sc.fence()}, ops)
	if err != nil {
		return err
	}
	for _, t := range txns {
		if err := sc.apply(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// apply runs one transaction whose first operation is the fence, and records the index
// it wrote at (Scheduler.written). Errors: ErrNotLeader when the fence failed; a
// *store.TxnError when another operation was rejected; the store's when it could not
// be asked.
func (sc *Scheduler) apply(ctx context.Context, ops []store.Op) error {
	res, err := sc.s.Txn(ctx, ops)
	if err == nil {
		for _, op := range ops[1:] {
			for _, p := range watchedPrefixes {
				if !strings.HasPrefix(op.Key, p) {
					continue
				}
				switch op.Verb {
				case store.Set, store.CAS, store.Lock, store.Unlock:
					if res.Index > 0 {
						sc.written.Wrote(p, res.Index)
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
	} else if err != nil {
		// No answer (a timeout, Consul's leader lost mid-call): the transaction may have
		// been applied, at an index not known here. The next pass reads the cluster
		// afresh rather than trust a watch's view that may predate it (a grant whose
		// flip landed would look pending there, and the clean-up would remove it).
		sc.unknown = true
	}
	return err
}

// grantWrite is what committing one grant writes and checks: the grant (state
// pending), its key, the GPU locks (each node's drain check first, then its devices'
// locks), the check that the request still stands, the check that the pending grant is
// still the requester's, and how the grant record is written.
type grantWrite struct {
	r            PendingRequest
	g            Grant
	key          string
	locks        []store.Op
	held         store.Op
	stillPending store.Op
	write        func(Grant) store.Op
}

// newGrantWrite returns what granting r the nodes writes and checks.
func newGrantWrite(r PendingRequest, nodes []GrantNode) grantWrite {
	w := grantWrite{r: r, key: grantsPrefix + r.ID, g: Grant{ID: r.ID, State: GrantPending, Nodes: nodes, Session: r.Session}}
	for _, gn := range nodes {
		// The node is not drained as its GPUs are locked: the scheduler's view of the
		// drains (a watch of its own) may be older than its view of the requests.
		w.locks = append(w.locks, store.Op{Verb: store.CheckNotExists, Key: drainPrefix + gn.Name})
		for _, d := range gn.Devices {
			if gn.Session != "" {
				// The node's agent holds this grant's keys (a job's), as it holds every
				// other job's on the node: Consul lets a session lock again a key it
				// holds, so its lock alone would not stop a view older than another
				// job's grant from granting the same GPU twice. A free GPU has no key
				// (a holder's session deletes its keys when it ends).
				w.locks = append(w.locks, store.Op{Verb: store.CheckNotExists, Key: gpuKey(gn.Name, d)})
			}
			w.locks = append(w.locks, store.Op{Verb: store.Lock, Key: gpuKey(gn.Name, d), Value: []byte(r.ID), Session: w.g.KeySession(gn)})
		}
	}
	// The request still stands: held by its requester's session, or, a job's (held by
	// none), unchanged since it was read.
	w.held = store.Op{Verb: store.CheckSession, Key: requestsPrefix + r.ID, Session: r.Session}
	w.write = func(g Grant) store.Op {
		return store.Op{Verb: store.Lock, Key: w.key, Value: mustRecord(schema.Grant, g), Session: r.Session}
	}
	w.stillPending = store.Op{Verb: store.CheckSession, Key: w.key, Session: r.Session}
	if r.Durable() {
		w.held = store.Op{Verb: store.CheckIndex, Key: requestsPrefix + r.ID, Index: r.Index}
		w.write = func(g Grant) store.Op {
			return store.Op{Verb: store.Set, Key: w.key, Value: mustRecord(schema.Grant, g)}
		}
		w.stillPending = store.Op{Verb: store.Get, Key: w.key}
	}
	return w
}

// header is the first transaction's operations before the GPU locks: the fence, the
// request's check, the grant's absence, and the grant written as g.
func (w grantWrite) header(fence store.Op, g Grant) []store.Op {
	return []store.Op{fence, w.held, {Verb: store.CheckNotExists, Key: w.key}, w.write(g)}
}

// granted returns w's grant in state granted at t.
func (w grantWrite) granted(t time.Time) Grant {
	g := w.g
	g.State, g.Granted = GrantGranted, t
	return g
}

// oneTxn returns the operations, the fence first, that write w's grant granted at t
// with all its locks in one transaction; nil when they do not fit one (see commit).
func (w grantWrite) oneTxn(fence store.Op, t time.Time) []store.Op {
	ops := append(w.header(fence, w.granted(t)), w.locks...)
	if txns, err := store.SplitTxn(nil, ops); err != nil || len(txns) != 1 {
		return nil
	}
	return ops
}

// commit grants r the chosen nodes. A gang whose GPU locks fit in one transaction is
// written granted, with its locks, in that one. A larger one: the pending grant and the
// GPU locks in as many transactions as store.SplitTxn needs, then the flip to
// "granted". The first transaction creates the grant record (state "pending") and each
// later one checks that the requester still holds it, so a gang is never visible
// half-granted. Any rejection rolls back what was locked. Errors: apply's.
func (sc *Scheduler) commit(ctx context.Context, r PendingRequest, nodes []GrantNode) error {
	w := newGrantWrite(r, nodes)
	if t := w.oneTxn(sc.fence(), sc.now().UTC()); t != nil {
		// The whole gang fits in one transaction, which no reader sees half-applied:
		// the grant is written granted at once, one transaction instead of two.
		err := sc.apply(ctx, t)
		if err == nil || errors.Is(err, store.ErrTxnRejected) || errors.Is(err, ErrNotLeader) {
			return err
		}
		return sc.settle(ctx, r, w.key, nil, err)
	}
	// The pieces are cut for the first transaction's header, the larger: the later
	// header (a check instead of the grant's creation) is shorter, so they fit too.
	first := w.header(sc.fence(), w.g)
	later := []store.Op{sc.fence(), w.held, w.stillPending}
	txns, err := store.SplitTxn(first, w.locks)
	if err != nil {
		return fmt.Errorf("grant %s: %w", r.ID, err)
	}
	var done []store.Op
	for i, t := range txns {
		chunk := t[len(first):]
		if i > 0 {
			t = append(append(make([]store.Op, 0, len(later)+len(chunk)), later...), chunk...)
		}
		if err := sc.apply(ctx, t); err != nil {
			sc.rollback(ctx, w.key, 0, done, i > 0)
			return err
		}
		done = append(done, chunk...)
	}
	err = sc.txn(ctx, []store.Op{w.held, w.write(w.granted(sc.now().UTC()))})
	if err == nil {
		return nil
	}
	if errors.Is(err, store.ErrTxnRejected) {
		sc.rollback(ctx, w.key, 0, done, true)
		return err
	}
	return sc.settle(ctx, r, w.key, done, err)
}

// A pass's one-transaction grants are committed together: grantBatch collects them, in
// the order they were placed, into as few transactions as the limits allow (one
// Consul write for up to a dozen one-node grants instead of one each), since the
// scheduler's grants, one after another, bounded how fast a deep queue started. A
// transaction is all or nothing: when one is rejected (a request changed, a GPU
// locked meanwhile), each of its grants is committed again alone, so one stale grant
// holds back only itself.

// batched is one grant waiting in a grantBatch: its write and its transaction's
// operations after the fence.
type batched struct {
	w     grantWrite
	nodes []GrantNode
	ops   []store.Op
}

// grantBatch is the grants of a pass waiting to be committed together.
type grantBatch struct {
	items []batched
	ops   []store.Op // the fence, then every item's ops
}

// fits reports whether ops join b's transaction within store.SplitTxn's limits.
func (b *grantBatch) fits(ops []store.Op) bool {
	txns, err := store.SplitTxn(nil, append(b.ops[:len(b.ops):len(b.ops)], ops...))
	return err == nil && len(txns) == 1
}

// batchResult is how one grant of a batch ended: err nil when it was granted.
type batchResult struct {
	r     PendingRequest
	nodes []GrantNode
	err   error
}

// flush commits b's grants and empties it: in one transaction, or, when that one is
// rejected, each alone (commit). It returns each grant's outcome in b's order, and an
// error (ErrNotLeader, or the store's when the shared transaction got no answer and its
// outcome could not be read) that ends the pass.
func (sc *Scheduler) flush(ctx context.Context, b *grantBatch) ([]batchResult, error) {
	items := b.items
	ops := b.ops
	b.items, b.ops = nil, nil
	if len(items) == 0 {
		return nil, nil
	}
	out := make([]batchResult, len(items))
	for i, it := range items {
		out[i] = batchResult{r: it.w.r, nodes: it.nodes}
	}
	if len(items) == 1 {
		out[0].err = sc.commit(ctx, items[0].w.r, items[0].nodes)
		if errors.Is(out[0].err, ErrNotLeader) {
			return nil, out[0].err
		}
		return out, nil
	}
	err := sc.apply(ctx, ops)
	switch {
	case err == nil:
		return out, nil
	case errors.Is(err, ErrNotLeader):
		return nil, err
	case errors.Is(err, store.ErrTxnRejected):
		sc.log.Debug("a shared grant transaction was rejected; committing its grants one by one", zap.Int("grants", len(items)), zap.Error(err))
		for i, it := range items {
			out[i].err = sc.commit(ctx, it.w.r, it.nodes)
			if errors.Is(out[i].err, ErrNotLeader) {
				return nil, out[i].err
			}
		}
		return out, nil
	}
	// No answer: the transaction may have been applied (all of it) or not (none). Its
	// first grant, read back, tells which; nothing was half-done to roll back.
	first := items[0].w
	e, rerr := sc.s.Get(ctx, first.key)
	if rerr != nil || e == nil {
		return nil, err
	}
	var cur Grant
	if schema.Unmarshal(schema.Grant, e.Value, &cur) == nil && cur.State == GrantGranted && e.Session == first.r.Session {
		sc.log.Info("grants applied although their commit got no answer", zap.Int("grants", len(items)), zap.Error(err))
		return out, nil
	}
	return nil, err
}

// settle ends a commit of r whose last transaction got no answer (err: a timeout, a
// leader lost while committing): it may have been applied, and the requester may
// already run on the GPUs. Look before undoing: a granted grant stays (nil); a pending
// one is rolled back with the GPU keys done only as it was read, so a flip landing
// meanwhile is never undone; what cannot be read is left to the next pass's cleanup,
// which removes pending grants.
func (sc *Scheduler) settle(ctx context.Context, r PendingRequest, grantKey string, done []store.Op, err error) error {
	e, rerr := sc.s.Get(ctx, grantKey)
	if rerr != nil || e == nil {
		return err
	}
	var cur Grant
	if schema.Unmarshal(schema.Grant, e.Value, &cur) == nil && cur.State == GrantGranted && e.Session == r.Session {
		sc.log.Info("grant applied although its commit got no answer", zap.String("grant", r.ID), zap.Error(err))
		return nil
	}
	sc.rollback(ctx, grantKey, e.ModifyIndex, done, true)
	return err
}

// requestStands reports whether request id is there and held (as parseCluster judges
// it) by a fresh consistent read; false when it is not, or cannot be read (the
// transaction that removes it then fails too).
func (sc *Scheduler) requestStands(ctx context.Context, id string) bool {
	e, err := sc.s.Get(ctx, requestsPrefix+id)
	if err != nil || e == nil {
		return false
	}
	var r Request
	if err := schema.Unmarshal(schema.Request, e.Value, &r); err != nil {
		return errors.Is(err, schema.ErrNewer) // a newer gangrun's request: left alone
	}
	alive := requestHeld(*e, r)
	if alive {
		sc.log.Info("a granted request looked gone in the watched view but stands", zap.String("grant", id))
		sc.unknown = true
	}
	return alive
}

// rollback deletes the GPU keys a failed commit locked and, when it was written, its
// pending grant; with grantIndex (non-zero) the grant only if it is still as read at
// that index, and then nothing at all if it is not (the grant, first, and the keys go
// in one transaction while they fit in one). What it cannot delete, the next pass's
// cleanup does (a pending grant, or GPU keys whose grant is gone).
func (sc *Scheduler) rollback(ctx context.Context, grantKey string, grantIndex uint64, locked []store.Op, grantWritten bool) {
	var dels []store.Op
	switch {
	case grantWritten && grantIndex != 0:
		dels = append(dels, store.Op{Verb: store.DeleteCAS, Key: grantKey, Index: grantIndex})
	case grantWritten:
		dels = append(dels, store.Op{Verb: store.Delete, Key: grantKey})
	}
	for _, op := range locked {
		if op.Verb == store.Lock { // not the checks among them (a node's drain key)
			dels = append(dels, store.Op{Verb: store.Delete, Key: op.Key})
		}
	}
	if err := sc.txnChunks(ctx, dels); err != nil {
		sc.log.Warn("roll back a failed grant", zap.String("grant", grantKey), zap.Error(err))
	}
}

// refuse answers r with a refusal the requester reads. A requester that left meanwhile
// is no error.
func (sc *Scheduler) refuse(ctx context.Context, r PendingRequest, reason string) error {
	g := Grant{ID: r.ID, State: GrantRefused, Reason: reason, Session: r.Session}
	err := sc.txn(ctx, []store.Op{
		{Verb: store.CheckSession, Key: requestsPrefix + r.ID, Session: r.Session},
		{Verb: store.Lock, Key: grantsPrefix + r.ID, Value: mustRecord(schema.Grant, g), Session: r.Session},
	})
	if errors.Is(err, store.ErrTxnRejected) {
		return nil // the requester left meanwhile
	}
	if err == nil {
		sc.log.Info("refused", zap.String("id", r.ID), zap.String("reason", reason))
	}
	return err
}

// cleanup rolls back what a dead scheduler or an interrupted release left, and removes
// it from c: pending grants (no commit is in progress outside Pass), grants and GPU keys
// of requests that are gone, and GPU keys without a grant. It returns the ids of the
// granted grants it removed (their request is gone or no longer held). What a newer
// gangrun wrote (c.Newer) is not gone: a grant of a newer request, and the GPU keys of
// a newer grant, stay.
func (sc *Scheduler) cleanup(ctx context.Context, c *Cluster) (expired []string, err error) {
	var dels []store.Op
	for id, g := range c.Grants {
		if c.Newer[requestsPrefix+id] != nil {
			continue
		}
		r, ok := c.Requests[id]
		if g.State == GrantGranted && (!ok || !r.Alive) && sc.requestStands(ctx, id) {
			// The watches' views of requests and grants can be of different moments: a
			// holder's grant is taken away only when a fresh read agrees.
			continue
		}
		if g.State == GrantPending || !ok || !r.Alive {
			if g.State == GrantGranted {
				expired = append(expired, id)
			}
			dels = append(dels, store.Op{Verb: store.Delete, Key: grantsPrefix + id})
			for _, gn := range g.Nodes {
				for _, d := range gn.Devices {
					// Only the keys the view shows this grant holding, each at the index
					// seen: a GPU freed since and granted again is the new grant's.
					if n, ok := c.Nodes[gn.Name]; ok && !n.holds(d, id) {
						continue
					}
					dels = append(dels, c.gpuDelete(gpuKey(gn.Name, d)))
				}
			}
			delete(c.Grants, id)
		}
	}
	for key := range c.Orphans {
		dels = append(dels, c.gpuDelete(key))
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
		sc.log.Info("cleaning up", zap.Int("keys", len(dels)), zap.Strings("grants_expired", expired))
	}
	if err := sc.txnChunks(ctx, dels); err != nil {
		return expired, fmt.Errorf("clean up: %w", err)
	}
	return expired, nil
}
