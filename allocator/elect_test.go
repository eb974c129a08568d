package allocator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestElectionAfterTheLeaderDiesInItsLockDelay: the leader's session ends with a
// lock-delay on the scheduler's key, so the waiting agent, woken by the key's deletion,
// is refused once; it must try again rather than wait for a change that never comes
// (an agent killed -9 left the cluster without a scheduler for good, about one run in
// five on a local Consul whose answer came inside the 1 ms lock-delay).
func TestElectionAfterTheLeaderDiesInItsLockDelay(t *testing.T) {
	s := store.NewMemory()
	ctx := context.Background()
	old, err := s.CreateSession(ctx, store.SessionOptions{Name: "a leader about to die", TTL: 10 * time.Second,
		Behavior: store.DeleteKeys, LockDelay: 800 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: schedulerKey, Value: []byte("old"), Session: old}}); err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, s: s, agents: map[string]*Agent{}, stops: map[string]context.CancelFunc{}, done: map[string]chan struct{}{}}
	t.Cleanup(tc.stopAll)
	tc.add("node01", "pcie-2socket", nil, false)
	time.Sleep(300 * time.Millisecond) // node01 has found the key held and waits on it
	if e, _ := s.Get(ctx, schedulerKey); e == nil || string(e.Value) != "old" {
		t.Fatalf("the old leader's key: %+v", e)
	}
	if err := s.DestroySession(ctx, old); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		e, _ := s.Get(ctx, schedulerKey)
		return e != nil && string(e.Value) == "node01" && e.Session != ""
	}, "node01 elected once the lock-delay passed")
}

// TestLeaderTasksOutliveOtherKeysRefusals: a leader's task whose transaction is refused
// because another key's session check failed (a GPU's key not held by the session the
// write expected) has not lost the leadership, and LostLeadership says so; one that
// stops while the agent still leads is started again (the job controller stopped for
// good on such a refusal, and the cluster granted jobs that never launched).
func TestLeaderTasksOutliveOtherKeysRefusals(t *testing.T) {
	s := store.NewMemory()
	ctx := context.Background()
	var starts atomic.Int32
	var lost, other atomic.Value
	task := func(ctx context.Context, s store.Store, session string) error {
		n := starts.Add(1)
		if n > 1 {
			<-ctx.Done()
			return nil
		}
		stranger, err := s.CreateSession(ctx, store.SessionOptions{Name: "a step", TTL: 10 * time.Second, Behavior: store.DeleteKeys})
		if err != nil {
			return err
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "gangrun/cluster/gpus/x/0", Session: stranger}}); err != nil {
			return err
		}
		_, err = s.Txn(ctx, []store.Op{LeaderFence(session), {Verb: store.CheckSession, Key: "gangrun/cluster/gpus/x/0", Session: session}})
		other.Store(fmt.Sprint(LostLeadership(err), errors.Is(err, store.ErrNotLockHolder)))
		_, err2 := s.Txn(ctx, []store.Op{LeaderFence(stranger)})
		lost.Store(fmt.Sprint(LostLeadership(err2)))
		return err
	}
	a, err := NewAgent(s, AgentConfig{Node: "node01", Addr: "10.0.0.1", Inventory: inventory(t, "pcie-2socket", "node01"),
		Leader: []func(context.Context, store.Store, string) error{task}})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(actx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, func() bool { return starts.Load() >= 2 }, "the stopped task started again")
	if got := other.Load(); got != "false true" {
		t.Errorf("another key's failed check: LostLeadership, ErrNotLockHolder = %v, want false true", got)
	}
	if got := lost.Load(); got != "true" {
		t.Errorf("a fence with a session that does not lead: LostLeadership = %v, want true", got)
	}
}

// flakyLock is a Store whose first Lock of the scheduler's key fails as an unreachable
// Consul's does.
type flakyLock struct {
	store.Store
	failed atomic.Bool
}

func (f *flakyLock) Txn(ctx context.Context, ops []store.Op) (store.TxnResult, error) {
	if len(ops) == 1 && ops[0].Verb == store.Lock && ops[0].Key == schedulerKey && f.failed.CompareAndSwap(false, true) {
		return store.TxnResult{}, &store.UnavailableError{Op: "txn", Err: errors.New("connection refused")}
	}
	return f.Store.Txn(ctx, ops)
}

// TestElectionWithTheKeyHeldByItsOwnSession: a Consul that lost its data refused the
// agent's bid to lead; then the operator's restore brought the scheduler's key back,
// held by the session the agent still renews. The agent leads again instead of waiting
// for a change of the key that nothing would make (the cluster's jobs stayed PENDING
// for good: TestRecoveryAfterConsulOutages/short in CI).
func TestElectionWithTheKeyHeldByItsOwnSession(t *testing.T) {
	mem := store.NewMemory()
	s := &flakyLock{Store: mem}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sess, err := mem.CreateSession(ctx, store.SessionOptions{Name: "node01", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Txn(ctx, []store.Op{{Verb: store.Lock, Key: schedulerKey, Value: []byte("node01"), Session: sess}}); err != nil {
		t.Fatal(err)
	}
	led := make(chan struct{}, 1)
	task := func(ctx context.Context, _ store.Store, _ string) error {
		select {
		case led <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil
	}
	a, err := NewAgent(s, AgentConfig{Node: "node01", Addr: "10.0.0.1", Inventory: inventory(t, "pcie-2socket", "node01"),
		Leader: []func(context.Context, store.Store, string) error{task}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.elect(ctx, sess) }()
	select {
	case <-led:
	case err := <-done:
		t.Fatalf("elect returned %v without leading", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the agent did not lead again with the scheduler's key held by its own session")
	}
	if !s.failed.Load() {
		t.Error("the first bid was not refused: the test did not test the wait")
	}
	cancel()
	<-done
}
