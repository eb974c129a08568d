package job

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/reason"
)

// TestUpdates: scontrol update of a pending job withdraws its request and changes its
// spec (the controller writes the request again, from the new spec); as Slurm, a user
// lowers a time limit and a priority but raises neither, a running job's time limit
// goes to its state for its steps, and its partition and node count are not changed
// (ErrNotPending, ErrNotSupported); bad values are refused with Slurm's
// words, nothing changed; an ended job is ErrFinished; every update is audited, refused
// ones too, whoever's the job is.
func TestUpdates(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNode(t, s, "n1", nil)
	now := time.Now().UTC()
	pend := Job{Spec: Spec{ID: "1", User: "alice", Name: "a", Command: []string{"true"}, WorkDir: "/tmp", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, TimeLimit: time.Hour, Submitted: now},
		State: newState(EvSubmit, "")}
	putJob(t, s, pend)
	reqOps, err := allocator.JobRequestOps(request(pend.Spec, false, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, reqOps); err != nil {
		t.Fatal(err)
	}
	entry := func(user string) func(action, target, owner, detail string) audit.Entry {
		return func(action, target, owner, detail string) audit.Entry {
			return audit.Entry{User: user, Token: "none", Action: action, Target: target, Owner: owner, Detail: detail}
		}
	}
	alice, root := Actor{User: "alice", Entry: entry("alice")}, Actor{User: "root", Admin: true, Entry: entry("root")}
	half, two, name := 30*time.Minute, 2*time.Hour, "renamed"
	if n, err := alice.Update(ctx, s, "1", Update{TimeLimit: &half, Name: &name}); n != 1 || err != nil {
		t.Fatalf("alice lowers her job's time limit: %d, %v", n, err)
	}
	j, _ := Read(ctx, s, "1")
	if e, _ := s.Get(ctx, allocator.RequestKey("1")); j.Spec.TimeLimit != half || j.Spec.Name != name || j.State.Phase() != deferred || e != nil {
		t.Errorf("updated: --time %s, name %q, %s, request %v; want 30m, renamed, %s and no request", j.Spec.TimeLimit, j.Spec.Name, j.State.Phase(), e, deferred)
	}
	if _, err := alice.Update(ctx, s, "1", Update{TimeLimit: &two}); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("alice raises her time limit: %v, want ErrAccessDenied", err)
	}
	prio := 10
	if _, err := alice.Update(ctx, s, "1", Update{Priority: &prio}); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("alice raises her priority: %v, want ErrAccessDenied", err)
	}
	if _, err := alice.Update(ctx, s, "1", Update{Nice: ptr(-5)}); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("alice gives her job a negative nice: %v, want ErrAccessDenied", err)
	}
	if _, err := alice.Update(ctx, s, "1", Update{Nice: ptr(5)}); err != nil {
		t.Errorf("alice's nice 5: %v", err)
	}
	if j, _ = Read(ctx, s, "1"); j.Spec.Nice != 5 || request(j.Spec, false, nil).Priority != -5 {
		t.Errorf("nice 5: spec %d, request priority %d; want 5, -5", j.Spec.Nice, request(j.Spec, false, nil).Priority)
	}
	if n, err := root.Update(ctx, s, "1", Update{TimeLimit: &two, Priority: &prio}); n != 1 || err != nil {
		t.Fatalf("root raises the time limit and priority: %d, %v", n, err)
	}
	if j, _ = Read(ctx, s, "1"); j.Spec.TimeLimit != two || j.Spec.Priority != prio || request(j.Spec, false, nil).Priority != prio-5 {
		t.Errorf("after root's update: --time %s, priority %d", j.Spec.TimeLimit, j.Spec.Priority)
	}
	bad := map[string]struct {
		u    Update
		want error
	}{
		"a partition no node is in": {Update{Partition: ptr("nope")}, ErrInvalidPartition},
		"more nodes than there are": {Update{MinNodes: ptr(4), MaxNodes: ptr(4)}, ErrNodeConfig},
		"a dependency on no job":    {Update{Dependency: ptr("afterok:999")}, ErrDependency},
		"a dependency in no form":   {Update{Dependency: ptr("after:")}, ErrDependency},
	}
	for what, c := range bad {
		if _, err := alice.Update(ctx, s, "1", c.u); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", what, err, c.want)
		}
	}
	if j2, _ := Read(ctx, s, "1"); j2.SpecIndex != j.SpecIndex {
		t.Errorf("a refused update changed the spec: %+v", j2.Spec)
	}
	// Held: it stays held, its spec changed.
	if _, err := alice.Hold(ctx, s, "1", OpHold); err != nil {
		t.Fatal(err)
	}
	putJob(t, s, Job{Spec: Spec{ID: "5", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1}, State: State{Status: Completed}})
	if _, err := alice.Update(ctx, s, "1", Update{Dependency: ptr("afterany:5")}); err != nil {
		t.Fatalf("update of a held job: %v", err)
	}
	if j, _ = Read(ctx, s, "1"); j.State.Phase() != heldUser || len(j.Spec.Dependency) != 1 {
		t.Errorf("held job updated: %s, dependencies %v; want %s and one", j.State.Phase(), j.Spec.Dependency, heldUser)
	}

	run := Job{Spec: Spec{ID: "2", User: "alice", Command: []string{"true"}, WorkDir: "/tmp", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, TimeLimit: time.Hour, Submitted: now},
		State: State{Status: Running, Nodes: []string{"n1"}, Placement: 1}}
	putJob(t, s, run)
	if _, err := alice.Update(ctx, s, "2", Update{Partition: ptr("")}); !errors.Is(err, ErrNotPending) {
		t.Errorf("partition of a running job: %v, want ErrNotPending", err)
	}
	if _, err := alice.Update(ctx, s, "2", Update{TimeLimit: &half}); err != nil {
		t.Errorf("alice lowers her running job's time limit: %v", err)
	}
	if j, _ = Read(ctx, s, "2"); j.State.Status != Running || j.State.TimeLimit == nil || *j.State.TimeLimit != half || j.Spec.TimeLimit != half {
		t.Errorf("running job's time limit lowered: %s, state's %v, spec's %s; want RUNNING, 30m for its steps", j.State.Status, j.State.TimeLimit, j.Spec.TimeLimit)
	}
	if _, err := alice.Update(ctx, s, "2", Update{TimeLimit: &two}); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("alice raises her running job's time limit: %v, want ErrAccessDenied", err)
	}
	if _, err := alice.Update(ctx, s, "2", Update{Name: &name}); err != nil {
		t.Errorf("name of a running job: %v", err)
	}
	if j, _ = Read(ctx, s, "2"); j.State.Status != Running || j.Spec.Name != name {
		t.Errorf("running job renamed: %s, %q", j.State.Status, j.Spec.Name)
	}
	putJob(t, s, Job{Spec: Spec{ID: "3", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1}, State: State{Status: Completed}})
	if _, err := alice.Update(ctx, s, "3", Update{Name: &name}); !errors.Is(err, ErrFinished) {
		t.Errorf("update of an ended job: %v, want ErrFinished", err)
	}
	if _, err := alice.Update(ctx, s, "99", Update{Name: &name}); !errors.Is(err, ErrNotFound) {
		t.Errorf("update of no job: %v, want ErrNotFound", err)
	}
	entries, err := audit.List(ctx, s, now.Add(-time.Minute), "")
	if err != nil {
		t.Fatal(err)
	}
	var done, refused int
	for _, e := range entries {
		switch {
		case e.Action != audit.ActionUpdate:
		case strings.Contains(e.Detail, "refused: "):
			refused++
		default:
			done++
		}
	}
	if done != 6 || refused != 10 {
		t.Errorf("audit: %d updates and %d refusals, want 6 and 10 (none for no job): %+v", done, refused, entries)
	}
}

// TestUpdateTransition: EvUpdate takes a pending or deferred job to deferred, reason
// Priority until the controller looks again, and is refused from any other phase.
func TestUpdateTransition(t *testing.T) {
	for _, p := range []Phase{pending, deferred} {
		st := phaseState(p)
		if err := st.apply(Transition{Event: EvUpdate}); err != nil || st.Phase() != deferred || st.ReasonCode() != reason.Priority {
			t.Errorf("update from %s: %v, %s %s", p, err, st.Phase(), st.ReasonCode())
		}
	}
	for _, p := range []Phase{heldUser, requeue, running} {
		st := phaseState(p)
		if err := st.apply(Transition{Event: EvUpdate}); !errors.Is(err, ErrTransition) {
			t.Errorf("update from %s: %v, want ErrTransition", p, err)
		}
	}
}

// ptr is a pointer to v.
func ptr[T any](v T) *T { return &v }

// TestSubmitQOS: a --qos the cluster's policy has not (or with no policy at all) is
// refused at submit in Slurm's words; one it has goes with the job's request, for the
// policy's QOS priority and limits.
func TestSubmitQOS(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNode(t, s, "n1", nil)
	spec := Spec{User: "alice", Command: []string{"true"}, WorkDir: "/tmp", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, QOS: "high"}
	if _, err := Submit(ctx, s, spec); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Invalid qos specification") {
		t.Errorf("--qos high without a policy: %v, want it refused", err)
	}
	p, err := policy.Parse([]byte(`{"qos": {"high": {"priority": 10}}}`))
	if err != nil {
		t.Fatal(err)
	}
	ops, _, err := policy.SaveOps(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, ops); err != nil {
		t.Fatal(err)
	}
	id, err := Submit(ctx, s, spec)
	if err != nil {
		t.Fatalf("--qos high: %v", err)
	}
	e, _ := s.Get(ctx, allocator.RequestKey(id))
	if e == nil || !strings.Contains(string(e.Value), `"qos":"high"`) {
		t.Errorf("the job's request: %v, want its QOS in it", e)
	}
	spec.QOS = "low"
	if _, err := Submit(ctx, s, spec); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Invalid qos specification") {
		t.Errorf("--qos low, not in the policy: %v, want it refused", err)
	}
}

// TestUpdateDependencyCycle: scontrol update refuses a dependency of a job on itself
// (ErrDependency, as slurmctld; an array task on its array too) and one that closes a
// loop through other pending jobs' dependencies (ErrCircular), which would wait
// forever; a chain without a loop, and one through an ended job, are taken.
func TestUpdateDependencyCycle(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNode(t, s, "n1", nil)
	now := time.Now().UTC()
	for _, id := range []string{"10", "11", "12", "13_1"} {
		putJob(t, s, Job{Spec: Spec{ID: id, User: "alice", Command: []string{"true"}, WorkDir: "/tmp", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, TimeLimit: time.Hour, Submitted: now},
			State: newState(EvSubmit, "")})
	}
	putJob(t, s, Job{Spec: Spec{ID: "14", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Dependency: []Dependency{{Type: AfterOK, IDs: []string{"10"}}}}, State: State{Status: Completed}})
	alice := Actor{User: "alice", Entry: func(action, target, owner, detail string) audit.Entry {
		return audit.Entry{User: "alice", Token: "none", Action: action, Target: target, Owner: owner, Detail: detail}
	}}
	steps := []struct {
		id, dep string
		want    error
	}{
		{"10", "afterok:10", ErrDependency},
		{"13_1", "afterok:13", ErrDependency},
		{"10", "afterok:11", nil},
		{"11", "afterok:10", ErrCircular},
		{"11", "afterany:12", nil},
		{"12", "afterok:13_1?afternotok:10", ErrCircular}, // 12 -> 10 -> 11 -> 12
		{"12", "afterok:13_1", nil},
		{"13_1", "afterok:14", nil}, // 14 waited on 10, but has ended
		{"13_1", "singleton", nil},
	}
	for _, st := range steps {
		_, err := alice.Update(ctx, s, st.id, Update{Dependency: ptr(st.dep)})
		if st.want == nil && err != nil || st.want != nil && !errors.Is(err, st.want) {
			t.Errorf("job %s Dependency=%s: %v, want %v", st.id, st.dep, err, st.want)
		}
	}
	if j, _ := Read(ctx, s, "11"); FormatDependencies(j.Spec.Dependency) != "afterany:12" {
		t.Errorf("job 11's dependency after the refusals: %s, want afterany:12", FormatDependencies(j.Spec.Dependency))
	}
}

// TestUpdateWaitsForTheAttestation: an update of a job whose credential the cluster has
// not checked yet (scontrol update straight after sbatch) waits for the attestation and
// is made, as slurmctld takes it at once, rather than refused.
func TestUpdateWaitsForTheAttestation(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	registerNode(t, s, "n1", nil)
	spec := Spec{ID: "1", User: "alice", Name: "a", Command: []string{"true"}, WorkDir: "/tmp", MinNodes: 1, MaxNodes: 1,
		GPUsPerNode: 1, TimeLimit: time.Hour, Submitted: time.Now().UTC()}
	writeJob(t, s, spec, &Auth{Credential: "cred"})
	go func() {
		time.Sleep(300 * time.Millisecond) // the controller's check, a moment later
		e, err := s.Get(ctx, authKey("1"))
		if err != nil || e == nil {
			return
		}
		var a Auth
		if json.Unmarshal(e.Value, &a) != nil {
			return
		}
		a.Attestation = "attested"
		b, _ := json.Marshal(a)
		_, _ = s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: authKey("1"), Value: b, Index: e.ModifyIndex}})
	}()
	resealed := 0
	reseal := func(context.Context, Spec, Auth) (string, error) { resealed++; return "attested again", nil }
	half := 30 * time.Minute
	if n, err := DoUpdate(ctx, s, "1", Update{TimeLimit: &half}, false, reseal); n != 1 || err != nil {
		t.Fatalf("update of a job not attested yet: %d, %v; want it made once the attestation comes", n, err)
	}
	if j, _ := Read(ctx, s, "1"); j.Spec.TimeLimit != half || resealed != 1 {
		t.Errorf("updated: --time %s, resealed %d times; want 30m, once", j.Spec.TimeLimit, resealed)
	}
}
