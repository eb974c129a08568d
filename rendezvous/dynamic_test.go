package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// testNode is one simulated node of a job.
type testNode struct {
	name string
	rdzv *Dynamic
}

func newNodes(t *testing.T, s store.Store, job string, n, min, max int, host func(i int) string) []*testNode {
	t.Helper()
	var nodes []*testNode
	for i := 0; i < n; i++ {
		h := "host"
		if host != nil {
			h = host(i)
		}
		c, err := NewDynamic(s, DynamicConfig{JobID: job, MinNodes: min, MaxNodes: max, MaxRestarts: 3, LastCall: 500 * time.Millisecond, Host: h})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, &testNode{name: fmt.Sprintf("n%03d", i), rdzv: c})
		t.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	return nodes
}

func (n *testNode) request(addr string) JoinRequest {
	return JoinRequest{Node: n.name, Addr: addr, LocalWorldSize: 2, Switch: "sw" + n.name[len(n.name)-1:]}
}

// joinAll joins every node concurrently and returns their rounds by node name.
func joinAll(t *testing.T, nodes []*testNode, resume string) map[string]Round {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	rounds := map[string]Round{}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func(i int, n *testNode) {
			defer wg.Done()
			req := n.request(fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
			req.ChooseResume = func(context.Context) (string, error) { return resume, nil }
			r, err := n.rdzv.Join(ctx, req)
			if err != nil {
				t.Errorf("%s: join: %v", n.name, err)
				return
			}
			mu.Lock()
			rounds[n.name] = r
			mu.Unlock()
		}(i, n)
	}
	wg.Wait()
	return rounds
}

// checkRound asserts the rounds agree: one round number, distinct node ranks 0..N-1,
// rank offsets that tile the world, one master, one resume checkpoint.
func checkRound(t *testing.T, rounds map[string]Round, wantNodes int, resume string) int {
	t.Helper()
	if len(rounds) != wantNodes {
		t.Fatalf("%d nodes got a round, want %d", len(rounds), wantNodes)
	}
	var first Assignment
	ranks := map[int]string{}
	offsets := map[int]int{}
	for name, r := range rounds {
		a := r.Assignment()
		if first.JobID == "" {
			first = a
		}
		if a.Round != first.Round || a.MasterAddr != first.MasterAddr || a.MasterPort != first.MasterPort || a.ResumeFrom != resume ||
			a.NNodes != wantNodes || a.WorldSize != 2*wantNodes || a.LocalWorldSize != 2 {
			t.Fatalf("%s: %+v disagrees with %+v (want %d nodes, resume %q)", name, a, first, wantNodes, resume)
		}
		if other, dup := ranks[a.NodeRank]; dup {
			t.Fatalf("node rank %d given to %s and %s", a.NodeRank, other, name)
		}
		ranks[a.NodeRank] = name
		offsets[a.NodeRank] = a.RankOffset
	}
	for i := 0; i < wantNodes; i++ {
		if offsets[i] != 2*i {
			t.Fatalf("node rank %d has rank offset %d, want %d", i, offsets[i], 2*i)
		}
	}
	return first.Round
}

func TestConsulRendezvousForms(t *testing.T) {
	for _, n := range []int{2, 8, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			consultest.EachStore(t, func(t *testing.T, s store.Store) {
				nodes := newNodes(t, s, "job", n, n, n, nil)
				rounds := joinAll(t, nodes, "/ckpt/step-10")
				round := checkRound(t, rounds, n, "/ckpt/step-10")
				if round != 0 {
					t.Errorf("first round is %d, want 0", round)
				}
				// Node rank 0 is the leader and MASTER_ADDR is its address; nodes under one
				// switch have adjacent node ranks.
				bySwitch := map[string][]int{}
				for name, r := range rounds {
					a := r.Assignment()
					bySwitch["sw"+name[len(name)-1:]] = append(bySwitch["sw"+name[len(name)-1:]], a.NodeRank)
				}
				for sw, rs := range bySwitch {
					sort.Ints(rs)
					if rs[len(rs)-1]-rs[0] != len(rs)-1 {
						t.Errorf("switch %s has non-adjacent node ranks %v", sw, rs)
					}
				}
			})
		})
	}
}

func TestConsulRendezvousFailureRestartsEveryone(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		nodes := newNodes(t, s, "job", 3, 3, 3, nil)
		rounds := joinAll(t, nodes, "")
		ctx := context.Background()
		f := Failure{Node: "n001", Rank: 3, LocalRank: 1, ExitCode: 7, Reason: "exit code 7"}
		if err := rounds["n001"].Fail(ctx, f); err != nil {
			t.Fatal(err)
		}
		for name, r := range rounds {
			select {
			case <-r.Ended():
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not see the round end", name)
			}
			e := r.End()
			if e.Kind != Failed || e.Failure == nil || e.Failure.Rank != 3 || e.Failure.ExitCode != 7 {
				t.Errorf("%s: end = %+v, want the failure of rank 3", name, e)
			}
		}
		// A second failure report of the same round is ignored.
		if err := rounds["n002"].Fail(ctx, Failure{Node: "n002", Rank: 5}); err != nil {
			t.Fatal(err)
		}
		next := joinAll(t, nodes, "/ckpt/step-20")
		round := checkRound(t, next, 3, "/ckpt/step-20")
		if round != 1 {
			t.Errorf("round after the failure = %d, want 1", round)
		}
		for name, r := range next {
			if r.Assignment().RestartCount != 1 {
				t.Errorf("%s: restart count %d, want 1", name, r.Assignment().RestartCount)
			}
		}
	})
}

func TestConsulRendezvousElastic(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		nodes := newNodes(t, s, "elastic", 3, 2, 3, nil)
		// Two nodes join; with MIN 2 the round closes after the last call without the third.
		rounds := joinAll(t, nodes[:2], "")
		checkRound(t, rounds, 2, "")
		// A late joiner waits and makes the running round end (scale-up), not as a
		// failure: the next round has all three, and no restart was charged.
		late := make(chan Round, 1)
		go func() {
			r, err := nodes[2].rdzv.Join(ctx, nodes[2].request("10.0.9.9"))
			if err != nil {
				t.Errorf("late join: %v", err)
			}
			late <- r
		}()
		for name, r := range rounds {
			select {
			case <-r.Ended():
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: the running round did not end for the late joiner", name)
			}
			if e := r.End(); e.Kind != MembershipChanged || !strings.Contains(e.Detail, "n002 waiting to join") {
				t.Errorf("%s: end = %+v, want a membership change for n002", name, e)
			}
		}
		next := joinAll(t, nodes[:2], "")
		next["n002"] = <-late
		checkRound(t, next, 3, "")
		for name, r := range next {
			if r.Assignment().RestartCount != 0 {
				t.Errorf("%s: restart count %d after a scale-up, want 0", name, r.Assignment().RestartCount)
			}
		}
		// A node dies (its session ends): the survivors see a membership change and
		// re-form without it, since MIN (2) remain.
		if err := nodes[1].rdzv.Close(ctx); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"n000", "n002"} {
			r := next[name]
			select {
			case <-r.Ended():
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: no end after n001 died", name)
			}
			if e := r.End(); e.Kind != MembershipChanged || !strings.Contains(e.Detail, "n001 left") {
				t.Errorf("%s: end = %+v, want n001 left", name, e)
			}
		}
		down := joinAll(t, []*testNode{nodes[0], nodes[2]}, "")
		checkRound(t, down, 2, "")
	})
}

func TestConsulRendezvousJobsAreSeparateAndReusable(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		a := newNodes(t, s, "job-a", 2, 2, 2, nil)
		b := newNodes(t, s, "job-b", 2, 2, 2, nil)
		ra := joinAll(t, a, "")
		rb := joinAll(t, b, "")
		checkRound(t, ra, 2, "")
		checkRound(t, rb, 2, "")
		// Job a fails; job b does not notice.
		if err := ra["n000"].Fail(ctx, Failure{Node: "n000", Rank: 0, ExitCode: 1}); err != nil {
			t.Fatal(err)
		}
		<-ra["n001"].Ended()
		select {
		case <-rb["n000"].Ended():
			t.Fatal("job b's round ended when job a's failed")
		case <-time.After(300 * time.Millisecond):
		}
		// Job b succeeds: every node reports success and sees the job succeed.
		succeedAll(t, ctx, rb)
		// Reusing job b's id after it finished starts a new run: no restarts spent, and
		// its rounds numbered on from the last one (attempt numbers, log directories and
		// the fencing number never go back within a job id).
		again := newNodes(t, s, "job-b", 2, 2, 2, nil)
		for _, n := range b {
			_ = n.rdzv.Close(ctx)
		}
		r2 := joinAll(t, again, "")
		if round := checkRound(t, r2, 2, ""); round != 1 {
			t.Errorf("reused job id starts at round %d, want 1 (after the finished run's round 0)", round)
		}
		for name, r := range r2 {
			if rc := r.Assignment().RestartCount; rc != 0 {
				t.Errorf("%s: reused job id starts with %d restarts spent, want 0", name, rc)
			}
		}
		// Reused once more by one node alone: the earlier runs' records of round 0
		// (n000 and n001) must not make its leader think a node of its round left.
		succeedAll(t, ctx, r2)
		for _, n := range again {
			_ = n.rdzv.Close(ctx)
		}
		alone := newNodes(t, s, "job-b", 1, 1, 1, nil)
		r3 := joinAll(t, alone, "")
		select {
		case <-r3["n000"].Ended():
			t.Fatalf("the lone node's round ended at once: %+v", r3["n000"].End())
		case <-time.After(time.Second):
		}
	})
}

func TestConsulRendezvousRefusesLoopbackMasterAcrossHosts(t *testing.T) {
	s := store.NewMemory()
	nodes := newNodes(t, s, "lo", 2, 2, 2, func(i int) string { return fmt.Sprintf("host%d", i) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for _, n := range nodes {
		go func(n *testNode) {
			_, err := n.rdzv.Join(ctx, n.request("127.0.0.1"))
			errs <- err
		}(n)
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), "run on different hosts") {
			t.Errorf("join = %v, want the loopback MASTER_ADDR refused", err)
		}
	}
}

func TestConsulActivityLeaderSeesTheGang(t *testing.T) {
	s := store.NewMemory()
	nodes := newNodes(t, s, "hang", 2, 2, 2, nil)
	rounds := joinAll(t, nodes, "")
	ctx := context.Background()
	var leader, other Round
	for _, r := range rounds {
		if r.Assignment().NodeRank == 0 {
			leader = r
		} else {
			other = r
		}
	}
	old := time.Now().Add(-time.Hour)
	recent := time.Now()
	// The other node still writes output; the leader's own workers are silent.
	if got := other.Activity(ctx, recent); time.Since(got) > time.Second {
		t.Errorf("a non-leader judged the gang: %v", got)
	}
	if got := leader.Activity(ctx, old); got.Before(recent.Add(-time.Millisecond)) {
		t.Errorf("leader saw the gang's newest output at %v, want the other node's %v", got, recent)
	}
}

func TestConsulRendezvousResumesAJobWhoseNodesAllDied(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		first := newNodes(t, s, "crashed", 2, 2, 2, nil)
		checkRound(t, joinAll(t, first, ""), 2, "")
		// The whole job dies mid-round (every session gone); new gangruns of the same job
		// re-form it: a membership change, not a failure.
		for _, n := range first {
			if err := n.rdzv.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		again := newNodes(t, s, "crashed", 2, 2, 2, nil)
		rounds := joinAll(t, again, "")
		if round := checkRound(t, rounds, 2, ""); round != 1 {
			t.Errorf("round %d, want 1 (the crashed round 0 ended as a membership change)", round)
		}
		for name, r := range rounds {
			if r.Assignment().RestartCount != 0 {
				t.Errorf("%s: restart count %d, want 0", name, r.Assignment().RestartCount)
			}
		}
	})
}

// TestConsulRendezvousRefusesAnotherNNodes: a node given --nnodes 3 while the job's run
// was started with --nnodes 2 is refused at once, in one line naming both; the first
// node goes on waiting for a second node of the same --nnodes, which completes it.
func TestConsulRendezvousRefusesAnotherNNodes(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		two := newNodes(t, s, "mixed", 2, 2, 2, nil)
		three := newNodes(t, s, "mixed", 1, 3, 3, nil)[0]
		three.name = "n009"
		first := make(chan error, 1)
		go func() {
			_, err := two[0].rdzv.Join(ctx, two[0].request("10.0.0.1"))
			first <- err
		}()
		// Wait until the first node has started the run (its job state exists).
		for {
			entries, _, err := s.List(ctx, "gangrun/jobs/mixed/ctl/")
			if err != nil {
				t.Fatal(err)
			}
			if st, _, _ := two[0].rdzv.readCtl(entries); st != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		_, err := three.rdzv.Join(ctx, three.request("10.0.0.9"))
		want := "--nnodes 3 differs from job mixed's --nnodes 2"
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("join with --nnodes 3: %v, want one line containing %q", err, want)
		}
		r, err := two[1].rdzv.Join(ctx, two[1].request("10.0.0.2"))
		if err != nil {
			t.Fatal(err)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if a := r.Assignment(); a.NNodes != 2 {
			t.Errorf("round of %d nodes, want 2", a.NNodes)
		}
	})
}

// TestConsulRendezvousRefusesAnotherMaxRestarts: --max-restarts must agree too (a node
// with a smaller budget would finish the job under the others' feet), and a run stays
// refused to other settings even once its nodes are gone: only a new job id starts over.
func TestConsulRendezvousRefusesAnotherMaxRestarts(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		node := func(name string, nnodes, maxRestarts int) *testNode {
			c, err := NewDynamic(s, DynamicConfig{JobID: "budget", MinNodes: nnodes, MaxNodes: nnodes, MaxRestarts: maxRestarts, LastCall: 100 * time.Millisecond, Host: "host"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			return &testNode{name: name, rdzv: c}
		}
		a := node("n001", 2, 0)
		jctx, jcancel := context.WithCancel(ctx)
		joined := make(chan error, 1)
		go func() {
			_, err := a.rdzv.Join(jctx, a.request("10.0.0.1"))
			joined <- err
		}()
		for { // until a's run exists
			entries, _, err := s.List(ctx, "gangrun/jobs/budget/ctl/")
			if err != nil {
				t.Fatal(err)
			}
			if st, _, _ := a.rdzv.readCtl(entries); st != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		want := "--max-restarts 3 differs from job budget's --max-restarts 0"
		b := node("n002", 2, 3)
		if _, err := b.rdzv.Join(ctx, b.request("10.0.0.2")); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("join with --max-restarts 3: %v, want %q", err, want)
		}
		jcancel()
		<-joined
		if err := a.rdzv.Close(ctx); err != nil {
			t.Fatal(err)
		}
		c := node("n003", 2, 3)
		if _, err := c.rdzv.Join(ctx, c.request("10.0.0.3")); err == nil || !strings.Contains(err.Error(), "a new --job-id starts over") {
			t.Fatalf("join of the abandoned run with other settings: %v, want a refusal naming the way out", err)
		}
	})
}

// TestConsulRendezvousWaiterDoesNotRerunAFinishedJob: a node that arrives while a full
// gang runs (--nnodes 1, no room) waits; when the job succeeds, its Join ends with a
// JobFinishedError instead of starting a second run of the job on its own.
func TestConsulRendezvousWaiterDoesNotRerunAFinishedJob(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		nodes := newNodes(t, s, "full", 2, 1, 1, nil)
		r, err := nodes[0].rdzv.Join(ctx, nodes[0].request("10.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		waiter := make(chan error, 1)
		go func() {
			_, err := nodes[1].rdzv.Join(ctx, nodes[1].request("10.0.0.2"))
			waiter <- err
		}()
		select {
		case err := <-waiter:
			t.Fatalf("the second node joined a full job: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
		if e, err := r.Succeed(ctx); err != nil || e.Kind != Succeeded {
			t.Fatalf("succeed = %+v, %v", e, err)
		}
		var finished *JobFinishedError
		if err := <-waiter; !errors.As(err, &finished) || !finished.Succeeded {
			t.Fatalf("the waiter's join: %v, want a JobFinishedError of a succeeded job", err)
		}
	})
}

// TestConsulRendezvousRejoinAfterKill: a node whose previous gangrun was SIGKILLed
// comes back while the dead one's session still holds its membership key: the join
// waits for that session to go, then succeeds (it had failed at once with "already in
// job").
func TestConsulRendezvousRejoinAfterKill(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// The dead gangrun's session and key, as it left them.
		stale, err := s.CreateSession(ctx, store.SessionOptions{Name: "killed gangrun", TTL: store.MinSessionTTL, Behavior: store.DeleteKeys})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "gangrun/jobs/back/members/n000", Value: []byte(`{"node":"n000","round":0}`), Session: stale}}); err != nil {
			t.Fatal(err)
		}
		node := newNodes(t, s, "back", 1, 1, 1, nil)[0]
		joined := make(chan error, 1)
		go func() {
			_, err := node.rdzv.Join(ctx, node.request("10.0.0.1"))
			joined <- err
		}()
		select {
		case err := <-joined:
			t.Fatalf("joined while the dead session held the name: %v", err)
		case <-time.After(time.Second):
		}
		// The session expires (destroyed here rather than waited for).
		if err := s.DestroySession(ctx, stale); err != nil {
			t.Fatal(err)
		}
		if err := <-joined; err != nil {
			t.Fatalf("join after the dead session went: %v", err)
		}
	})
}

// succeedAll has every node of rounds report success at once and checks that each sees
// the job succeed.
func succeedAll(t *testing.T, ctx context.Context, rounds map[string]Round) {
	t.Helper()
	var wg sync.WaitGroup
	for name, r := range rounds {
		wg.Add(1)
		go func(name string, r Round) {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if e, err := r.Succeed(sctx); err != nil || e.Kind != Succeeded {
				t.Errorf("%s: succeed = %+v, %v", name, e, err)
			}
		}(name, r)
	}
	wg.Wait()
}

// flakyDone is a Store whose first done-marker transaction fails as a Consul without a
// leader answers.
type flakyDone struct {
	store.Store
	mu     sync.Mutex
	failed bool
}

func (f *flakyDone) Txn(ctx context.Context, ops []store.Op) (store.TxnResult, error) {
	f.mu.Lock()
	first := !f.failed && len(ops) == 1 && strings.Contains(ops[0].Key, "/done/")
	f.failed = f.failed || first
	f.mu.Unlock()
	if first {
		return store.TxnResult{}, errors.New("Unexpected response code: 500 (No cluster leader)")
	}
	return f.Store.Txn(ctx, ops)
}

// TestConsulRendezvousSucceedRetriesThroughAnOutage: a success report that meets a
// passing store error is retried, so the job succeeds, rather than the node giving up
// (which the leader would take for a node that left without finishing).
func TestConsulRendezvousSucceedRetriesThroughAnOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := &flakyDone{Store: store.NewMemory()}
	nodes := newNodes(t, s, "flaky", 2, 2, 2, nil)
	rounds := joinAll(t, nodes, "")
	succeedAll(t, ctx, rounds)
	if !s.failed {
		t.Fatal("the done marker never failed: the test tested nothing")
	}
}

// TestEvictRemovesALostNodesKeys: Evict deletes a node's membership key and the leader
// key its session holds, leaves another session's leader key alone, and reports false
// for a node that is not a member.
func TestEvictRemovesALostNodesKeys(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		base := "gangrun/jobs/evict-job/"
		sess := func(name string) string {
			id, err := s.CreateSession(ctx, store.SessionOptions{Name: name, TTL: time.Minute, Behavior: store.DeleteKeys})
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		dead, alive := sess("dead"), sess("alive")
		lock := func(key, session string) {
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: key, Value: []byte("{}"), Session: session}}); err != nil {
				t.Fatal(err)
			}
		}
		lock(base+"members/node-b", dead)
		lock(base+"ctl/leader", dead)
		lock(base+"members/node-a", alive)
		if ok, err := Evict(ctx, s, "evict-job", "node-b"); !ok || err != nil {
			t.Fatalf("Evict(node-b) = %v, %v", ok, err)
		}
		for _, k := range []string{"members/node-b", "ctl/leader"} {
			if e, _ := s.Get(ctx, base+k); e != nil {
				t.Errorf("%s still there after the eviction", k)
			}
		}
		if e, _ := s.Get(ctx, base+"members/node-a"); e == nil || e.Session != alive {
			t.Errorf("node-a's membership touched: %+v", e)
		}
		// The leader key held by another node's session stays.
		lock(base+"ctl/leader", alive)
		lock(base+"members/node-c", dead)
		if ok, err := Evict(ctx, s, "evict-job", "node-c"); !ok || err != nil {
			t.Fatalf("Evict(node-c) = %v, %v", ok, err)
		}
		if e, _ := s.Get(ctx, base+"ctl/leader"); e == nil || e.Session != alive {
			t.Errorf("the live leader's key went with node-c: %+v", e)
		}
		if ok, err := Evict(ctx, s, "evict-job", "node-z"); ok || err != nil {
			t.Errorf("Evict of a non-member = %v, %v; want false, nil", ok, err)
		}
	})
}

// lockDelayed is a Store that refuses every Lock of one key as Consul does within its
// last holder's lock-delay, until armed's time has passed.
type lockDelayed struct {
	store.Store
	key   string
	mu    sync.Mutex
	until time.Time
	tries int
}

func (l *lockDelayed) Txn(ctx context.Context, ops []store.Op) (store.TxnResult, error) {
	l.mu.Lock()
	delayed := len(ops) == 1 && ops[0].Verb == store.Lock && ops[0].Key == l.key && time.Now().Before(l.until)
	if delayed {
		l.tries++
	}
	l.mu.Unlock()
	if delayed {
		return store.TxnResult{}, &store.TxnError{Errors: []store.OpError{{Op: 0, Key: l.key, Reason: store.ErrLockDelay,
			What: fmt.Sprintf("failed to lock key %q due to lock delay", l.key)}}}
	}
	return l.Store.Txn(ctx, ops)
}

// TestConsulRendezvousLeaderTakenAfterALockDelay: the leader's key of a running round
// goes (its holder's session ended) and is in its lock-delay when the other nodes try
// for it; they try again once the delay is over instead of waiting on a watch nothing
// will wake (a frozen leader's gang never re-formed: TestNoSplitBrain in CI).
func TestConsulRendezvousLeaderTakenAfterALockDelay(t *testing.T) {
	ctx := context.Background()
	s := &lockDelayed{Store: store.NewMemory(), key: "gangrun/jobs/delayed/ctl/leader"}
	nodes := newNodes(t, s, "delayed", 2, 2, 2, nil)
	joinAll(t, nodes, "")
	if e, _ := s.Get(ctx, s.key); e == nil || e.Session == "" {
		t.Fatalf("no leader after the round formed: %+v", e)
	}
	s.mu.Lock()
	s.until = time.Now().Add(1500 * time.Millisecond)
	s.mu.Unlock()
	if _, err := s.Store.Txn(ctx, []store.Op{{Verb: store.Delete, Key: s.key}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if e, _ := s.Get(ctx, s.key); e != nil && e.Session != "" {
			break
		}
		if time.Now().After(deadline) {
			s.mu.Lock()
			tries := s.tries
			s.mu.Unlock()
			t.Fatalf("nobody took the leader's key within 10 s of its going (%d tries refused in the lock-delay)", tries)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tries == 0 {
		t.Fatal("no try met the lock-delay: the test tested nothing")
	}
}

// TestConsulRendezvousStateDeletedUnderARewrittenMarker: the job's state deleted while
// the cluster's marker reads another value (a local user at work where Consul's ACLs
// are off) is no lost Consul data: Consul still knows the nodes' sessions. The round
// ends at once, the state gone, instead of waiting for a restore that will not come
// (the steps waited for good, their sessions renewed all the while).
func TestConsulRendezvousStateDeletedUnderARewrittenMarker(t *testing.T) {
	s := consultest.ConsulStore(t, consultest.Start(t))
	ctx := context.Background()
	nodes := newNodes(t, s, "job", 2, 2, 2, nil)
	rounds := joinAll(t, nodes, "")
	if m, err := s.Get(ctx, store.MarkerKey); err != nil || m == nil {
		t.Fatalf("no cluster marker after the nodes' sessions: %v %v", m, err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: store.MarkerKey, Value: []byte("another")},
		{Verb: store.Delete, Key: jobKey("job", "ctl", "state")}}); err != nil {
		t.Fatal(err)
	}
	for name, r := range rounds {
		select {
		case <-r.Ended():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the round did not end with the job's state deleted", name)
		}
		if e := r.End(); e.Kind != MembershipChanged || !strings.Contains(e.Detail, "disappeared") {
			t.Errorf("%s: end = %+v, want a membership change: the state disappeared", name, e)
		}
	}
}
