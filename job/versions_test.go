package job

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// newer is v as a record of kind k one schema newer than this gangrun reads.
func newer(t testing.TB, k schema.Kind, v any) []byte {
	t.Helper()
	b, err := schema.MarshalVersion(k, k.Version()+1, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// set writes key=value, locked by session when given.
func set(t testing.TB, s store.Store, key string, value []byte, session string) {
	t.Helper()
	op := store.Op{Verb: store.Set, Key: key, Value: value}
	if session != "" {
		op.Verb, op.Session = store.Lock, session
	}
	if _, err := s.Txn(context.Background(), []store.Op{op}); err != nil {
		t.Fatal(err)
	}
}

// versionCluster is a one-node cluster on the in-memory store: node a (a recorded DGX
// H100) up under its agent's session, and a leader session with a scheduler and a job
// controller that the test drives pass by pass.
type versionCluster struct {
	s     store.Store
	agent string
	sc    *allocator.Scheduler
	c     *Controller
}

func newVersionCluster(t *testing.T) *versionCluster {
	t.Helper()
	ctx := context.Background()
	s := store.NewMemory()
	agent, err := s.CreateSession(ctx, store.SessionOptions{Name: "agent a", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv.Node = "a"
	data, err := inv.JSON()
	if err != nil {
		t.Fatal(err)
	}
	set(t, s, "gangrun/inventory/a", data, "")
	rec, _ := schema.Marshal(schema.Node, allocator.NodeRecord{Name: "a", Addr: "127.0.0.1", GPUs: len(inv.GPUs), Devices: inv.Allocatable()})
	set(t, s, allocator.ClusterPrefix+"nodes/a", rec, "")
	set(t, s, allocator.ClusterPrefix+"alive/a", []byte("127.0.0.1"), agent)
	leader, err := s.CreateSession(ctx, store.SessionOptions{Name: "leader", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	set(t, s, throughputLeaderKey, []byte("a"), leader)
	return &versionCluster{s: s, agent: agent,
		sc: allocator.NewScheduler(s, allocator.SchedulerConfig{Session: leader, Name: "a"}),
		c:  &Controller{s: s, rdzv: s, session: leader, log: zap.NewNop(), events: event.Or(nil), now: time.Now, minJobAge: time.Second}}
}

// passes runs the scheduler's and the controller's passes a few times over.
func (vc *versionCluster) passes(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for range 3 {
		cl, err := allocator.Snapshot(ctx, vc.s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := vc.sc.Pass(ctx, cl); err != nil {
			t.Fatalf("scheduler pass: %v", err)
		}
		if err := vc.c.Pass(ctx); err != nil {
			t.Fatalf("controller pass: %v", err)
		}
	}
}

// wantRefused fails unless err refuses a record a newer gangrun wrote, with the reason.
func wantRefused(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, schema.ErrNewer) || !strings.Contains(err.Error(), "written by a newer gangrun (schema 2; this one reads up to 1)") {
		t.Errorf("%s: %v, want the refusal of a record written by a newer gangrun", what, err)
	}
}

// TestNewerJobRecordsAreRefusedAndLeftAlone: for each record kind of a job, a record one
// schema newer than this gangrun reads is refused with its reason and left as it is by
// the scheduler's and the controller's passes, by cancel (directly and through a
// request box), by `gangrun queue` and `show` (which list the job with the reason), and
// by the elected agent's keepers (replay markers, request boxes, accounting folds).
func TestNewerJobRecordsAreRefusedAndLeftAlone(t *testing.T) {
	ctx := context.Background()
	spec := Spec{ID: "7", Name: "train", User: "alice", Command: []string{"true"}, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1,
		WorkDir: "/tmp", Submitted: time.Now().UTC().Add(-time.Hour)}
	pending := State{Status: Pending, Reason: "Priority"}
	// writeJob writes job 7 as Submit would, each record through rec (which may make it
	// newer), and its request.
	writeJob := func(t *testing.T, s store.Store, sp, st, auth []byte) {
		ops := []store.Op{{Verb: store.Set, Key: specKey("7"), Value: sp}, {Verb: store.Set, Key: stateKey("7"), Value: st}}
		if auth != nil {
			ops = append(ops, store.Op{Verb: store.Set, Key: authKey("7"), Value: auth})
		}
		req, err := allocator.JobRequestOps(request(spec, false, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, append(ops, req...)); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(k schema.Kind, v any) []byte { b, _ := schema.Marshal(k, v); return b }
	// refusedJob checks what every reader makes of job 7 when its spec, state or auth is
	// newer: nothing run, the reason shown.
	refusedJob := func(t *testing.T, vc *versionCluster, wantState Status) {
		vc.passes(t)
		_, err := Read(ctx, vc.s, "7")
		wantRefused(t, "read job 7", err)
		_, err = Cancel(ctx, vc.s, "7")
		wantRefused(t, "cancel job 7", err)
		a, _, err := cancelFor(ctx, vc.s, nil, asker{user: "alice"}, "7")
		if err != nil || !strings.Contains(a.Error, "written by a newer gangrun") {
			t.Errorf("cancel of job 7 through a request box: %+v, %v; want an answer with the reason", a, err)
		}
		q, err := Queue(ctx, vc.s, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(q) != 1 || q[0].ID != "7" || q[0].State != wantState || !strings.Contains(q[0].Reason, "job 7: job ") ||
			!strings.Contains(q[0].Reason, "written by a newer gangrun (schema 2; this one reads up to 1)") {
			t.Errorf("gangrun queue: %+v, want job 7 %s with the reason", q, wantState)
		}
		if placed, _, _ := vc.s.List(ctx, placedPrefix); len(placed) != 0 {
			t.Errorf("job 7 was placed to run: %v", placed)
		}
		if steps, _ := Steps(ctx, vc.s, "7"); len(steps) != 0 {
			t.Errorf("job 7 has steps: %v", steps)
		}
	}
	cases := []struct {
		kind  schema.Kind
		setup func(t *testing.T, vc *versionCluster) []string // the newer records' keys
		check func(t *testing.T, vc *versionCluster)
	}{
		{schema.JobSpec, func(t *testing.T, vc *versionCluster) []string {
			// Ended long ago by its state: still not removed (MinJobAge) by a reader
			// that cannot read its spec.
			done := State{Status: Completed, Started: time.Now().Add(-time.Hour), Ended: time.Now().Add(-time.Hour)}
			writeJob(t, vc.s, newer(t, schema.JobSpec, spec), rec(schema.JobState, pending), nil)
			set(t, vc.s, stateKey("7"), rec(schema.JobState, done), "")
			return []string{specKey("7"), stateKey("7")}
		}, func(t *testing.T, vc *versionCluster) {
			refusedJob(t, vc, Completed)
		}},
		{schema.JobState, func(t *testing.T, vc *versionCluster) []string {
			writeJob(t, vc.s, rec(schema.JobSpec, spec), newer(t, schema.JobState, pending), nil)
			return []string{specKey("7"), stateKey("7")}
		}, func(t *testing.T, vc *versionCluster) {
			refusedJob(t, vc, Unknown)
		}},
		{schema.JobAuth, func(t *testing.T, vc *versionCluster) []string {
			writeJob(t, vc.s, rec(schema.JobSpec, spec), rec(schema.JobState, pending), newer(t, schema.JobAuth, Auth{Credential: "MUNGE:x"}))
			return []string{specKey("7"), stateKey("7"), authKey("7")}
		}, func(t *testing.T, vc *versionCluster) {
			refusedJob(t, vc, Pending)
		}},
		{schema.JobStep, func(t *testing.T, vc *versionCluster) []string {
			// Running on node a for an hour, its step holding the node's GPUs: the step's
			// newer record is a step that runs, not a lost node.
			step, _ := vc.s.CreateSession(ctx, store.SessionOptions{Name: "step", TTL: time.Minute, Behavior: store.DeleteKeys})
			long := time.Now().UTC().Add(-time.Hour)
			running := State{Status: Running, Nodes: []string{"a"}, NodesSince: long, Placement: 1, Started: long, PlacedAt: long,
				AgentSessions: map[string]string{"a": vc.agent}}
			writeJob(t, vc.s, rec(schema.JobSpec, spec), rec(schema.JobState, running), nil)
			g := allocator.Grant{ID: "7", State: allocator.GrantGranted, Granted: long,
				Nodes: []allocator.GrantNode{{Name: "a", GPUs: []int{0}, Devices: []string{"0"}, Session: step}}}
			set(t, vc.s, allocator.GrantKey("7"), rec(schema.Grant, g), "")
			set(t, vc.s, allocator.ClusterPrefix+"gpus/a/0", []byte("7"), step)
			set(t, vc.s, stepKey("7", "a"), newer(t, schema.JobStep, StepRecord{Node: "a", Placement: 1}), step)
			return []string{stepKey("7", "a")}
		}, func(t *testing.T, vc *versionCluster) {
			vc.passes(t)
			j, err := Read(ctx, vc.s, "7")
			if err != nil || j.State.Status != Running || len(j.State.LostNodes) != 0 {
				t.Errorf("job 7 with a newer step record: %+v, %v; want RUNNING, no node lost", j.State, err)
			}
			if steps, err := Steps(ctx, vc.s, "7"); err != nil || len(steps) != 1 || steps["a"].Node != "a" {
				t.Errorf("the steps of job 7: %v, %v; want node a's", steps, err)
			}
		}},
		{schema.IdleMark, func(t *testing.T, vc *versionCluster) []string {
			writeJob(t, vc.s, rec(schema.JobSpec, spec), rec(schema.JobState, State{Status: Running, Nodes: []string{"a"}}), nil)
			set(t, vc.s, idleKey("7", "a"), newer(t, schema.IdleMark, IdleMark{Node: "a", GPUs: []int{0}}), vc.agent)
			return []string{idleKey("7", "a")}
		}, func(t *testing.T, vc *versionCluster) {
			j, err := Read(ctx, vc.s, "7")
			if err != nil || len(j.Idle) != 0 {
				t.Errorf("job 7 with a newer idle mark: %+v, %v; want it read, the mark left out", j, err)
			}
		}},
		{schema.CredentialSeen, func(t *testing.T, vc *versionCluster) []string {
			set(t, vc.s, seenPrefix+"abc", newer(t, schema.CredentialSeen, seenMark{Job: "1", Expires: time.Now().Add(-time.Hour)}), "")
			return []string{seenPrefix + "abc"}
		}, func(t *testing.T, vc *versionCluster) {
			if err := vc.c.purgeSeen(ctx, time.Now()); err != nil {
				t.Fatal(err)
			}
		}},
		{schema.RequestBox, func(t *testing.T, vc *versionCluster) []string {
			text, _ := json.Marshal(Request{Kind: requestCancel, Job: "1"})
			key := acl.UserPrefix("alice") + "cancel-1-x"
			old := &Answer{At: time.Now().Add(-time.Hour)} // answered long ago: a box this gangrun reads would go
			set(t, vc.s, key, newer(t, schema.RequestBox, boxed{Request: text}), "")
			set(t, vc.s, key+"-answered", newer(t, schema.RequestBox, boxed{Request: text, Answer: old}), "")
			return []string{key, key + "-answered"}
		}, func(t *testing.T, vc *versionCluster) {
			sv := &server{s: vc.s, fence: allocator.LeaderFence(vc.c.session), log: vc.c.log}
			entries, _, _ := vc.s.List(ctx, acl.UsersPrefix)
			for _, e := range entries {
				if err := sv.serve(ctx, e); err != nil {
					t.Errorf("serve %s: %v", e.Key, err)
				}
			}
		}},
		{schema.AcctRecord, func(t *testing.T, vc *versionCluster) []string {
			ended := time.Now().UTC().Add(-60 * 24 * time.Hour)
			r := Record{ID: "7", User: "alice", Account: "a", State: Completed, Ended: ended, GPUSeconds: 10}
			set(t, vc.s, acctJobKey(dayOf(ended), "7"), newer(t, schema.AcctRecord, r), "")
			return []string{acctJobKey(dayOf(ended), "7")}
		}, func(t *testing.T, vc *versionCluster) {
			now := time.Now()
			if n, err := Fold(ctx, vc.s, nil, now.Add(-DefaultAcctRetention), now); err != nil || n != 0 {
				t.Errorf("fold: %d, %v; want nothing folded", n, err)
			}
			rs, err := Records(ctx, vc.s, now.Add(-90*24*time.Hour), now, Filter{})
			if err != nil || len(rs) != 0 {
				t.Errorf("records: %+v, %v; want the newer one left out", rs, err)
			}
		}},
		{schema.AcctRollup, func(t *testing.T, vc *versionCluster) []string {
			ended := time.Now().UTC().Add(-60 * 24 * time.Hour)
			day := dayOf(ended)
			set(t, vc.s, acctDailyKey(day), newer(t, schema.AcctRollup, Rollup{Day: day}), "")
			// A record of that day this gangrun reads: not folded into the newer rollup.
			r := Record{ID: "7", User: "alice", Account: "a", State: Completed, Ended: ended, GPUSeconds: 10}
			set(t, vc.s, acctJobKey(day, "7"), rec(schema.AcctRecord, r), "")
			return []string{acctDailyKey(day), acctJobKey(day, "7")}
		}, func(t *testing.T, vc *versionCluster) {
			now := time.Now()
			n, err := Fold(ctx, vc.s, nil, now.Add(-DefaultAcctRetention), now)
			if n != 0 {
				t.Errorf("fold folded %d records into a newer rollup", n)
			}
			wantRefused(t, "fold", err)
		}},
	}
	for _, tc := range cases {
		t.Run(string(tc.kind), func(t *testing.T) {
			vc := newVersionCluster(t)
			keys := tc.setup(t, vc)
			before := map[string]store.Entry{}
			for _, k := range keys {
				e, err := vc.s.Get(ctx, k)
				if err != nil || e == nil {
					t.Fatalf("%s: %v", k, err)
				}
				before[k] = *e
			}
			tc.check(t, vc)
			for _, k := range keys {
				e, err := vc.s.Get(ctx, k)
				switch {
				case err != nil:
					t.Fatal(err)
				case e == nil:
					t.Errorf("%s was deleted", k)
				case !bytes.Equal(e.Value, before[k].Value) || e.ModifyIndex != before[k].ModifyIndex:
					t.Errorf("%s was written over: %s, was %s", k, e.Value, before[k].Value)
				}
			}
		})
	}
}

// TestJobWithoutVersionsRuns: a job whose records carry no schema version (as gangrun
// wrote them before 0.1.0) is read as version 1: placed, started, and written back with
// the version.
func TestJobWithoutVersionsRuns(t *testing.T) {
	ctx := context.Background()
	vc := newVersionCluster(t)
	spec := Spec{ID: "7", Name: "train", User: "alice", Command: []string{"true"}, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, WorkDir: "/tmp"}
	putJob(t, vc.s, Job{Spec: spec, State: State{Status: Pending, Reason: "Priority"}}) // plain JSON
	req, _ := json.Marshal(request(spec, false, nil))
	set(t, vc.s, allocator.RequestKey("7"), req, "")
	vc.passes(t)
	j, err := Read(ctx, vc.s, "7")
	if err != nil || j.State.Status != Running || len(j.State.Nodes) != 1 {
		t.Fatalf("job 7: %+v, %v; want RUNNING on node a", j, err)
	}
	e, _ := vc.s.Get(ctx, stateKey("7"))
	if v, err := schema.Of(e.Value); err != nil || v != schema.JobState.Version() || !bytes.HasPrefix(e.Value, []byte(`{"schema":`)) {
		t.Errorf("job 7's state written back as %s, want it to carry its schema first", e.Value)
	}
	if e, _ := vc.s.Get(ctx, specKey("7")); bytes.Contains(e.Value, []byte(`"schema"`)) {
		t.Errorf("job 7's spec was written again: %s", e.Value)
	}
}
