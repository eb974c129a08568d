package allocator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// mustJSON is v as JSON without a schema version: a record as gangrun wrote it before
// records carried versions, which every reader takes as version 1.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// newerRecord is v as a record of kind k one schema newer than this gangrun reads: what
// the next release would write.
func newerRecord(t testing.TB, k schema.Kind, v any) []byte {
	t.Helper()
	b, err := schema.MarshalVersion(k, k.Version()+1, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// put writes key=value (locked by session when given).
func put(t testing.TB, s store.Store, key string, value []byte, session string) {
	t.Helper()
	op := store.Op{Verb: store.Set, Key: key, Value: value}
	if session != "" {
		op = store.Op{Verb: store.Lock, Key: key, Value: value, Session: session}
	}
	if _, err := s.Txn(context.Background(), []store.Op{op}); err != nil {
		t.Fatal(err)
	}
}

// wantNewer fails unless err says a newer gangrun wrote the record (schema.ErrNewer,
// with its reason in the text).
func wantNewer(t testing.TB, what string, err error) {
	t.Helper()
	// (an inventory names its own member, schema_version)
	if msg := strings.Replace(fmt.Sprint(err), "schema_version 2", "schema 2", 1); !errors.Is(err, schema.ErrNewer) || !strings.Contains(msg, "written by a newer gangrun (schema 2; this one reads up to 1)") {
		t.Errorf("%s: %v, want the refusal of a record written by a newer gangrun", what, err)
	}
}

// TestNewerRecordsAreRefusedAndLeftAlone: for each record kind of the allocator, a
// record one schema newer than this gangrun reads (what the next release writes) is
// refused with its reason by every reader — the scheduler's passes (cleanup, placement,
// accounting), `gangrun nodes`, show, cancel, drain and resume, a job's release and
// hand-over — and its key is never written or deleted by them.
func TestNewerRecordsAreRefusedAndLeftAlone(t *testing.T) {
	ctx := context.Background()
	type env struct {
		s     store.Store
		sc    *Scheduler
		agent string // node a's agent session (it holds a's alive key)
	}
	// pass runs the scheduler's pass on a fresh snapshot, the clock moved past every
	// interval (usage flushes, reservations), and returns the snapshot after it.
	pass := func(t *testing.T, e env) *Cluster {
		t.Helper()
		for range 3 {
			e.sc.now = func() time.Time { return time.Now().Add(time.Hour) }
			c, err := Snapshot(ctx, e.s)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.sc.Pass(ctx, c); err != nil {
				t.Fatalf("pass: %v", err)
			}
		}
		c, err := Snapshot(ctx, e.s)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// jobRequest writes job id's durable request, asking for nodes nodes of one GPU.
	jobRequest := func(t *testing.T, s store.Store, id string, nodes int) {
		t.Helper()
		ops, err := JobRequestOps(JobRequest(id, nodes, nodes, 1, "", "", nil, 0, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		kind schema.Kind
		// setup writes the newer record(s) and returns their keys.
		setup func(t *testing.T, e env) []string
		// check runs the readers and writers over them.
		check func(t *testing.T, e env)
	}{
		{schema.Node, func(t *testing.T, e env) []string {
			b, _ := e.s.CreateSession(ctx, store.SessionOptions{Name: "agent b", TTL: time.Minute, Behavior: store.DeleteKeys})
			put(t, e.s, nodesPrefix+"b", newerRecord(t, schema.Node, NodeRecord{Name: "b", Devices: nil}), "")
			put(t, e.s, alivePrefix+"b", []byte("10.0.0.2"), b)
			jobRequest(t, e.s, "7", 2) // two nodes: only a and b are there
			return []string{nodesPrefix + "b"}
		}, func(t *testing.T, e env) {
			c := pass(t, e)
			if _, ok := c.Grants["7"]; ok {
				t.Errorf("a job of 2 nodes was granted with node b, whose record is a newer gangrun's: %+v", c.Grants["7"])
			}
			var b *NodeStatus
			for _, n := range c.NodeList() {
				if n.Name == "b" {
					b = &n
				}
			}
			if b == nil || b.State != NodeInval || !strings.Contains(b.Reason, "node record written by a newer gangrun (schema 2; this one reads up to 1)") {
				t.Errorf("gangrun nodes shows node b as %+v, want inval with the reason", b)
			}
			st, _ := ReadStatus(ctx, e.s)
			if why := st.Pending["7"]; !strings.Contains(why, "1 "+reasonInval) {
				t.Errorf("the pending reason: %q, want it to count node b as %q", why, reasonInval)
			}
			_, err := NodeAddr(ctx, e.s, "b")
			wantNewer(t, "the address of node b", err)
		}},
		{schema.Drain, func(t *testing.T, e env) []string {
			put(t, e.s, drainPrefix+"a", newerRecord(t, schema.Drain, Drain{Reason: "rewired"}), "")
			jobRequest(t, e.s, "7", 1)
			return []string{drainPrefix + "a"}
		}, func(t *testing.T, e env) {
			c := pass(t, e)
			if _, ok := c.Grants["7"]; ok {
				t.Error("a job was granted on node a, whose drain is a newer gangrun's")
			}
			if n := c.NodeList()[0]; n.State != NodeDrained || !strings.Contains(n.Reason, "drain written by a newer gangrun") {
				t.Errorf("gangrun nodes shows node a as %+v, want drained with the reason", n)
			}
			wantNewer(t, "drain a", SetDrain(ctx, e.s, "a", "another reason"))
			wantNewer(t, "resume a", SetDrain(ctx, e.s, "a", ""))
		}},
		{schema.Request, func(t *testing.T, e env) []string {
			r := JobRequest("7", 1, 1, 1, "", "", nil, 0, nil)
			put(t, e.s, requestsPrefix+"7", newerRecord(t, schema.Request, r), "")
			// A grant this gangrun reads, of the newer request: not taken for one whose
			// request is gone.
			g := Grant{ID: "7", State: GrantGranted, Session: "", Nodes: []GrantNode{{Name: "a", GPUs: []int{0}, Devices: []string{"0"}, Session: e.agent}}}
			put(t, e.s, grantsPrefix+"7", mustRecord(schema.Grant, g), "")
			put(t, e.s, gpuKey("a", "0"), []byte("7"), e.agent)
			return []string{requestsPrefix + "7", grantsPrefix + "7", gpuKey("a", "0")}
		}, func(t *testing.T, e env) {
			pass(t, e)
			_, _, err := Show(ctx, e.s, "7")
			wantNewer(t, "show 7", err)
			wantNewer(t, "cancel 7", Cancel(ctx, e.s, "7"))
			c, _ := Snapshot(ctx, e.s)
			wantNewer(t, "release job 7", ReleaseJobIn(ctx, e.s, c, "7"))
		}},
		{schema.Grant, func(t *testing.T, e env) []string {
			jobRequest(t, e.s, "7", 1)
			g := Grant{ID: "7", State: GrantGranted, Nodes: []GrantNode{{Name: "a", GPUs: []int{0}, Devices: []string{"0"}, Session: e.agent}}}
			put(t, e.s, grantsPrefix+"7", newerRecord(t, schema.Grant, g), "")
			put(t, e.s, gpuKey("a", "0"), []byte("7"), e.agent)
			// Another job, which must not get the GPU the newer grant holds.
			jobRequest(t, e.s, "8", 1)
			return []string{requestsPrefix + "7", grantsPrefix + "7", gpuKey("a", "0")}
		}, func(t *testing.T, e env) {
			c := pass(t, e)
			if g, ok := c.Grants["8"]; !ok || g.State != GrantGranted {
				t.Fatalf("job 8 was not granted: %+v", c.Grants)
			} else if g.Nodes[0].Devices[0] == "0" {
				t.Error("job 8 was granted GPU a/0, which the newer grant of job 7 holds")
			}
			if _, ok := c.Orphans[gpuKey("a", "0")]; ok {
				t.Error("GPU a/0 taken for an orphan: its grant is a newer gangrun's")
			}
			_, _, err := ReadGrant(ctx, e.s, "7")
			wantNewer(t, "read grant 7", err)
			_, err = HandOver(ctx, e.s, "7", "a", "step session")
			wantNewer(t, "hand job 7's GPUs over to its step", err)
			wantNewer(t, "release node a of job 7", ReleaseNode(ctx, e.s, "7", "a", e.agent))
			wantNewer(t, "release job 7", ReleaseJobIn(ctx, e.s, c, "7"))
			_, _, err = Show(ctx, e.s, "7")
			wantNewer(t, "show 7", err)
		}},
		{schema.Status, func(t *testing.T, e env) []string {
			put(t, e.s, statusKey, newerRecord(t, schema.Status, SchedulerStatus{Leader: "z"}), "")
			return nil // the elected scheduler's own record: it writes it whole at each pass
		}, func(t *testing.T, e env) {
			_, err := ReadStatus(ctx, e.s)
			wantNewer(t, "read the scheduler's status", err)
		}},
		{schema.Usage, func(t *testing.T, e env) []string {
			e.sc.SetPolicy(&policy.Policy{})
			u := policy.NewUsage()
			u.Charge("acct", "alice", 3600)
			put(t, e.s, policy.UsageKey, newerRecord(t, schema.Usage, u), "")
			jobRequest(t, e.s, "7", 1)
			return []string{policy.UsageKey}
		}, func(t *testing.T, e env) {
			c := pass(t, e) // passes an hour apart: the usage is due to be written
			if g, ok := c.Grants["7"]; !ok || g.State != GrantGranted {
				t.Errorf("job 7 was not granted under a policy whose usage is a newer gangrun's: %+v", c.Grants)
			}
			if e.sc.usageNewer == nil {
				t.Error("the scheduler took the newer usage for its own")
			}
			_, err := policy.LoadUsage(ctx, e.s)
			wantNewer(t, "read the usage", err)
		}},
		{schema.Inventory, func(t *testing.T, e env) []string {
			inv := inventory(t, "dgx-h100", "a")
			inv.SchemaVersion = schema.Inventory.Version() + 1
			b, err := json.Marshal(inv)
			if err != nil {
				t.Fatal(err)
			}
			put(t, e.s, inventoryPrefix+"a", b, "")
			return []string{inventoryPrefix + "a"}
		}, func(t *testing.T, e env) {
			c, _ := Snapshot(ctx, e.s)
			_, err := newInventories(e.s).get(ctx, c.Nodes["a"])
			wantNewer(t, "read node a's inventory", err)
		}},
	}
	for _, tc := range cases {
		t.Run(string(tc.kind), func(t *testing.T) {
			s := store.NewMemory()
			agent, err := s.CreateSession(ctx, store.SessionOptions{Name: "agent a", TTL: time.Minute, Behavior: store.DeleteKeys})
			if err != nil {
				t.Fatal(err)
			}
			inv := inventory(t, "dgx-h100", "a")
			data, _ := inv.JSON()
			put(t, s, inventoryPrefix+"a", data, "")
			put(t, s, nodesPrefix+"a", mustRecord(schema.Node, NodeRecord{Name: "a", GPUs: len(inv.GPUs), Devices: inv.Allocatable()}), "")
			put(t, s, alivePrefix+"a", []byte("10.0.0.1"), agent)
			e := env{s: s, sc: NewScheduler(s, SchedulerConfig{Session: leaderSession(t, s), Name: "test"}), agent: agent}
			keys := tc.setup(t, e)
			before := map[string]store.Entry{}
			for _, k := range keys {
				en, err := s.Get(ctx, k)
				if err != nil || en == nil {
					t.Fatalf("%s: %v", k, err)
				}
				before[k] = *en
			}
			tc.check(t, e)
			for _, k := range keys {
				en, err := s.Get(ctx, k)
				switch {
				case err != nil:
					t.Fatal(err)
				case en == nil:
					t.Errorf("%s was deleted", k)
				case !bytes.Equal(en.Value, before[k].Value) || en.ModifyIndex != before[k].ModifyIndex || en.Session != before[k].Session:
					t.Errorf("%s was written over: %s (session %q), was %s (session %q)", k, en.Value, en.Session, before[k].Value, before[k].Session)
				}
			}
		})
	}
}

// TestRecordsWithoutVersionAreRead: records as gangrun wrote them before records
// carried versions (no "schema") are read as version 1: a node, a drain, a job's
// request and grant, and the scheduler's status; and what this gangrun writes carries
// its version.
func TestRecordsWithoutVersionAreRead(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	agent, _ := s.CreateSession(ctx, store.SessionOptions{Name: "agent a", TTL: time.Minute, Behavior: store.DeleteKeys})
	inv := inventory(t, "dgx-h100", "a")
	data, _ := inv.JSON()
	put(t, s, inventoryPrefix+"a", data, "")
	put(t, s, nodesPrefix+"a", mustJSON(NodeRecord{Name: "a", GPUs: len(inv.GPUs), Devices: inv.Allocatable()}), "")
	put(t, s, alivePrefix+"a", []byte("10.0.0.1"), agent)
	put(t, s, drainPrefix+"a", mustJSON(Drain{Reason: "fan"}), "")
	put(t, s, requestsPrefix+"7", mustJSON(JobRequest("7", 1, 1, 1, "", "", nil, 0, nil)), "")
	put(t, s, grantsPrefix+"7", mustJSON(Grant{ID: "7", State: GrantGranted, Nodes: []GrantNode{{Name: "a", GPUs: []int{0}, Devices: []string{"0"}, Session: agent}}}), "")
	put(t, s, gpuKey("a", "0"), []byte("7"), agent)
	put(t, s, statusKey, mustJSON(SchedulerStatus{Leader: "old", Pending: map[string]string{"9": "Resources"}}), "")
	c, err := Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Newer) > 0 {
		t.Fatalf("records without a version taken for newer ones: %v", c.Newer)
	}
	n := c.NodeList()
	if len(n) != 1 || n[0].State != NodeDrained || n[0].Reason != "fan" || n[0].GPUsUsed != 1 || n[0].GPUsTotal != len(inv.Allocatable()) {
		t.Errorf("node a read as %+v", n)
	}
	if r, ok := c.Requests["7"]; !ok || !r.Durable() || !r.Alive {
		t.Errorf("job 7's request read as %+v", r)
	}
	if g, ok := c.Grants["7"]; !ok || g.State != GrantGranted || g.Nodes[0].Session != agent {
		t.Errorf("job 7's grant read as %+v", g)
	}
	if st, err := ReadStatus(ctx, s); err != nil || st.Pending["9"] != "Resources" {
		t.Errorf("the status read as %+v, %v", st, err)
	}
	// Written back by this gangrun: with its version, read the same.
	if err := SetDrain(ctx, s, "a", "fan again"); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, drainPrefix+"a"); e == nil || !bytes.HasPrefix(e.Value, []byte(`{"schema":1,`)) {
		t.Errorf("the drain written: %s, want it to carry schema 1 first", e.Value)
	}
}
