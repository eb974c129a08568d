package store_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// blackHole is a Store whose renewals, while cut is set, hang until their context ends,
// as a request into a partition that drops packets does.
type blackHole struct {
	store.Store
	mu      sync.Mutex
	cut     bool
	renewed int
}

func (b *blackHole) setCut(v bool) {
	b.mu.Lock()
	b.cut = v
	b.mu.Unlock()
}

func (b *blackHole) RenewSession(ctx context.Context, id string) error {
	b.mu.Lock()
	cut := b.cut
	b.mu.Unlock()
	if cut {
		<-ctx.Done()
		return ctx.Err()
	}
	err := b.Store.RenewSession(ctx, id)
	b.mu.Lock()
	b.renewed++
	b.mu.Unlock()
	return err
}

// leaseTTL is the TTL the lease tests time their leases by: the store's session has
// Consul's minimum TTL, the lease's own clock a shorter one, so the tests run fast.
const leaseTTL = time.Second

func TestLeaseRenewsAndExtendsKillBy(t *testing.T) {
	s := &blackHole{Store: store.NewMemory()}
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	l := store.Keep(s, id, leaseTTL, time.Now(), nil)
	defer l.Close()
	var mu sync.Mutex
	var kills []time.Time
	l.OnRenew(func(k time.Time) { mu.Lock(); kills = append(kills, k); mu.Unlock() })
	time.Sleep(3 * leaseTTL)
	if !l.Valid() || l.Err() != nil {
		t.Fatalf("lease of a renewed session is over: %v", l.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kills) < 5 {
		t.Fatalf("OnRenew called %d times in 3 TTLs, want the registration call and a renewal every TTL/5", len(kills))
	}
	for i := 1; i < len(kills); i++ {
		if kills[i].Before(kills[i-1]) {
			t.Errorf("KillBy went back: %v after %v", kills[i], kills[i-1])
		}
	}
	if d := time.Until(kills[len(kills)-1]); d <= 0 || d > store.LeaseKill(leaseTTL) {
		t.Errorf("last KillBy is %s away, want within (0, %s]", d, store.LeaseKill(leaseTTL))
	}
}

// TestLeaseEndsWhenRenewalsHang: a partition that drops packets makes every renewal
// hang; each one gives up at its timeout, and the lease is over by its stop time,
// before Consul may invalidate the session. It stays over when renewals succeed again.
func TestLeaseEndsWhenRenewalsHang(t *testing.T) {
	s := &blackHole{Store: store.NewMemory()}
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	l := store.Keep(s, id, leaseTTL, time.Now(), nil)
	defer l.Close()
	time.Sleep(leaseTTL / 2)
	s.setCut(true)
	cutAt := time.Now()
	select {
	case <-l.Done():
	case <-time.After(5 * leaseTTL):
		t.Fatal("the lease did not end while no renewal got through")
	}
	if since := time.Since(cutAt); since > store.LeaseStop(leaseTTL)+leaseTTL/2 {
		t.Errorf("the lease ended %s after the cut, want by its stop time %s", since, store.LeaseStop(leaseTTL))
	}
	if !errors.Is(l.Err(), store.ErrLeaseExpired) {
		t.Errorf("Err() = %v, want ErrLeaseExpired", l.Err())
	}
	s.setCut(false)
	time.Sleep(leaseTTL)
	if l.Valid() {
		t.Error("the lease holds again after renewals got through: it must stay over")
	}
	// An expired lease destroys its session as soon as the store answers.
	deadline := time.Now().Add(5 * leaseTTL)
	for {
		ok, err := s.SessionExists(context.Background(), id)
		if err == nil && !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session of an expired lease was not destroyed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeaseJudgedOnTheCallersClock: a holder that was stalled past its lease (here: a
// lease whose last renewal lies further back than its stop time) is told so by Valid
// before the lease's own timer or goroutine has run.
func TestLeaseJudgedOnTheCallersClock(t *testing.T) {
	s := store.NewMemory()
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	l := store.Keep(s, id, leaseTTL, time.Now().Add(-store.LeaseStop(leaseTTL)-time.Millisecond), nil)
	defer l.Close()
	if l.Valid() {
		t.Fatal("a lease last renewed before its stop time is valid")
	}
	<-l.Done()
}

func TestLeaseEndsWhenTheSessionIsGone(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
		l := store.Keep(s, id, store.MinSessionTTL, time.Now(), nil)
		defer l.Close()
		if err := s.DestroySession(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Done():
		case <-time.After(store.MinSessionTTL):
			t.Fatal("the lease of a destroyed session did not end")
		}
		if !errors.Is(l.Err(), store.ErrSessionGone) {
			t.Errorf("Err() = %v, want ErrSessionGone", l.Err())
		}
	})
}

// TestLeaseHoldsSessionPastTTL: a 10s session kept by a lease outlives 2×TTL.
func TestLeaseHoldsSessionPastTTL(t *testing.T) {
	s := store.NewMemory()
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	l := store.Keep(s, id, store.MinSessionTTL, time.Now(), nil)
	time.Sleep(2*store.MinSessionTTL + time.Second)
	if ok, _ := s.SessionExists(context.Background(), id); !ok || !l.Valid() {
		t.Fatalf("session expired (exists %v) or lease over (%v) while kept", ok, l.Err())
	}
	l.Close()
	if l.Valid() {
		t.Error("a closed lease is still valid")
	}
}

// TestLeaseReportsAnOutage stops a real Consul server (one that keeps its data) under a
// kept session: the lease says the coordinator is unreachable, ends at its stop time,
// and says so.
func TestLeaseReportsAnOutage(t *testing.T) {
	agent := consultest.StartPersistent(t)
	s := consultest.ConsulStore(t, agent)
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	core, logs := observer.New(zapcore.InfoLevel)
	l := store.Keep(s, id, store.MinSessionTTL, time.Now(), zap.New(core))
	defer l.Close()
	agent.Stop()
	waitLog(t, logs, "coordinator unreachable: cannot renew the session, retrying", 2*store.MinSessionTTL)
	waitLog(t, logs, "lease over: what this session guards must stop now", 2*store.MinSessionTTL)
	if !errors.Is(l.Err(), store.ErrLeaseExpired) {
		t.Errorf("Err() = %v, want ErrLeaseExpired", l.Err())
	}
	if n := logs.FilterMessage("coordinator unreachable: cannot renew the session, retrying").Len(); n != 1 {
		t.Errorf("the outage was reported %d times at its start, want once", n)
	}
	agent.Restart()
}

func waitLog(t *testing.T, logs *observer.ObservedLogs, msg string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for logs.FilterMessage(msg).Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged within %s; logged: %v", msg, within, logs.All())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeaseOutlivesConsulReplacedAndRestored: Consul's only server is replaced by an
// empty one, which answers "no such session" until the operator restores the snapshot
// (docs/operations.md, "Recovery"). The lease takes that answer from a store whose data
// went back in time for an outage, not for its session's end: it holds, and renews
// again once the restore brings the session back. A session destroyed afterwards, on
// the restored Consul, still ends the lease at once.
func TestLeaseOutlivesConsulReplacedAndRestored(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	ctx := context.Background()
	for i := range 40 {
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "lease-test/k" + strconv.Itoa(i), Value: []byte("v")}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.List(ctx, "lease-test/"); err != nil {
		t.Fatal(err)
	}
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	restore := saveSnapshot(t, agent)
	core, logs := observer.New(zapcore.InfoLevel)
	l := store.Keep(s, id, store.MinSessionTTL, time.Now(), zap.New(core))
	defer l.Close()
	agent.Kill()
	agent.Launch() // empty: it knows neither the keys nor the session
	// Renewals on the empty Consul: the lease says the coordinator is unavailable and
	// holds.
	waitLog(t, logs, "coordinator unreachable: cannot renew the session, retrying", store.MinSessionTTL)
	if !l.Valid() {
		t.Fatalf("the lease ended on the empty Consul: %v", l.Err())
	}
	if got := logs.FilterMessage("coordinator unreachable: cannot renew the session, retrying").All()[0].ContextMap()["error"]; !strings.Contains(fmt.Sprint(got), "went back in time") {
		t.Errorf("renewal error %q does not say Consul's data went back", got)
	}
	restore()
	waitLog(t, logs, "coordinator reachable again: session renewed", store.MinSessionTTL)
	if !l.Valid() {
		t.Fatalf("the lease ended: %v", l.Err())
	}
	if err := s.DestroySession(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(store.MinSessionTTL / 2):
		t.Fatal("the lease of a session destroyed on the restored Consul did not end")
	}
	if !errors.Is(l.Err(), store.ErrSessionGone) {
		t.Errorf("Err() = %v, want ErrSessionGone", l.Err())
	}
}

// TestConsulDataLostPastTheIndex: the empty Consul that replaced a lost one takes
// writes from the other clients (agents registering again, creating sessions) until its
// index passes the highest this client saw, so the index no longer tells it apart from
// the data it had. The cluster marker does: "no such session", to a renewal or to a
// transaction naming the session, is still an outage to this client, and DataLost says
// so, until the snapshot's restore brings the marker and the session back; then a
// renewal succeeds and DataLost is false.
func TestConsulDataLostPastTheIndex(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	ctx := context.Background()
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "lost-test/k", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	_, seen, err := s.List(ctx, "lost-test/")
	if err != nil {
		t.Fatal(err)
	}
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL})
	m, err := s.Get(ctx, store.MarkerKey)
	if err != nil || m == nil || len(m.Value) == 0 {
		t.Fatalf("no cluster marker after the first session: %v, %v", m, err)
	}
	if store.DataLost(ctx, s) {
		t.Fatal("DataLost on the Consul the client has known all along")
	}
	restore := saveSnapshot(t, agent)
	agent.Kill()
	agent.Launch()
	// Another client writes to the empty Consul, creating a session there (and so a
	// marker of its own), until its index is past what s saw.
	other := consultest.ConsulStore(t, agent)
	session(t, other, store.SessionOptions{TTL: store.MinSessionTTL})
	raiseIndexPast(t, other, seen+5)
	err = s.RenewSession(ctx, id)
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "its gangrun/cluster/marker is") {
		t.Fatalf("renewal on the empty Consul past the index: %v, want ErrUnavailable naming the cluster marker", err)
	}
	if !store.DataLost(ctx, s) {
		t.Error("DataLost false on the empty Consul whose index passed what the client saw")
	}
	// A transaction naming the session (an agent's bid to lead) meets the same outage,
	// not the session's end: the agent does not register again into the empty Consul.
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "lost-test/lock", Value: []byte("x"), Session: id}}); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrSessionGone) {
		t.Errorf("a lock with the session on the empty Consul: %v, want ErrUnavailable", err)
	}
	restore()
	if err := s.RenewSession(ctx, id); err != nil {
		t.Errorf("renewal after the restore: %v", err)
	}
	if store.DataLost(ctx, s) {
		t.Error("DataLost after the restore brought the client's data back")
	}
	if err := s.DestroySession(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := s.RenewSession(ctx, id); !errors.Is(err, store.ErrSessionGone) {
		t.Errorf("renewal of a session destroyed on the restored Consul: %v, want ErrSessionGone", err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "lost-test/lock", Value: []byte("x"), Session: id}}); !errors.Is(err, store.ErrSessionGone) {
		t.Errorf("a lock with a session destroyed on the restored Consul: %v, want ErrSessionGone", err)
	}
	if store.DataLost(ctx, store.NewMemory()) {
		t.Error("DataLost on a Memory store")
	}
}

// TestWatcherSeesTheRestore: a watch that got its last answer from the empty Consul that
// replaced a lost one, at an index the other clients' writes raised past where the
// snapshot's restore puts its prefix, sees the restored keys within seconds, though
// nothing is written under its prefix after the restore: not after its blocking query's
// whole wait (5 minutes: a scheduler whose view of the nodes came from the empty Consul
// granted nothing for that long in CI, TestRecoveryAfterConsulOutages/short).
func TestWatcherSeesTheRestore(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	ctx := context.Background()
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "watch-test/a", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	id := session(t, s, store.SessionOptions{TTL: store.MinSessionTTL}) // takes the cluster's marker
	w := store.NewWatcher(s, "watch-test/")
	if _, err := w.Next(ctx); err != nil {
		t.Fatal(err)
	}
	// idle asks nothing through the outage (an agent's watch of the scheduler's key
	// while it leads): no error of its own tells it the store may be another.
	idle := store.NewWatcher(s, "watch-test/")
	if _, err := idle.Next(ctx); err != nil {
		t.Fatal(err)
	}
	seen := w.Index()
	restore := saveSnapshot(t, agent)
	// The watch runs throughout, as a scheduler's does: its blocking query is cut by
	// Consul's death.
	answers := make(chan []store.Entry, 64)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			entries, err := w.Next(wctx)
			if err != nil {
				return
			}
			answers <- entries
		}
	}()
	time.Sleep(200 * time.Millisecond) // the watch blocks at its index
	agent.Kill()
	agent.Launch()
	other := consultest.ConsulStore(t, agent)
	raiseIndexPast(t, other, seen+20)
	// Its answers until one comes from the empty Consul past the old index.
	deadline := time.After(30 * time.Second)
	for empty := false; !empty; {
		select {
		case e := <-answers:
			empty = len(e) == 0 && w.Index() > seen
		case <-deadline:
			t.Fatal("no answer from the empty Consul")
		}
	}
	// The client's renewal meets the lost data; idle's next answer comes from the
	// empty Consul, then it waits at that index.
	if err := s.RenewSession(ctx, id); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("renewal on the empty Consul: %v, want ErrUnavailable", err)
	}
	if e, err := idle.Next(ctx); err != nil || len(e) != 0 {
		t.Fatalf("idle's answer from the empty Consul: %v, %v", e, err)
	}
	idleAnswers := make(chan []store.Entry, 64)
	go func() {
		for {
			entries, err := idle.Next(wctx)
			if err != nil {
				return
			}
			idleAnswers <- entries
		}
	}()
	time.Sleep(200 * time.Millisecond)
	restore()
	start := time.Now()
	seesRestored(t, "the watch", answers, start)
	seesRestored(t, "the idle watch", idleAnswers, start)
	if store.Unsettled(s) {
		t.Error("the client's data still unsettled after the restore")
	}
}

// seesRestored waits up to 15 s for an answer holding key "watch-test/a".
func seesRestored(t *testing.T, who string, answers <-chan []store.Entry, start time.Time) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case e := <-answers:
			for _, x := range e {
				if x.Key == "watch-test/a" {
					t.Logf("%s: the restored key seen %s after the restore", who, time.Since(start).Round(time.Millisecond))
					return
				}
			}
		case <-deadline:
			t.Fatalf("%s did not see the restored key within 15 s", who)
		}
	}
}

// saveSnapshot saves agent's data with consul snapshot save and returns what restores
// it into the agent (consul snapshot restore), as an operator would.
func saveSnapshot(t *testing.T, agent *consultest.Agent) (restore func()) {
	t.Helper()
	bin, err := consultest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "consul.snap")
	if out, err := exec.Command(bin, "snapshot", "save", "-http-addr="+agent.Addr, snap).CombinedOutput(); err != nil {
		t.Fatalf("snapshot save: %v\n%s", err, out)
	}
	return func() {
		t.Helper()
		if out, err := exec.Command(bin, "snapshot", "restore", "-http-addr="+agent.Addr, snap).CombinedOutput(); err != nil {
			t.Fatalf("snapshot restore: %v\n%s", err, out)
		}
	}
}

// raiseIndexPast writes keys under elsewhere/ through s until the KV store's index is
// past idx, as other clients' writes raise an empty Consul's.
func raiseIndexPast(t *testing.T, s store.Store, idx uint64) {
	t.Helper()
	ctx := context.Background()
	for i := 0; ; i++ {
		_, at, err := s.List(ctx, "elsewhere/none/") // no keys: the KV table's index
		if err != nil {
			t.Fatal(err)
		}
		if at > idx {
			return
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "elsewhere/" + strconv.Itoa(i), Value: []byte("v")}}); err != nil {
			t.Fatal(err)
		}
	}
}
