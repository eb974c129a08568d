package job

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/rendezvous"
)

// restartOf records attempt 0 (a) as followed by attempt 1, with lost, and returns the
// state; it fails t when a is counted before the next attempt or counted twice.
func restartOf(t *testing.T, a Attempt, lost []LostNode) State {
	t.Helper()
	st := State{Attempts: []Attempt{a}, LostNodes: lost}
	if st.countRestarts() {
		t.Errorf("%q: counted before a next attempt", a.Cause)
	}
	if !record(&st, event.Event{Kind: event.RoundClosed, Attempt: 1, Time: a.Ended.Add(time.Minute), Nodes: []string{"node-a"}}, time.Time{}) {
		t.Fatalf("%q: the next attempt not recorded", a.Cause)
	}
	n := st.RestartsByCause[st.Attempts[0].RestartCause]
	if st.countRestarts() || st.RestartsByCause[st.Attempts[0].RestartCause] != n {
		t.Errorf("%q: counted twice", a.Cause)
	}
	return st
}

// TestRestartCauses: each kind of failure the supervisor and the controller report is
// counted under its class once a next attempt restarts the job; a node lost during an
// attempt wins over its peers' worker failures; the last attempt is not a restart.
func TestRestartCauses(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, tc := range []struct {
		cause string
		kind  failure.Kind
		lost  []LostNode
		want  string
	}{
		{"failed: rank 3 on node-b: exit code 1", failure.Exit, nil, CauseWorkerExit},
		{"failed: rank 0 on node-a: signal SIGKILL (9)", failure.Signal, nil, CauseSignal},
		{"failed: node-a: no output from any rank for 5m0s (--hang-timeout 5m0s)", failure.Hang, nil, CauseHang},
		{"failed: rank 2 on node-a: no heartbeat for 2m0s, the longest of any rank (--hang-timeout 1m0s); every rank's stack is in its stderr", failure.Hang, nil, CauseHang},
		{`failed: rank 1 on node-a: watchdog timer "step" expired (torch.distributed.elastic.timer); every rank's stack is in its stderr`, failure.Watchdog, nil, CauseHang},
		{"failed: rank 3 on node-b: exit code 1", failure.Exit, []LostNode{{Node: "node-c", Why: "node node-c is down (its agent's session ended)", Kind: failure.NodeLost, At: at(5)}}, CauseNodeLost},
		{"requeued: node node-b was drained: GPU 3 failed: Xid 79", failure.GPUHealth, []LostNode{{Node: "node-b", Why: "node node-b was drained: GPU 3 failed: Xid 79", Kind: failure.GPUHealth, At: at(5)}}, CauseGPUHealth},
		{"membership changed: node node-b left", "", []LostNode{{Node: "node-b", Why: "node node-b was drained: maintenance", Kind: failure.NodeLost, At: at(5)}}, CauseNodeLost},
		{"failed: rank 3 on node-b: exit code 1", failure.Exit, []LostNode{{Node: "node-c", Why: "down", Kind: failure.NodeLost, At: at(30)}}, CauseWorkerExit}, // lost after the restart
		{"membership changed: node node-d joined", "", nil, CauseOther},
		{"failed: node-a: fork/exec /no/such: no such file or directory", failure.StartError, nil, CauseOther},
		{"requeued: lost node-b", failure.NodeLost, nil, CauseNodeLost},
		{"preempted by job 9 (partition high)", failure.Preempted, nil, CausePreempted},
	} {
		st := restartOf(t, Attempt{Number: 0, Started: at(0), Ended: at(6), Cause: tc.cause, Failure: tc.kind}, tc.lost)
		if st.Attempts[0].RestartCause != tc.want || st.RestartsByCause[tc.want] != 1 || len(st.RestartsByCause) != 1 {
			t.Errorf("%s %q (lost %v): %q %v, want %s", tc.kind, tc.cause, tc.lost, st.Attempts[0].RestartCause, st.RestartsByCause, tc.want)
		}
	}
}

// TestRestartCauseIgnoresWords: the cause a restart is counted under (the label of
// gangrun_job_restarts_total) comes from the failure's kind alone: an attempt's cause
// reworded, even into a sentence an older release wrote for another class, changes
// nothing; so does a lost node's reason.
func TestRestartCauseIgnoresWords(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, words := range []string{
		"",
		"failed: the worker stopped (reworded)",
		"failed: rank 0 on node-a: signal SIGKILL (9)",
		"failed: node-a: no output from any rank for 5m0s (--hang-timeout 5m0s): exit code 1",
		"requeued: node node-b was drained: GPU 3 failed: Xid 79",
		"preempted by job 9 (partition high)",
	} {
		for _, k := range failure.Kinds() {
			if k == failure.Preempted {
				continue // a pre-emption wins whatever the words; the others must not read as one
			}
			st := restartOf(t, Attempt{Started: t0, Ended: t0.Add(time.Minute), Cause: words, Failure: k}, nil)
			if got := st.Attempts[0].RestartCause; got != CauseOf(k) {
				t.Errorf("kind %s with cause %q: counted as %s, want %s", k, words, got, CauseOf(k))
			}
		}
		lost := []LostNode{{Node: "node-b", Why: words, Kind: failure.NodeLost, At: t0.Add(30 * time.Second)}}
		if got := restartOf(t, Attempt{Started: t0, Ended: t0.Add(time.Minute), Cause: "failed", Failure: failure.Exit}, lost).Attempts[0].RestartCause; got != CauseNodeLost {
			t.Errorf("a lost node whose reason reads %q: counted as %s, want %s", words, got, CauseNodeLost)
		}
	}
}

// TestCauseOfEveryKind: every kind of failure is counted under one of RestartCauses, and
// only a start error (of the kinds) under CauseOther: a new kind needs its case in
// CauseOf.
func TestCauseOfEveryKind(t *testing.T) {
	for _, k := range failure.Kinds() {
		c := CauseOf(k)
		if !slices.Contains(RestartCauses(), c) {
			t.Errorf("CauseOf(%s) = %q, not a restart cause", k, c)
		}
		if (c == CauseOther) != (k == failure.StartError) {
			t.Errorf("CauseOf(%s) = %q", k, c)
		}
	}
	if c := CauseOf(""); c != CauseOther {
		t.Errorf("CauseOf no kind = %q, want %s", c, CauseOther)
	}
}

// TestRestartCausesOfOlderRecords: records an older release wrote carry no kinds; each
// cause it wrote is counted under the class it counted it under (legacykind.go), a node
// lost during an attempt wins over its peers' worker failures, and the last attempt is
// not a restart.
func TestRestartCausesOfOlderRecords(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, tc := range []struct {
		cause string
		lost  []LostNode
		want  string
	}{
		{"failed: rank 3 on node-b: exit code 1", nil, CauseWorkerExit},
		{"failed: rank 0 on node-a: signal SIGKILL (9)", nil, CauseSignal},
		{"failed: node-a: no output from any rank for 5m0s (--hang-timeout 5m0s)", nil, CauseHang},
		{"failed: rank 2 on node-a: no heartbeat for 2m0s, the longest of any rank (--hang-timeout 1m0s); every rank's stack is in its stderr", nil, CauseHang},
		{`failed: rank 1 on node-a: watchdog timer "step" expired (torch.distributed.elastic.timer); every rank's stack is in its stderr`, nil, CauseHang},
		{"failed: rank 3 on node-b: exit code 1", []LostNode{{Node: "node-c", Why: "node node-c is down (its agent's session ended)", At: at(5)}}, CauseNodeLost},
		{"requeued: node node-b was drained: GPU 3 failed: Xid 79", []LostNode{{Node: "node-b", Why: "node node-b was drained: GPU 3 failed: Xid 79", At: at(5)}}, CauseGPUHealth},
		{"membership changed: node node-b left", []LostNode{{Node: "node-b", Why: "node node-b was drained: maintenance", At: at(5)}}, CauseNodeLost},
		{"failed: rank 3 on node-b: exit code 1", []LostNode{{Node: "node-c", Why: "down", At: at(30)}}, CauseWorkerExit}, // lost after the restart
		{"membership changed: node node-d joined", nil, CauseOther},
		{"requeued: lost node-b", nil, CauseNodeLost},
		{"preempted by job 9 (partition high)", nil, CausePreempted},
		{"batch script: exit code 2", nil, CauseWorkerExit},
	} {
		st := restartOf(t, Attempt{Number: 0, Started: at(0), Ended: at(6), Cause: tc.cause}, tc.lost)
		if st.Attempts[0].RestartCause != tc.want || st.RestartsByCause[tc.want] != 1 || len(st.RestartsByCause) != 1 {
			t.Errorf("%q (lost %v): %q %v, want %s", tc.cause, tc.lost, st.Attempts[0].RestartCause, st.RestartsByCause, tc.want)
		}
	}
}

// TestLostKind: a node lost while drained for a failed GPU (the agent's drain, or an
// older agent's by its reason) is a GPU health loss; any other loss is a lost node.
func TestLostKind(t *testing.T) {
	cl := &allocator.Cluster{Nodes: map[string]*allocator.NodeState{
		"gpu":      {Up: true, Drain: &allocator.Drain{Reason: "the reason reworded", Kind: failure.GPUHealth}},
		"older":    {Up: true, Drain: &allocator.Drain{Reason: "GPU 0 failed: Xid 79"}},
		"operator": {Up: true, Drain: &allocator.Drain{Reason: "maintenance"}},
		"down":     {Up: false, Drain: &allocator.Drain{Reason: "GPU 1 failed: Xid 48", Kind: failure.GPUHealth}},
		"up":       {Up: true},
	}}
	for n, want := range map[string]failure.Kind{"gpu": failure.GPUHealth, "older": failure.GPUHealth, "operator": failure.NodeLost,
		"down": failure.NodeLost, "up": failure.NodeLost, "unknown": failure.NodeLost} {
		if got := lostKind(cl, n); got != want {
			t.Errorf("node %s: lost as %s, want %s", n, got, want)
		}
	}
}

// TestETTRAndRecovery: productive time is the workers' time up to the checkpoint the
// next attempt resumed from (failed attempts) or to now (the running one), over the wall
// time since the job started; the recovery is the last failure to the next workers'
// start. Without a checkpoint directory a failure makes ETTR unknown.
func TestETTRAndRecovery(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	st := State{Status: Running, Started: at(0), Attempts: []Attempt{
		// workers 1..31, checkpoint at 21, failed at 31: 20 productive minutes.
		{Number: 0, Started: at(0), WorkersStarted: at(1), Ended: at(31), Cause: "failed: rank 1 on a: exit code 1", RestartCause: CauseWorkerExit},
		// workers 33..40, no new checkpoint (resumes from 21 again): none.
		{Number: 1, Started: at(32), WorkersStarted: at(33), ResumeFromTime: at(21), Ended: at(40), Cause: "failed: rank 1 on a: exit code 1", RestartCause: CauseWorkerExit},
		// workers from 43, running at 100: 57.
		{Number: 2, Started: at(42), WorkersStarted: at(43), ResumeFromTime: at(21)},
	}}
	got, ok := st.ETTR("ckpt", at(100))
	if want := 77.0 / 100; !ok || math.Abs(got-want) > 1e-9 {
		t.Errorf("ETTR %v %v, want %v", got, ok, want)
	}
	if _, ok := st.ETTR("", at(100)); ok {
		t.Errorf("ETTR without a checkpoint dir after a failure: want unknown")
	}
	if d, ok := st.Recovery(); !ok || d != 3*time.Minute {
		t.Errorf("recovery %v %v, want 3m (failure at 40, workers at 43)", d, ok)
	}
	if n := st.RankZeroNode(); n != "" {
		t.Errorf("rank-0 node %q of an attempt without nodes and a job without nodes", n)
	}
	st.Nodes, st.Attempts[2].Nodes = []string{"b", "a"}, []string{"a", "b"}
	if n := st.RankZeroNode(); n != "a" {
		t.Errorf("rank-0 node %q, want a (the attempt's first)", n)
	}
	fresh := State{Status: Running, Started: at(0), Attempts: []Attempt{{Number: 0, Started: at(0), WorkersStarted: at(2)}}}
	if got, ok := fresh.ETTR("", at(10)); !ok || math.Abs(got-0.8) > 1e-9 {
		t.Errorf("ETTR of a first attempt: %v %v, want 0.8", got, ok)
	}
	if _, ok := fresh.Recovery(); ok {
		t.Errorf("recovery without a restart")
	}
}

// TestOwnRestarts: a job's own restarts are its run's failed rounds less those lost
// nodes and pre-emptions caused, and never count the failure that ended the run past its
// budget (a --max-restarts 3 job that failed four times restarted three times).
func TestOwnRestarts(t *testing.T) {
	for _, tc := range []struct {
		failures, budget, node, preempt, want int
	}{
		{failures: 4, budget: 3, want: 3},                      // out of restarts: the last failure restarted nothing
		{failures: 1, budget: 3, want: 1},                      // running again after one failure
		{failures: 2, budget: -1, want: 2},                     // a state without its budget: as counted
		{failures: 5, budget: 4, node: 1, want: 3},             // one lost node's restart given back
		{failures: 2, budget: 3, node: 1, preempt: 1, want: 0}, // neither is the job's own
	} {
		got := ownRestarts(rendezvous.RunInfo{Failures: tc.failures, MaxRestarts: tc.budget}, State{NodeFailures: tc.node, PreemptFailures: tc.preempt})
		if got != tc.want {
			t.Errorf("%+v: own restarts %d, want %d", tc, got, tc.want)
		}
	}
}

// TestRecordKeepsTheKind: a step records the kind a RoundEnded carries beside its words,
// and the restart after it is counted by the kind.
func TestRecordKeepsTheKind(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var st State
	record(&st, event.Event{Kind: event.RoundClosed, Attempt: 0, Time: t0, Nodes: []string{"node-a"}}, time.Time{})
	record(&st, event.Event{Kind: event.RoundEnded, Attempt: 0, Time: t0.Add(time.Minute), Cause: "failed",
		Detail: "rank 0 on node-a: the worker went away (exit code 1)", Failure: failure.Signal}, time.Time{})
	if a := st.Attempts[0]; a.Failure != failure.Signal || a.Cause != "failed: rank 0 on node-a: the worker went away (exit code 1)" {
		t.Fatalf("attempt %+v, want kind %s and the words kept", a, failure.Signal)
	}
	record(&st, event.Event{Kind: event.RoundClosed, Attempt: 1, Time: t0.Add(2 * time.Minute), Nodes: []string{"node-a"}}, time.Time{})
	if st.Attempts[0].RestartCause != CauseSignal || st.RestartsByCause[CauseSignal] != 1 {
		t.Errorf("restart counted as %q %v, want %s", st.Attempts[0].RestartCause, st.RestartsByCause, CauseSignal)
	}
}
