package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/reason"
)

// usersBin is gangrunBin copied where every user may run it (the test binary's own
// directory is root's alone), once.
var usersBin = struct {
	sync.Once
	path string
	err  error
}{}

func binForUsers(t *testing.T) string {
	t.Helper()
	usersBin.Do(func() {
		dir, err := os.MkdirTemp("", "gangrun-users-bin-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		var b []byte
		if err == nil {
			b, err = os.ReadFile(gangrunBin)
		}
		if err == nil {
			usersBin.path = filepath.Join(dir, "gangrun")
			err = os.WriteFile(usersBin.path, b, 0o755)
		}
		usersBin.err = err
	})
	if usersBin.err != nil {
		t.Fatal(usersBin.err)
	}
	return usersBin.path
}

// runAsUser runs `gangrun ARGS` as Unix user name, in dir, with munged at socket (its
// host's), and returns how it ended.
func runAsUser(t *testing.T, name, socket, dir string, args ...string) gangrunResult {
	t.Helper()
	return runAsUserEnv(t, name, socket, dir, nil, args...)
}

// runAsUserEnv is runAsUser with extra environment entries (a Consul token).
func runAsUserEnv(t *testing.T, name, socket, dir string, env []string, args ...string) gangrunResult {
	t.Helper()
	return runBinAsUser(t, binForUsers(t), name, socket, dir, env, args...)
}

// runBinAsUser is runAsUserEnv for gangrun at bin (a link named sbatch: Slurm's command).
func runBinAsUser(t *testing.T, bin, name, socket, dir string, env []string, args ...string) gangrunResult {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "USER=" + name, "LOGNAME=" + name, "MUNGE_SOCKET=" + socket}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r := gangrunResult{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
	if err != nil && r.code < 0 {
		t.Fatalf("gangrun %v as %s: %v", args, name, err)
	}
	return r
}

// mungeAs makes a MUNGE credential as Unix user name on the host whose munged is at
// socket, bound to content as gangrun binds its credentials (identity.Seal: the
// payload is gangrun's prefix and the content's SHA-256): what a hostile user can make
// with munge(1) alone.
func mungeAs(t *testing.T, name, socket string, content []byte) string {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	sum := sha256.Sum256(content)
	cmd := exec.Command("munge", "--socket", socket, "--string", identity.PayloadPrefix+hex.EncodeToString(sum[:]))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("munge as %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// attack is one row of TestIdentityAttacks' table: what was tried, and whether it
// was refused (nothing run as anyone else, the victim's job untouched).
type attack struct {
	what    string
	refused bool
}

// TestIdentityAttacks: a default cluster (a Consul without ACLs; two agents, each with
// its own munged sharing the cluster's key, as two hosts), attacked by a local Unix
// user, mallory, the way issue 25 found open: every attack is refused, the victim's
// job is untouched, and mallory's own jobs run as mallory from either host. The
// attacks: cancelling root's job with gangrun; her pending job's record changed to
// root's; a job record written straight into Consul; a credential replayed after its
// job was removed; root's credential copied into a record of hers; a credential she
// made for a record naming root; a cancel forged in root's request box, with her
// credential and with none; a job submitted from a host outside the cluster (another
// MUNGE key); drain, resume and policy. Each refusal is in the audit log. The table
// of attacks and outcomes is logged (docs/testing.md quotes it).
func TestIdentityAttacks(t *testing.T) {
	unixUsers(t, "mallory")
	consul := consultest.Start(t).Addr
	hostB := mungetest.StartWithKey(t, testMunge.Key) // a second host of the cluster
	outside := mungetest.Start(t)                     // a host with a key of its own
	startAgentWith(t, consul, "id-a", nil)
	startAgentWith(t, consul, "id-b", []string{hostB.Env()})
	waitUntilFor(t, 60*time.Second, func() bool {
		nodes := nodesJSON(t, consul)
		return len(nodes) == 2 && nodes[0].State == "up" && nodes[1].State == "up" && nodes[0].Auth == "munge" && nodes[1].Auth == "munge"
	}, "both agents up, checking MUNGE credentials")
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	dir := sharedDir(t)
	t.Chdir(dir)
	mallory, err := user.Lookup("mallory")
	if err != nil {
		t.Fatal(err)
	}
	var table []attack
	note := func(what string, refused bool) {
		table = append(table, attack{what, refused})
		if !refused {
			t.Errorf("attack not refused: %s", what)
		}
	}
	state := func(id string) (job.Status, string) {
		j, err := job.Read(ctx, s, id)
		if err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		return j.State.Status, j.State.Reason
	}
	waitFinal := func(id string) (job.Status, string) {
		var st job.Status
		var why string
		waitUntilFor(t, 90*time.Second, func() bool { st, why = state(id); return st.Final() }, "job "+id+" ended")
		return st, why
	}
	refusedJob := func(what, id, want string) {
		t.Helper()
		st, why := waitFinal(id)
		ok := st == job.Failed && strings.HasPrefix(why, string(reason.InvalidCredential)+": ") && strings.Contains(why, want)
		if !ok {
			t.Errorf("%s: job %s %s %q, want FAILED %s: ...%s...", what, id, st, why, string(reason.InvalidCredential), want)
		}
		if j, _ := job.Read(ctx, s, id); j != nil && !j.State.Started.IsZero() {
			t.Errorf("%s: job %s started", what, id)
			ok = false
		}
		note(what, ok)
	}

	// The victim: root's job, running.
	code, out, errOut := inProcess("submit", "--consul", consul, "--name", "victim", "--", "sleep", "300")
	if code != 0 {
		t.Fatalf("root's submit: %d %s", code, errOut)
	}
	victim := strings.TrimSpace(out)
	waitUntilFor(t, 60*time.Second, func() bool { st, _ := state(victim); return st == job.Running }, "root's job running")
	untouched := func(what string) {
		t.Helper()
		if st, why := state(victim); st != job.Running {
			t.Fatalf("after %s: root's job %s %q, want it RUNNING", what, st, why)
		}
	}

	// 1. gangrun cancel of root's job.
	r := runAsUser(t, "mallory", testMunge.Socket, dir, "cancel", "--consul", consul, victim)
	note("gangrun cancel of root's running job", r.code == 2 && strings.Contains(r.stderr, "permission denied: job "+victim+" belongs to root (your MUNGE credential is mallory's)"))
	untouched("mallory's cancel")

	// Her own jobs run as her, from either host.
	var owned []string
	for _, host := range []*mungetest.Daemon{testMunge, hostB} {
		r := runAsUser(t, "mallory", host.Socket, dir, "submit", "--consul", consul, "--output", "own-%j.out", "--", "id", "-u")
		if r.code != 0 {
			t.Fatalf("mallory's own submit: exit %d %s", r.code, r.stderr)
		}
		id := strings.TrimSpace(r.stdout)
		owned = append(owned, id)
		if st, why := waitFinal(id); st != job.Completed {
			t.Fatalf("mallory's own job %s: %s %q", id, st, why)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "own-"+id+".out"))
		if !strings.Contains(string(b), "[rank0]: "+mallory.Uid+"\n") {
			t.Errorf("mallory's job %s printed %q, want her uid %s", id, b, mallory.Uid)
		}
	}

	// 2. Her pending job's record, user changed to root after it was queued. It waits
	// on root's job, and would run `id -u` once that ends.
	r = runAsUser(t, "mallory", testMunge.Socket, dir, "submit", "--consul", consul, "--dependency", "afterany:"+victim,
		"--output", "pending-%j.out", "--", "id", "-u")
	if r.code != 0 {
		t.Fatalf("mallory's pending submit: %d %s", r.code, r.stderr)
	}
	pending := strings.TrimSpace(r.stdout)
	waitUntilFor(t, 30*time.Second, func() bool {
		j, _ := job.Read(ctx, s, pending)
		return j != nil && j.Auth != nil && j.Auth.Attestation != ""
	}, "her job accepted")
	e, err := s.Get(ctx, "gangrun/batch/jobs/"+pending+"/spec")
	if err != nil || e == nil {
		t.Fatal(err)
	}
	forged := bytes.Replace(e.Value, []byte(`"user":"mallory"`), []byte(`"user":"root"`), 1)
	put(t, s, "gangrun/batch/jobs/"+pending+"/spec", forged)

	// 3. A new job record, written straight into Consul: root's, no credential.
	var sp job.Spec
	if err := json.Unmarshal(forged, &sp); err != nil {
		t.Fatal(err)
	}
	writeRecord := func(id string, spec job.Spec, cred string) {
		t.Helper()
		spec.ID, spec.Dependency = id, nil
		spec.Output = "forged-%j.out"
		b, _ := json.Marshal(spec)
		put(t, s, "gangrun/batch/jobs/"+id+"/spec", b)
		if cred != "" {
			a, _ := json.Marshal(job.Auth{Credential: cred})
			put(t, s, "gangrun/batch/jobs/"+id+"/auth", a)
		}
		st, _ := json.Marshal(job.State{Status: job.Pending, Reason: "Priority"})
		put(t, s, "gangrun/batch/jobs/"+id+"/state", st)
		req, _ := json.Marshal(allocator.JobRequest(id, 1, 1, 1, "", "", nil, 0, nil))
		put(t, s, allocator.RequestKey(id), req)
	}
	writeRecord("9001", sp, "")
	refusedJob("a job record written straight into Consul (root's, no credential)", "9001", "no MUNGE credential")

	// 4. A replay: one of her finished jobs' records removed, then written again whole.
	first := owned[0]
	own, err := job.Read(ctx, s, first)
	if err != nil || own.Auth == nil {
		t.Fatalf("her first job: %+v %v", own, err)
	}
	ownSpec, err := s.Get(ctx, "gangrun/batch/jobs/"+first+"/spec")
	if err != nil || ownSpec == nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteTree, Key: "gangrun/batch/jobs/" + first + "/"}}); err != nil {
		t.Fatal(err)
	}
	replayAuth, _ := json.Marshal(job.Auth{Credential: own.Auth.Credential})
	put(t, s, "gangrun/batch/jobs/"+first+"/spec", ownSpec.Value)
	put(t, s, "gangrun/batch/jobs/"+first+"/auth", replayAuth)
	st0, _ := json.Marshal(job.State{Status: job.Pending, Reason: "Priority"})
	put(t, s, "gangrun/batch/jobs/"+first+"/state", st0)
	refusedJob("her finished job's record replayed whole, with its credential", first, "replayed")

	// 5. Root's credential copied into a record of hers claiming root.
	vj, err := job.Read(ctx, s, victim)
	if err != nil || vj.Auth == nil {
		t.Fatalf("root's job: %v", err)
	}
	writeRecord("9002", sp, vj.Auth.Credential)
	refusedJob("root's job's credential copied into a new record", "9002", "made for another job or other content")

	// 6. A credential she made herself, bound to a record naming root.
	sp6 := sp
	sp6.ID, sp6.Dependency, sp6.Output = "9003", nil, "forged-%j.out"
	content, _ := json.Marshal(sp6)
	writeRecord("9003", sp6, mungeAs(t, "mallory", testMunge.Socket, append([]byte("gangrun job 9003\n"), content...)))
	refusedJob("a record naming root, with her own credential bound to it", "9003", "the job says user root (uid 0), its credential is uid "+mallory.Uid+"'s (mallory)")

	// 7. Cancels forged in root's request box: with her credential, and with none.
	for i, cred := range []string{"mine", ""} {
		key := fmt.Sprintf("%sroot/cancel-%019d-forged%d", acl.UsersPrefix, time.Now().UnixNano(), i)
		text, _ := json.Marshal(job.Request{Kind: "cancel", Job: victim})
		if cred == "mine" {
			cred = mungeAs(t, "mallory", testMunge.Socket, append([]byte("gangrun request "+key+"\n"), text...))
		}
		b, _ := json.Marshal(map[string]any{"request": json.RawMessage(text), "credential": cred})
		put(t, s, key, b)
		var answer string
		waitUntilFor(t, 30*time.Second, func() bool {
			e, _ := s.Get(ctx, key)
			var v struct{ Answer *job.Answer }
			if e != nil && json.Unmarshal(e.Value, &v) == nil && v.Answer != nil {
				answer = v.Answer.Error
				return true
			}
			return false
		}, "the forged cancel answered")
		what := "a cancel of root's job forged in root's request box, with her credential"
		want := "its MUNGE credential is uid " + mallory.Uid + "'s (mallory)"
		if cred == "" {
			what, want = "a cancel of root's job forged in root's request box, with no credential", "carries no MUNGE credential"
		}
		note(what, strings.HasPrefix(answer, "permission denied: ") && strings.Contains(answer, want))
		untouched(what)
	}

	// 8. A job submitted from a host outside the cluster (another MUNGE key).
	r = runAsUser(t, "mallory", outside.Socket, dir, "submit", "--consul", consul, "--", "id", "-u")
	if r.code != 0 {
		t.Fatalf("submit from outside: exit %d %s", r.code, r.stderr)
	}
	refusedJob("a job submitted from a host outside the cluster (another MUNGE key)", strings.TrimSpace(r.stdout), "not of this cluster")

	// 9. The operator's actions.
	for _, args := range [][]string{{"drain", "id-a", "--reason", "mine"}, {"resume", "id-a"}} {
		r := runAsUser(t, "mallory", testMunge.Socket, dir, append([]string{args[0], "--consul", consul}, args[1:]...)...)
		note("gangrun "+args[0], r.code == 2 && strings.Count(r.stderr, "\n") == 1 && strings.Contains(r.stderr, "is root's (the operator's): your MUNGE credential is mallory's"))
	}
	pol := filepath.Join(dir, "pol.json")
	if err := os.WriteFile(pol, []byte(`{"accounts": {"ml": {"shares": 1000, "users": {"mallory": {"default": true}}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r = runAsUser(t, "mallory", testMunge.Socket, dir, "policy", "--consul", consul, "set", pol)
	note("gangrun policy set", r.code == 2 && strings.Contains(r.stderr, "changing the policy is root's"))
	if e, _ := s.Get(ctx, "gangrun/policy/config"); e != nil {
		t.Errorf("a policy was set: %s", e.Value)
	}
	if c, _ := allocator.Snapshot(ctx, s); c.Nodes["id-a"] == nil || c.Nodes["id-a"].Drain != nil {
		t.Errorf("id-a drained")
	}
	untouched("every attack")

	// Root's job ends; mallory's job changed to root's is then refused, never run.
	if code, _, errOut := inProcess("cancel", "--consul", consul, victim); code != 0 {
		t.Fatalf("root's cancel: %d %s", code, errOut)
	}
	refusedJob("her pending job's record changed to root's after it was queued", pending, "changed after it was accepted")
	if b, err := os.ReadFile(filepath.Join(dir, "pending-"+pending+".out")); err == nil {
		t.Errorf("the changed job ran: %q", b)
	}
	if outs, _ := filepath.Glob(filepath.Join(dir, "forged-*.out")); len(outs) > 0 {
		t.Errorf("forged jobs ran: %v", outs)
	}

	// Every refused job and request is in the audit log.
	entries, err := audit.List(ctx, s, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	refusals := 0
	for _, e := range entries {
		if e.Action == audit.ActionRefuse {
			refusals++
		}
	}
	if refusals < 8 {
		t.Errorf("%d refusals in the audit log, want one per refused job and forged request (8): %+v", refusals, entries)
	}
	tried, ok := 0, 0
	var b strings.Builder
	for _, a := range table {
		tried++
		mark := "REFUSED"
		if a.refused {
			ok++
		} else {
			mark = "GOT THROUGH"
		}
		fmt.Fprintf(&b, "  %-11s %s\n", mark, a.what)
	}
	t.Logf("attacks tried %d, refused %d:\n%s", tried, ok, b.String())
}

// put writes key straight into Consul, as anyone who reaches it could.
func put(t *testing.T, s store.Store, key string, value []byte) {
	t.Helper()
	if _, err := s.Txn(context.Background(), []store.Op{{Verb: store.Set, Key: key, Value: value}}); err != nil {
		t.Fatal(err)
	}
}

// TestStepChecksWhatTheControllerLetThrough: each node's step checks a job itself,
// whatever the elected agent decided. The elected agent here runs --auth none (it
// checks nothing); a second node checks MUNGE credentials. A job record written
// straight into Consul, for the second node's partition, is granted there, and its step
// refuses it: the job ends FAILED with the step's reason, its command never runs, and
// the refusal is in the audit log, naming the node.
func TestStepChecksWhatTheControllerLetThrough(t *testing.T) {
	consul := consultest.Start(t).Addr
	ctlLog := startAgentWith(t, consul, "ctl", nil, "--auth", "none", "--labels", "partition=open")
	waitUntilFor(t, 60*time.Second, func() bool { n := nodesJSON(t, consul); return len(n) == 1 && n[0].State == "up" }, "ctl up")
	startAgentWith(t, consul, "sec", nil, "--no-scheduler", "--labels", "partition=secure")
	waitUntilFor(t, 60*time.Second, func() bool { n := nodesJSON(t, consul); return len(n) == 2 && n[1].State == "up" }, "sec up")
	if n := nodesJSON(t, consul); n[0].Auth != "none" || n[1].Auth != "munge" {
		t.Fatalf("nodes' auth: %+v", n)
	}
	if !strings.Contains(ctlLog.String(), "--auth none: no credential is checked: any local user who reaches Consul can run jobs as any user, root included") {
		t.Errorf("the --auth none agent did not warn:\n%s", ctlLog.String())
	}
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := sharedDir(t)
	ran := filepath.Join(dir, "ran")
	sp := job.Spec{ID: "7001", Name: "forged", User: "root", Partition: "secure", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1,
		Command: []string{"touch", ran}, WorkDir: dir, Output: "forged.out", Submitted: time.Now().UTC()}
	b, _ := json.Marshal(sp)
	put(t, s, "gangrun/batch/jobs/7001/spec", b)
	st, _ := json.Marshal(job.State{Status: job.Pending, Reason: "Priority"})
	put(t, s, "gangrun/batch/jobs/7001/state", st)
	req := allocator.JobRequest("7001", 1, 1, 1, "secure", "", nil, 0, nil)
	rb, _ := json.Marshal(req)
	put(t, s, allocator.RequestKey("7001"), rb)
	var j *job.Job
	waitUntilFor(t, 90*time.Second, func() bool {
		j, err = job.Read(context.Background(), s, "7001")
		return err == nil && j.State.Status.Final()
	}, "the forged job ended")
	if j.State.Status != job.Failed || !strings.Contains(j.State.Reason, "InvalidCredential: no MUNGE credential") {
		t.Errorf("the forged job: %s %q, want FAILED, InvalidCredential: no MUNGE credential", j.State.Status, j.State.Reason)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Errorf("the forged job's command ran")
	}
	entries, err := audit.List(context.Background(), s, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		found = found || e.Action == audit.ActionRefuse && e.Target == "job 7001" && strings.Contains(e.Detail, "on node sec: ")
	}
	if !found {
		t.Errorf("no audit entry of the step's refusal: %+v", entries)
	}
}

// TestAgentRefusesWithoutIdentity: an agent that finds neither a munged nor Consul's
// ACLs refuses to start, in one line saying how to set up either (exit 2); --auth munge
// without a munged, and an --auth of no known mode, are refused the same way.
func TestAgentRefusesWithoutIdentity(t *testing.T) {
	consul := consultest.Start(t).Addr
	inv := filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json")
	noSocket := []string{"MUNGE_SOCKET=" + filepath.Join(t.TempDir(), "no-munged")}
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, "gangrun agent: no way to tell users apart: munged does not answer at "},
		{[]string{"--auth", "munge"}, "gangrun agent: --auth munge: munged does not answer at "},
		{[]string{"--auth", "kerberos"}, `gangrun agent: --auth "kerberos": want munge or none`},
	} {
		r := runGangrun(t, noSocket, append([]string{"agent", "--consul", consul, "--node-name", "lonely", "--topology-file", inv}, tc.flags...)...)
		if r.code != 2 || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, tc.want) {
			t.Errorf("agent %v: exit %d, stderr %q; want exit 2 and one line starting %q", tc.flags, r.code, r.stderr, tc.want)
		}
		if tc.flags == nil && !strings.Contains(r.stderr, "Consul's ACLs are off; start munge on every node with one key") ||
			tc.flags == nil && !strings.Contains(r.stderr, "or pass --auth none") {
			t.Errorf("the refusal does not say how to set up MUNGE, ACLs or --auth none: %q", r.stderr)
		}
	}
	if n := nodesJSON(t, consul); len(n) != 0 {
		t.Errorf("a refused agent registered: %+v", n)
	}
}

// TestIdentityAttacksOnWhatJobsTrust: the attacks a breaker found past the first round
// of checks, each refused on a default cluster (no ACLs, MUNGE), mallory as the local
// user: (1) the rendezvous of root's next job taken over before it starts (its leader
// key, state and assignment written by her, with GANGRUN_RESUME_FROM pointing at her
// files and her master port): the job never takes her assignment; (2) answers forged
// in root's request box before the elected agent answers: root's cancel and drain say
// the answer is not the cluster's (exit 1) instead of reporting success; (3) root's
// drain request replayed after the replay marker was deleted: refused; (4) an audit
// entry written by her: `gangrun audit` (root) marks it, the agent's entries are sealed.
func TestIdentityAttacksOnWhatJobsTrust(t *testing.T) {
	unixUsers(t, "mallory")
	consul := consultest.Start(t).Addr
	startAgentWith(t, consul, "tr-a", nil)
	waitUntilFor(t, 60*time.Second, func() bool { n := nodesJSON(t, consul); return len(n) == 1 && n[0].State == "up" }, "the agent up")
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	dir := sharedDir(t)
	t.Chdir(dir)

	// (1) The rendezvous of root's next job, taken over by mallory first.
	seq, _ := s.Get(ctx, "gangrun/batch/jobseq")
	next := 1
	if seq != nil {
		next, _ = strconv.Atoi(string(seq.Value))
		next++
	}
	prefix := fmt.Sprintf("gangrun/jobs/%d/", next)
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "mallory", TTL: time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		t.Fatal(err)
	}
	defer s.DestroySession(context.Background(), sess)
	evil := filepath.Join(dir, "evil-ckpt")
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: prefix + "ctl/leader", Value: []byte("tr-a"), Session: sess},
		{Verb: store.Set, Key: prefix + "ctl/state", Value: []byte(`{"run":"evil","round":0,"status":"open","failures":0,"nnodes":"1","max_restarts":3}`)}}); err != nil {
		t.Fatal(err)
	}
	// As the job's leader she waits for the step to join, then closes the round with
	// her assignment: her checkpoint to resume from, her master port.
	hijacked := make(chan bool, 1)
	go func() {
		var idx uint64
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			entries, i, err := s.WatchList(ctx, prefix+"members/", idx, time.Second)
			if err != nil {
				break
			}
			idx = i
			if len(entries) == 0 {
				continue
			}
			_, err = s.Txn(ctx, []store.Op{
				{Verb: store.Set, Key: prefix + "rounds/0/tr-a", Value: []byte(`{"run":"evil","job_id":"` + strconv.Itoa(next) + `","round":0,"restart_count":0,"node_rank":0,"nnodes":1,` +
					`"local_world_size":1,"world_size":1,"rank_offset":0,"master_addr":"127.0.0.1","master_port":29999,"resume_from":"` + evil + `"}`)},
				{Verb: store.Set, Key: prefix + "ctl/state", Value: []byte(`{"run":"evil","round":0,"status":"running","failures":0,"nnodes":"1","max_restarts":3}`)}})
			hijacked <- err == nil
			return
		}
		hijacked <- false
	}()
	code, out, errOut := inProcess("submit", "--consul", consul, "--output", "trusting-%j.out", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--", "/bin/sh", "-c", `echo "resume=$GANGRUN_RESUME_FROM port=$MASTER_PORT"`)
	if code != 0 || strings.TrimSpace(out) != strconv.Itoa(next) {
		t.Fatalf("root's submit: exit %d %q %s (want job %d)", code, out, errOut, next)
	}
	if !<-hijacked {
		t.Fatal("the step never joined mallory's round: the attack was not made")
	}
	time.Sleep(8 * time.Second) // time enough for a step to take a forged round
	if b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("trusting-%d.out", next))); strings.Contains(string(b), "resume=") {
		t.Errorf("root's job ran with mallory's rendezvous: %q", b)
	}
	// Her lock gone, the job runs on its own rendezvous.
	if err := s.DestroySession(ctx, sess); err != nil {
		t.Fatal(err)
	}
	waitUntilFor(t, 90*time.Second, func() bool {
		j, err := job.Read(ctx, s, strconv.Itoa(next))
		return err == nil && j.State.Status.Final()
	}, "root's job ended")
	b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("trusting-%d.out", next)))
	if !strings.Contains(string(b), "[rank0]: resume= port=") || strings.Contains(string(b), "29999") || strings.Contains(string(b), evil) {
		t.Errorf("root's job's output: %q, want it run on its own rendezvous (no resume, its own port)", b)
	}

	// (2) Answers forged in root's box: mallory answers before the agent can.
	code, out, _ = inProcess("submit", "--consul", consul, "--", "sleep", "300")
	if code != 0 {
		t.Fatal("root's second submit")
	}
	victim := strings.TrimSpace(out)
	waitUntilFor(t, 60*time.Second, func() bool { j, _ := job.Read(ctx, s, victim); return j != nil && j.State.Status == job.Running }, "root's job running")
	stop := make(chan struct{})
	forger := make(chan struct{})
	go func() { // answers every new request in root's box at once, as a watching script would
		defer close(forger)
		var idx uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			entries, i, err := s.WatchList(ctx, acl.UsersPrefix+"root/", idx, time.Second)
			if err != nil {
				return
			}
			idx = i
			for _, e := range entries {
				var v map[string]json.RawMessage
				if json.Unmarshal(e.Value, &v) != nil || v["answer"] != nil {
					continue
				}
				v["answer"] = json.RawMessage(`{"at":"2026-12-04T00:00:00Z","cancelled":1}`)
				b, _ := json.Marshal(v)
				_, _ = s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: e.Key, Value: b, Index: e.ModifyIndex}})
			}
		}
	}()
	for _, args := range [][]string{{"cancel", victim}, {"drain", "tr-a", "--reason", "replacing GPU 3"}} {
		code, out, errOut := inProcess(append([]string{args[0], "--consul", consul}, args[1:]...)...)
		if code != 1 || !strings.Contains(errOut, "the answer is not the cluster's") || strings.Contains(out, "cancelled") || strings.Contains(out, "drained") {
			t.Errorf("root's %s with a forged answer: exit %d, %q %q; want exit 1 saying the answer is not the cluster's", args[0], code, out, errOut)
		}
	}
	close(stop)
	<-forger
	if j, _ := job.Read(ctx, s, victim); j == nil || j.State.Status != job.Running {
		t.Errorf("root's job after the forged cancel: %+v", j)
	}

	// (3) Root's drain, then resume; the drain request replayed with its marker deleted.
	var drainReq store.Entry
	replayDone := make(chan struct{})
	go func() { // keeps a copy of root's drain request, as a watching script would
		defer close(replayDone)
		var idx uint64
		for i := 0; i < 50; i++ {
			entries, ix, err := s.WatchList(ctx, acl.UsersPrefix+"root/", idx, time.Second)
			if err != nil {
				return
			}
			idx = ix
			for _, e := range entries {
				if strings.Contains(e.Key, "/drain-") {
					drainReq = e
					return
				}
			}
		}
	}()
	if code, _, errOut := inProcess("drain", "--consul", consul, "tr-a", "--reason", "fan swap"); code != 0 {
		t.Fatalf("root's drain: %d %s", code, errOut)
	}
	<-replayDone
	if drainReq.Key == "" {
		t.Fatal("the drain request was not seen")
	}
	if code, _, errOut := inProcess("resume", "--consul", consul, "tr-a"); code != 0 {
		t.Fatalf("root's resume: %d %s", code, errOut)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteTree, Key: "gangrun/batch/seen/"}}); err != nil {
		t.Fatal(err)
	}
	var v map[string]json.RawMessage
	_ = json.Unmarshal(drainReq.Value, &v)
	delete(v, "answer")
	delete(v, "seal")
	replayed, _ := json.Marshal(v)
	put(t, s, drainReq.Key, replayed)
	waitUntilFor(t, 30*time.Second, func() bool {
		e, _ := s.Get(ctx, drainReq.Key)
		var got struct{ Answer *job.Answer }
		return e != nil && json.Unmarshal(e.Value, &got) == nil && got.Answer != nil
	}, "the replayed drain answered")
	if c, _ := allocator.Snapshot(ctx, s); c.Nodes["tr-a"] == nil || c.Nodes["tr-a"].Drain != nil {
		t.Errorf("tr-a drained again by a replayed request")
	}

	// (4) An audit entry written by her, as root's.
	forgedEntry, _ := json.Marshal(audit.Entry{At: time.Now().UTC(), User: "root", Token: "munge", Host: "vm", Action: audit.ActionDrain, Target: "node tr-a", Detail: "forged"})
	put(t, s, fmt.Sprintf("%s%s/%019d-deadbeef", audit.Prefix, time.Now().UTC().Format("2006-01-02"), time.Now().UnixNano()), forgedEntry)
	code, out, errOut = inProcess("audit", "--consul", consul, "--json")
	if code != 0 {
		t.Fatalf("audit: %d %s", code, errOut)
	}
	var entries []struct {
		audit.Entry
		Check string `json:"check"`
	}
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatal(err)
	}
	sealed, forged := 0, 0
	for _, e := range entries {
		switch {
		case e.Detail == "forged" && e.Check == audit.Unsealed:
			forged++
		case e.Detail == "forged":
			t.Errorf("the forged entry checks %q, want unsealed", e.Check)
		case e.Check == audit.Sealed:
			sealed++
		default:
			t.Errorf("the agent's entry %+v checks %q, want sealed", e.Entry, e.Check)
		}
	}
	if forged != 1 || sealed < 3 {
		t.Errorf("audit: %d forged and %d sealed entries, want 1 and at least 3 (drain, resume, the replay's refusal):\n%s", forged, sealed, out)
	}
	if code, out, _ := inProcess("audit", "--consul", consul); code != 0 || !strings.Contains(out, "CHECK") || !strings.Contains(out, "unsealed") {
		t.Errorf("audit table: exit %d:\n%s", code, out)
	}
	if code, _, _ := inProcess("cancel", "--consul", consul, victim); code != 0 {
		t.Errorf("root's cancel")
	}
}
