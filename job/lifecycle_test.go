package job

import (
	"errors"
	"flag"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/reason"
)

// updateDocs rewrites docs/jobs.md's transitions block from the table:
// go test ./job -run TestTheDocsListTheTransitions -update-docs.
var updateDocs = flag.Bool("update-docs", false, "rewrite docs/jobs.md's list of transitions from the table")

// TestTheDocsListTheTransitions: docs/jobs.md's state machine lists the table the code
// applies, line for line.
func TestTheDocsListTheTransitions(t *testing.T) {
	b, err := os.ReadFile("../docs/jobs.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- transitions: generated from job.TransitionTable (go test ./job -run TestTheDocsListTheTransitions -update-docs) -->\n", "<!-- end of transitions -->"
	head, rest, ok := strings.Cut(string(b), begin)
	block, tail, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatal("docs/jobs.md has no transitions block")
	}
	if *updateDocs {
		text := head + begin + "- " + strings.Join(TransitionTable(), "\n- ") + "\n" + end + tail
		if err := os.WriteFile("../docs/jobs.md", []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	var docs []string
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		docs = append(docs, strings.TrimPrefix(l, "- "))
	}
	if want := TransitionTable(); !slices.Equal(docs, want) {
		t.Errorf("docs/jobs.md lists\n%s\nthe table is\n%s", strings.Join(docs, "\n"), strings.Join(want, "\n"))
	}
}

// phaseState is a state in phase p (a COMPLETING one ending FAILED).
func phaseState(p Phase) State {
	st := State{Status: p.Status, Reason: "before", Code: reason.Resources}
	switch p.Hold {
	case HoldDeferred:
		st.Deferred = true
	case HoldRequeue:
		st.Requeue = true
	case HoldPreempted:
		st.PreemptedBy = "9"
	case HoldUser, HoldAdmin:
		st.Deferred, st.Held = true, p.Hold
	}
	if p.Status == Completing {
		st.End = Failed
	}
	return st
}

// TestApplyFollowsTheTable: from every phase a job can be in, each event is applied
// exactly when the table has it from there, and leads where the table says; refused,
// it leaves the state as it was.
func TestApplyFollowsTheTable(t *testing.T) {
	phases := []Phase{pending, deferred, requeue, preempted, heldUser, heldAdmin, running, completing, {Status: Preempted}}
	for _, s := range []Status{Completed, Failed, Cancelled, Timeout, NodeFail} {
		phases = append(phases, Phase{Status: s})
	}
	for _, r := range transitions {
		for _, p := range phases {
			st := phaseState(p)
			before := st
			tr := Transition{Event: r.event, End: Completed, Code: reason.Dependency, Words: "words", PreemptedBy: "7"}
			if r.event == EvMarkHold {
				tr.Code = reason.JobHeldUser
			}
			err := st.apply(tr)
			legal := slices.Contains(r.from, p)
			switch {
			case legal && err != nil:
				t.Errorf("%s from %s: %v, want it applied", r.event, p, err)
			case !legal && err == nil:
				t.Errorf("%s from %s applied (to %s), want it refused", r.event, p, st.Phase())
			case !legal && (!errors.Is(err, ErrTransition) || !reflect.DeepEqual(st, before)):
				t.Errorf("%s from %s refused with %v, state %+v, want ErrTransition and no change", r.event, p, err, st)
			case legal:
				want := r.to
				switch {
				case r.event == EvFinish:
					want = Phase{Status: Failed}
				case r.to == Phase{}:
					want = p // its status unchanged
				}
				if st.Phase() != want {
					t.Errorf("%s from %s went to %s, want %s", r.event, p, st.Phase(), want)
				}
				if want.Hold == HoldPreempted && st.PreemptedBy != "7" {
					t.Errorf("%s: pre-empted by %q, want 7", r.event, st.PreemptedBy)
				}
				if st.Status == Completing && st.End == "" {
					t.Errorf("%s from %s: COMPLETING without its end", r.event, p)
				}
			}
		}
	}
	// A new job's state: only submit's events.
	for _, r := range transitions {
		var st State
		if err := st.apply(Transition{Event: r.event, End: Completed, Code: reason.Dependency}); (err == nil) != (r.from == nil) {
			t.Errorf("%s on a new job: %v", r.event, err)
		}
	}
}

// TestApplyReasons: the reason's code and words each transition gives.
func TestApplyReasons(t *testing.T) {
	cases := []struct {
		from  Phase
		tr    Transition
		code  reason.Code
		words string
		end   Status
	}{
		{running, Transition{Event: EvEnd, End: Failed, Words: "failed: rank 1 on a: exit code 3"}, reason.NonZeroExitCode, "failed: rank 1 on a: exit code 3", Failed},
		{running, Transition{Event: EvEnd, End: Timeout, Words: "time limit 1m0s reached"}, reason.TimeLimit, "time limit 1m0s reached", Timeout},
		{running, Transition{Event: EvEnd, End: NodeFail, Words: "node b lost: down"}, reason.NodeDown, "node b lost: down", NodeFail},
		{running, Transition{Event: EvEnd, End: Completed}, reason.None, "", Completed},
		{running, Transition{Event: EvCancel, Words: "cancelled"}, reason.Cancelled, "cancelled", Cancelled},
		{deferred, Transition{Event: EvStillHeld, Code: reason.JobArrayTaskLimit}, reason.JobArrayTaskLimit, "JobArrayTaskLimit", ""},
		{deferred, Transition{Event: EvRelease}, reason.Priority, "Priority", ""},
		{requeue, Transition{Event: EvRequestAgain}, reason.Resources, "Resources", ""},
		{Phase{Status: Preempted}, Transition{Event: EvPreemptStopped, PreemptedBy: "4"}, reason.BeginTime, "BeginTime", ""},
		{pending, Transition{Event: EvPlace}, reason.None, "", ""},
		{running, Transition{Event: EvRequeue, Words: "requeued: down"}, reason.Requeued, "requeued: down", ""},
	}
	for _, c := range cases {
		st := phaseState(c.from)
		if err := st.apply(c.tr); err != nil {
			t.Errorf("%s from %s: %v", c.tr.Event, c.from, err)
			continue
		}
		if st.Code != c.code || st.Reason != c.words || st.End != c.end {
			t.Errorf("%s from %s: code %q, words %q, end %q; want %q, %q, %q", c.tr.Event, c.from, st.Code, st.Reason, st.End, c.code, c.words, c.end)
		}
	}
	// EvEnd must name a final end other than CANCELLED (cancel's own); EvStillHeld a code.
	for _, tr := range []Transition{{Event: EvEnd, End: Cancelled}, {Event: EvEnd, End: Running}, {Event: EvEnd}} {
		st := phaseState(running)
		if err := st.apply(tr); !errors.Is(err, ErrTransition) || st.Status != Running {
			t.Errorf("end %q: %v, state %s; want refused", tr.End, err, st.Status)
		}
	}
	st := phaseState(deferred)
	if err := st.apply(Transition{Event: EvStillHeld}); !errors.Is(err, ErrTransition) {
		t.Errorf("still-held without a code: %v, want refused", err)
	}
	// finish keeps the end's reason.
	st = phaseState(running)
	_ = st.apply(Transition{Event: EvEnd, End: Timeout, Words: "time limit 1m0s reached"})
	if err := st.apply(Transition{Event: EvFinish}); err != nil || st.Status != Timeout || st.Code != reason.TimeLimit || st.Reason != "time limit 1m0s reached" {
		t.Errorf("finish: %v, %s %q %q", err, st.Status, st.Code, st.Reason)
	}
}

// TestReasonCodeOfOlderRecords: a state an older gangrun wrote (no reason_code) gets
// the code its words or status imply.
func TestReasonCodeOfOlderRecords(t *testing.T) {
	cases := []struct {
		st   State
		want reason.Code
	}{
		{State{Status: Pending, Reason: "Priority"}, reason.Priority},
		{State{Status: Pending, Reason: "DependencyNeverSatisfied", Deferred: true}, reason.DependencyNeverSatisfied},
		{State{Status: Pending, Reason: "requeued: node b lost", Requeue: true}, reason.Requeued},
		{State{Status: Preempted, Reason: "preempted by job 3 (partition hi)"}, reason.Preempted},
		{State{Status: Completing, End: Timeout, Reason: "time limit 1m0s reached"}, reason.TimeLimit},
		{State{Status: Failed, Reason: "InvalidCredential: no such user"}, reason.InvalidCredential},
		{State{Status: Failed, Reason: "failed: rank 0 on a: exit code 1"}, reason.NonZeroExitCode},
		{State{Status: Cancelled, Reason: "cancelled while pending"}, reason.Cancelled},
		{State{Status: Completed}, reason.None},
		{State{Status: Running}, reason.None},
	}
	for _, c := range cases {
		if got := c.st.ReasonCode(); got != c.want {
			t.Errorf("%s %q: code %q, want %q", c.st.Status, c.st.Reason, got, c.want)
		}
	}
}

// TestSrunStepEnds: an srun step ends only in one of Slurm's step end states.
func TestSrunStepEnds(t *testing.T) {
	for _, st := range []Status{Completed, Failed, Cancelled} {
		if err := checkStepEnd(st); err != nil {
			t.Errorf("%s: %v", st, err)
		}
	}
	for _, st := range []Status{Running, Pending, Timeout, NodeFail, ""} {
		if err := checkStepEnd(st); !errors.Is(err, ErrTransition) {
			t.Errorf("%q: %v, want refused", st, err)
		}
	}
}

// TestHoldOfARunningJobWaitsForItsRequeue: a hold of a running job (Slurm keeps it for
// the job's requeue) leaves it running; requeued after a lost node, or pre-empted, it
// waits held instead of asking for GPUs again; released while it ran, it does not.
func TestHoldOfARunningJobWaitsForItsRequeue(t *testing.T) {
	steps := func(st *State, trs ...Transition) {
		t.Helper()
		for _, tr := range trs {
			if err := st.apply(tr); err != nil {
				t.Fatalf("%s from %s: %v", tr.Event, st.Phase(), err)
			}
		}
	}
	st := phaseState(running)
	steps(&st, Transition{Event: EvMarkHold, Code: reason.JobHeldAdmin})
	if st.Phase() != running || st.Held != HoldAdmin {
		t.Fatalf("held while running: %s, held %q", st.Phase(), st.Held)
	}
	steps(&st, Transition{Event: EvRequeue, Words: "requeued: down"})
	if st.Phase() != requeue {
		t.Fatalf("requeued: %s, want %s (its old grant must go first)", st.Phase(), requeue)
	}
	steps(&st, Transition{Event: EvRequestAgain})
	if st.Phase() != heldAdmin || st.ReasonCode() != reason.JobHeldAdmin {
		t.Errorf("after the requeue: %s %s, want %s JobHeldAdmin", st.Phase(), st.ReasonCode(), heldAdmin)
	}
	st = phaseState(running)
	steps(&st, Transition{Event: EvMarkHold, Code: reason.JobHeldUser}, Transition{Event: EvPreempt, Words: "preempted"},
		Transition{Event: EvPreemptStopped, PreemptedBy: "3"}, Transition{Event: EvResume})
	if st.Phase() != heldUser {
		t.Errorf("pre-empted while held: %s, want %s", st.Phase(), heldUser)
	}
	st = phaseState(running)
	steps(&st, Transition{Event: EvMarkHold, Code: reason.JobHeldUser}, Transition{Event: EvUnmarkHold},
		Transition{Event: EvRequeue}, Transition{Event: EvRequestAgain})
	if st.Phase() != pending || st.Held != "" {
		t.Errorf("released while it ran, requeued: %s, held %q; want %s", st.Phase(), st.Held, pending)
	}
	// Released (or held) while its requeue is under way (scontrol requeuehold, then
	// release before the old grant went): the release is not lost.
	st = phaseState(running)
	steps(&st, Transition{Event: EvMarkHold, Code: reason.JobHeldUser}, Transition{Event: EvRequeueAsked})
	if !st.holdWaits() {
		t.Fatalf("requeue under way (%s): a hold should wait for it", st.Phase())
	}
	steps(&st, Transition{Event: EvUnmarkHold}, Transition{Event: EvRequestAgain})
	if st.Phase() != pending || st.Held != "" {
		t.Errorf("released while requeued, then placed again: %s, held %q; want %s", st.Phase(), st.Held, pending)
	}
	st = phaseState(running)
	steps(&st, Transition{Event: EvRequeueAsked}, Transition{Event: EvMarkHold, Code: reason.JobHeldUser}, Transition{Event: EvRequestAgain})
	if st.Phase() != heldUser {
		t.Errorf("held while requeued: %s, want %s", st.Phase(), heldUser)
	}
	if err := st.apply(Transition{Event: EvMarkHold, Code: reason.Priority}); !errors.Is(err, ErrTransition) {
		t.Errorf("mark-hold with reason Priority: %v, want refused", err)
	}
}
