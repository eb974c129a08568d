package allocator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// TestJobGrantLifecycle: a job's durable request is granted with each node's keys held
// by the node's agent; a step takes its node's keys over, after which an agent restart
// frees nothing while a node whose agent dies before its step started comes back by
// itself; the step gives its node back; the job's end removes the rest.
func TestJobGrantLifecycle(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		tc := startCluster(t, s, 3, "dgx-h100", nil)
		r := JobRequest("41", 2, 2, 4, "", "", nil, 0, []string{"node02"})
		ops, err := JobRequestOps(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, ops); err != nil {
			t.Fatal(err)
		}
		var g *Grant
		waitFor(t, 30*time.Second, func() bool {
			g, _, err = ReadGrant(ctx, s, "41")
			return err == nil && g != nil && g.State == GrantGranted
		}, "the job's grant")
		c := checkInvariants(t, s)
		if g.Session != "" || len(g.Nodes) != 2 {
			t.Fatalf("grant %+v: want no session and 2 nodes", g)
		}
		for _, gn := range g.Nodes {
			if gn.Name == "node02" {
				t.Errorf("placed on the excluded node02")
			}
			if gn.Session == "" || gn.Session != c.Nodes[gn.Name].AliveSession {
				t.Errorf("node %s's keys held by %q, want its agent's %q", gn.Name, gn.Session, c.Nodes[gn.Name].AliveSession)
			}
		}
		a, b := g.Nodes[0].Name, g.Nodes[1].Name
		if err := Cancel(ctx, s, "41"); !errors.Is(err, ErrJobRequest) {
			t.Errorf("Cancel of the job's request: %v, want ErrJobRequest (the job is cancelled through the job)", err)
		}
		if g2, _, err := ReadGrant(ctx, s, "41"); err != nil || g2 == nil || g2.State != GrantGranted {
			t.Errorf("the job's grant after the refused Cancel: %+v, %v", g2, err)
		}

		// The step on a takes its keys over.
		step, err := s.CreateSession(ctx, store.SessionOptions{Name: "step", TTL: time.Minute, Behavior: store.DeleteKeys})
		if err != nil {
			t.Fatal(err)
		}
		gn, err := HandOver(ctx, s, "41", a, step)
		if err != nil || gn.Session != step {
			t.Fatalf("HandOver = %+v, %v", gn, err)
		}
		if _, err := HandOver(ctx, s, "41", a, "another"); !errors.Is(err, ErrNotHolder) {
			t.Errorf("a second hand-over to another session: %v, want ErrNotHolder", err)
		}
		// Both agents stop: a's keys stay with its step; b's go with b's agent.
		tc.stop(a)
		tc.stop(b)
		waitFor(t, 30*time.Second, func() bool {
			c := checkInvariants(t, s)
			return len(c.Nodes[b].Held) == 0
		}, "node b's keys to go with its agent's session")
		c = checkInvariants(t, s)
		if len(c.Nodes[a].Held) != 4 {
			t.Fatalf("node a holds %d devices after its agent stopped, want the step's 4", len(c.Nodes[a].Held))
		}
		if err := ReleaseJob(ctx, s, "41"); !errors.Is(err, ErrNotHolder) {
			t.Errorf("ReleaseJob while a step holds GPUs: %v, want ErrNotHolder", err)
		}
		// The step gives its node back, then the job's end removes the rest.
		if err := ReleaseNode(ctx, s, "41", a, step); err != nil {
			t.Fatal(err)
		}
		c = checkInvariants(t, s)
		if len(c.Nodes[a].Held) != 0 || len(c.Grants["41"].Nodes) != 1 {
			t.Fatalf("after ReleaseNode: a holds %v, grant %+v", c.Nodes[a].Held, c.Grants["41"])
		}
		if err := ReleaseJob(ctx, s, "41"); err != nil {
			t.Fatal(err)
		}
		c = checkInvariants(t, s)
		if _, ok := c.Grants["41"]; ok {
			t.Error("the grant outlived ReleaseJob")
		}
		if _, ok := c.Requests["41"]; ok {
			t.Error("the request outlived ReleaseJob")
		}
	})
}
