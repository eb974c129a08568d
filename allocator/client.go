package allocator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// ErrRefused means the scheduler refused the request (its --wait ran out); the error
// text carries the reason.
var ErrRefused = errors.New("request refused")

// ErrRequestLost means a request disappeared before it was granted: withdrawn by
// `gangrun cancel`, or its session expired (Consul unreachable for longer than 2×TTL).
var ErrRequestLost = errors.New("request lost before it was granted")

// NewID returns a fresh request id such as "a3f9c1d27b0e".
func NewID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Ticket is a submitted request and, once granted, its grant. Its session is kept
// alive until Release; if the process dies, the session expires and everything the
// ticket holds is freed by Consul.
type Ticket struct {
	s       store.Store
	req     Request
	lease   *store.Lease
	lost    chan struct{}
	once    sync.Once
	grant   Grant
	granted bool

	releaseOnce sync.Once
	releaseErr  error
}

// Submit validates r against the cluster (CheckFeasible), creates the requester's
// session and writes the request. Nothing is reserved when it returns an error: one
// that wraps ErrInfeasible for a request no registered node could ever satisfy, one
// that names r.ID when it is not a valid key segment, else the store's.
func Submit(ctx context.Context, s store.Store, r Request) (*Ticket, error) {
	c, err := RegisteredNodes(ctx, s)
	if err != nil {
		return nil, err
	}
	if err := CheckFeasible(c, r); err != nil {
		return nil, err
	}
	if r.ID == "" {
		r.ID = NewID()
	}
	if err := store.CheckSegment("request id", r.ID); err != nil {
		return nil, err
	}
	since := time.Now()
	sess, err := s.CreateSession(ctx, store.SessionOptions{
		Name: "gangrun alloc " + r.ID, TTL: SessionTTL, LockDelay: GrantLockDelay, Behavior: store.DeleteKeys,
	})
	if err != nil {
		return nil, err
	}
	r.Session = sess
	r.Submitted = time.Now().UTC()
	if _, err := s.Txn(ctx, []store.Op{
		{Verb: store.CheckNotExists, Key: requestsPrefix + r.ID},
		{Verb: store.Lock, Key: requestsPrefix + r.ID, Value: mustRecord(schema.Request, r), Session: sess},
	}); err != nil {
		_ = s.DestroySession(context.WithoutCancel(ctx), sess)
		return nil, fmt.Errorf("submit request %s: %w", r.ID, err)
	}
	t := &Ticket{s: s, req: r, lease: store.Keep(s, sess, SessionTTL, since, nil), lost: make(chan struct{})}
	go func() {
		<-t.lease.Done()
		t.markLost()
	}()
	return t, nil
}

func (t *Ticket) markLost() { t.once.Do(func() { close(t.lost) }) }

// Request returns the submitted request (with its id and session).
func (t *Ticket) Request() Request { return t.req }

// Lost is closed when the ticket's lease is over (its session is gone, or no renewal
// was accepted within the lease: store.Lease) or, after Wait granted it, when the grant
// disappears (cancelled elsewhere). Whatever uses the grant's GPUs must then stop, and
// be dead by Lease().KillBy().
func (t *Ticket) Lost() <-chan struct{} { return t.lost }

// Lease returns the lease of the requester's session, which holds the grant's GPU keys.
func (t *Ticket) Lease() *store.Lease { return t.lease }

// pendingReasonEvery is how often Wait reads the scheduler's status for the request's
// pending reason, when it reports progress.
const pendingReasonEvery = time.Second

// Wait blocks until the request is granted, refused (ErrRefused, with the reason), the
// session is lost (ErrRequestLost) or ctx ends. While it waits, progress receives the
// scheduler's pending reason whenever it changes (progress may be nil).
func (t *Ticket) Wait(ctx context.Context, progress func(reason string)) (Grant, error) {
	grantKey := grantsPrefix + t.req.ID
	w := store.NewWatcher(t.s, grantKey)
	type next struct {
		entries []store.Entry
		err     error
	}
	ch := make(chan next, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			e, err := w.Next(wctx)
			select {
			case ch <- next{e, err}:
			case <-wctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var statusTick <-chan time.Time
	if progress != nil {
		tk := time.NewTicker(pendingReasonEvery)
		defer tk.Stop()
		statusTick = tk.C
	}
	lastReason := ""
	for {
		select {
		case <-ctx.Done():
			return Grant{}, ctx.Err()
		case <-t.lost:
			return Grant{}, fmt.Errorf("request %s: %w: it was cancelled (gangrun cancel) or its session expired", t.req.ID, ErrRequestLost)
		case <-statusTick:
			if st, err := ReadStatus(ctx, t.s); err == nil {
				if why := st.Pending[t.req.ID]; why != "" && why != lastReason {
					lastReason = why
					progress(why)
				}
			}
		case n := <-ch:
			if n.err != nil {
				return Grant{}, n.err
			}
			for _, e := range n.entries {
				if e.Key != grantKey {
					continue
				}
				var g Grant
				if err := schema.Unmarshal(schema.Grant, e.Value, &g); errors.Is(err, schema.ErrNewer) {
					return Grant{}, fmt.Errorf("request %s: %w", t.req.ID, err)
				} else if err != nil {
					continue
				}
				switch g.State {
				case GrantGranted:
					t.grant, t.granted = g, true
					go t.watchGrant()
					return g, nil
				case GrantRefused:
					return Grant{}, fmt.Errorf("request %s: %w: %s", t.req.ID, ErrRefused, g.Reason)
				}
			}
		}
	}
}

// watchGrant closes Lost when the grant key disappears after it was granted.
func (t *Ticket) watchGrant() {
	w := store.NewWatcher(t.s, grantsPrefix+t.req.ID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-t.lost
		cancel()
	}()
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return
		}
		present := false
		for _, e := range entries {
			present = present || e.Key == grantsPrefix+t.req.ID
		}
		if !present {
			// Confirm with a consistent read before giving the grant up: a watch's answer
			// during a Consul leader election can lack a key that is there.
			if e, err := t.s.Get(ctx, grantsPrefix+t.req.ID); err != nil || e != nil {
				continue
			}
			t.markLost()
			return
		}
	}
}

// Release gives everything back: the grant and its GPUs (explicitly, so no lock-delay
// applies), the request, and the session. Safe to call more than once.
func (t *Ticket) Release(ctx context.Context) error {
	t.releaseOnce.Do(func() {
		t.releaseErr = release(ctx, t.s, t.req.ID, t.req.Session)
		t.lease.Close()
		t.markLost()
	})
	return t.releaseErr
}

// release deletes grant id (with its first chunk of GPU keys, so the grant disappears
// in one step), the remaining GPU keys, the request (in as many transactions as
// store.SplitTxn cuts them into), and then destroys session.
func release(ctx context.Context, s store.Store, id, session string) error {
	ctx = context.WithoutCancel(ctx)
	entries, _, err := s.List(ctx, gpusPrefix)
	if err != nil {
		return err
	}
	ops := []store.Op{{Verb: store.Delete, Key: grantsPrefix + id}}
	for _, e := range entries {
		if string(e.Value) == id && (session == "" || e.Session == session) {
			ops = append(ops, store.Op{Verb: store.Delete, Key: e.Key})
		}
	}
	ops = append(ops, store.Op{Verb: store.Delete, Key: requestsPrefix + id})
	txns, err := store.SplitTxn(nil, ops)
	if err != nil {
		return fmt.Errorf("release %s: %w", id, err)
	}
	for _, t := range txns {
		if _, err := s.Txn(ctx, t); err != nil {
			return fmt.Errorf("release %s: %w", id, err)
		}
	}
	if session != "" {
		if err := s.DestroySession(ctx, session); err != nil {
			return err
		}
	}
	return nil
}

// Cancel releases grant or request id from any process, like scancel: the holder sees
// its grant lost. ErrNotFound when there is no such request or grant; ErrJobRequest for
// a cluster job's request or grant, which only the job's own cancel (job.Cancel) may
// end, so that its steps stop before their GPUs go.
func Cancel(ctx context.Context, s store.Store, id string) error {
	if err := store.CheckSegment("id", id); err != nil {
		return err
	}
	c, err := Snapshot(ctx, s)
	if err != nil {
		return err
	}
	if err := c.newer(id); err != nil {
		return err
	}
	session := ""
	if r, ok := c.Requests[id]; ok && r.Durable() {
		return fmt.Errorf("%s: %w", id, ErrJobRequest)
	} else if ok {
		session = r.Session
	} else if g, ok := c.Grants[id]; ok {
		session = g.Session
	} else {
		return fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	return release(ctx, s, id, session)
}

// newer returns why request id or its grant cannot be read (written by a newer
// gangrun: schema.ErrNewer), nil when both can.
func (c *Cluster) newer(id string) error {
	for _, k := range []string{requestsPrefix + id, grantsPrefix + id} {
		if err := c.Newer[k]; err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	return nil
}

// Show returns the request and its grant (nil when not granted yet). An error wrapping
// schema.ErrNewer when either was written by a newer gangrun.
func Show(ctx context.Context, s store.Store, id string) (*PendingRequest, *Grant, error) {
	if err := store.CheckSegment("id", id); err != nil {
		return nil, nil, err
	}
	c, err := Snapshot(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	if err := c.newer(id); err != nil {
		return nil, nil, err
	}
	r, hasReq := c.Requests[id]
	g, hasGrant := c.Grants[id]
	if !hasReq && !hasGrant {
		return nil, nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	var rp *PendingRequest
	if hasReq {
		rp = &r
	}
	var gp *Grant
	if hasGrant {
		gp = &g
	}
	return rp, gp, nil
}

// SetDrain drains node (reason required) or, with reason "", returns it to service.
// ErrNotFound for a node that never registered. also's operations (an audit entry)
// are applied in the same transaction.
func SetDrain(ctx context.Context, s store.Store, node, reason string, also ...store.Op) error {
	ops, err := DrainOps(ctx, s, node, reason)
	if err != nil {
		return err
	}
	_, err = s.Txn(ctx, append(ops, also...))
	return err
}

// DrainOps are the operations that drain node (reason required) or, with reason "",
// return it to service. ErrNotFound for a node that never registered. A drain a newer
// gangrun wrote is neither replaced nor removed (an error wrapping schema.ErrNewer);
// the operations apply only while the drain is as read.
func DrainOps(ctx context.Context, s store.Store, node, reason string) ([]store.Op, error) {
	return drainOps(ctx, s, node, "", reason)
}

// SetFailureDrain drains node because of a failure of kind (failure.GPUHealth), which
// the drain records beside reason (required) for what acts on the drain (the job
// controller's lost node) to switch on.
func SetFailureDrain(ctx context.Context, s store.Store, node string, kind failure.Kind, reason string) error {
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("drain node %s for a %s failure: a reason is required", node, kind)
	}
	ops, err := drainOps(ctx, s, node, kind, reason)
	if err != nil {
		return err
	}
	_, err = s.Txn(ctx, ops)
	return err
}

// drainOps are DrainOps, for a drain of kind ("" for an operator's).
func drainOps(ctx context.Context, s store.Store, node string, kind failure.Kind, reason string) ([]store.Op, error) {
	if err := store.CheckSegment("node", node); err != nil {
		return nil, err
	}
	e, err := s.Get(ctx, nodesPrefix+node)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, fmt.Errorf("node %q: %w (registered nodes: gangrun nodes)", node, ErrNotFound)
	}
	guard := store.Op{Verb: store.CheckNotExists, Key: drainPrefix + node}
	if d, err := s.Get(ctx, drainPrefix+node); err != nil {
		return nil, err
	} else if d != nil {
		if err := schema.Check(schema.Drain, d.Value); errors.Is(err, schema.ErrNewer) {
			return nil, fmt.Errorf("node %s: %w: drain and resume it with that gangrun", node, err)
		}
		guard = store.Op{Verb: store.CheckIndex, Key: drainPrefix + node, Index: d.ModifyIndex}
	}
	if reason == "" {
		return []store.Op{guard, {Verb: store.Delete, Key: drainPrefix + node}}, nil
	}
	d := Drain{Reason: strings.TrimSpace(reason), Kind: kind, Since: time.Now().UTC()}
	return []store.Op{guard, {Verb: store.Set, Key: drainPrefix + node, Value: mustRecord(schema.Drain, d)}}, nil
}
