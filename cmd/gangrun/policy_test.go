package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/reason"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/policy"
)

// setPolicy writes doc to a file and runs `gangrun policy set` on it.
func (c *jobCluster) setPolicy(doc string) {
	c.t.Helper()
	f := filepath.Join(c.t.TempDir(), "policy.json")
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if code, _, errOut := c.gangrun("policy", "set", f); code != 0 {
		c.t.Fatalf("policy set: exit %d: %s", code, errOut)
	}
}

// reason returns job id's pending reason as `gangrun queue --json` shows it.
func (c *jobCluster) reason(id string) string {
	c.t.Helper()
	code, out, errOut := c.gangrun("queue", "--json")
	if code != 0 {
		c.t.Fatalf("queue: exit %d: %s", code, errOut)
	}
	var q []job.Entry
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		c.t.Fatal(err)
	}
	for _, e := range q {
		if e.ID == id {
			return e.Reason
		}
	}
	return ""
}

// TestUserOverMaxGPUsWaitsWithTheReason: alice at her account's max_gpus_per_user waits
// PENDING with QOSMaxGRESPerUser while bob's job starts on the GPUs left; raising the
// limit lets hers start on the next pass.
func TestUserOverMaxGPUsWaitsWithTheReason(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	unixUsers(t, "alice", "bob", "eve") // the jobs run as their users
	t.Chdir(sharedDir(t))
	c.setPolicy(`{"accounts": {"ml": {"max_gpus_per_user": 4, "users": {"alice": {}, "bob": {}}}}}`)
	first := c.submit("--uid", "alice", "--gpus-per-node", "4", "--", "sleep", "300")
	c.waitState(first, job.Running, 60*time.Second)
	second := c.submit("--uid", "alice", "--gpus-per-node", "4", "--", "sleep", "300")
	waitUntilFor(t, 30*time.Second, func() bool { return strings.HasPrefix(c.reason(second), string(reason.QOSMaxGRESPerUser)+":") },
		"alice's second job pending with "+string(reason.QOSMaxGRESPerUser))
	if m := c.show(second); m["account"] != "ml" {
		t.Errorf("alice's default account: %v, want ml (her only account)", m["account"])
	} else if r, _ := m["reason"].(string); !strings.HasPrefix(r, string(reason.QOSMaxGRESPerUser)+":") {
		t.Errorf("show's reason %q, want queue's (%s: ...)", r, string(reason.QOSMaxGRESPerUser))
	}
	bobs := c.submit("--uid", "bob", "--gpus-per-node", "4", "--", "sleep", "300")
	c.waitState(bobs, job.Running, 60*time.Second)
	if m := c.show(second); m["state"] != string(job.Pending) {
		t.Fatalf("alice's second job: %v, want PENDING", m["state"])
	}
	_, q, _ := c.gangrun("queue")
	if !strings.Contains(q, "(QOSMaxGRESPerUser: alice holds 4 of 4 GPUs in account ml") {
		t.Errorf("queue does not show the reason:\n%s", q)
	}
	c.setPolicy(`{"accounts": {"ml": {"max_gpus_per_user": 8, "users": {"alice": {}, "bob": {}}}}}`)
	c.waitState(second, job.Running, 60*time.Second)
	// Someone outside the account is refused at submission, with exit code 2.
	if code, _, errOut := c.gangrun("submit", "--uid", "eve", "--account", "ml", "--", "true"); code != 2 || !strings.Contains(errOut, `--account "ml": user eve is not a user of the account`) {
		t.Errorf("eve's submit: exit %d: %s", code, errOut)
	}
	for _, id := range []string{first, second, bobs} {
		c.gangrun("cancel", id)
	}
	for _, id := range []string{first, second, bobs} {
		c.waitState(id, job.Cancelled, 60*time.Second)
	}
}

// TestFairShareOrdersTheHeavyUserAfterTheLight: with the fair-share weight set and a
// recorded usage that makes heavy's account over-served (all of the usage on one of
// three equal shares: F = 2^(-1/(1/3)) = 0.125), light's job, submitted after
// heavy's, is ranked first (queue --priority) and gets the GPUs when they come free.
func TestFairShareOrdersTheHeavyUserAfterTheLight(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	unixUsers(t, "heavy", "light") // the jobs run as their users
	t.Chdir(sharedDir(t))
	// The usage first: the scheduler reads it when it first passes under a policy.
	s, err := store.NewConsul(c.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u, _ := json.Marshal(policy.Usage{Updated: time.Now().UTC(), Accounts: map[string]float64{"hpc": 3.6e6}, Users: map[string]float64{"hpc/heavy": 3.6e6}})
	if _, err := s.Txn(context.Background(), []store.Op{{Verb: store.Set, Key: policy.UsageKey, Value: u}}); err != nil {
		t.Fatal(err)
	}
	c.setPolicy(`{"priority": {"weights": {"fairshare": 10000, "age": 10}},
		"accounts": {"hpc": {"users": {"heavy": {}}}, "lab": {"users": {"light": {}}}, "ops": {}}}`)
	blocker := c.submit("--uid", "root", "--account", "ops", "--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	c.waitState(blocker, job.Running, 60*time.Second)
	heavy := c.submit("--uid", "heavy", "--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	light := c.submit("--uid", "light", "--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	code, out, errOut := c.gangrun("queue", "--priority", "--json")
	if code != 0 {
		t.Fatalf("queue --priority: exit %d: %s", code, errOut)
	}
	var prio []job.PriorityEntry
	if err := json.Unmarshal([]byte(out), &prio); err != nil {
		t.Fatal(err)
	}
	if len(prio) != 2 || prio[0].ID != light || prio[1].ID != heavy || !(prio[1].Factors.FairShare < 0.2 && prio[0].Factors.FairShare == 1) {
		t.Fatalf("queue --priority: want light (%s, fair-share 1) before heavy (%s, fair-share about 2^-3: all the usage on 1 of 3 shares):\n%s", light, heavy, out)
	}
	_, table, _ := c.gangrun("queue", "--priority")
	if !strings.Contains(table, "FAIRSHARE") || !strings.Contains(table, "10000") {
		t.Errorf("queue --priority table:\n%s", table)
	}
	c.gangrun("cancel", blocker)
	c.waitState(light, job.Running, 90*time.Second)
	if m := c.show(heavy); m["state"] != string(job.Pending) {
		t.Errorf("heavy's job: %v, want PENDING behind light's", m["state"])
	}
	for _, id := range []string{heavy, light} {
		c.gangrun("cancel", id)
	}
	c.waitState(light, job.Cancelled, 60*time.Second)
}

// TestAllocCountsAgainstTheUsersLimit: an allocation is its user's, as a job is: with
// max_gpus_per_user 4 in the user's account, an alloc holding 4 GPUs keeps the same
// user's job pending with the limit's reason until the alloc ends.
func TestAllocCountsAgainstTheUsersLimit(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	t.Chdir(t.TempDir())
	me := currentUser()
	c.setPolicy(`{"accounts": {"ml": {"max_gpus_per_user": 4, "users": {"` + me + `": {}}}}}`)
	alloc := exec.Command(gangrunBin, "alloc", "--consul", c.consul, "--gpus-per-node", "4", "--", "sleep", "300")
	alloc.Env = append(os.Environ(), c.mark)
	var out syncBuffer
	alloc.Stdout, alloc.Stderr = &out, &out
	if err := alloc.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = alloc.Wait(); close(done) }()
	t.Cleanup(func() { _ = alloc.Process.Signal(syscall.SIGTERM); <-done })
	waitUntilFor(t, 60*time.Second, func() bool {
		free, total := freeGPUs(nodesJSON(t, c.consul))
		return total-free == 4
	}, "the alloc holding 4 GPUs")
	id := c.submit("--gpus-per-node", "4", "--", "true")
	waitUntilFor(t, 30*time.Second, func() bool { return strings.HasPrefix(c.reason(id), string(reason.QOSMaxGRESPerUser)+":") },
		"the job pending with "+string(reason.QOSMaxGRESPerUser)+" while the alloc holds the user's 4 GPUs")
	if r := c.reason(id); !strings.Contains(r, me+" holds 4 of 4 GPUs in account ml") {
		t.Errorf("reason %q does not count the alloc's GPUs as %s's in ml", r, me)
	}
	_ = alloc.Process.Signal(syscall.SIGTERM)
	<-done
	c.waitState(id, job.Completed, 90*time.Second)
}
