package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

func session(t *testing.T, s store.Store, o store.SessionOptions) string {
	t.Helper()
	if o.TTL == 0 {
		o.TTL = 30 * time.Second
	}
	id, err := s.CreateSession(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// eachStore runs fn on the memory and Consul stores (consultest.EachStore) and on a
// memory store served to another process's Remote (remoteStore).
func eachStore(t *testing.T, fn func(t *testing.T, s store.Store)) {
	consultest.EachStore(t, fn)
	t.Run("remote", func(t *testing.T) { fn(t, remoteStore(t, store.NewMemory())) })
}

// remoteStore serves s on a loopback port and returns its Remote; the test's cleanup
// stops both.
func remoteStore(t *testing.T, s store.Store) *store.Remote {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := store.ServeRemote(ln, s)
	r := store.NewRemote(ln.Addr().String())
	t.Cleanup(func() {
		r.Close()
		_ = srv.Close()
	})
	return r
}

func TestStoreSemantics(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		t.Run("txn is all or nothing", func(t *testing.T) {
			a := session(t, s, store.SessionOptions{Name: "a"})
			b := session(t, s, store.SessionOptions{Name: "b"})
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "t1/x", Value: []byte("a"), Session: a}}); err != nil {
				t.Fatal(err)
			}
			_, err := s.Txn(ctx, []store.Op{
				{Verb: store.Lock, Key: "t1/y", Value: []byte("b"), Session: b},
				{Verb: store.Lock, Key: "t1/x", Value: []byte("b"), Session: b},
			})
			var te *store.TxnError
			if !errors.As(err, &te) || !errors.Is(err, store.ErrTxnRejected) || len(te.Errors) != 1 || te.Errors[0].Op != 1 {
				t.Fatalf("err = %v, want a rejection naming op 1", err)
			}
			if e, _ := s.Get(ctx, "t1/y"); e != nil {
				t.Errorf("t1/y was written by a rejected transaction: %+v", e)
			}
			if e, _ := s.Get(ctx, "t1/x"); e == nil || e.Session != a || string(e.Value) != "a" {
				t.Errorf("t1/x = %+v, want held by a", e)
			}
		})
		t.Run("cas and checks", func(t *testing.T) {
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: "t2/k", Value: []byte("1"), Index: 0}}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: "t2/k", Value: []byte("2"), Index: 0}}); !errors.Is(err, store.ErrTxnRejected) {
				t.Errorf("CAS index 0 on an existing key: %v, want rejected", err)
			}
			e, _ := s.Get(ctx, "t2/k")
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.CheckIndex, Key: "t2/k", Index: e.ModifyIndex}, {Verb: store.CAS, Key: "t2/k", Value: []byte("3"), Index: e.ModifyIndex}}); err != nil {
				t.Errorf("CAS with the current index: %v", err)
			}
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: "t2/k", Value: []byte("4"), Index: e.ModifyIndex}}); !errors.Is(err, store.ErrTxnRejected) {
				t.Errorf("CAS with a stale index: %v, want rejected", err)
			}
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.CheckNotExists, Key: "t2/k"}}); !errors.Is(err, store.ErrTxnRejected) {
				t.Errorf("check-not-exists on an existing key: %v", err)
			}
			got, err := s.Txn(ctx, []store.Op{{Verb: store.CheckNotExists, Key: "t2/none"}, {Verb: store.Get, Key: "t2/k"}})
			if err != nil || len(got.Entries) != 1 || string(got.Entries[0].Value) != "3" {
				t.Errorf("get in txn = %+v, %v", got, err)
			}
			// A write reports the index it was applied at: a List from then on sees it.
			w, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "t2/w", Value: []byte("x")}})
			if err != nil || w.Index == 0 {
				t.Fatalf("write index = %d, %v", w.Index, err)
			}
			if _, idx, err := s.List(ctx, "t2/"); err != nil || idx < w.Index {
				t.Errorf("list index %d after a write at %d (%v)", idx, w.Index, err)
			}
		})
		t.Run("session behaviors and lock-delay", func(t *testing.T) {
			del := session(t, s, store.SessionOptions{Name: "del", Behavior: store.DeleteKeys, LockDelay: 2 * time.Second})
			rel := session(t, s, store.SessionOptions{Name: "rel", Behavior: store.Release})
			other := session(t, s, store.SessionOptions{Name: "other"})
			if _, err := s.Txn(ctx, []store.Op{
				{Verb: store.Lock, Key: "t3/d", Value: []byte("x"), Session: del},
				{Verb: store.Lock, Key: "t3/r", Value: []byte("y"), Session: rel},
			}); err != nil {
				t.Fatal(err)
			}
			if err := s.DestroySession(ctx, del); err != nil {
				t.Fatal(err)
			}
			if err := s.DestroySession(ctx, rel); err != nil {
				t.Fatal(err)
			}
			if e, _ := s.Get(ctx, "t3/d"); e != nil {
				t.Errorf("delete behavior left %+v", e)
			}
			if e, _ := s.Get(ctx, "t3/r"); e == nil || e.Session != "" || string(e.Value) != "y" {
				t.Errorf("release behavior: %+v, want the key kept, unlocked", e)
			}
			_, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "t3/d", Session: other}})
			var te *store.TxnError
			if !errors.As(err, &te) || len(te.LockDelayed()) != 1 || te.LockDelayed()[0] != "t3/d" {
				t.Fatalf("lock within the lock-delay: %v, want a lock-delay rejection of t3/d", err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err = s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "t3/d", Session: other}})
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("lock after the lock-delay: %v", err)
			}
			if ok, _ := s.SessionExists(ctx, del); ok {
				t.Errorf("destroyed session still exists")
			}
			if err := s.RenewSession(ctx, del); !errors.Is(err, store.ErrSessionGone) {
				t.Errorf("renew of a destroyed session: %v, want ErrSessionGone", err)
			}
		})
		t.Run("blocking list", func(t *testing.T) {
			_, idx, err := s.List(ctx, "t4/")
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, idx2, err := s.WatchList(ctx, "t4/", idx, 300*time.Millisecond)
			if err != nil || idx2 != idx || time.Since(start) < 250*time.Millisecond {
				t.Errorf("unchanged watch: index %d→%d after %s, %v; want the wait to run out", idx, idx2, time.Since(start), err)
			}
			go func() {
				time.Sleep(200 * time.Millisecond)
				_, _ = s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "t4/a", Value: []byte("v")}})
			}()
			got, idx3, err := s.WatchList(ctx, "t4/", idx, 20*time.Second)
			if err != nil || idx3 <= idx || len(got) != 1 || got[0].Key != "t4/a" {
				t.Errorf("watch after a write: %+v index %d, %v", got, idx3, err)
			}
		})
		t.Run("transaction limits", func(t *testing.T) {
			ops := make([]store.Op, store.MaxTxnOps)
			for i := range ops {
				ops[i] = store.Op{Verb: store.Set, Key: fmt.Sprintf("t5/%03d", i), Value: []byte("v")}
			}
			if _, err := s.Txn(ctx, ops); err != nil {
				t.Errorf("%d operations: %v", store.MaxTxnOps, err)
			}
			ops = append(ops, store.Op{Verb: store.Set, Key: "t5/extra"})
			if _, err := s.Txn(ctx, ops); err == nil || !strings.Contains(err.Error(), "at most 128") {
				t.Errorf("%d operations: %v, want refused", len(ops), err)
			}
		})
		t.Run("bad session options", func(t *testing.T) {
			for _, o := range []store.SessionOptions{{TTL: time.Second}, {TTL: 48 * time.Hour}, {TTL: 20 * time.Second, LockDelay: 2 * time.Minute}, {TTL: 20 * time.Second, Behavior: "explode"}} {
				if _, err := s.CreateSession(ctx, o); err == nil {
					t.Errorf("CreateSession(%+v) accepted", o)
				}
			}
		})
	})
}

// backwards is a Store whose index goes back once, as after a restore.
type backwards struct {
	store.Store
	mu    sync.Mutex
	calls int
	seen  []uint64
}

func (b *backwards) WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]store.Entry, uint64, error) {
	b.mu.Lock()
	b.calls++
	n := b.calls
	b.seen = append(b.seen, index)
	b.mu.Unlock()
	switch n {
	case 1:
		return []store.Entry{{Key: "k", Value: []byte("empty")}}, 0, nil // 0 is taken as 1
	case 2:
		return []store.Entry{{Key: "k", Value: []byte("old")}}, 100, nil
	case 3:
		return []store.Entry{{Key: "k", Value: []byte("restored")}}, 7, nil // backwards
	case 4:
		return []store.Entry{{Key: "k", Value: []byte("restored")}}, 7, nil
	}
	<-ctx.Done()
	return nil, 0, ctx.Err()
}

func TestWatcherIndexRules(t *testing.T) {
	b := &backwards{}
	w := store.NewWatcher(b, "p/")
	ctx := context.Background()
	for i, want := range []string{"empty", "old", "restored", "restored"} {
		got, err := w.Next(ctx)
		if err != nil || len(got) != 1 || string(got[0].Value) != want {
			t.Fatalf("call %d: %+v %v, want %s", i, got, err, want)
		}
	}
	if w.Index() != 7 {
		t.Errorf("index = %d, want 7", w.Index())
	}
	// The index the watcher sent: 0 first; 1 after a result of 0; 100; after going
	// backwards, 0 again (start over).
	want := []uint64{0, 1, 100, 0}
	for i := range want {
		if b.seen[i] != want[i] {
			t.Errorf("query %d sent index %d, want %d (all: %v)", i, b.seen[i], want[i], b.seen)
		}
	}
}

// TestTxnErrorReasons: every kind of rejected operation carries the same typed reason on
// both stores, so callers test errors.Is and never the store's wording.
func TestTxnErrorReasons(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		a := session(t, s, store.SessionOptions{LockDelay: 5 * time.Second})
		b := session(t, s, store.SessionOptions{})
		c := session(t, s, store.SessionOptions{})
		if _, err := s.Txn(ctx, []store.Op{
			{Verb: store.Set, Key: "r/plain", Value: []byte("1")},
			{Verb: store.Lock, Key: "r/held", Value: []byte("1"), Session: c},
			{Verb: store.Lock, Key: "r/delayed", Value: []byte("1"), Session: a},
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.DestroySession(ctx, a); err != nil { // r/delayed enters its lock-delay
			t.Fatal(err)
		}
		plain, _ := s.Get(ctx, "r/plain")
		for _, tc := range []struct {
			name string
			op   store.Op
			want error
		}{
			{"lock held", store.Op{Verb: store.Lock, Key: "r/held", Value: []byte("x"), Session: b}, store.ErrLockHeld},
			{"lock delay", store.Op{Verb: store.Lock, Key: "r/delayed", Value: []byte("x"), Session: b}, store.ErrLockDelay},
			{"invalid session", store.Op{Verb: store.Lock, Key: "r/free", Value: []byte("x"), Session: a}, store.ErrSessionGone},
			{"cas stale", store.Op{Verb: store.CAS, Key: "r/plain", Value: []byte("x"), Index: plain.ModifyIndex + 100}, store.ErrStaleIndex},
			{"cas create exists", store.Op{Verb: store.CAS, Key: "r/plain", Value: []byte("x"), Index: 0}, store.ErrStaleIndex},
			{"check-index stale", store.Op{Verb: store.CheckIndex, Key: "r/plain", Index: plain.ModifyIndex + 100}, store.ErrStaleIndex},
			{"check-index missing", store.Op{Verb: store.CheckIndex, Key: "r/none", Index: 1}, store.ErrKeyNotFound},
			{"get missing", store.Op{Verb: store.Get, Key: "r/none"}, store.ErrKeyNotFound},
			{"check-not-exists", store.Op{Verb: store.CheckNotExists, Key: "r/plain"}, store.ErrKeyExists},
			{"check-session", store.Op{Verb: store.CheckSession, Key: "r/held", Session: b}, store.ErrNotLockHolder},
			{"unlock not holder", store.Op{Verb: store.Unlock, Key: "r/held", Session: b}, store.ErrNotLockHolder},
		} {
			_, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "r/other", Value: []byte("y")}, tc.op})
			var te *store.TxnError
			if !errors.As(err, &te) || !errors.Is(err, store.ErrTxnRejected) || !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want a *TxnError with reason %v", tc.name, err, tc.want)
				continue
			}
			if len(te.Errors) == 0 || te.Errors[0].Op != 1 || te.Errors[0].Key != tc.op.Key {
				t.Errorf("%s: op errors %+v, want op 1 on %s", tc.name, te.Errors, tc.op.Key)
			}
		}
		if e, _ := s.Get(ctx, "r/other"); e != nil {
			t.Error("a rejected transaction applied its other operation")
		}
	})
}

func TestSplitTxn(t *testing.T) {
	fence := []store.Op{{Verb: store.CheckSession, Key: "leader", Session: "s"}, {Verb: store.CheckIndex, Key: "state", Index: 7}}
	var ops []store.Op
	for i := 0; i < 300; i++ {
		ops = append(ops, store.Op{Verb: store.Lock, Key: fmt.Sprintf("gpus/n%03d", i), Value: []byte("g"), Session: "s"})
	}
	txns, err := store.SplitTxn(fence, ops)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for i, txn := range txns {
		if err := store.CheckTxn(txn); err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
		if txn[0].Key != fence[0].Key || txn[1].Key != fence[1].Key {
			t.Errorf("transaction %d does not begin with the fence", i)
		}
		for _, op := range txn[len(fence):] {
			if op.Key != ops[seen].Key {
				t.Fatalf("transaction %d: %s out of order, want %s", i, op.Key, ops[seen].Key)
			}
			seen++
		}
	}
	if seen != len(ops) || len(txns) != 3 {
		t.Errorf("%d transactions holding %d operations, want 3 holding %d", len(txns), seen, len(ops))
	}
	// Large values split by bytes too.
	big := []store.Op{}
	for i := 0; i < 10; i++ {
		big = append(big, store.Op{Verb: store.Set, Key: fmt.Sprint(i), Value: make([]byte, 100<<10)})
	}
	txns, err = store.SplitTxn(nil, big)
	if err != nil || len(txns) < 3 {
		t.Errorf("10 × 100 KiB: %d transactions (%v), want at least 3", len(txns), err)
	}
	for i, txn := range txns {
		if err := store.CheckTxn(txn); err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
	}
	if _, err := store.SplitTxn(nil, []store.Op{{Verb: store.Set, Key: "huge", Value: make([]byte, store.MaxTxnBytes)}}); !errors.Is(err, store.ErrTxnTooLarge) {
		t.Errorf("one operation over the limit: %v, want ErrTxnTooLarge", err)
	}
	if txns, err := store.SplitTxn(fence, nil); err != nil || len(txns) != 0 {
		t.Errorf("no operations: %v, %v", txns, err)
	}
}

// TestTxnHandsALockOver: operations apply in order, each seeing what the ones before it
// wrote, on both stores: an Unlock by the holder and a Lock by another session in one
// transaction hand the key over (a job's GPUs go from the node's agent to its step); a
// check after a write sees the write.
func TestTxnHandsALockOver(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		agent := session(t, s, store.SessionOptions{Name: "agent"})
		step := session(t, s, store.SessionOptions{Name: "step"})
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "h/gpu0", Value: []byte("g1"), Session: agent}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, []store.Op{
			{Verb: store.CheckSession, Key: "h/gpu0", Session: agent},
			{Verb: store.Unlock, Key: "h/gpu0", Value: []byte("g1"), Session: agent},
			{Verb: store.Lock, Key: "h/gpu0", Value: []byte("g1"), Session: step},
			{Verb: store.CheckSession, Key: "h/gpu0", Session: step},
		}); err != nil {
			t.Fatalf("hand-over: %v", err)
		}
		e, err := s.Get(ctx, "h/gpu0")
		if err != nil || e == nil || e.Session != step || string(e.Value) != "g1" {
			t.Fatalf("after the hand-over: %+v, %v", e, err)
		}
		// The old holder can no longer give it away.
		_, err = s.Txn(ctx, []store.Op{
			{Verb: store.Unlock, Key: "h/gpu0", Value: []byte("g1"), Session: agent},
			{Verb: store.Lock, Key: "h/gpu0", Value: []byte("g2"), Session: agent},
		})
		if !errors.Is(err, store.ErrNotLockHolder) {
			t.Errorf("a second hand-over by the old holder: %v, want ErrNotLockHolder", err)
		}
		if e, _ := s.Get(ctx, "h/gpu0"); e == nil || e.Session != step {
			t.Errorf("the failed hand-over changed the key: %+v", e)
		}
	})
}

// TestAnchorSteadiesAnEmptyPrefix: Consul answers a list of a prefix without keys with
// the index of the whole store, so a blocking query on it would return at every write
// anywhere; once anchored, the prefix's index moves only with changes under it. On
// both stores the anchor is written once and left alone after.
func TestAnchorSteadiesAnEmptyPrefix(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		index := func(prefix string) uint64 {
			t.Helper()
			_, idx, err := s.List(ctx, prefix)
			if err != nil {
				t.Fatal(err)
			}
			return idx
		}
		write := func(key string) {
			t.Helper()
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok := s.(*store.Consul); ok {
			before := index("anchor/empty/")
			write("elsewhere/1")
			if after := index("anchor/empty/"); after <= before {
				t.Errorf("Consul: an empty prefix's index stayed %d after a write elsewhere (%d); the anchor's reason is gone", before, after)
			}
		}
		if err := store.Anchor(ctx, s, "anchor/empty/"); err != nil {
			t.Fatal(err)
		}
		e, err := s.Get(ctx, "anchor/empty/")
		if err != nil || e == nil || len(e.Value) != 0 {
			t.Fatalf("the anchor: %+v, %v; want an empty key", e, err)
		}
		before := index("anchor/empty/")
		write("elsewhere/2")
		if after := index("anchor/empty/"); after != before {
			t.Errorf("an anchored prefix's index moved from %d to %d with a write elsewhere", before, after)
		}
		if err := store.Anchor(ctx, s, "anchor/empty/"); err != nil {
			t.Errorf("anchoring again: %v", err)
		}
		if again, _ := s.Get(ctx, "anchor/empty/"); again == nil || again.ModifyIndex != e.ModifyIndex {
			t.Errorf("anchoring again rewrote the anchor: %+v, was %+v", again, e)
		}
		write("anchor/empty/job")
		if after := index("anchor/empty/"); after <= before {
			t.Errorf("an anchored prefix's index stayed %d after a write under it", after)
		}
	})
}

// TestKeysTellWhatChanged: Keys names the keys List returns, with List's index, so the
// same names and index mean nothing under the prefix was written or deleted since.
func TestKeysTellWhatChanged(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		n := 0
		set := func(key string) {
			t.Helper()
			n++ // a new value: Consul skips a write of the value a key has
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: []byte(fmt.Sprint(n))}}); err != nil {
				t.Fatal(err)
			}
		}
		keys := func() ([]string, uint64) {
			t.Helper()
			k, idx, err := s.Keys(ctx, "keys/")
			if err != nil {
				t.Fatal(err)
			}
			entries, lidx, err := s.List(ctx, "keys/")
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Key)
			}
			if fmt.Sprint(names) != fmt.Sprint(k) || lidx != idx {
				t.Fatalf("Keys = %v at %d, List = %v at %d", k, idx, names, lidx)
			}
			return k, idx
		}
		set("keys/b")
		set("keys/a")
		set("other")
		k1, i1 := keys()
		if fmt.Sprint(k1) != "[keys/a keys/b]" {
			t.Fatalf("Keys = %v, want [keys/a keys/b]", k1)
		}
		set("other")
		if k, i := keys(); fmt.Sprint(k) != fmt.Sprint(k1) || i != i1 {
			t.Errorf("a write elsewhere changed Keys: %v at %d, was %v at %d", k, i, k1, i1)
		}
		set("keys/a")
		k2, i2 := keys()
		if i2 <= i1 {
			t.Errorf("a write under the prefix left its index at %d (was %d)", i2, i1)
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: "keys/b"}}); err != nil {
			t.Fatal(err)
		}
		if k, _ := keys(); fmt.Sprint(k) == fmt.Sprint(k2) {
			t.Errorf("a delete under the prefix left the names %v", k)
		}
	})
}
