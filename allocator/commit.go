package allocator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/store"
)

// The scheduler's writes. Every transaction it makes begins with the fence (a
// check-session on the leader key), so a deposed scheduler cannot write anything. A
// grant is committed in chunks without ever being visible half-granted (commit), and a
// commit that fails is rolled back (rollback), or else by the next pass's cleanup.

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
