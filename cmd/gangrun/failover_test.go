package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// Settings of the fail-over test.
const (
	// failoverSteps × failoverStepTime is how long the job trains at least: long enough
	// to span the kill, the election, the outage and the relaunch of the old leader on a
	// loaded two-core machine.
	failoverSteps    = 600
	failoverStepTime = "0.1"
	// failoverCkptEvery is how often the trainer writes a checkpoint and says so: the
	// grain of "the job's next progress".
	failoverCkptEvery = 5
	// failoverOutage is the least time the killed leader stays down: the remaining two
	// servers carry the cluster meanwhile.
	failoverOutage = 5 * time.Second
	// failoverDeadline bounds every wait on a condition in the test.
	failoverDeadline = 2 * time.Minute
	// schedulerLeaderKey is the key the elected scheduler holds (docs/cluster.md: "How a gang
	// is granted").
	schedulerLeaderKey = "gangrun/scheduler/leader"
)

// grantObserver reads the allocator's keys through one Consul agent all along the test
// (checkGrants, one consistent read each time) and keeps what it saw: how
// many reads succeeded and failed, every breach of the grant invariants, and every
// tracked grant that was missing or changed in a read while its holder still held it.
type grantObserver struct {
	s store.Store

	mu         sync.Mutex
	reads      int
	failed     []time.Time // when reads failed
	lastErrMsg string
	breaches   map[string]bool
	tracked    map[string]trackedGrant // grant id → as it was granted
	gen        uint64                  // counts calls of track
	lost       map[string]string       // grant id → what a read showed instead
	stop       chan struct{}
	done       chan struct{}
	closeOnce  sync.Once
}

func startObserver(s store.Store) *grantObserver {
	o := &grantObserver{s: s, breaches: map[string]bool{}, tracked: map[string]trackedGrant{},
		lost: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go o.run()
	return o
}

func (o *grantObserver) run() {
	defer close(o.done)
	for {
		select {
		case <-o.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		o.check()
	}
}

// check is one read. Only grants tracked before the read began are checked: a read
// that began before a holder saw its grant may show it still pending.
func (o *grantObserver) check() {
	o.mu.Lock()
	gen := o.gen
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, bad, err := checkGrants(ctx, o.s)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.failed = append(o.failed, time.Now())
		o.lastErrMsg = err.Error()
		return
	}
	o.reads++
	for _, b := range bad {
		o.breaches[b] = true
	}
	for id, want := range o.tracked {
		if want.gen > gen {
			continue
		}
		g, ok := c.Grants[id]
		switch {
		case !ok:
			o.lost[id] = "the grant is gone"
		case g.State != allocator.GrantGranted || g.Session != want.Session || !sameNodes(g.Nodes, want.Nodes):
			o.lost[id] = fmt.Sprintf("the grant changed: %+v", g)
		}
	}
}

// failedSince returns how many reads failed since t, and the last of them.
func (o *grantObserver) failedSince(t time.Time) (int, time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, last := 0, time.Time{}
	for _, f := range o.failed {
		if !f.Before(t) {
			n, last = n+1, f
		}
	}
	return n, last
}

// track makes every later read check that grant g is still there, unchanged.
func (o *grantObserver) track(g allocator.Grant) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.gen++
	o.tracked[g.ID] = trackedGrant{g, o.gen}
}

// untrack stops checking grant id (its holder is about to release it).
func (o *grantObserver) untrack(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.tracked, id)
}

// close stops the reads; safe to call twice.
func (o *grantObserver) close() {
	o.closeOnce.Do(func() { close(o.stop) })
	<-o.done
}

func sameNodes(a, b []allocator.GrantNode) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// churn grants and releases 1-GPU requests in a loop, through the allocator's own client
// inside the test, so that grants are being committed, held and released at the moment
// of each kill. A grant lost while its holder held it is an error; failed calls are
// counted (each is retried after a pause).
type churn struct {
	s   store.Store
	obs *grantObserver

	mu         sync.Mutex
	granted    int
	failed     map[string]int // what failed (submit, wait, release) → how often
	lastErr    string
	lost       []string
	stop       chan struct{}
	wg         sync.WaitGroup
	stopOnce   sync.Once
	holdFor    time.Duration
	retryAfter time.Duration
}

func startChurn(s store.Store, obs *grantObserver, workers int) *churn {
	c := &churn{s: s, obs: obs, failed: map[string]int{}, stop: make(chan struct{}),
		holdFor: 300 * time.Millisecond, retryAfter: 100 * time.Millisecond}
	for i := 0; i < workers; i++ {
		c.wg.Add(1)
		go c.run(i)
	}
	return c
}

// pause waits d, or until the churn is stopped (false).
func (c *churn) pause(d time.Duration) bool {
	select {
	case <-c.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (c *churn) fail(what string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed[what]++
	c.lastErr = what + ": " + err.Error()
}

func (c *churn) run(worker int) {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		tk, err := allocator.Submit(ctx, c.s, allocator.Request{Nodes: 1, GPUsPerNode: 1, Priority: 5,
			Holder: fmt.Sprintf("churn %d", worker)})
		if err != nil {
			if ctx.Err() == nil {
				c.fail("submit", err)
			}
			if !c.pause(c.retryAfter) {
				return
			}
			continue
		}
		g, err := tk.Wait(ctx, nil)
		if err != nil {
			if ctx.Err() == nil {
				c.fail("wait", err)
			}
			_ = tk.Release(context.Background())
			continue
		}
		c.obs.track(g)
		c.mu.Lock()
		c.granted++
		c.mu.Unlock()
		select {
		case <-tk.Lost():
		case <-time.After(c.holdFor):
		}
		c.obs.untrack(g.ID)
		select {
		case <-tk.Lost():
			why := "its grant's key is gone"
			if err := tk.Lease().Err(); err != nil {
				why = err.Error()
			}
			c.mu.Lock()
			c.lost = append(c.lost, g.ID+" ("+why+")")
			c.mu.Unlock()
		default:
		}
		if err := tk.Release(context.Background()); err != nil {
			c.fail("release", err)
		}
	}
}

// close stops the churn and waits for its workers; safe to call twice.
func (c *churn) close() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}

// trackedGrant is a grant the observer checks, and the track call that added it.
type trackedGrant struct {
	allocator.Grant
	gen uint64
}

// allocRequest is one `gangrun alloc --json` holder process.
type allocRequest struct {
	*gangrunNode
	label string
}

var requestIDRE = regexp.MustCompile(`request ([0-9a-f]+) submitted`)

// id returns the request id the holder printed ("" until it has).
func (r *allocRequest) id() string {
	if m := requestIDRE.FindStringSubmatch(r.stderr.String()); m != nil {
		return m[1]
	}
	return ""
}

// grant returns the grant the holder printed, once it has printed all of it.
func (r *allocRequest) grant() (allocator.Grant, bool) {
	var a allocator.Summary
	if json.Unmarshal([]byte(r.stdout.String()), &a) != nil || a.ID == "" {
		return allocator.Grant{}, false
	}
	return allocator.Grant{ID: a.ID, State: allocator.GrantGranted, Nodes: a.Nodes}, true
}

// exited reports whether the process has exited.
func (n *gangrunNode) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// checkpointRE is rank 0's line for each checkpoint.
var checkpointRE = regexp.MustCompile(`(?m)^\[rank0\]: checkpoint step \d+ `)

// attemptRE is rank 0's first line of each attempt (gangrun prefixes each worker's
// lines with its rank).
var attemptRE = regexp.MustCompile(`(?m)^\[rank0\]: training: world size (\d+), backend gloo, steps (\d+)\.\.(\d+), attempt (\S+)$`)

// TestConsulLeaderFailover runs gangrun on a 3-server Consul cluster, each node through
// its own client agent, and SIGKILLs the Consul leader twice while a 2-node PyTorch job
// trains, grants are held and requests are pending: once alone (the job should carry
// on), once together with a worker, so the gang restarts and joins its next round during
// the election (the job should resume from its checkpoint). Each time the old leader is
// launched again with its data after some seconds. Reading Consul all along through a
// surviving agent, it asserts: no GPU is ever held by two grants and every grant is
// whole; no held grant is lost or changed (its holder still holds it); pending requests
// stay pending, and are granted in turn once there is room; new grants are made after
// each kill and after each relaunch; both nodes stay up; the job finishes exactly once,
// and a restart resumes from a checkpoint, never from step 0. It logs the seconds from
// each kill to the next new grant and to the job's next progress, and what failed
// meanwhile (findings).
func TestConsulLeaderFailover(t *testing.T) {
	cluster := consultest.StartCluster(t, 3, 3)
	consulOf := map[string]string{"node-a": cluster.Clients[0].Addr, "node-b": cluster.Clients[1].Addr}
	login := cluster.Clients[2].Addr // where alloc runs and the test reads
	mark := testMark(t)
	ctx := context.Background()
	s, err := store.NewConsul(login)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// Two nodes: a gangrun agent each (8 recorded H100s), through the node's own Consul
	// client agent.
	inv := filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json")
	agents := map[string]*gangrunNode{}
	for _, name := range []string{"node-a", "node-b"} {
		agents[name] = startNode(t, "agent "+name, []string{mark, "TMPDIR=" + agentTmp}, "agent", "--consul", consulOf[name], "--node-name", name,
			"--advertise-addr", "127.0.0.1", "--topology-file", inv, "--labels", "partition=train")
	}
	waitUntilFor(t, failoverDeadline, func() bool {
		c, err := allocator.Snapshot(ctx, s)
		if err != nil {
			return false
		}
		up := 0
		for _, n := range c.NodeList() {
			if n.State == allocator.NodeUp {
				up++
			}
		}
		e, err := s.Get(ctx, schedulerLeaderKey)
		return up == 2 && err == nil && e != nil && e.Session != ""
	}, "two agents up and a scheduler elected")
	var killed time.Time // when the Consul leader was SIGKILLed
	obs := startObserver(s)
	defer obs.close()

	// The job: two gangrun run processes, node-a and node-b, through their own agents.
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	job := map[string]*gangrunNode{}
	for _, name := range []string{"node-a", "node-b"} {
		args := append([]string{"run", "--coordinator", "consul://" + consulOf[name], "--job-id", "failover", "--nnodes", "2",
			"--node-name", name, "--advertise-addr", "127.0.0.1", "--nproc-per-node", "1", "--restart-backoff", "0s",
			"--checkpoint-dir", ckpt, "--"}, trainer(t, "--steps", strconv.Itoa(failoverSteps),
			"--ckpt-every", strconv.Itoa(failoverCkptEvery), "--step-time", failoverStepTime)...)
		job[name] = startNode(t, name, []string{mark}, args...)
	}
	jobOut := func() string { return job["node-a"].stdout.String() + job["node-b"].stdout.String() }
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"node-a", "node-b"} {
				t.Logf("gangrun run %s:\n%s", name, job[name].output())
				t.Logf("gangrun agent %s:\n%s", name, agents[name].output())
			}
		}
	})

	// Requests: two granted and held, two pending (more than is free), all from the
	// login node's client agent. H1 takes 3 GPUs on each node and H2 2 on one: 8 of 16
	// stay free (3 on one node, 5 on the other), so P1 (2 × 6) and P2 (1 × 8) wait, and
	// the 1-GPU requests of the churn and of each fail-over (of higher priorities) fit.
	alloc := func(label string, args ...string) *allocRequest {
		return &allocRequest{gangrunNode: startNode(t, label, []string{mark},
			append([]string{"alloc", "--consul", login, "--json"}, args...)...), label: label}
	}
	waitGranted := func(r *allocRequest) allocator.Grant {
		t.Helper()
		var g allocator.Grant
		waitUntilFor(t, failoverDeadline, func() bool {
			printed, ok := r.grant()
			if !ok {
				if r.exited() {
					t.Fatalf("alloc %s exited %d before it was granted:\n%s", r.label, r.code, r.output())
				}
				return false
			}
			// The whole record, with its session and time, as Consul has it.
			e, err := s.Get(ctx, "gangrun/cluster/grants/"+printed.ID)
			if err != nil {
				return false // a read through an agent that has not noticed the dead server yet
			}
			if e == nil || json.Unmarshal(e.Value, &g) != nil || g.State != allocator.GrantGranted {
				t.Fatalf("alloc %s printed grant %s, which Consul has as %+v", r.label, printed.ID, e)
			}
			return true
		}, "a grant for "+r.label)
		return g
	}
	// submit starts alloc and, should it fail before its request is written (Consul
	// unreachable: "exit 1" with the error, the way a user sees it), starts it again, as
	// a user or a script would; each failure is a finding.
	var findings []string
	submitFailures := map[string]int{}
	submit := func(label string, args ...string) *allocRequest {
		t.Helper()
		first := ""
		defer func() {
			if n := submitFailures[label]; n > 0 {
				findings = append(findings, fmt.Sprintf("alloc %s failed %d time(s) to submit its request (exit 1) and was started again until it was accepted %.1f s after the kill; the first error: %s",
					label, n, time.Since(killed).Seconds(), first))
			}
		}()
		for {
			r := alloc(label, args...)
			waitUntilFor(t, failoverDeadline, func() bool { return r.id() != "" || r.exited() }, "alloc "+label+" submitted")
			if r.id() != "" {
				return r
			}
			if r.code != 1 {
				t.Fatalf("alloc %s exited %d before it submitted its request:\n%s", label, r.code, r.output())
			}
			submitFailures[label]++
			if first == "" {
				first = strings.TrimSpace(r.stderr.String())
			}
		}
	}
	held := map[string]*allocRequest{}
	for _, h := range []struct{ label, nodes, gpus string }{{"H1", "2", "3"}, {"H2", "1", "2"}} {
		r := alloc(h.label, "--nodes", h.nodes, "--gpus-per-node", h.gpus)
		obs.track(waitGranted(r))
		held[h.label] = r
	}
	// P1 is submitted before P2 (arrival decides between equal priorities): released
	// GPUs go to P1 first, then to P2.
	pending := map[string]*allocRequest{"P1": submit("P1", "--nodes", "2", "--gpus-per-node", "6")}
	pending["P2"] = submit("P2", "--nodes", "1", "--gpus-per-node", "8")
	waitPending := func(what string) {
		t.Helper()
		waitUntilFor(t, failoverDeadline, func() bool {
			st, err := allocator.ReadStatus(ctx, s)
			if err != nil {
				return false
			}
			for label, r := range pending {
				if r.exited() {
					t.Fatalf("pending alloc %s exited %d:\n%s", label, r.code, r.output())
				}
				if _, ok := r.grant(); ok {
					t.Fatalf("alloc %s was granted although it cannot fit: %s", label, r.stdout.String())
				}
				if id := r.id(); id == "" || !strings.HasPrefix(st.Pending[id], "Resources") {
					return false
				}
			}
			return true
		}, what)
	}
	waitPending("P1 and P2 pending for want of resources")

	// checkpoints maps the step of each complete checkpoint to when its .complete
	// marker was written.
	checkpoints := func() map[int]time.Time {
		out := map[int]time.Time{}
		entries, _ := os.ReadDir(ckpt)
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), "step-")
			step, err := strconv.Atoi(name)
			if !ok || err != nil {
				continue
			}
			if fi, err := os.Stat(filepath.Join(ckpt, e.Name(), ".complete")); err == nil {
				out[step] = fi.ModTime()
			}
		}
		return out
	}
	newest := func() int {
		n := -1
		for step := range checkpoints() {
			n = max(n, step)
		}
		return n
	}
	// lastAttempt is the number of rank 0's last attempt so far (-1 before the first).
	lastAttempt := func() int {
		n := -1
		for _, m := range attemptRE.FindAllStringSubmatch(jobOut(), -1) {
			if a, err := strconv.Atoi(m[4]); err == nil {
				n = max(n, a)
			}
		}
		return n
	}
	// restarted reports whether an attempt after attempt has written its first
	// checkpoint (on whichever node its rank 0 runs).
	restarted := func(attempt int) bool {
		for _, n := range job {
			out := n.stdout.String()
			for _, m := range attemptRE.FindAllStringSubmatchIndex(out, -1) {
				if a, err := strconv.Atoi(out[m[8]:m[9]]); err == nil && a > attempt && checkpointRE.MatchString(out[m[1]:]) {
					return true
				}
			}
		}
		return false
	}
	// firstPast returns the first complete checkpoint past step and when it was
	// complete; ok is false while there is none.
	firstPast := func(step int) (at time.Time, ok bool) {
		first := -1
		for st, t := range checkpoints() {
			if st > step && (first < 0 || st < first) {
				first, at = st, t
			}
		}
		return at, first >= 0
	}
	checkHolders := func(when string) {
		t.Helper()
		for label, r := range held {
			if r.exited() {
				t.Errorf("%s: holder %s exited %d: its grant was lost\n%s", when, label, r.code, r.output())
			}
		}
		waitPending("P1 and P2 still pending " + when)
		var c *allocator.Cluster
		waitUntilFor(t, failoverDeadline, func() bool {
			var err error
			c, err = allocator.Snapshot(ctx, s)
			return err == nil
		}, "a snapshot of the cluster")
		for _, n := range c.NodeList() {
			if n.State != allocator.NodeUp {
				t.Errorf("%s: node %s is %s, want up", when, n.Name, n.State)
			}
		}
	}

	// failover SIGKILLs the Consul leader (and, with workerToo, node-b's worker at the
	// same moment, so the gang restarts and joins a new round during the election),
	// submits a new request at once, launches the old leader again after
	// failoverOutage, and submits another. It returns the figures.
	type figures struct {
		elected, grant, progress, healthy, grantAfterLaunch time.Duration
		step                                                int
		failedReads, failedSubmits                          int
		failedFor                                           time.Duration // from the kill to the last failed read
	}
	failover := func(label string, workerToo bool) figures {
		t.Helper()
		var f figures
		for name, n := range job {
			if n.exited() {
				t.Fatalf("%s: %s ended before the fail-over (raise failoverSteps):\n%s", label, name, n.output())
			}
		}
		var old *consultest.Agent
		waitUntilFor(t, failoverDeadline, func() bool {
			var err error
			old, err = cluster.Leader(ctx)
			return err == nil
		}, "the Consul leader")
		worker := 0
		if workerToo {
			if worker = workerPID(mark, "node-b", 0); worker == 0 {
				t.Fatalf("%s: no worker of node-b found", label)
			}
		}
		f.step = newest()
		attemptAtKill := lastAttempt()
		killed = time.Now()
		old.Kill()
		if worker != 0 {
			if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: SIGKILLed the Consul leader %s at the job's step %d (and node-b's worker: %v)", label, old.Name, f.step, workerToo)
		// A new request at once, with a priority above the pending ones (which keep
		// both nodes reserved for P1, ahead in the queue, otherwise).
		nr := submit(label+"-N1", "--nodes", "1", "--gpus-per-node", "1", "--priority", "10")
		var newLeader *consultest.Agent
		waitUntilFor(t, failoverDeadline, func() bool {
			l, err := cluster.Leader(ctx)
			newLeader = l
			return err == nil && l != old
		}, "a new Consul leader")
		f.elected = time.Since(killed)
		g := waitGranted(nr)
		f.grant = g.Granted.Sub(killed) // when the scheduler committed it
		obs.track(g)
		held[label+"-N1"] = nr
		waitUntilFor(t, 5*time.Minute, func() bool {
			if !workerToo {
				at, ok := firstPast(f.step)
				f.progress = at.Sub(killed)
				return ok
			}
			if restarted(attemptAtKill) {
				f.progress = time.Since(killed) // polled: within 0.1 s
				return true
			}
			return false
		}, label+": the job's progress after the kill")
		t.Logf("%s: %s leads %.1f s after the kill; first new grant after %.1f s; the job's next checkpoint (past step %d, or of its next attempt) after %.1f s",
			label, newLeader.Name, f.elected.Seconds(), f.grant.Seconds(), f.step, f.progress.Seconds())
		// The old leader stays down a while, then comes back with its data.
		time.Sleep(time.Until(killed.Add(failoverOutage))) // a deliberate outage, not a wait for a condition
		relaunched := time.Now()
		cluster.Launch(old, failoverDeadline)
		f.healthy = time.Since(relaunched)
		for name, n := range job {
			if n.exited() {
				t.Errorf("%s: %s ended before the old leader was back: the job did not span the fail-over (raise failoverSteps)", label, name)
			}
		}
		nr = submit(label+"-N2", "--nodes", "1", "--gpus-per-node", "1", "--priority", "10")
		g = waitGranted(nr)
		f.grantAfterLaunch = g.Granted.Sub(relaunched)
		obs.track(g)
		held[label+"-N2"] = nr
		t.Logf("%s: %s launched again %.1f s after the kill, the cluster whole again %.1f s later, a new grant %.1f s after the launch",
			label, old.Name, relaunched.Sub(killed).Seconds(), f.healthy.Seconds(), f.grantAfterLaunch.Seconds())
		checkHolders("after " + label)
		var last time.Time
		if f.failedReads, last = obs.failedSince(killed); f.failedReads > 0 {
			f.failedFor = last.Sub(killed)
		}
		f.failedSubmits = submitFailures[label+"-N1"] + submitFailures[label+"-N2"]
		return f
	}

	// Grants made and released all along, two at a time.
	ch := startChurn(s, obs, 2)
	defer ch.close()

	// The job has progressed and still trains.
	waitUntilFor(t, failoverDeadline, func() bool { return newest() >= 20 }, "the job's checkpoint at step 20")
	// 1: the leader dies while the job trains: the job carries on.
	leaderOnly := failover("leader", false)
	restartsBefore := len(attemptRE.FindAllStringSubmatch(jobOut(), -1)) - 1
	// 2: the leader dies as the gang restarts: the nodes join the next round during the
	// election, and the job resumes from its checkpoint.
	withRestart := failover("leader+worker", true)

	// The job completes, exactly once.
	for name, n := range job {
		if code := n.wait(t, 5*time.Minute); code != 0 {
			t.Fatalf("%s exited %d\n%s", name, code, n.output())
		}
	}
	out := jobOut()
	if n := strings.Count(out, fmt.Sprintf("]: finished at step %d ", failoverSteps)); n != 1 {
		t.Errorf("the job reached its last step %d times, want once:\n%s", n, out)
	}
	attempts := attemptRE.FindAllStringSubmatch(out, -1)
	// Rank 0 may be on either node in each attempt (node ranks are given again at every
	// round) and the output is node-a's then node-b's: order the attempts by number.
	sort.SliceStable(attempts, func(i, j int) bool { return mustAtoi(attempts[i][4]) < mustAtoi(attempts[j][4]) })
	if len(attempts) == 0 || attempts[0][2] != "0" {
		t.Errorf("the job's first attempt: %v, want one from step 0", attempts)
	}
	for _, a := range attempts[min(1, len(attempts)):] {
		if from := mustAtoi(a[2]); from == 0 || from%failoverCkptEvery != 0 {
			t.Errorf("attempt %s started at step %d: after the job had progressed, a restart must resume from a checkpoint", a[4], from)
		}
	}
	restarts := len(attempts) - 1
	if restarts <= restartsBefore {
		t.Errorf("the gang did not restart after its worker's SIGKILL: %d attempt(s)", len(attempts))
	}
	if restarts > 0 {
		findings = append(findings, fmt.Sprintf("the job restarted %d time(s), resuming from its checkpoint", restarts))
	}
	for name, n := range job {
		if k := strings.Count(n.stderr.String(), "rendezvous session lost"); k > 0 {
			findings = append(findings, fmt.Sprintf("%s's gangrun run lost its rendezvous session %d time(s)", name, k))
		}
	}

	// Everything is released; the pending requests get their grants in turn (the churn,
	// of a higher priority, would take them first).
	ch.close()
	release := func(label string, r *allocRequest) {
		t.Helper()
		if g, ok := r.grant(); ok {
			obs.untrack(g.ID)
		}
		if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := r.wait(t, failoverDeadline); code != 0 {
			t.Errorf("holder %s exited %d on SIGTERM, want 0 (released)\n%s", label, code, r.output())
		}
	}
	labels := make([]string, 0, len(held))
	for label := range held {
		labels = append(labels, label)
	}
	sort.Strings(labels)
	for _, label := range labels {
		release(label, held[label])
	}
	waitGranted(pending["P1"])
	release("P1", pending["P1"])
	waitGranted(pending["P2"])
	release("P2", pending["P2"])
	obs.check() // one last read with everything released
	obs.close()

	for name, a := range agents {
		if k := strings.Count(a.stderr.String(), "session lost"); k > 0 {
			findings = append(findings, fmt.Sprintf("agent %s lost its session %d time(s) and registered again", name, k))
		}
		if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := a.wait(t, failoverDeadline); code != 0 {
			t.Errorf("agent %s exited %d on SIGTERM\n%s", name, code, a.output())
		}
	}

	obs.mu.Lock()
	defer obs.mu.Unlock()
	breaches := make([]string, 0, len(obs.breaches))
	for b := range obs.breaches {
		breaches = append(breaches, b)
	}
	sort.Strings(breaches)
	for _, b := range breaches {
		t.Errorf("invariant broken: %s", b)
	}
	for id, why := range obs.lost {
		t.Errorf("held grant %s lost while its holder held it: %s", id, why)
	}
	for _, id := range ch.lost {
		t.Errorf("churn grant %s was lost while its holder held it", id)
	}
	if ch.granted < 10 {
		t.Errorf("the churn made only %d grants: the scheduler made too few to judge", ch.granted)
	}
	t.Logf("churn: %d grants made and released; failed calls %v (the last: %s)", ch.granted, ch.failed, ch.lastErr)
	if obs.reads < 50 {
		t.Errorf("only %d reads of Consul succeeded: the observer saw too little", obs.reads)
	}
	t.Logf("figures: grants lost %d, GPUs double-booked %d in %d consistent reads of Consul; the job finished at step %d once, "+
		"with %d restart(s) after the leader's death alone and %d in all", len(obs.lost)+len(ch.lost), len(breaches), obs.reads, failoverSteps, restartsBefore, restarts)
	for _, f := range []struct {
		label string
		f     figures
	}{{"leader killed", leaderOnly}, {"leader killed as the gang restarts", withRestart}} {
		t.Logf("figures, %s at step %d: new leader %.1f s; first new grant %.1f s; job's next checkpoint %.1f s; "+
			"%d failed reads (the last %.1f s after the kill), %d failed alloc submissions; "+
			"old leader back and the cluster whole %.1f s after its launch, a new grant %.1f s after it",
			f.label, f.f.step, f.f.elected.Seconds(), f.f.grant.Seconds(), f.f.progress.Seconds(),
			f.f.failedReads, f.f.failedFor.Seconds(), f.f.failedSubmits, f.f.healthy.Seconds(), f.f.grantAfterLaunch.Seconds())
	}
	if obs.lastErrMsg != "" {
		t.Logf("the last failed read: %s", obs.lastErrMsg)
	}
	for _, f := range findings {
		t.Logf("finding: %s", f)
	}
}

// checkGrants reads the allocator's keys in one consistent read and checks them with
// allocator.CheckInvariants; an error means nothing was read (no leader, say).
func checkGrants(ctx context.Context, s store.Store) (*allocator.Cluster, []string, error) {
	entries, idx, err := s.List(ctx, allocator.ClusterPrefix)
	if err != nil {
		return nil, nil, err
	}
	c, vs := allocator.CheckInvariants(entries, idx)
	bad := make([]string, len(vs))
	for i, v := range vs {
		bad[i] = v.String()
	}
	return c, bad, nil
}
