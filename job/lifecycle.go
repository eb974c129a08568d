package job

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gangrun/gangrun/reason"
)

// A job's life is the table below (transitions): every change of its status, of what
// holds a pending job back (Hold), and of its reason goes through State.apply, which
// refuses a change the table does not have. docs/jobs.md's "The state machine" lists
// the same table (TestTheDocsListTheTransitions checks it). To add a state or a
// transition: a Status or Hold constant (state.go, here), a row in transitions, its line
// in docs/jobs.md, and the code that calls apply with it.

// Hold says what holds a PENDING job's request back from the scheduler: a requeue or a
// pre-emption under way first, then a hold (user, admin), then deferred. The stored
// record keeps it in four fields (State.Deferred, State.Requeue, State.PreemptedBy,
// State.Held); State.Hold reads them, and only apply writes them. A held job
// (HoldUser, HoldAdmin) has State.Deferred set too: like a deferred one, it has no
// request.
type Hold string

// The holds of a PENDING job; HoldNone for every other status.
const (
	// HoldNone: its request is the scheduler's (reason Priority, Resources or a
	// policy limit's).
	HoldNone Hold = ""
	// HoldDeferred: no request is written yet, as its --dependency or its array's
	// --array %N cap holds it back (reason Dependency, DependencyNeverSatisfied,
	// JobArrayTaskLimit). State.Deferred.
	HoldDeferred Hold = "deferred"
	// HoldRequeue: it lost a node it could not do without; its old steps are stopping
	// and its old grant is still to go (reason Requeued). State.Requeue.
	HoldRequeue Hold = "requeue"
	// HoldPreempted: pre-empted, it waits for the job that pre-empted it to start
	// (reason BeginTime). State.PreemptedBy names that job.
	HoldPreempted Hold = "preempted"
	// HoldUser: held by its user (sbatch --hold, scontrol hold or uhold; reason
	// JobHeldUser): no request until released (hold.go). State.Held.
	HoldUser Hold = "user"
	// HoldAdmin: held by an operator (scontrol hold; reason JobHeldAdmin): only an
	// operator releases it. State.Held.
	HoldAdmin Hold = "admin"
)

// Hold returns what holds the job back: HoldNone unless it is PENDING.
func (s State) Hold() Hold {
	switch {
	case s.Status != Pending:
		return HoldNone
	case s.Requeue:
		return HoldRequeue
	case s.PreemptedBy != "":
		return HoldPreempted
	case s.Held == HoldUser || s.Held == HoldAdmin:
		return s.Held
	case s.Deferred:
		return HoldDeferred
	}
	return HoldNone
}

// holdWaits reports whether a hold of the job (scontrol hold, or release of one) is
// kept for its next return to the queue (EvMarkHold, EvUnmarkHold) rather than done at
// once: it runs, is stopping, was pre-empted, or is being requeued and its old grant
// has not gone yet (Slurm keeps a running job's hold for its requeue).
func (s State) holdWaits() bool {
	return s.Status == Running || s.Status == Completing || s.Status == Preempted || s.Hold() == HoldRequeue
}

// Phase is a status with its hold: a node of the state machine.
type Phase struct {
	Status Status
	Hold   Hold
}

// String is "PENDING" or "PENDING (deferred)".
func (p Phase) String() string {
	if p.Hold == HoldNone {
		return string(p.Status)
	}
	return string(p.Status) + " (" + string(p.Hold) + ")"
}

// Phase returns the job's status and hold.
func (s State) Phase() Phase { return Phase{s.Status, s.Hold()} }

// Event names a change of a job's state: a row of the table.
type Event string

// The events, in the order of a job's life.
const (
	// EvSubmit: submit writes the job with its request (submit.go).
	EvSubmit Event = "submit"
	// EvSubmitHeld: submit writes the job without a request: a --dependency or an array
	// task (submit.go).
	EvSubmitHeld Event = "submit-held"
	// EvStillHeld: its dependencies, its --begin or its array's cap hold it back still,
	// for another reason than before (controller.go, deferred).
	EvStillHeld Event = "still-held"
	// EvRelease: its dependencies and array cap allow it: its request is written in the
	// same transaction (controller.go, deferred).
	EvRelease Event = "release"
	// EvRefuse: its submit credential did not prove its user; it ends without running
	// (auth.go).
	EvRefuse Event = "refuse"
	// EvPlace: its grant is taken: it runs on the grant's nodes (controller.go, start).
	EvPlace Event = "place"
	// EvEnd: its run ended (succeeded, failed past its budget, timed out, lost a node
	// with --no-requeue); its steps stop (step.go, ledger.go, controller.go).
	EvEnd Event = "end"
	// EvCancel: `gangrun cancel` or scancel of a job that may hold GPUs; its steps stop
	// (submit.go).
	EvCancel Event = "cancel"
	// EvCancelPending: cancel of a job never granted: it ends at once, its request
	// deleted in the same transaction (submit.go).
	EvCancelPending Event = "cancel-pending"
	// EvFinish: every step has stopped: it ends in the status its end named
	// (controller.go, finish).
	EvFinish Event = "finish"
	// EvRequeue: it lost a node it could not do without, or (a batch job) any node
	// (controller.go, watchNodes).
	EvRequeue Event = "requeue"
	// EvRequeueSilent: it failed after nodes' steps ended without a word (the nodes
	// died): a node failure, not the job's (controller.go, requeueSilent).
	EvRequeueSilent Event = "requeue-silent"
	// EvRequestAgain: its old steps and grant are gone: a new request is written, away
	// from the nodes it lost (controller.go).
	EvRequestAgain Event = "request-again"
	// EvPreempt: a job of a higher tier pre-empts it; its steps stop (preempt.go).
	EvPreempt Event = "preempt"
	// EvPreemptStopped: its steps have stopped after a pre-emption (preempt.go).
	EvPreemptStopped Event = "preempt-stopped"
	// EvResume: the job that pre-empted it started (or gave up waiting): its request is
	// written again (preempt.go).
	EvResume Event = "resume"
	// EvSubmitHold: submit writes the job held by its user (sbatch --hold; submit.go).
	EvSubmitHold Event = "submit-hold"
	// EvHold: its user holds it (scontrol hold or uhold); its request is deleted in the
	// same transaction (hold.go).
	EvHold Event = "hold"
	// EvHoldAdmin: an operator holds it (scontrol hold), a user's hold or not (hold.go).
	EvHoldAdmin Event = "hold-admin"
	// EvReleaseHold: scontrol release: it waits as a deferred job, until the controller
	// writes its request (hold.go).
	EvReleaseHold Event = "release-hold"
	// EvMarkHold: a hold of a job that runs (or is stopping): its status stays, and the
	// hold (State.Held, Transition.Code JobHeldUser or JobHeldAdmin) waits for a requeue,
	// which leaves it held (Slurm keeps a running job's hold for its requeue; hold.go).
	EvMarkHold Event = "mark-hold"
	// EvUnmarkHold: scontrol release of such a job: the hold waiting is gone.
	EvUnmarkHold Event = "unmark-hold"
	// EvRequeueAsked: scontrol requeue (or requeuehold) of a running job: its steps
	// stop, and it is placed again as after a lost node, with no node excluded
	// (hold.go).
	EvRequeueAsked Event = "requeue-asked"
	// EvUpdate: scontrol update of a pending job that is not held: its request is
	// withdrawn in the transaction that changes its spec, and it waits as a deferred
	// job until the controller writes the request again, from the new spec (update.go).
	EvUpdate Event = "update"
)

// rule is a row of the table: the phases event may leave and the one it enters (a
// zero status: the status its end names, EvFinish; or its status, unchanged).
type rule struct {
	event Event
	from  []Phase
	to    Phase
	// code is the reason the job gets, unless the transition gives its own.
	code reason.Code
}

var (
	pending   = Phase{Status: Pending}
	deferred  = Phase{Pending, HoldDeferred}
	requeue   = Phase{Pending, HoldRequeue}
	preempted = Phase{Pending, HoldPreempted}
	heldUser  = Phase{Pending, HoldUser}
	heldAdmin = Phase{Pending, HoldAdmin}
	anyPend   = []Phase{pending, deferred, requeue, preempted, heldUser, heldAdmin}
	running   = Phase{Status: Running}
	// completing is COMPLETING with its end (Transition.End).
	completing = Phase{Status: Completing}
)

// transitions is the job's life. A Phase with a zero Status in from matches none.
var transitions = []rule{
	{EvSubmit, nil, pending, reason.Priority},
	{EvSubmitHeld, nil, deferred, reason.Dependency},
	{EvStillHeld, []Phase{deferred}, deferred, ""},
	{EvRelease, []Phase{deferred}, pending, reason.Priority},
	{EvRefuse, anyPend, Phase{Status: Failed}, reason.InvalidCredential},
	{EvPlace, []Phase{pending, deferred, preempted}, running, reason.None},
	{EvEnd, []Phase{running}, completing, ""},
	{EvCancel, append(slices.Clone(anyPend), running, Phase{Status: Preempted}), completing, reason.Cancelled},
	{EvCancelPending, anyPend, Phase{Status: Cancelled}, reason.Cancelled},
	{EvFinish, []Phase{completing}, Phase{}, ""},
	{EvRequeue, []Phase{running}, requeue, reason.Requeued},
	{EvRequeueSilent, []Phase{completing}, requeue, reason.Requeued},
	{EvRequestAgain, []Phase{requeue}, pending, reason.Resources},
	{EvPreempt, []Phase{running}, Phase{Status: Preempted}, reason.Preempted},
	{EvPreemptStopped, []Phase{{Status: Preempted}}, preempted, reason.BeginTime},
	{EvResume, []Phase{preempted}, pending, reason.Priority},
	{EvSubmitHold, nil, heldUser, reason.JobHeldUser},
	{EvHold, []Phase{pending, deferred, heldAdmin}, heldUser, reason.JobHeldUser},
	{EvHoldAdmin, []Phase{pending, deferred, heldUser}, heldAdmin, reason.JobHeldAdmin},
	{EvReleaseHold, []Phase{heldUser, heldAdmin}, deferred, reason.Priority},
	{EvRequeueAsked, []Phase{running}, requeue, reason.Requeued},
	{EvMarkHold, []Phase{running, completing, {Status: Preempted}, requeue}, Phase{}, ""},
	{EvUnmarkHold, []Phase{running, completing, {Status: Preempted}, requeue}, Phase{}, ""},
	{EvUpdate, []Phase{pending, deferred}, deferred, reason.Priority},
}

// Transition is one change of a job's state, as State.apply takes it.
type Transition struct {
	Event Event
	// End is, for EvEnd, the status the job ends in (COMPLETED, FAILED, TIMEOUT,
	// NODE_FAIL); EvCancel's is CANCELLED.
	End Status
	// Code is the reason's code where the event has none of its own (EvStillHeld's:
	// Dependency, DependencyNeverSatisfied, BeginTime or JobArrayTaskLimit), or to give another
	// than the event's; Words the reason in words for people ("" for the code itself).
	Code  reason.Code
	Words string
	// PreemptedBy is, for EvPreemptStopped, the job that pre-empted it.
	PreemptedBy string
}

// endCode is the reason code of a job that ends in status end.
func endCode(end Status) reason.Code {
	switch end {
	case Failed:
		return reason.NonZeroExitCode
	case Timeout:
		return reason.TimeLimit
	case NodeFail:
		return reason.NodeDown
	case Cancelled:
		return reason.Cancelled
	case OutOfMemory:
		return reason.OutOfMemory
	}
	return reason.None
}

// ErrTransition means a change the job's state machine does not have: the event from
// the job's phase (a writer that read the job before another changed it).
var ErrTransition = fmt.Errorf("no such transition")

// apply makes transition t on the job's state: its status, end, hold and reason, as the
// table says; every other field is the caller's. It returns an error wrapping
// ErrTransition, and changes nothing, when the table has no such change from where the
// job is.
func (s *State) apply(t Transition) error {
	r, ok := ruleOf(t.Event)
	if !ok {
		return fmt.Errorf("job state: event %q: %w", t.Event, ErrTransition)
	}
	from := s.Phase()
	if s.Status != "" || r.from != nil { // a new job's state has no status
		if !slices.ContainsFunc(r.from, func(p Phase) bool { return p == from }) {
			return fmt.Errorf("job state: %s from %s: %w", t.Event, from, ErrTransition)
		}
	}
	if t.Event == EvMarkHold || t.Event == EvUnmarkHold {
		return s.markHold(t)
	}
	to, end := r.to, Status("")
	if s.Held != "" && (t.Event == EvRequestAgain || t.Event == EvResume) {
		// Held while it ran (EvMarkHold): requeued, it stays held, with no request, and
		// says so in Slurm's words (squeue's reason for it).
		r.code, to, t.Words = reason.JobHeldUser, heldUser, "job requeued in held state"
		if s.Held == HoldAdmin {
			r.code, to = reason.JobHeldAdmin, heldAdmin
		}
	}
	switch t.Event {
	case EvEnd:
		if !t.End.Final() || t.End == Cancelled {
			return fmt.Errorf("job state: %s with end %q: %w", t.Event, t.End, ErrTransition)
		}
		end = t.End
	case EvCancel:
		end = Cancelled
	case EvFinish:
		to, end = Phase{Status: s.End}, s.End // End stays in the record, as it always has
	case EvStillHeld:
		if t.Code == "" {
			return fmt.Errorf("job state: %s without a reason: %w", t.Event, ErrTransition)
		}
	}
	code := r.code
	if code == "" && end != "" {
		code = endCode(end)
	}
	if t.Code != "" {
		code = t.Code
	}
	words := t.Words
	switch {
	case t.Event == EvFinish:
		code, words = s.ReasonCode(), s.Reason // its end's, as recorded
	case words == "" && to.Status == Pending:
		words = string(code) // a pending job's reason is its code (squeue's REASON)
	}
	s.Status, s.End, s.Code, s.Reason = to.Status, end, code, words
	held := to.Hold == HoldUser || to.Hold == HoldAdmin
	s.Deferred, s.Requeue = to.Hold == HoldDeferred || held, to.Hold == HoldRequeue
	switch {
	case held:
		s.Held = to.Hold
	case to.Hold == HoldRequeue || to.Hold == HoldPreempted || to.Status == Running || to.Status == Completing || to.Status == Preempted:
		// A hold marked while it ran waits for its requeue (EvMarkHold).
	default:
		s.Held = ""
	}
	s.PreemptedBy = ""
	if to.Hold == HoldPreempted {
		s.PreemptedBy = t.PreemptedBy
	}
	return nil
}

// markHold is EvMarkHold (Transition.Code JobHeldUser or JobHeldAdmin) or
// EvUnmarkHold on a job that is not pending: only State.Held changes.
func (s *State) markHold(t Transition) error {
	switch {
	case t.Event == EvUnmarkHold:
		s.Held = ""
	case t.Code == reason.JobHeldUser:
		s.Held = HoldUser
	case t.Code == reason.JobHeldAdmin:
		s.Held = HoldAdmin
	default:
		return fmt.Errorf("job state: %s with reason %q: %w", t.Event, t.Code, ErrTransition)
	}
	return nil
}

// ruleOf returns event's row.
func ruleOf(ev Event) (rule, bool) {
	i := slices.IndexFunc(transitions, func(r rule) bool { return r.event == ev })
	if i < 0 {
		return rule{}, false
	}
	return transitions[i], true
}

// ReasonCode returns the code of the job's reason. A record an older gangrun wrote has
// none stored: its words are the code when they are one, else the code is the one its
// status implies.
func (s State) ReasonCode() reason.Code {
	if s.Code != "" {
		return s.Code
	}
	if c := reason.Code(s.Reason); c.Known() {
		return c
	}
	switch {
	case s.Hold() == HoldRequeue, s.Status == Pending && strings.HasPrefix(s.Reason, "requeued"):
		return reason.Requeued
	case s.Status == Preempted:
		return reason.Preempted
	case s.Status == Completing:
		return endCode(s.End)
	case s.Status == Failed && strings.HasPrefix(s.Reason, string(reason.InvalidCredential)):
		return reason.InvalidCredential
	case s.Status.Final():
		return endCode(s.Status)
	}
	return reason.None
}

// An srun step of a batch job (srun.go) has a life of its own, in Slurm's step states:
// srun writes its request, and it runs (RUNNING) until its end is written, once, in one
// of stepEnds (EndSrunStep refuses another; the first end written wins). A batch job's
// batch step is the job's own step: its states are the job's.
var stepEnds = []Status{Completed, Failed, Cancelled, OutOfMemory}

// checkStepEnd returns an error wrapping ErrTransition unless end is one of stepEnds.
func checkStepEnd(end Status) error {
	if !slices.Contains(stepEnds, end) {
		return fmt.Errorf("srun step state: end %q: %w", end, ErrTransition)
	}
	return nil
}

// TransitionTable returns the table as lines "`event`: FROM, FROM → TO, reason CODE",
// in its order: what docs/jobs.md lists between its "transitions" markers.
func TransitionTable() []string {
	var out []string
	for _, r := range transitions {
		var from []string
		for _, p := range r.from {
			from = append(from, p.String())
		}
		to := r.to.String()
		switch r.event {
		case EvFinish:
			to = "its end's status"
		case EvMarkHold:
			to = "unchanged, held once requeued (reason JobHeldUser or JobHeldAdmin then)"
		case EvUnmarkHold:
			to = "unchanged, not held once requeued"
		case EvEnd, EvCancel:
			to += " (with its end)"
		}
		f := "(new)"
		if len(from) > 0 {
			f = strings.Join(from, ", ")
		}
		why := ""
		switch {
		case r.code != "":
			why = ", reason " + string(r.code)
		case r.event == EvEnd:
			why = ", reason by its end (NonZeroExitCode, TimeLimit, NodeDown, OutOfMemory, None)"
		case r.event == EvStillHeld:
			why = ", reason Dependency, DependencyNeverSatisfied, BeginTime or JobArrayTaskLimit"
		}
		out = append(out, fmt.Sprintf("`%s`: %s → %s%s", r.event, f, to, why))
	}
	var ends []string
	for _, e := range stepEnds {
		ends = append(ends, string(e))
	}
	out = append(out, "srun step `start`: (new) → RUNNING",
		"srun step `end`: RUNNING → "+strings.Join(ends, ", ")+" (the first end written wins)")
	return out
}

// newState is a new job's state, as submit writes it: event EvSubmit or EvSubmitHeld,
// with reason code ("" for the event's).
func newState(ev Event, code reason.Code) State {
	var st State
	if err := st.apply(Transition{Event: ev, Code: code}); err != nil {
		panic(err) // the table has both events from a new job: a broken table
	}
	return st
}
