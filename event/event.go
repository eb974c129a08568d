// Package event carries what happens in gangrun's long-running loops — the supervisor's
// worker group, the rendezvous' rounds, the scheduler's grants — to the sinks that
// observe them (metrics, accounting, tests), so a new observer plugs in through a
// Config without editing those loops. Every loop takes a Sink in its Config; a nil
// Sink is Discard.
package event

import (
	"sync"
	"time"

	"github.com/gangrun/gangrun/failure"
)

// Kind names what happened.
type Kind string

// The kinds of event, by the loop that emits them.
const (
	// StateChanged: the supervisor's worker group moved to State (launcher.GroupState:
	// "init", "healthy", "unhealthy", "failed", "succeeded", "stopped", torch's
	// WorkerState names).
	StateChanged Kind = "state_changed"
	// WorkerFailed: a worker failed (or the gang hung); Failure is its kind, Rank,
	// ExitCode and Cause describe the root cause.
	WorkerFailed Kind = "worker_failed"
	// Restarting: the gang starts attempt Attempt after a failure (Failure its kind,
	// Cause its reason), after Detail's backoff.
	Restarting Kind = "restarting"
	// CheckpointChosen: attempt Attempt resumes from Checkpoint ("" for a fresh start).
	CheckpointChosen Kind = "checkpoint_chosen"
	// RoundClosed: rendezvous round Attempt closed with Nodes.
	RoundClosed Kind = "round_closed"
	// RoundEnded: round Attempt ended for this node; Cause is the end's kind
	// ("succeeded", "failed", "membership changed"), Detail why (a failure's root cause,
	// in words), Failure the failure's kind when it failed.
	RoundEnded Kind = "round_ended"
	// Granted: the scheduler granted request Job its Nodes (GPUs in all).
	Granted Kind = "granted"
	// Pending: request Job waits; Cause is the reason.
	Pending Kind = "pending"
	// Released: grant Job's GPUs went back to the pool (Cause: "released",
	// "cancelled", "expired").
	Released Kind = "released"
	// Passed: the scheduler made one pass over the pending requests, in Duration.
	Passed Kind = "passed"
	// JobStarted: cluster job Job of Partition started running on Nodes for the first
	// time, Duration after it was submitted (its wait in the queue).
	JobStarted Kind = "job_started"
	// JobPreempted: the job controller pre-empted running cluster job Job of Partition
	// (on Nodes) for pending job Cause of a higher tier.
	JobPreempted Kind = "job_preempted"
)

// Event is one thing that happened. Which fields are set depends on Kind (see there);
// the others are zero.
type Event struct {
	Time time.Time
	Kind Kind
	// Job is the job id (supervisor, rendezvous) or the request/grant id (scheduler).
	Job string
	// Node is the node the event happened on ("" for cluster-wide events).
	Node string
	// Attempt is the attempt (rendezvous round) it belongs to; -1 when none.
	Attempt int
	// State is the worker group's state after a StateChanged.
	State string
	// Cause is a short machine-readable cause: a failure's reason, an end's kind, a
	// pending reason.
	Cause string
	// Detail is a human-readable explanation.
	Detail string
	// Failure is the kind of the failure a WorkerFailed, a Restarting or a failed
	// RoundEnded is about; "" for other events, and for a failure an older gangrun
	// reported without one. Consumers switch on it, never on Cause or Detail.
	Failure failure.Kind
	// Rank and ExitCode describe a failed worker (Rank -1: not one worker's failure).
	Rank     int
	ExitCode int
	// Checkpoint is the checkpoint an attempt resumes from.
	Checkpoint string
	// Nodes are the nodes of a round or grant.
	Nodes []string
	// GPUs is the number of GPUs granted.
	GPUs int
	// Duration is how long it took (a scheduler pass) or waited (a job's wait).
	Duration time.Duration
	// Partition is a job's partition ("" for none).
	Partition string
}

// Sink receives events. Emit is called from the emitting loop's goroutine and must not
// block: a sink that does slow work queues it.
type Sink interface {
	Emit(Event)
}

// Discard is the Sink that drops every event.
type Discard struct{}

// Emit implements Sink.
func (Discard) Emit(Event) {}

// Or returns s, or Discard when s is nil.
func Or(s Sink) Sink {
	if s == nil {
		return Discard{}
	}
	return s
}

// Multi fans every event out to each of its sinks, in order.
type Multi []Sink

// Emit implements Sink.
func (m Multi) Emit(e Event) {
	for _, s := range m {
		s.Emit(e)
	}
}

// Recorder is a Sink that keeps every event, for tests and for callers that read what
// happened afterwards. The zero value is ready to use; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

// Emit implements Sink.
func (r *Recorder) Emit(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events returns a copy of the events so far, in the order they were emitted.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// Of returns the events of kind k so far.
func (r *Recorder) Of(k Kind) []Event {
	var out []Event
	for _, e := range r.Events() {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}
