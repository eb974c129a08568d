package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// TestVersion: gangrun version prints the release, the commit and every record kind's
// schema; --json the same for tools.
func TestVersion(t *testing.T) {
	code, out, errOut := inProcess("version")
	if code != 0 || !strings.HasPrefix(out, "gangrun "+gangrun.Version()+" (commit ") {
		t.Fatalf("version: exit %d\n%s%s", code, out, errOut)
	}
	for _, k := range schema.Kinds() {
		if !strings.Contains(out, "  "+string(k)+" ") {
			t.Errorf("version does not list %q:\n%s", k, out)
		}
	}
	code, out, _ = inProcess("version", "--json")
	var v struct {
		Version string         `json:"version"`
		Commit  string         `json:"commit"`
		Schemas map[string]int `json:"schemas"`
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Version != gangrun.Version() || v.Commit == "" || len(v.Schemas) != len(schema.Kinds()) {
		t.Errorf("version --json: exit %d, %+v, %v\n%s", code, v, err, out)
	}
	if semver(gangrun.Version()) == nil {
		t.Errorf("VERSION %q is not X.Y.Z", gangrun.Version())
	}
}

// TestCommandsShowNewerRecords: on a real Consul with an elected agent, a job whose spec
// a newer gangrun wrote and a node whose record a newer gangrun wrote are shown by
// queue, show and nodes with the reason, and left alone: the job is not run, cancel
// refuses it with the reason, the node takes no job; neither record changes.
func TestCommandsShowNewerRecords(t *testing.T) {
	consul := consultest.Start(t).Addr
	startAgentWith(t, consul, "gpu-a", nil)
	waitUntilFor(t, 60*time.Second, func() bool { n := nodesJSON(t, consul); return len(n) == 1 && n[0].State == "up" }, "gpu-a up")
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	spec, _ := schema.MarshalVersion(schema.JobSpec, 2, job.Spec{ID: "900", Name: "from-the-future", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Command: []string{"true"}, WorkDir: "/tmp"})
	state, _ := schema.Marshal(schema.JobState, job.State{Status: job.Pending, Reason: "Priority"})
	req, _ := schema.Marshal(schema.Request, allocator.JobRequest("900", 1, 1, 1, "", "", nil, 0, nil))
	node, _ := schema.MarshalVersion(schema.Node, 2, allocator.NodeRecord{Name: "gpu-z"})
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "agent gpu-z", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]byte{"gangrun/batch/jobs/900/spec": spec, "gangrun/batch/jobs/900/state": state,
		allocator.RequestKey("900"): req, allocator.ClusterPrefix + "nodes/gpu-z": node}
	ops := []store.Op{{Verb: store.Lock, Key: allocator.ClusterPrefix + "alive/gpu-z", Value: []byte("127.0.0.2"), Session: sess}}
	for k, v := range keys {
		ops = append(ops, store.Op{Verb: store.Set, Key: k, Value: v})
	}
	if _, err := s.Txn(ctx, ops); err != nil {
		t.Fatal(err)
	}
	const reason = "written by a newer gangrun (schema 2; this one reads up to 1)"

	code, out, errOut := inProcess("queue", "--consul", consul)
	if code != 0 || !strings.Contains(out, "900") || !strings.Contains(out, "job 900: job spec "+reason) {
		t.Errorf("queue: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = inProcess("queue", "--consul", consul, "--json")
	var q []job.Entry
	if err := json.Unmarshal([]byte(out), &q); code != 0 || err != nil || len(q) != 1 || q[0].ID != "900" || q[0].State != job.Pending || !strings.Contains(q[0].Reason, reason) {
		t.Errorf("queue --json: exit %d, %+v, %v", code, q, err)
	}
	code, _, errOut = inProcess("show", "--consul", consul, "900")
	if code != 1 || errOut != "gangrun show: job 900: job spec "+reason+"\n" {
		t.Errorf("show 900: exit %d: %q", code, errOut)
	}
	code, out, _ = inProcess("nodes", "--consul", consul)
	if code != 0 || !strings.Contains(out, "gpu-z") || !strings.Contains(out, "inval") || !strings.Contains(out, "node record "+reason) {
		t.Errorf("nodes: exit %d\n%s", code, out)
	}
	for _, n := range nodesJSON(t, consul) {
		if n.Name == "gpu-z" && (n.State != allocator.NodeInval || !strings.Contains(n.Reason, reason)) {
			t.Errorf("nodes --json: gpu-z %+v", n)
		}
		if n.Name == "gpu-a" && n.Version != gangrun.Version() {
			t.Errorf("nodes --json: gpu-a runs release %q, want %s", n.Version, gangrun.Version())
		}
	}
	code, _, errOut = inProcess("cancel", "--consul", consul, "900")
	if code == 0 || !strings.Contains(errOut, reason) {
		t.Errorf("cancel 900: exit %d: %s", code, errOut)
	}
	// The elected agent's passes leave both alone.
	time.Sleep(3 * time.Second)
	for k, v := range keys {
		e, err := s.Get(ctx, k)
		if err != nil || e == nil || !bytes.Equal(e.Value, v) {
			t.Errorf("%s: %+v, %v; want it as the newer gangrun wrote it", k, e, err)
		}
	}
	if e, _ := s.Get(ctx, allocator.GrantKey("900")); e != nil {
		// The request is this gangrun's (schema 1): the scheduler may grant it, but the
		// job is not started on it.
		if steps, _ := job.Steps(ctx, s, "900"); len(steps) != 0 {
			t.Errorf("job 900 has steps: %v", steps)
		}
	}
}
