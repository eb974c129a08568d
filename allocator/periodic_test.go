package allocator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gangrun/gangrun/internal/store"
)

// TestPeriodic: a leader's periodic task runs at once and then every interval, its
// writes fenced by the leader's session; a failure of its own is logged and tried again;
// once the session no longer leads, the fenced write fails and the task returns that
// error (the agent starts it again should it lead again), having written nothing more.
func TestPeriodic(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	sess, err := s.CreateSession(ctx, store.SessionOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: schedulerKey, Value: []byte("a"), Session: sess}}); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	var runs, writes atomic.Int32
	task := Periodic(zap.New(core), 10*time.Millisecond, "test: the task failed", func(ctx context.Context, s store.Store, fence []store.Op) error {
		n := runs.Add(1)
		if n == 2 {
			return errors.New("a failure of its own")
		}
		if n == 4 {
			if err := s.DestroySession(ctx, sess); err != nil {
				t.Error(err)
			}
		}
		_, err := s.Txn(ctx, append(fence, store.Op{Verb: store.Set, Key: "periodic/k", Value: []byte{byte(n)}}))
		if err == nil {
			writes.Add(1)
		}
		return err
	})
	done := make(chan error, 1)
	go func() { done <- task(ctx, s, sess) }()
	select {
	case err := <-done:
		if !LostLeadership(err) {
			t.Errorf("the task ended with %v, want the lost leadership", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not end once its session no longer led")
	}
	if runs.Load() != 4 || writes.Load() != 2 {
		t.Errorf("runs %d, fenced writes accepted %d; want 4 and 2 (the second failed, the fourth no longer led)", runs.Load(), writes.Load())
	}
	if n := logs.FilterMessage("test: the task failed").Len(); n != 1 {
		t.Errorf("%d warnings of the task's own failure, want 1", n)
	}
	// A context that ends stops the task with no error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Periodic(nil, time.Hour, "x", func(context.Context, store.Store, []store.Op) error { return nil })(cctx, s, sess); err != nil {
		t.Errorf("a task whose context ended: %v, want nil", err)
	}
}
