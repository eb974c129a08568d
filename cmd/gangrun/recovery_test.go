package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// recovery is a one-node cluster whose Consul the test takes away and restores from a
// snapshot (docs/operations.md, "Recovery"): a Consul dev agent, one agent with a state
// directory of its own, a work directory, and the process mark of everything it starts.
type recovery struct {
	t      *testing.T
	consul *consultest.Agent
	dir    string
	mark   string
}

func startRecovery(t *testing.T) *recovery {
	t.Helper()
	r := &recovery{t: t, consul: consultest.Start(t), dir: t.TempDir(), mark: testMark(t)}
	startAgentWith(t, r.consul.Addr, "rc-a", []string{r.mark}, "--state-dir", filepath.Join(r.dir, "state"))
	waitUntilFor(t, 60*time.Second, func() bool { n := nodesJSON(t, r.consul.Addr); return len(n) == 1 && n[0].State == "up" }, "the agent up")
	t.Chdir(r.dir)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// The jobs' output, the steps' messages among it, and what Consul holds.
		outs, _ := filepath.Glob(filepath.Join(r.dir, "*.out"))
		for _, f := range outs {
			b, _ := os.ReadFile(f)
			t.Logf("%s:\n%s", filepath.Base(f), b)
		}
		if bin, err := consultest.Binary(); err == nil {
			out, _ := exec.Command(bin, "kv", "get", "-http-addr="+r.consul.Addr, "-recurse", "gangrun/").CombinedOutput()
			t.Logf("Consul's gangrun/ keys:\n%s", out)
		}
	})
	return r
}

// consulCmd runs the consul command line against the test's Consul.
func (r *recovery) consulCmd(args ...string) {
	r.t.Helper()
	bin, err := consultest.Binary()
	if err != nil {
		r.t.Fatal(err)
	}
	// consul's flags come before its positional arguments: "snapshot save -http-addr=A F".
	argv := append(append(append([]string{}, args[:2]...), "-http-addr="+r.consul.Addr), args[2:]...)
	out, err := exec.Command(bin, argv...).CombinedOutput()
	if err != nil {
		r.t.Fatalf("consul %v: %v\n%s", args, err, out)
	}
}

// submit submits a job whose workers run script in the work directory.
func (r *recovery) submit(script string, flags ...string) string {
	r.t.Helper()
	code, out, errOut := inProcess(append(append([]string{"submit", "--consul", r.consul.Addr, "--term-timeout", "5s"}, flags...), "--", "/bin/sh", "-c", script)...)
	if code != 0 {
		r.t.Fatalf("submit: exit %d: %s", code, errOut)
	}
	return strings.TrimSpace(out)
}

func (r *recovery) read(id string) *job.Job {
	r.t.Helper()
	s, err := store.NewConsul(r.consul.Addr)
	if err != nil {
		r.t.Fatal(err)
	}
	defer s.Close()
	j, err := job.Read(context.Background(), s, id)
	if err != nil {
		return nil
	}
	return j
}

// waitFor waits until job id's state satisfies ok.
func (r *recovery) waitFor(id, what string, within time.Duration, ok func(j *job.Job) bool) *job.Job {
	r.t.Helper()
	var j *job.Job
	waitUntilFor(r.t, within, func() bool { j = r.read(id); return j != nil && ok(j) }, "job "+id+" "+what)
	return j
}

// outage snapshots Consul's data, kills Consul, waits down, then starts an empty Consul
// on the same address and restores the snapshot into it as soon as it answers; before,
// when not nil, runs between the snapshot and the kill.
func (r *recovery) outage(down time.Duration, before func()) {
	r.outageWith(down, before, nil)
}

// outageWith is outage running meanwhile, when not nil, between the empty Consul's
// start and the restore (an operator at work: the empty Consul answers meanwhile).
func (r *recovery) outageWith(down time.Duration, before, meanwhile func()) {
	r.t.Helper()
	snap := filepath.Join(r.dir, "consul.snap")
	r.consulCmd("snapshot", "save", snap)
	if before != nil {
		before()
	}
	r.consul.Kill()
	time.Sleep(down)
	r.consul.Launch()
	if meanwhile != nil {
		meanwhile()
	}
	r.consulCmd("snapshot", "restore", snap)
}

// raiseIndexPast writes keys outside gangrun/ into the test's Consul until its KV index
// is past idx, as the other clients of a cluster do to an empty Consul that replaced a
// lost one.
func (r *recovery) raiseIndexPast(idx uint64) {
	r.t.Helper()
	s, err := store.NewConsul(r.consul.Addr)
	if err != nil {
		r.t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i := 0; ; i++ {
		_, at, err := s.List(ctx, "recovery-test/")
		if err != nil {
			r.t.Fatal(err)
		}
		if at > idx {
			return
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "recovery-test/" + strconv.Itoa(i), Value: []byte("x")}}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// index is the test's Consul's KV index now.
func (r *recovery) index() uint64 {
	r.t.Helper()
	s, err := store.NewConsul(r.consul.Addr)
	if err != nil {
		r.t.Fatal(err)
	}
	defer s.Close()
	_, at, err := s.List(context.Background(), "gangrun/")
	if err != nil {
		r.t.Fatal(err)
	}
	return at
}

// lines counts the lines of file in the work directory holding s.
func (r *recovery) lines(file, s string) int {
	b, _ := os.ReadFile(filepath.Join(r.dir, file))
	return strings.Count(string(b), s)
}

// TestRecoveryAfterConsulOutages: a one-node cluster recovers from every Consul outage
// by itself, nothing run twice at once, nothing left RUNNING, no job stuck PENDING on
// a node that is up:
//
//   - short (Consul's data lost, an empty Consul answering and written to until its
//     index is past the one lost, then the snapshot restored): the running job's step
//     carries on; it and the job waiting on it complete, each run once;
//   - long (30 s, past the steps' lease): the step stops its workers and ends; once
//     Consul is back the job is requeued as a node failure (not its own restart), its
//     node not excluded, and runs again to completion;
//   - a job that ended after the snapshot: restored, Consul shows it running; the node's
//     ledger records its outcome again and it is not run a second time;
//   - a job submitted after the snapshot: the restore loses it; its step, whose session
//     the restored Consul does not know, stops its workers and ends.
func TestRecoveryAfterConsulOutages(t *testing.T) {
	t.Run("short", func(t *testing.T) {
		r := startRecovery(t)
		first := r.submit(`echo run >> short-1.log; sleep 12`)
		second := r.submit(`echo run >> short-2.log`, "--dependency", "afterok:"+first)
		r.waitFor(first, "RUNNING", 60*time.Second, func(j *job.Job) bool { return j.State.Status == job.Running })
		// Its workers run (its step's rendezvous formed) before the snapshot: a snapshot
		// from before the step joined the rendezvous restores a job whose step has not
		// (its session unknown), and the step runs its workers again, as documented.
		waitUntilFor(t, 60*time.Second, func() bool { return r.lines("short-1.log", "run") == 1 }, "job "+first+"'s workers running")
		// Before the restore, the empty Consul takes writes until its index is past
		// the one the step saw (as the agents' would, registering again): the cluster's
		// marker, not the index, tells the step that this Consul lost its data. The
		// outage, the writes and the wait stay within the steps' lease (12 s after
		// their last renewal, 4 s apart).
		// The restore waits until the step has met the empty Consul (its rendezvous
		// says what it made of it).
		var before uint64
		r.outageWith(500*time.Millisecond, func() { before = r.index() }, func() {
			r.raiseIndexPast(before + 10)
			out := "gangrun-" + first + ".out"
			waitUntilFor(t, 8*time.Second, func() bool {
				return r.lines(out, "waiting for its restore") > 0 || r.lines(out, "membership changed") > 0
			}, "the step to meet the empty Consul")
		})
		for _, id := range []string{first, second} {
			if j := r.waitFor(id, "ended", 120*time.Second, func(j *job.Job) bool { return j.State.Status.Final() }); j.State.Status != job.Completed {
				t.Errorf("job %s: %s %q, want COMPLETED", id, j.State.Status, j.State.Reason)
			}
		}
		if a, b := r.lines("short-1.log", "run"), r.lines("short-2.log", "run"); a != 1 || b != 1 {
			t.Errorf("runs: %d and %d, want each job run once", a, b)
		}
	})
	t.Run("long", func(t *testing.T) {
		r := startRecovery(t)
		id := r.submit(`echo "run $GANGRUN_ATTEMPT" >> long.log; if [ -e long.again ]; then exit 0; fi; touch long.again; sleep 300`)
		r.waitFor(id, "RUNNING", 60*time.Second, func(j *job.Job) bool { return j.State.Status == job.Running })
		r.outage(30*time.Second, nil)
		j := r.waitFor(id, "ended", 180*time.Second, func(j *job.Job) bool { return j.State.Status.Final() })
		if j.State.Status != job.Completed || j.State.NodeFailures < 1 || j.State.Restarts != 0 {
			t.Errorf("job: %s %q, node failures %d, restarts %d; want COMPLETED after a node failure, no restart of its own",
				j.State.Status, j.State.Reason, j.State.NodeFailures, j.State.Restarts)
		}
		for _, l := range j.State.LostNodes {
			if l.Exclude {
				t.Errorf("node %s excluded after its step was fenced by the outage: %+v", l.Node, l)
			}
		}
		if n := r.lines("long.log", "run"); n != 2 {
			t.Errorf("the job ran %d times, want twice (fenced, then again)", n)
		}
	})
	t.Run("ended after the snapshot", func(t *testing.T) {
		r := startRecovery(t)
		id := r.submit(`echo run >> ended.log; sleep 6`)
		r.waitFor(id, "RUNNING", 60*time.Second, func(j *job.Job) bool { return j.State.Status == job.Running })
		r.outage(2*time.Second, func() {
			r.waitFor(id, "COMPLETED", 60*time.Second, func(j *job.Job) bool { return j.State.Status == job.Completed })
		})
		j := r.waitFor(id, "ended again", 120*time.Second, func(j *job.Job) bool { return j.State.Status.Final() })
		if j.State.Status != job.Completed {
			t.Errorf("job after the restore: %s %q, want COMPLETED", j.State.Status, j.State.Reason)
		}
		time.Sleep(3 * time.Second)
		if n := r.lines("ended.log", "run"); n != 1 {
			t.Errorf("the job ran %d times, want once", n)
		}
	})
	t.Run("submitted after the snapshot", func(t *testing.T) {
		r := startRecovery(t)
		var id string
		r.outage(2*time.Second, func() {
			id = r.submit(`echo run >> lost.log; sleep 300`)
			r.waitFor(id, "RUNNING", 60*time.Second, func(j *job.Job) bool { return j.State.Status == job.Running })
		})
		if j := r.read(id); j != nil {
			t.Errorf("the restore kept job %s: %s", id, j.State.Status)
		}
		waitUntilFor(t, 90*time.Second, func() bool { return len(markedProcs(t, r.mark, "sleep")) == 0 }, "the lost job's workers gone")
		// Its step ends too: at once, or, while the restored Consul's index is still
		// below what the step saw (nothing written since the restore), once its lease
		// is over.
		waitUntilFor(t, 90*time.Second, func() bool { return len(markedProcs(t, r.mark, stepCommand)) == 0 }, "the lost job's step gone")
	})
	t.Run("never back", func(t *testing.T) {
		r := startRecovery(t)
		id := r.submit(`echo run >> gone.log; sleep 300`)
		r.waitFor(id, "RUNNING", 60*time.Second, func(j *job.Job) bool { return j.State.Status == job.Running })
		r.consul.Kill()
		start := time.Now()
		// The step's lease ends 12 s after its last renewal; then its workers get
		// SIGTERM and the job's --term-timeout (5 s); the step ends.
		waitUntilFor(t, 60*time.Second, func() bool {
			return len(markedProcs(t, r.mark, "sleep")) == 0 && len(markedProcs(t, r.mark, stepCommand)) == 0
		}, "the step and its workers gone")
		t.Logf("the step and its workers gone %s after Consul", time.Since(start).Round(time.Second))
		for _, p := range markedProcs(t, r.mark, "") {
			if st, _ := os.ReadFile("/proc/" + p + "/stat"); strings.Contains(string(st), ") Z ") {
				t.Errorf("a zombie left: %s", st)
			}
		}
	})
}

// markedProcs lists the processes carrying mark in their environment whose command
// line holds word ("" for any), by pid.
func markedProcs(t *testing.T, mark, word string) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		env, err := os.ReadFile("/proc/" + pid + "/environ")
		if err != nil || !strings.Contains(string(env), mark) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		if word == "" || strings.Contains(strings.ReplaceAll(string(cmdline), "\x00", " "), word) {
			if pid != strconv.Itoa(os.Getpid()) {
				out = append(out, pid)
			}
		}
	}
	return out
}
