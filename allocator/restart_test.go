package allocator

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
)

func TestConsulRestartKeepsGrantsAndAgents(t *testing.T) {
	// A Consul server with its data on disk is restarted while a grant is held: the
	// agents stay (or come back) up, the grant is neither lost nor duplicated, and the
	// cluster keeps granting.
	agent := consultest.StartPersistent(t)
	s := consultest.ConsulStore(t, agent)
	startCluster(t, s, 3, "dgx-h100", nil)
	tk, g := submitAndWait(t, s, Request{Nodes: 2, GPUsPerNode: 4, Holder: "before restart"})

	agent.Restart()

	waitFor(t, 60*time.Second, func() bool {
		c, err := Snapshot(context.Background(), s)
		if err != nil {
			return false
		}
		up := 0
		for _, n := range c.NodeList() {
			if n.State == NodeUp {
				up++
			}
		}
		return up == 3
	}, "all three nodes up after the restart")
	c := checkInvariants(t, s)
	got, ok := c.Grants[g.ID]
	if !ok || got.State != GrantGranted || got.DeviceCount() != 8 {
		t.Fatalf("grant after the restart: %+v (present %v), want the same 8 devices", got, ok)
	}
	if len(c.Grants) != 1 {
		t.Errorf("%d grants after the restart, want 1", len(c.Grants))
	}
	select {
	case <-tk.Lost():
		t.Fatalf("the holder lost its grant across the restart")
	default:
	}
	// The holder's session outlives 2×TTL after the restart: it is still renewed.
	time.Sleep(2*SessionTTL + time.Second)
	if c := checkInvariants(t, s); c.Grants[g.ID].State != GrantGranted {
		t.Fatalf("grant expired after the restart")
	}
	_, g2 := submitAndWait(t, s, Request{Nodes: 1, GPUsPerNode: 8, Holder: "after restart"})
	if g2.DeviceCount() != 8 {
		t.Fatalf("new grant after the restart: %+v", g2)
	}
	checkInvariants(t, s)
}

func TestAgentsReregisterAfterConsulLosesItsState(t *testing.T) {
	// A dev agent keeps its state in memory: a restart loses every session and key. The
	// agents notice their sessions are gone and register again.
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	startCluster(t, s, 2, "pcie-2socket", nil)
	agent.Restart()
	waitFor(t, 90*time.Second, func() bool {
		c, err := Snapshot(context.Background(), s)
		if err != nil {
			return false
		}
		up := 0
		for _, n := range c.NodeList() {
			if n.State == NodeUp {
				up++
			}
		}
		e, _ := s.Get(context.Background(), schedulerKey)
		return up == 2 && e != nil && e.Session != ""
	}, "both nodes registered again and a scheduler elected")
	_, g := submitAndWait(t, s, Request{Nodes: 2, GPUsPerNode: 2, Holder: "after state loss"})
	if g.DeviceCount() != 4 {
		t.Fatalf("grant = %+v", g)
	}
}
