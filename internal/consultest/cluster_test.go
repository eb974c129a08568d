package consultest

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestClusterLeaderFailover starts three servers and two client agents, SIGKILLs the
// leader under a session-held key, and launches it again: another server leads
// meanwhile, the key and its session survive on both sides of the kill, and the cluster
// is whole again afterwards. When the test ends, no agent is left running.
func TestClusterLeaderFailover(t *testing.T) {
	var c *Cluster
	pids := map[string]int{}
	t.Run("failover", func(t *testing.T) {
		defer func() {
			for _, a := range append(append([]*Agent(nil), c.Servers...), c.Clients...) {
				a.mu.Lock()
				if a.cmd != nil {
					pids[a.Name] = a.cmd.Process.Pid
				}
				a.mu.Unlock()
			}
		}()
		started := time.Now()
		c = StartCluster(t, 3, 2)
		t.Logf("3 servers and 2 clients healthy after %s", time.Since(started).Round(time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		s, err := store.NewConsul(c.Clients[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		since := time.Now()
		sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "consultest", TTL: store.MinSessionTTL, NodeHealth: true})
		if err != nil {
			t.Fatal(err)
		}
		lease := store.Keep(s, sess, store.MinSessionTTL, since, nil)
		defer lease.Close()
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "held", Value: []byte("x"), Session: sess}}); err != nil {
			t.Fatal(err)
		}
		old, err := c.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		old.Kill()
		if old.Running() {
			t.Fatalf("%s runs after Kill", old.Name)
		}
		var leader *Agent
		for leader == nil {
			if ctx.Err() != nil {
				t.Fatalf("no new leader after the kill: %v\n%s", ctx.Err(), c.Logs())
			}
			if l, err := c.Leader(ctx); err == nil {
				leader = l
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if leader == old {
			t.Fatalf("the killed server %s still leads", old.Name)
		}
		t.Logf("%s leads %s after %s was SIGKILLed", leader.Name, time.Since(killed).Round(time.Millisecond), old.Name)
		// Through the other client agent, with the old leader still down.
		s2, err := store.NewConsul(c.Clients[1].Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		checkHeld := func(when string) {
			t.Helper()
			e, err := s2.Get(ctx, "held")
			if err != nil || e == nil || e.Session != sess {
				t.Fatalf("%s: key held = %+v, %v; want it locked by %s", when, e, err, sess)
			}
		}
		checkHeld("with the old leader down")
		launched := time.Now()
		c.Launch(old, time.Minute)
		t.Logf("cluster healthy %s after %s was launched again", time.Since(launched).Round(time.Millisecond), old.Name)
		if !old.Running() {
			t.Fatalf("%s does not run after Launch", old.Name)
		}
		checkHeld("with the old leader back")
		// 2×TTL after the kill the session is still renewed: the new leader took over its
		// timer.
		for time.Since(killed) < 2*store.MinSessionTTL+time.Second {
			time.Sleep(time.Second)
		}
		checkHeld("2×TTL after the kill")
	})
	if c == nil {
		return
	}
	for _, a := range append(append([]*Agent(nil), c.Servers...), c.Clients...) {
		if a.Running() {
			t.Errorf("agent %s still runs after the test", a.Name)
		}
	}
	if len(pids) != 5 {
		t.Errorf("%d agents ran at the end of the test, want 5: %v", len(pids), pids)
	}
	for name, pid := range pids {
		if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
			t.Errorf("agent %s's process %d still exists (kill -0: %v)", name, pid, err)
		}
	}
}
