package job

import (
	"math"
	"testing"
	"time"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/rendezvous"
)

// TestRestartCauses: each cause the supervisor and the controller write is counted under
// its class once a next attempt restarts the job; a node lost during an attempt wins
// over its peers' worker failures; the last attempt is not a restart.
func TestRestartCauses(t *testing.T) {
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
	} {
		st := State{Attempts: []Attempt{{Number: 0, Started: at(0), Ended: at(6), Cause: tc.cause}}, LostNodes: tc.lost}
		if st.countRestarts() {
			t.Errorf("%q: counted before a next attempt", tc.cause)
		}
		if !record(&st, event.Event{Kind: event.RoundClosed, Attempt: 1, Time: at(7), Nodes: []string{"node-a"}}, time.Time{}) {
			t.Fatalf("%q: the next attempt not recorded", tc.cause)
		}
		if st.Attempts[0].RestartCause != tc.want || st.RestartsByCause[tc.want] != 1 || len(st.RestartsByCause) != 1 {
			t.Errorf("%q (lost %v): %q %v, want %s", tc.cause, tc.lost, st.Attempts[0].RestartCause, st.RestartsByCause, tc.want)
		}
		if st.countRestarts() || st.RestartsByCause[tc.want] != 1 {
			t.Errorf("%q: counted twice", tc.cause)
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
