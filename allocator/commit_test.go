package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/store"
)

// leaderSession creates a session that holds the scheduler's leader key, as an elected
// agent's does.
func leaderSession(t testing.TB, s store.Store) string {
	t.Helper()
	ctx := context.Background()
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "test scheduler", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: schedulerKey, Session: sess}}); err != nil {
		t.Fatal(err)
	}
	return sess
}

// txnLog is a store that records every transaction it is asked to apply.
type txnLog struct {
	store.Store
	mu   sync.Mutex
	txns [][]store.Op
}

func (l *txnLog) Txn(ctx context.Context, ops []store.Op) (store.TxnResult, error) {
	l.mu.Lock()
	l.txns = append(l.txns, append([]store.Op(nil), ops...))
	l.mu.Unlock()
	return l.Store.Txn(ctx, ops)
}

func TestCommitInChunks(t *testing.T) {
	// A 512-node × 8 gang: 4,096 locks, each node's behind a check that it is not
	// drained, cut by store.SplitTxn. Every transaction begins with the fence and the
	// request check; the first creates the pending grant, each later one checks it is
	// still held; a last one flips it to granted.
	ctx := context.Background()
	log := &txnLog{Store: store.NewMemory()}
	sc := NewScheduler(log, SchedulerConfig{Session: leaderSession(t, log), Name: "test"})
	sess, err := log.CreateSession(ctx, store.SessionOptions{Name: "requester", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	r := PendingRequest{Request: Request{ID: "big", Nodes: 512, GPUsPerNode: 8, Session: sess}}
	if _, err := log.Txn(ctx, []store.Op{{Verb: store.Lock, Key: requestsPrefix + r.ID, Value: mustJSON(r.Request), Session: sess}}); err != nil {
		t.Fatal(err)
	}
	var nodes []GrantNode
	for i := range 512 {
		gn := GrantNode{Name: fmt.Sprintf("node%04d", i)}
		for d := range 8 {
			gn.GPUs = append(gn.GPUs, d)
			gn.Devices = append(gn.Devices, fmt.Sprint(d))
		}
		nodes = append(nodes, gn)
	}
	log.txns = nil
	if err := sc.commit(ctx, r, nodes); err != nil {
		t.Fatal(err)
	}

	// 4,608 operations (the locks and a drain check per node), 124 a chunk after the
	// first's 4 and the later ones' 3 header operations: 38 chunks, then the flip.
	if len(log.txns) != 39 {
		t.Errorf("%d transactions, want 38 chunks of locks and checks, and the flip", len(log.txns))
	}
	locks, checks := 0, 0
	count := func(ops []store.Op) {
		for _, op := range ops {
			switch {
			case op.Verb == store.Lock && strings.HasPrefix(op.Key, gpusPrefix):
				locks++
			case op.Verb == store.CheckNotExists && strings.HasPrefix(op.Key, drainPrefix):
				checks++
			}
		}
	}
	for i, txn := range log.txns {
		if len(txn) > store.MaxTxnOps {
			t.Errorf("transaction %d has %d operations", i, len(txn))
		}
		if err := store.CheckTxn(txn); err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
		if !reflect.DeepEqual(txn[0], sc.fence()) || txn[1].Verb != store.CheckSession || txn[1].Key != requestsPrefix+r.ID {
			t.Errorf("transaction %d begins %+v %+v, want the fence and the request check", i, txn[0], txn[1])
		}
		grantKey := grantsPrefix + r.ID
		switch {
		case i == 0:
			if txn[2].Verb != store.CheckNotExists || txn[2].Key != grantKey || txn[3].Verb != store.Lock || txn[3].Key != grantKey {
				t.Errorf("the first transaction does not create the grant: %+v %+v", txn[2], txn[3])
			}
			count(txn[4:])
		case i < len(log.txns)-1:
			if txn[2].Verb != store.CheckSession || txn[2].Key != grantKey {
				t.Errorf("transaction %d does not check the grant: %+v", i, txn[2])
			}
			count(txn[3:])
		default:
			var g Grant
			if len(txn) != 3 || txn[2].Key != grantKey || json.Unmarshal(txn[2].Value, &g) != nil || g.State != GrantGranted {
				t.Errorf("the last transaction is not the flip to granted: %+v", txn)
			}
		}
	}
	if locks != 4096 || checks != 512 {
		t.Errorf("%d locks and %d drain checks written, want 4096 and 512", locks, checks)
	}
	entries, _, err := log.List(ctx, gpusPrefix)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, e := range entries {
		if e.Session == sess && string(e.Value) == r.ID {
			held++
		}
	}
	if held != 4096 {
		t.Errorf("%d GPU keys held by the requester, want 4096", held)
	}
}

// lostAnswer is a store whose transactions that flip a grant to granted get no answer:
// applied (or not) by the store, then reported as an unavailable store.
type lostAnswer struct {
	store.Store
	apply bool
}

func (l *lostAnswer) Txn(ctx context.Context, ops []store.Op) (store.TxnResult, error) {
	for _, op := range ops {
		var g Grant
		if op.Verb == store.Lock && json.Unmarshal(op.Value, &g) == nil && g.State == GrantGranted {
			if l.apply {
				if _, err := l.Store.Txn(ctx, ops); err != nil {
					return store.TxnResult{}, err
				}
			}
			return store.TxnResult{}, &store.UnavailableError{Op: "consul txn", Err: fmt.Errorf("leadership lost while committing log")}
		}
	}
	return l.Store.Txn(ctx, ops)
}

// TestCommitWithoutAnAnswer: a flip to granted that the store applied but did not
// confirm is not rolled back (the requester may already use the GPUs); one that was not
// applied is.
func TestCommitWithoutAnAnswer(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprint("applied=", applied), func(t *testing.T) {
			ctx := context.Background()
			s := &lostAnswer{Store: store.NewMemory(), apply: applied}
			sc := NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test"})
			sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "requester", TTL: time.Minute, Behavior: store.DeleteKeys})
			if err != nil {
				t.Fatal(err)
			}
			r := PendingRequest{Request: Request{ID: "r1", Nodes: 1, GPUsPerNode: 2, Session: sess}}
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: requestsPrefix + r.ID, Value: mustJSON(r.Request), Session: sess}}); err != nil {
				t.Fatal(err)
			}
			err = sc.commit(ctx, r, []GrantNode{{Name: "n1", GPUs: []int{0, 1}, Devices: []string{"0", "1"}}})
			entries, idx, lerr := s.List(ctx, ClusterPrefix)
			if lerr != nil {
				t.Fatal(lerr)
			}
			c, bad := CheckInvariants(entries, idx)
			if len(bad) > 0 {
				t.Fatalf("invariants: %v", bad)
			}
			g, ok := c.Grants[r.ID]
			if applied {
				if err != nil || !ok || g.State != GrantGranted {
					t.Errorf("commit = %v, grant %+v: an applied flip must stand", err, g)
				}
				return
			}
			if err == nil || ok {
				t.Errorf("commit = %v, grant present %v: a flip not applied must be rolled back", err, ok)
			}
			for _, e := range entries {
				if _, _, isGPU := parseGPUKey(e.Key); isGPU {
					t.Errorf("GPU key %s left after the rollback", e.Key)
				}
			}
		})
	}
}

// TestCommitRefusesADrainedNode: a node drained after the scheduler's view of the
// drains was read (its watch lags the requests') is not granted: the commit is rejected
// by the node's drain check, no GPU key is left locked, and the drain stays.
func TestCommitRefusesADrainedNode(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	sc := NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test"})
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "requester", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	r := PendingRequest{Request: Request{ID: "r", Nodes: 2, GPUsPerNode: 1, Session: sess}}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: requestsPrefix + r.ID, Value: mustJSON(r.Request), Session: sess},
		{Verb: store.Set, Key: drainPrefix + "b", Value: mustJSON(Drain{Reason: "fan failure"})}}); err != nil {
		t.Fatal(err)
	}
	nodes := []GrantNode{{Name: "a", GPUs: []int{0}, Devices: []string{"0"}}, {Name: "b", GPUs: []int{0}, Devices: []string{"0"}}}
	if err := sc.commit(ctx, r, nodes); !errors.Is(err, store.ErrTxnRejected) {
		t.Fatalf("commit on a drained node: %v, want a rejected transaction", err)
	}
	for _, prefix := range []string{gpusPrefix, grantsPrefix} {
		if entries, _, err := s.List(ctx, prefix); err != nil || len(entries) != 0 {
			t.Errorf("%s after the refused commit: %v %v, want nothing", prefix, entries, err)
		}
	}
	if e, err := s.Get(ctx, drainPrefix+"b"); err != nil || e == nil {
		t.Errorf("the drain is gone after the refused commit: %v %v", e, err)
	}
}

// TestCommitRefusesAGPUAnotherJobHolds: two jobs' grants on one node are both held by
// that node's agent session, which Consul lets lock a key it already holds: a view
// older than the first job's grant (a lagging watch under load) must not grant the
// same GPU to the second. Its commit is rejected, the first job keeps the GPU, and no
// grant of the second is left.
func TestCommitRefusesAGPUAnotherJobHolds(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	sc := NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test"})
	agent, err := s.CreateSession(ctx, store.SessionOptions{Name: "agent a", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	jobs := []PendingRequest{}
	for _, id := range []string{"1", "2"} {
		r := JobRequest(id, 1, 1, 1, "", "", nil, 0, nil)
		ops, err := JobRequestOps(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, ops); err != nil {
			t.Fatal(err)
		}
		e, err := s.Get(ctx, requestsPrefix+id)
		if err != nil || e == nil {
			t.Fatal(err)
		}
		jobs = append(jobs, PendingRequest{Request: r, Index: e.ModifyIndex})
	}
	on := func() []GrantNode {
		return []GrantNode{{Name: "a", GPUs: []int{3}, Devices: []string{"3"}, Session: agent}}
	}
	if err := sc.commit(ctx, jobs[0], on()); err != nil {
		t.Fatalf("the first job's grant: %v", err)
	}
	if err := sc.commit(ctx, jobs[1], on()); !errors.Is(err, store.ErrTxnRejected) {
		t.Fatalf("the second job's grant of the same GPU: %v, want a rejected transaction", err)
	}
	if e, err := s.Get(ctx, gpuKey("a", "3")); err != nil || e == nil || string(e.Value) != "1" || e.Session != agent {
		t.Errorf("GPU a/3 after the refused commit: %+v %v, want job 1's, held by the agent", e, err)
	}
	if e, err := s.Get(ctx, grantsPrefix+"2"); err != nil || e != nil {
		t.Errorf("the second job's grant: %+v %v, want none", e, err)
	}
}

// grantTxns returns the transactions of l that write a grant granted, with how many
// grants each writes.
func grantTxns(l *txnLog) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for _, txn := range l.txns {
		n := 0
		for _, op := range txn {
			var g Grant
			if (op.Verb == store.Set || op.Verb == store.Lock) && strings.HasPrefix(op.Key, grantsPrefix) &&
				json.Unmarshal(op.Value, &g) == nil && g.State == GrantGranted {
				n++
			}
		}
		if n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// submitOneGPURequests submits n one-GPU requests r00, r01, … and releases them at the
// test's end.
func submitOneGPURequests(t *testing.T, s store.Store, n int) {
	t.Helper()
	for i := range n {
		tk, err := Submit(context.Background(), s, Request{ID: fmt.Sprintf("r%02d", i), Nodes: 1, GPUsPerNode: 1, Holder: "t"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tk.Release(context.Background()) })
	}
}

func TestPassCommitsItsGrantsTogether(t *testing.T) {
	// Twelve one-GPU grants of one pass: one shared transaction, not twelve, and each
	// grant in it as a grant committed alone would be (granted, its GPU locked).
	ctx := context.Background()
	log := &txnLog{Store: store.NewMemory()}
	registerNodes(t, log, 2, "dgx-h100")
	sc := NewScheduler(log, SchedulerConfig{Session: leaderSession(t, log), Name: "test"})
	submitOneGPURequests(t, log, 12)
	c, err := Snapshot(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	log.txns = nil
	log.mu.Unlock()
	if _, err := sc.Pass(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := grantTxns(log); !reflect.DeepEqual(got, []int{12}) {
		t.Errorf("grants written per transaction: %v, want all 12 in one", got)
	}
	entries, index, err := log.List(ctx, "gangrun/")
	if err != nil {
		t.Fatal(err)
	}
	after, violations := CheckInvariants(entries, index)
	if len(violations) > 0 {
		t.Errorf("invariants broken: %v", violations)
	}
	for i := range 12 {
		id := fmt.Sprintf("r%02d", i)
		if g, ok := after.Grants[id]; !ok || g.State != GrantGranted || g.DeviceCount() != 1 {
			t.Errorf("grant %s after the pass: %+v, want granted one GPU", id, g)
		}
	}
}

func TestPassCommitsAloneWhatASharedTransactionRejects(t *testing.T) {
	// A node is drained after the scheduler's snapshot was taken: the shared
	// transaction is rejected (its drain check), each of its grants is committed again
	// alone, those on the drained node wait ("raced"), the others are granted, and the
	// next pass, from a fresh snapshot, grants the waiting ones elsewhere.
	ctx := context.Background()
	log := &txnLog{Store: store.NewMemory()}
	registerNodes(t, log, 3, "dgx-h100")
	sc := NewScheduler(log, SchedulerConfig{Session: leaderSession(t, log), Name: "test"})
	submitOneGPURequests(t, log, 12) // 8 fill one node (best fit), 4 go on another
	c, err := Snapshot(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := log.Txn(ctx, []store.Op{{Verb: store.Set, Key: drainPrefix + "node0000", Value: mustJSON(Drain{Reason: "test"})}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Pass(ctx, c); err != nil {
		t.Fatal(err)
	}
	read := func() *Cluster {
		entries, index, err := log.List(ctx, "gangrun/")
		if err != nil {
			t.Fatal(err)
		}
		after, violations := CheckInvariants(entries, index)
		if len(violations) > 0 {
			t.Errorf("invariants broken: %v", violations)
		}
		return after
	}
	after := read()
	onDrained, granted := 0, 0
	for i := range 12 {
		id := fmt.Sprintf("r%02d", i)
		g, ok := after.Grants[id]
		switch {
		case ok && g.State == GrantGranted && g.Nodes[0].Name == "node0000":
			t.Errorf("%s granted on the drained node", id)
		case ok && g.State == GrantGranted:
			granted++
		case !ok && strings.Contains(sc.status.Pending[id], "raced"):
			onDrained++
		default:
			t.Errorf("%s after the first pass: grant %+v, pending %q", id, g, sc.status.Pending[id])
		}
	}
	if granted == 0 || onDrained == 0 || granted+onDrained != 12 {
		t.Errorf("first pass: %d granted, %d waiting after the race; want both, 12 in all", granted, onDrained)
	}
	if keys, _, err := log.List(ctx, gpusPrefix+"node0000/"); err != nil || len(keys) != 0 {
		t.Errorf("GPU keys on the drained node: %v %v", keys, err)
	}
	c, err = Snapshot(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Pass(ctx, c); err != nil {
		t.Fatal(err)
	}
	after = read()
	for i := range 12 {
		id := fmt.Sprintf("r%02d", i)
		if g, ok := after.Grants[id]; !ok || g.State != GrantGranted || g.Nodes[0].Name == "node0000" {
			t.Errorf("%s after the second pass: %+v, want granted off the drained node", id, g)
		}
	}
}

// TestSharedCommitWithoutAnAnswer: a shared grant transaction the store applied but did
// not confirm counts as granted (every grant in it, each with its Granted event); one
// that was not applied leaves nothing behind and ends the pass with the store's error,
// the next pass reading the cluster afresh.
func TestSharedCommitWithoutAnAnswer(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprint("applied=", applied), func(t *testing.T) {
			ctx := context.Background()
			s := &lostAnswer{Store: store.NewMemory(), apply: applied}
			registerNodes(t, s, 1, "dgx-h100")
			rec := &event.Recorder{}
			sc := NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test", Events: rec})
			submitOneGPURequests(t, s, 3)
			c, err := Snapshot(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			_, err = sc.Pass(ctx, c)
			entries, idx, lerr := s.List(ctx, ClusterPrefix)
			if lerr != nil {
				t.Fatal(lerr)
			}
			after, bad := CheckInvariants(entries, idx)
			if len(bad) > 0 {
				t.Fatalf("invariants: %v", bad)
			}
			granted := 0
			for _, e := range rec.Events() {
				if e.Kind == event.Granted {
					granted++
				}
			}
			if applied {
				if err != nil || len(after.Grants) != 3 || granted != 3 {
					t.Errorf("pass = %v, %d grants, %d Granted events: an applied shared commit must stand, all 3", err, len(after.Grants), granted)
				}
				return
			}
			if err == nil || len(after.Grants) != 0 || granted != 0 || !sc.unknown {
				t.Errorf("pass = %v, %d grants, %d Granted events, read afresh next %v: want the store's error, nothing granted, a fresh read next",
					err, len(after.Grants), granted, sc.unknown)
			}
		})
	}
}
