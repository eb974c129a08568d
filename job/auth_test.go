package job

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/reason"
	"github.com/gangrun/gangrun/topology"
)

// mungeCLI seals content as the munge command line does for the given uid and gid
// (another user's credential, made by that user's process), with ttl seconds (0:
// munged's default).
func mungeCLI(t *testing.T, d *mungetest.Daemon, content []byte, uid, gid, ttl int) string {
	t.Helper()
	sum := sha256.Sum256(content)
	cmd := exec.Command("munge", "--socket", d.Socket, "--ttl", strconv.Itoa(ttl), "--string", identity.PayloadPrefix+hex.EncodeToString(sum[:]))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("munge as %d: %v", uid, err)
	}
	return strings.TrimSpace(string(out))
}

// writeJob writes a pending job's spec, state, request and (when a is not nil) Auth
// straight into the store, as a user who reaches Consul could.
func writeJob(t *testing.T, s store.Store, spec Spec, a *Auth) {
	t.Helper()
	ops := jobOps(spec, State{Status: Pending, Reason: "Priority"})
	req, err := allocator.JobRequestOps(request(spec, false, nil))
	if err != nil {
		t.Fatal(err)
	}
	ops = append(ops, req...)
	if a != nil {
		b, _ := json.Marshal(a)
		ops = append(ops, store.Op{Verb: store.Set, Key: authKey(spec.ID), Value: b})
	}
	if _, err := s.Txn(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
}

// TestJobCredentials: on a real Consul with an elected agent whose controller checks
// MUNGE credentials (two munged daemons with one key as two hosts, a third with its own
// key as a host outside the cluster), a job submitted with its submitter's credential is
// accepted and attested, its ids the credential's; root's credential submits as
// another user (sbatch --uid) with that user's ids; every forged record is refused
// FAILED, with the reason and an audit entry, and never granted: no credential, a
// record whose user was changed, a credential copied from another job, one replayed
// after its job was removed, one made outside the cluster, one expired before the
// cluster saw it, one of another user than the record names.
func TestJobCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	agentHost := mungetest.Start(t)
	submitHost := mungetest.StartWithKey(t, agentHost.Key)
	outside := mungetest.Start(t)
	prover, err := identity.Open(agentHost.Socket)
	if err != nil {
		t.Fatal(err)
	}
	submitter, err := identity.Open(submitHost.Socket)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := identity.Open(outside.Socket)
	if err != nil {
		t.Fatal(err)
	}
	s := store.NewMemory()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv.Node = "n1"
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: "n1", Addr: "127.0.0.1", Inventory: inv,
		Leader: []func(context.Context, store.Store, string) error{Control(zaptest.NewLogger(t), nil, 0, prover)}})
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Run(actx) }()
	defer func() { stop(); wg.Wait() }()
	waitNodes(t, s, 1)

	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	nobodyUID, _ := strconv.Atoi(nobody.Uid)
	nobodyGID, _ := strconv.Atoi(nobody.Gid)
	spec := func(id, who string) Spec {
		return Spec{ID: id, Name: "t", User: who, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Command: []string{"true"},
			WorkDir: "/tmp", Output: DefaultOutput, Supervision: launcher.Supervision{MaxRestarts: 1}, Submitted: time.Now().UTC()}
	}
	refused := func(id, want string) {
		t.Helper()
		j := waitJob(t, s, id, "ended", func(j *Job) bool { return j.State.Status.Final() })
		if j.State.Status != Failed || !strings.HasPrefix(j.State.Reason, string(reason.InvalidCredential)+": ") || !strings.Contains(j.State.Reason, want) {
			t.Errorf("job %s: %s %q, want FAILED, %s: ...%s...", id, j.State.Status, j.State.Reason, string(reason.InvalidCredential), want)
		}
		if len(j.State.Attempts) > 0 || !j.State.Started.IsZero() {
			t.Errorf("job %s ran: %+v", id, j.State)
		}
	}
	accepted := func(id string) *Job {
		t.Helper()
		return waitJob(t, s, id, "accepted", func(j *Job) bool { return j.Auth != nil && j.Auth.Attestation != "" || j.State.Status.Final() })
	}

	// A job with its root submitter's credential, through SubmitSealed.
	id, err := SubmitSealed(ctx, s, spec("", "root"), submitter)
	if err != nil {
		t.Fatal(err)
	}
	j := accepted(id)
	if j.State.Status.Final() || j.Auth.UID != 0 || j.Auth.GID != 0 {
		t.Fatalf("root's job: %s %q, runs as %d:%d; want accepted as 0:0", j.State.Status, j.State.Reason, j.Auth.UID, j.Auth.GID)
	}
	if uid, gid, err := checkAttested(ctx, prover, j, 0); err != nil || uid != 0 || gid != 0 {
		t.Errorf("the attestation of root's job: %d:%d %v", uid, gid, err)
	}
	if e, _ := s.Get(ctx, seenPrefix+identity.Digest(j.Auth.Credential)); e == nil {
		t.Errorf("no replay marker for the accepted credential")
	}
	good := j

	// Root submits as nobody (sbatch --uid): nobody's ids.
	sp := spec("101", "nobody")
	writeJob(t, s, sp, &Auth{Credential: mustSeal(t, submitter, jobContent(sp))})
	if j := accepted("101"); j.State.Status.Final() || int(j.Auth.UID) != nobodyUID || int(j.Auth.GID) != nobodyGID {
		t.Errorf("root's job as nobody: %s %q, runs as %d:%d; want nobody's %d:%d", j.State.Status, j.State.Reason, j.Auth.UID, j.Auth.GID, nobodyUID, nobodyGID)
	}
	// Nobody's own job, with nobody's credential.
	sp = spec("102", "nobody")
	writeJob(t, s, sp, &Auth{Credential: mungeCLI(t, submitHost, jobContent(sp), nobodyUID, nobodyGID, 0)})
	if j := accepted("102"); j.State.Status.Final() || int(j.Auth.UID) != nobodyUID {
		t.Errorf("nobody's job: %s %q, runs as %d", j.State.Status, j.State.Reason, j.Auth.UID)
	}

	// The forgeries.
	writeJob(t, s, spec("201", "root"), nil)
	refused("201", "no MUNGE credential")

	sp = spec("202", "nobody")
	changed := sp
	changed.User = "root" // nobody's record, its user made root's
	writeJob(t, s, changed, &Auth{Credential: mungeCLI(t, submitHost, jobContent(sp), nobodyUID, nobodyGID, 0)})
	refused("202", "made for another job or other content")

	writeJob(t, s, spec("203", "root"), &Auth{Credential: good.Auth.Credential}) // job id's credential, copied
	refused("203", "made for another job or other content")

	sp = spec("205", "root")
	writeJob(t, s, sp, &Auth{Credential: mustSeal(t, foreign, jobContent(sp))})
	refused("205", "not of this cluster")

	sp = spec("206", "root")
	cred := mungeCLI(t, submitHost, jobContent(sp), 0, 0, 1)
	time.Sleep(2100 * time.Millisecond) // its 1 s TTL passes before the cluster sees it
	writeJob(t, s, sp, &Auth{Credential: cred})
	refused("206", "expired")

	sp = spec("207", "root")
	writeJob(t, s, sp, &Auth{Credential: mungeCLI(t, submitHost, jobContent(sp), nobodyUID, nobodyGID, 0)})
	refused("207", "the job says user root (uid 0), its credential is uid "+nobody.Uid+"'s (nobody)")

	// A replay: job id removed after it was accepted, and written again whole, as it
	// was submitted (its credential unchanged), while the credential is still fresh.
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteTree, Key: jobsPrefix + id + "/"}, {Verb: store.Delete, Key: allocator.RequestKey(id)}, {Verb: store.Delete, Key: allocator.GrantKey(id)}}); err != nil {
		t.Fatal(err)
	}
	writeJob(t, s, good.Spec, &Auth{Credential: good.Auth.Credential})
	refused(id, "replayed")

	// Each refusal is in the audit log.
	entries, err := audit.List(ctx, s, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	refusals := map[string]bool{}
	for _, e := range entries {
		if e.Action == audit.ActionRefuse {
			refusals[e.Target] = true
		}
	}
	for _, want := range []string{"201", "202", "203", "205", "206", "207", id} {
		if !refusals["job "+want] {
			t.Errorf("no audit entry for the refusal of job %s: %+v", want, entries)
		}
	}
}

func mustSeal(t *testing.T, m *identity.Munge, content []byte) string {
	t.Helper()
	cred, err := m.Seal(context.Background(), content)
	if err != nil {
		t.Fatal(err)
	}
	return cred
}

// waitNodes waits until n nodes are up and a scheduler is elected.
func waitNodes(t *testing.T, s store.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := allocator.Snapshot(context.Background(), s)
		up := 0
		if err == nil {
			for _, ns := range c.Nodes {
				if ns.Up {
					up++
				}
			}
		}
		if up == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d nodes up after a minute", up, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStepUser: a step runs the attested uid as this node names it; it refuses a job
// whose record changed after its acceptance, one attested by another user than the
// agents', and one whose uid this node knows by another name.
func TestStepUser(t *testing.T) {
	ctx := context.Background()
	d := mungetest.Start(t)
	m, err := identity.Open(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	sp := Spec{ID: "9", User: "nobody", Command: []string{"true"}, WorkDir: "/tmp"}
	cred := mungeCLI(t, d, jobContent(sp), uid, gid, 0)
	j := &Job{Spec: sp, Auth: &Auth{Credential: cred, UID: uint32(uid), GID: uint32(gid)}}
	j.Auth.Attestation = mustSeal(t, m, attestContent(sp, j.Auth.UID, j.Auth.GID, cred))
	u, err := stepUser(ctx, m, j, "n1")
	if err != nil || u.Name != "nobody" || int(u.UID) != uid || int(u.GID) != gid {
		t.Fatalf("stepUser: %+v %v, want nobody %d:%d", u, err, uid, gid)
	}
	var r *refusal
	tampered := *j
	tampered.Spec.Command = []string{"sh", "-c", "evil"}
	if _, err := stepUser(ctx, m, &tampered, "n1"); !errors.As(err, &r) || !strings.Contains(err.Error(), "changed after it was accepted") {
		t.Errorf("a command changed after acceptance: %v", err)
	}
	selfMade := *j
	a := *j.Auth
	a.Attestation = mungeCLI(t, d, attestContent(sp, a.UID, a.GID, cred), uid, gid, 0) // nobody attests for itself
	selfMade.Auth = &a
	if _, err := stepUser(ctx, m, &selfMade, "n1"); !errors.As(err, &r) || !strings.Contains(err.Error(), "not by a gangrun agent") {
		t.Errorf("an attestation by the job's own user: %v", err)
	}
	renamed := *j
	renamed.Spec.User = "root"
	a = *j.Auth
	a.Attestation = mustSeal(t, m, attestContent(renamed.Spec, a.UID, a.GID, cred))
	renamed.Auth = &a
	if _, err := stepUser(ctx, m, &renamed, "n1"); !errors.As(err, &r) || !strings.Contains(err.Error(), "is nobody on node n1, not the job's user root") {
		t.Errorf("uid %d named root by the record: %v", uid, err)
	}
	if _, err := stepUser(ctx, m, &Job{Spec: sp}, "n1"); !errors.As(err, &r) {
		t.Errorf("no Auth: %v", err)
	}
}

// TestPurgeSeen: the elected agent deletes the replay markers of expired credentials
// and keeps the others; a deposed one deletes nothing.
func TestPurgeSeen(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "leader", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: throughputLeaderKey, Session: sess}}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old, _ := json.Marshal(seenMark{Job: "1", Expires: now.Add(-time.Second)})
	fresh, _ := json.Marshal(seenMark{Job: "2", Expires: now.Add(time.Minute)})
	put := func(k string, v []byte) {
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: seenPrefix + k, Value: v}}); err != nil {
			t.Fatal(err)
		}
	}
	put("old", old)
	put("fresh", fresh)
	put("junk", []byte("not json"))
	deposed := &Controller{s: s, session: "someone-else", now: time.Now}
	if err := deposed.purgeSeen(ctx, now); !errors.Is(err, store.ErrNotLockHolder) {
		t.Errorf("a deposed controller's purge: %v, want ErrNotLockHolder", err)
	}
	c := &Controller{s: s, session: sess, now: time.Now}
	if err := c.purgeSeen(ctx, now); err != nil {
		t.Fatal(err)
	}
	left, _, _ := s.List(ctx, seenPrefix)
	if len(left) != 1 || left[0].Key != seenPrefix+"fresh" {
		t.Errorf("markers left: %v, want only the fresh one", left)
	}
}
