package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// aclCluster is a Consul dev agent with ACLs on and default deny, and what a test
// printed or served, kept to be searched for the tokens' secrets.
type aclCluster struct {
	t       *testing.T
	consul  *consultest.Agent
	outputs []string
}

// as runs `gangrun ARGS --consul ADDR` as a separate process with token (the secret in
// CONSUL_HTTP_TOKEN; "" for none) and keeps its output.
func (c *aclCluster) as(token string, args ...string) gangrunResult {
	c.t.Helper()
	r := runGangrun(c.t, []string{"CONSUL_HTTP_TOKEN=" + token, "CONSUL_HTTP_TOKEN_FILE="},
		append([]string{args[0], "--consul", c.consul.Addr}, args[1:]...)...)
	c.outputs = append(c.outputs, r.stdout, r.stderr)
	return r
}

// asFile is as with the token in a file (CONSUL_HTTP_TOKEN_FILE), as agents and
// operators keep it.
func (c *aclCluster) asFile(file string, args ...string) gangrunResult {
	c.t.Helper()
	r := runGangrun(c.t, []string{"CONSUL_HTTP_TOKEN=", "CONSUL_HTTP_TOKEN_FILE=" + file},
		append([]string{args[0], "--consul", c.consul.Addr}, args[1:]...)...)
	c.outputs = append(c.outputs, r.stdout, r.stderr)
	return r
}

// state is job id's state as `gangrun show --json` tells token's holder.
func (c *aclCluster) state(token, id string) string {
	c.t.Helper()
	r := c.as(token, "show", "--json", id)
	if r.code != 0 {
		c.t.Fatalf("show %s: exit %d: %s", id, r.code, r.stderr)
	}
	var m struct{ State string }
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		c.t.Fatalf("show --json: %v\n%s", err, r.stdout)
	}
	return m.State
}

// refused checks that r is a refusal: exit 2, one line on stderr holding want.
func refused(t *testing.T, what string, r gangrunResult, want string) {
	t.Helper()
	if r.code != 2 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("%s: exit %d, stderr %q; want exit 2 and one line with %q", what, r.code, r.stderr, want)
	}
}

// TestACLCluster: against a real Consul dev agent with ACLs on and default deny, and a
// real `gangrun agent` holding the agents' token, the operator bootstraps the policies
// and tokens (`gangrun acl bootstrap`, `gangrun acl user`); a job alice submits with
// her token is placed and runs to COMPLETED; bob's token is refused cancelling alice's
// job, draining a node, setting the policy, submitting as alice and writing alice's
// keys, each with one clear line and exit 2 (the scheduler and the agent carry on); the
// operator drains, resumes, sets the policy and cancels alice's job, and `gangrun audit`
// lists each of those, with who, from where and whose job, and bob's refused cancel;
// alice's cancel of her own job
// is no administrative action. No secret appears in any output, the agent's log or its
// metrics.
func TestACLCluster(t *testing.T) {
	c := &aclCluster{t: t, consul: consultest.StartACL(t)}
	mgmt := c.consul.ManagementToken
	inventory := filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json")
	// The users' jobs run as their Unix users (alice, bob), in a directory they may
	// write; the tokens are in root's own.
	unixUsers(t, "alice", "bob")
	dir := sharedDir(t)
	t.Chdir(dir)

	// Bootstrap: the tokens go into files of mode 0600, a user's onto stdout once.
	tokDir := filepath.Join(t.TempDir(), "tokens")
	if r := c.as(mgmt, "acl", "bootstrap", "--out", tokDir); r.code != 0 {
		t.Fatalf("acl bootstrap: exit %d: %s", r.code, r.stderr)
	}
	secret := map[string]string{"management": mgmt}
	for _, n := range []string{"agent", "operator"} {
		f := filepath.Join(tokDir, n+".token")
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
		b, _ := os.ReadFile(f)
		secret[n] = strings.TrimSpace(string(b))
	}
	refused(t, "bootstrap again into the same files", c.as(mgmt, "acl", "bootstrap", "--out", tokDir),
		"gangrun acl: --out: "+filepath.Join(tokDir, "agent.token")+" exists: a token is never written over another (remove it first)")
	missing := filepath.Join(tokDir, "no-such-dir", "carol.token")
	refused(t, "a user token into a missing directory", c.as(mgmt, "acl", "user", "carol", "--out", missing),
		"gangrun acl: --out "+missing+": its directory "+filepath.Dir(missing)+" does not exist (nothing was minted)")
	if r := c.as(mgmt, "acl", "user", "carol"); r.code != 0 {
		t.Errorf("carol's token after the refused --out: exit %d %s (was one minted before the refusal?)", r.code, r.stderr)
	}
	refused(t, "a user whose name differs from carol's in case only", c.as(mgmt, "acl", "user", "Carol"),
		`gangrun acl: user "Carol": ACL policy gangrun-user-Carol: the name is taken by gangrun-user-carol (Consul's policy names ignore case): nothing was minted`)
	for _, u := range []string{"alice", "bob"} {
		r := c.as(mgmt, "acl", "user", u)
		tok, ok := strings.CutPrefix(strings.TrimSpace(r.stdout), "user "+u+" token: ")
		if r.code != 0 || !ok {
			t.Fatalf("acl user %s: exit %d: %q %s", u, r.code, r.stdout, r.stderr)
		}
		secret[u] = tok
	}
	alice, bob, opFile := secret["alice"], secret["bob"], filepath.Join(tokDir, "operator.token")
	refused(t, "acl user with the operator's token", c.asFile(opFile, "acl", "user", "carol"), "permission denied: minting tokens takes Consul's management token (your token is the operator's)")
	if r := c.as(bob, "acl", "whoami"); r.code != 0 || !strings.HasPrefix(r.stdout, "user bob (token ") {
		t.Errorf("acl whoami: exit %d: %q", r.code, r.stdout)
	}

	// A node whose agent holds the agents' token.
	mark := testMark(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agent := exec.Command(gangrunBin, "agent", "--consul", c.consul.Addr, "--node-name", "acl-a", "--advertise-addr", "127.0.0.1",
		"--topology-file", inventory, "--metrics-addr", metricsAddr)
	agent.Env = agentEnv(mark, "CONSUL_HTTP_TOKEN=", "CONSUL_HTTP_TOKEN_FILE="+filepath.Join(tokDir, "agent.token"))
	agentLog := &syncBuffer{}
	agent.Stdout, agent.Stderr = agentLog, agentLog
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Signal(os.Interrupt)
		_ = agent.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", agentLog.String())
		}
	})
	waitUntilFor(t, 60*time.Second, func() bool {
		r := c.as(alice, "nodes", "--json")
		return r.code == 0 && strings.Contains(r.stdout, `"state": "up"`)
	}, "the agent up, as alice's token reads it")

	// Alice's job runs to COMPLETED: the elected agent queued it as hers, and the
	// agent's node runs its workers as her Unix user, who cannot read the agents' token
	// (as root they could).
	script := "echo hello from $RANK as $(id -un) home=$HOME; cat " + filepath.Join(tokDir, "agent.token") + " >/dev/null 2>&1 || echo the agent token is not mine"
	r := c.as(alice, "submit", "--gpus-per-node", "2", "--name", "hello", "--", "/bin/sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("alice's submit: exit %d: %s", r.code, r.stderr)
	}
	done := strings.TrimSpace(r.stdout)
	waitUntilFor(t, 120*time.Second, func() bool { return c.state(alice, done) == string(job.Completed) }, "alice's job COMPLETED")
	outFile := filepath.Join(dir, "gangrun-"+done+".out")
	if out, err := os.ReadFile(outFile); err != nil || !strings.Contains(string(out), "[rank1]: hello from 1 as alice home=/nonexistent\n") ||
		!strings.Contains(string(out), "[rank0]: the agent token is not mine\n") {
		t.Errorf("alice's job's output: %v %q", err, out)
	}
	if au, err := user.Lookup("alice"); err != nil {
		t.Error(err)
	} else if st, err := os.Stat(outFile); err != nil || fmt.Sprint(st.Sys().(*syscall.Stat_t).Uid) != au.Uid {
		t.Errorf("alice's output file %s: %v, want it hers (uid %s)", outFile, err, au.Uid)
	}
	// A long one, to be cancelled.
	r = c.as(alice, "submit", "--gpus-per-node", "2", "--", "sleep", "300")
	if r.code != 0 {
		t.Fatalf("alice's second submit: exit %d: %s", r.code, r.stderr)
	}
	long := strings.TrimSpace(r.stdout)
	waitUntilFor(t, 120*time.Second, func() bool { return c.state(alice, long) == string(job.Running) }, "alice's second job RUNNING")

	// Bob sees the outline of alice's job (its name, as queue shows it), not its command
	// or directories (Slurm's PrivateData=jobs); alice sees all of it.
	if r := c.as(bob, "show", long); r.code != 0 || strings.Contains(r.stdout, "sleep 300") || strings.Contains(r.stdout, dir) ||
		!strings.Contains(r.stdout, "Command="+job.Hidden) || !strings.Contains(r.stdout, "UserId=alice") {
		t.Errorf("bob's show of alice's job: exit %d:\n%s", r.code, r.stdout)
	}
	if r := c.as(bob, "show", "--json", long); r.code != 0 || strings.Contains(r.stdout, `"300"`) || strings.Contains(r.stdout, dir) {
		t.Errorf("bob's show --json of alice's job: exit %d:\n%s", r.code, r.stdout)
	}
	if r := c.as(alice, "show", long); r.code != 0 || !strings.Contains(r.stdout, "Command=sleep 300") {
		t.Errorf("alice's show of her job: exit %d:\n%s", r.code, r.stdout)
	}

	// MUNGE proves the uid inside the box too: the Unix user bob holding alice's token
	// submits nothing as alice.
	r = runAsUserEnv(t, "bob", testMunge.Socket, dir, []string{"CONSUL_HTTP_TOKEN=" + alice}, "submit", "--consul", c.consul.Addr, "--", "true")
	c.outputs = append(c.outputs, r.stdout, r.stderr)
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); r.code != 2 || len(lines) != 2 ||
		!strings.HasPrefix(lines[1], "gangrun submit: permission denied: the request is in alice's box, its MUNGE credential is uid ") || !strings.HasSuffix(lines[1], "(bob)") {
		t.Errorf("bob submits with alice's token: exit %d, stderr %q; want exit 2, the token's note and the refusal naming bob", r.code, r.stderr)
	}

	// Bob is refused what is not his.
	refused(t, "bob cancels alice's job", c.as(bob, "cancel", long), fmt.Sprintf("gangrun cancel: %s: permission denied: job %s belongs to alice (your token is bob's)", long, long))
	refused(t, "bob drains a node", c.as(bob, "drain", "acl-a", "--reason", "mine now"), "gangrun drain: permission denied: draining a node takes the operator's token (your token is bob's)")
	refused(t, "bob resumes a node", c.as(bob, "resume", "acl-a"), "gangrun resume: permission denied: resuming a node takes the operator's token (your token is bob's)")
	pol := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(pol, []byte(`{"accounts": {"ml": {"users": {"alice": {}, "bob": {}}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	refused(t, "bob sets the policy", c.as(bob, "policy", "set", pol), "gangrun policy: permission denied: changing the policy takes the operator's token (your token is bob's)")
	refused(t, "a submit with no token", c.as("", "submit", "--", "true"), "gangrun submit: no valid Consul ACL token: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE")
	refused(t, "an alloc with a user's token (no sessions): Consul's refusal", c.as(bob, "alloc", "--nodes", "1", "--gpus-per-node", "1", "--wait", "5s"),
		"lacks permission 'session:write'")
	refused(t, "a queue with no token", c.as("", "queue"), "gangrun queue: no valid Consul ACL token: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE")
	refused(t, "an agent with a user's token", c.as(bob, "agent", "--node-name", "bobs", "--topology-file", inventory),
		"gangrun agent: permission denied: an agent takes the agents' token from gangrun acl bootstrap (your token is bob's)")
	// Bob writing alice's keys himself, past gangrun's checks: Consul refuses.
	bs, err := store.NewConsulToken(c.consul.Addr, bob)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, key := range []string{"gangrun/batch/jobs/" + long + "/state", acl.UserPrefix("alice") + "cancel-1", "gangrun/cluster/drain/acl-a"} {
		_, err := bs.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: []byte(`{"status":"CANCELLED"}`)}})
		if !errors.Is(err, store.ErrPermissionDenied) {
			t.Errorf("bob writes %s: %v, want permission denied", key, err)
		}
		c.outputs = append(c.outputs, fmt.Sprint(err))
	}
	if st := c.state(bob, long); st != string(job.Running) {
		t.Errorf("alice's job after bob's attempts: %s, want RUNNING", st)
	}

	// The operator may, and each action is in the audit log.
	if r := c.asFile(opFile, "drain", "acl-a", "--reason", "fan swap"); r.code != 0 {
		t.Errorf("operator drain: exit %d: %s", r.code, r.stderr)
	}
	if r := c.asFile(opFile, "resume", "acl-a"); r.code != 0 {
		t.Errorf("operator resume: exit %d: %s", r.code, r.stderr)
	}
	if r := c.asFile(opFile, "policy", "set", pol); r.code != 0 {
		t.Errorf("operator policy set: exit %d: %s", r.code, r.stderr)
	}
	if r := c.asFile(opFile, "cancel", long); r.code != 0 || r.stdout != "cancelled job "+long+"\n" {
		t.Errorf("operator cancel: exit %d: %q %s", r.code, r.stdout, r.stderr)
	}
	waitUntilFor(t, 60*time.Second, func() bool { return c.state(alice, long) == string(job.Cancelled) }, "alice's job CANCELLED")

	// Alice cancels her own job: done, and no administrative action.
	r = c.as(alice, "submit", "--gpus-per-node", "2", "--", "sleep", "300")
	if r.code != 0 {
		t.Fatalf("alice's third submit: exit %d: %s", r.code, r.stderr)
	}
	own := strings.TrimSpace(r.stdout)
	if r := c.as(alice, "cancel", own); r.code != 0 || r.stdout != "cancelled job "+own+"\n" {
		t.Errorf("alice cancels her own job: exit %d: %q %s", r.code, r.stdout, r.stderr)
	}
	waitUntilFor(t, 60*time.Second, func() bool { return c.state(alice, own) == string(job.Cancelled) }, "alice's own cancel done")

	r = c.asFile(opFile, "audit", "--json")
	if r.code != 0 {
		t.Fatalf("audit: exit %d: %s", r.code, r.stderr)
	}
	var entries []audit.Entry
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, r.stdout)
	}
	// First the elected agent's refusal of bob's request in alice's box.
	if len(entries) == 0 || entries[0].Action != audit.ActionRefuse || entries[0].Owner != "alice" || !strings.Contains(entries[0].Detail, "(bob)") ||
		entries[0].User != "gangrun" || entries[0].Token != "agent" {
		t.Fatalf("audit: the first entry is not the refusal of bob's request:\n%s", r.stdout)
	}
	entries = entries[1:]
	host, _ := os.Hostname()
	// Then bob's refused cancel of alice's job (refusals are recorded too).
	if len(entries) == 0 || entries[0].Action != audit.ActionCancel || entries[0].User != "bob" || entries[0].Owner != "alice" ||
		entries[0].Target != "job "+long || entries[0].Detail != "refused: the job is alice's (your token is bob's)" {
		t.Fatalf("audit: the second entry is not bob's refused cancel:\n%s", r.stdout)
	}
	entries = entries[1:]
	want := []struct{ action, target, owner, detail string }{
		{audit.ActionDrain, "node acl-a", "", "fan swap"},
		{audit.ActionResume, "node acl-a", "", ""},
		{audit.ActionPolicySet, "policy", "", "0 partitions, 1 accounts"},
		{audit.ActionCancel, "job " + long, "alice", ""},
	}
	if len(entries) != len(want) {
		t.Fatalf("audit: %d entries, want %d:\n%s", len(entries), len(want), r.stdout)
	}
	for i, w := range want {
		e := entries[i]
		if e.Action != w.action || e.Target != w.target || e.Owner != w.owner || e.Detail != w.detail || e.Token != "operator" ||
			e.User != currentUser() || e.Host != host || e.Accessor == "" || time.Since(e.At) > time.Hour {
			t.Errorf("audit entry %d: %+v, want %+v by the operator's token from %s", i, e, w, host)
		}
	}
	if r := c.as(bob, "audit"); r.code != 0 || strings.Count(r.stdout, "\n") != 3+len(want) || !strings.Contains(r.stdout, "fan swap") {
		t.Errorf("audit (table): exit %d:\n%s", r.code, r.stdout)
	}

	// No secret anywhere: outputs, the agent's log, its metrics, show.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsBody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.outputs = append(c.outputs, agentLog.String(), string(metricsBody))
	for who, sec := range secret {
		for i, o := range c.outputs {
			if strings.Contains(o, sec) && !(who == "alice" || who == "bob") {
				t.Errorf("the %s token's secret appears in output %d:\n%s", who, i, o)
			}
		}
	}
	// The user tokens were printed once, by `acl user` (outputs 2 and 4, counting
	// stdout and stderr): nowhere else.
	for _, u := range []string{"alice", "bob"} {
		n := 0
		for _, o := range c.outputs {
			n += strings.Count(o, secret[u])
		}
		if n != 1 {
			t.Errorf("%s's secret appears %d times in the outputs, want once (acl user's)", u, n)
		}
	}
}

// TestAuditWithoutACLs: with Consul's ACLs off, MUNGE says who asks (the package's
// munged: the agents check credentials); `acl whoami` says so, `acl bootstrap` refuses
// with one line and exit 2, and root's drain and resume are recorded in the audit log
// by the elected agent, with token "munge".
func TestAuditWithoutACLs(t *testing.T) {
	consul := consultest.Start(t).Addr
	startAgent(t, consul, "open-a", "dgx-h100", "partition=train")
	waitUntilFor(t, 60*time.Second, func() bool {
		nodes := nodesJSON(t, consul)
		return len(nodes) == 1 && nodes[0].State == "up"
	}, "the agent up")
	if code, out, errOut := inProcess("acl", "--consul", consul, "whoami"); code != 0 || out != "Consul's ACLs are off; the agents check MUNGE credentials: you are root (uid 0)\n" {
		t.Errorf("acl whoami: exit %d: %q %s", code, out, errOut)
	}
	if code, _, errOut := inProcess("acl", "--consul", consul, "bootstrap"); code != 2 || !strings.HasPrefix(errOut, "gangrun acl: Consul's ACLs are off: turn them on") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("acl bootstrap without ACLs: exit %d: %q", code, errOut)
	}
	if code, _, errOut := inProcess("drain", "--consul", consul, "open-a", "--reason", "bios update"); code != 0 {
		t.Fatalf("drain: exit %d: %s", code, errOut)
	}
	if code, _, errOut := inProcess("resume", "--consul", consul, "open-a"); code != 0 {
		t.Fatalf("resume: exit %d: %s", code, errOut)
	}
	code, out, errOut := inProcess("audit", "--consul", consul, "--json", "--since", "1h")
	if code != 0 {
		t.Fatalf("audit: exit %d: %s", code, errOut)
	}
	var entries []audit.Entry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, out)
	}
	if len(entries) != 2 || entries[0].Action != audit.ActionDrain || entries[0].Detail != "bios update" || entries[1].Action != audit.ActionResume ||
		entries[0].Token != "munge" || entries[0].Accessor != "" || entries[0].User != currentUser() {
		t.Errorf("audit: %+v", entries)
	}
	if code, out, _ := inProcess("audit", "--consul", consul, "--user", "nobody-at-all"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("audit --user nobody-at-all: exit %d:\n%s", code, out)
	}
}
