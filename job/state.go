package job

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/reason"
)

// Keys of a job, under gangrun/batch/jobs/<id>/:
//
//	spec           Spec, written once by Submit
//	state          State, changed only by check-and-set
//	auth           Auth: who submitted it, proven (auth.go)
//	steps/<node>   StepRecord, held by the session of the job's step on the node: the
//	               step runs while the key exists
//
// gangrun/batch/jobseq, the last job id given, and gangrun/batch/placed/<node>/<id>,
// the placement (State.Placement) node runs job id in, written by the controller with
// the state: what a node's launcher watches, so that it reads its own jobs only. The
// job's request and grant are the allocator's (gangrun/cluster/requests/<id>,
// grants/<id>); its rendezvous is gangrun/jobs/<id>/, as `gangrun run --job-id <id>`'s.
// Jobs live outside gangrun/cluster/ so that the allocator's reads of the cluster (every
// submit, every pass) do not grow with the jobs ever submitted.
const (
	batchPrefix  = "gangrun/batch/"
	jobsPrefix   = batchPrefix + "jobs/"
	seqKey       = batchPrefix + "jobseq"
	placedPrefix = batchPrefix + "placed/"
)

// placedKey is node's entry for job id in the launchers' index.
func placedKey(node, id string) string { return placedPrefix + node + "/" + id }

// placedOf is the launchers' index of state st: each node it runs on → its placement
// (empty unless it is RUNNING).
func placedOf(st State) map[string]int {
	m := map[string]int{}
	if st.Status == Running {
		for _, n := range st.Nodes {
			m[n] = st.Placement
		}
	}
	return m
}

// placedDiff are the operations that turn the index entries of job id from before into
// after: entries written only where they change (a launcher wakes on each write).
func placedDiff(id string, before, after map[string]int) []store.Op {
	var ops []store.Op
	for _, n := range slices.Sorted(maps.Keys(after)) {
		if p, ok := before[n]; !ok || p != after[n] {
			ops = append(ops, store.Op{Verb: store.Set, Key: placedKey(n, id), Value: []byte(strconv.Itoa(after[n]))})
		}
	}
	for _, n := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[n]; !ok {
			ops = append(ops, store.Op{Verb: store.Delete, Key: placedKey(n, id)})
		}
	}
	return ops
}

func specKey(id string) string       { return jobsPrefix + id + "/spec" }
func stateKey(id string) string      { return jobsPrefix + id + "/state" }
func stepsPrefix(id string) string   { return jobsPrefix + id + "/steps/" }
func stepKey(id, node string) string { return stepsPrefix(id) + node }

// Status is a job's state, in Slurm's names (squeue's JOB STATE CODES).
type Status string

// The statuses. A job moves PENDING → RUNNING → COMPLETING → one of the final ones;
// PREEMPTED is a running job a job of a higher tier pre-empted (preempt.go): its steps
// stop, and it goes back to PENDING. Every move is a transition of lifecycle.go's table.
const (
	Pending    Status = "PENDING"
	Running    Status = "RUNNING"
	Completing Status = "COMPLETING"
	Completed  Status = "COMPLETED"
	Failed     Status = "FAILED"
	Cancelled  Status = "CANCELLED"
	Timeout    Status = "TIMEOUT"
	// OutOfMemory is a batch job whose cgroup's OOM killer killed a process of it
	// (Slurm's OUT_OF_MEMORY, exit 0:125).
	OutOfMemory Status = "OUT_OF_MEMORY"
	NodeFail    Status = "NODE_FAIL"
	Preempted   Status = "PREEMPTED"
	// Requeued is no job's stored status (a requeued job is PENDING, HoldRequeue): it is
	// what a step gives as the reason it stops its workers when its job was requeued.
	Requeued Status = "REQUEUED"
	// Unknown is how `gangrun queue` and `show` list a job whose state record a newer
	// gangrun wrote (schema.NewerError): this one cannot tell how it stands, and leaves
	// it alone. No job is ever in it; it is not one of Slurm's states.
	Unknown Status = "UNKNOWN"
)

// Final reports whether s is an end state: the job will not run again.
func (s Status) Final() bool {
	switch s {
	case Completed, Failed, Cancelled, Timeout, NodeFail, OutOfMemory:
		return true
	}
	return false
}

// Active reports whether the job may hold GPUs or run: pending (its request stands),
// running or completing.
func (s Status) Active() bool { return !s.Final() }

// Attempt is one rendezvous round of the job: the gang from start to end.
type Attempt struct {
	// Number is the round (GANGRUN_ATTEMPT).
	Number int `json:"number"`
	// Nodes are the round's nodes in node-rank order.
	Nodes []string `json:"nodes"`
	// Started and Ended bound it; Ended is zero while it runs.
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// Cause is how it ended, in words for people: "succeeded", "failed: rank 3 on
	// node-b: exit code 1", "node node-b lost: its agent's session ended", ... Nothing
	// parses it: Failure says what ended it.
	Cause string `json:"cause"`
	// Failure is the kind of failure that ended it (the supervisor's root cause, a lost
	// node, a pre-emption); "" when it ended otherwise (a success, a membership change,
	// a cancellation), and in a record an older gangrun wrote (legacykind.go).
	Failure failure.Kind `json:"failure,omitempty"`
	// ResumeFrom is the checkpoint it resumed from ("" for a fresh start), and
	// ResumeFromTime that checkpoint's modification time (when it was completed).
	ResumeFrom     string    `json:"resume_from"`
	ResumeFromTime time.Time `json:"resume_from_time,omitzero"`
	// WorkersStarted is when the first node's workers of the attempt started (zero
	// when they did not, or before they do).
	WorkersStarted time.Time `json:"workers_started,omitzero"`
	// RestartCause is, once a later attempt restarted the job after this one, the class
	// of how this one ended (one of RestartCauses); "" otherwise.
	RestartCause string `json:"restart_cause,omitempty"`
}

// LostNode is a node the job lost while it ran there.
type LostNode struct {
	Node string `json:"node"`
	// Why is the loss in words, for people; Kind its class (failure.NodeLost, or
	// failure.GPUHealth for a node drained because a GPU failed), "" in a record an
	// older gangrun wrote (legacykind.go).
	Why  string       `json:"why"`
	Kind failure.Kind `json:"kind,omitempty"`
	At   time.Time    `json:"at"`
	// Exclude keeps the job's later placements off the node: its step was lost while
	// the node itself looked up and healthy. A node lost by going down or being drained
	// is not excluded: the scheduler skips it while it is so, and takes it again once
	// its agent is back or it is resumed.
	Exclude bool `json:"exclude,omitempty"`
	// AgentSession is the node's agent session when it was lost: the exclusion lapses
	// once the agent has restarted (allocator.Request.ExcludeSession). "" (a record
	// older than it) excludes for good, as before.
	AgentSession string `json:"agent_session,omitempty"`
}

// closeAttempts ends the attempts still open at now with a failure of kind ("" for
// none: a cancellation, a time limit) described by cause (the job stopped on every
// node: a requeue).
func (s *State) closeAttempts(now time.Time, kind failure.Kind, cause string) {
	for i := range s.Attempts {
		if s.Attempts[i].Ended.IsZero() {
			s.Attempts[i].Ended, s.Attempts[i].Cause, s.Attempts[i].Failure = now, cause, kind
		}
	}
}

// State is a job's changing record. Every change is a check-and-set on its index.
type State struct {
	Status Status `json:"state"`
	// Reason says in words why a pending job waits (for one held by its own state: the
	// code itself, "Priority", "Dependency"), or why a stopping or final one ended
	// ("requeued: node gpu-b lost: ...", "cancelled", the root cause); Code is its kind
	// (Slurm's state_reason beside state_desc), "" in a record an older gangrun wrote
	// (ReasonCode tells it then). Both change only through apply (lifecycle.go).
	Reason string      `json:"reason,omitempty"`
	Code   reason.Code `json:"reason_code,omitempty"`
	// Status changes only through apply (lifecycle.go), as do End, Deferred, Requeue and
	// PreemptedBy (the job's Hold).
	//
	// End is, while COMPLETING, the status the job ends in once its steps have stopped
	// (and, once it has, that status still).
	End Status `json:"end,omitempty"`
	// Nodes are the nodes the job runs on (its steps'), Spares the ones it holds idle.
	Nodes  []string `json:"nodes,omitempty"`
	Spares []string `json:"spares,omitempty"`
	// NodesSince is when Nodes last gained a node (a placement, a spare taking a lost
	// node's place): a node whose step has not started StepStartTimeout after it is
	// handled as lost.
	NodesSince time.Time `json:"nodes_since,omitzero"`
	// Placement counts the job's placements: 1 for its first grant, more after a requeue.
	Placement int `json:"placement"`
	// AgentSessions are, for the current placement, each node's agent session when the
	// job was placed there: a node that loses the job's step while its agent still holds
	// that session is excluded from the job's later placements; one whose agent
	// registered again meanwhile (an outage of its own) is not.
	AgentSessions map[string]string `json:"agent_sessions,omitempty"`
	// Requeue is set on a PENDING job placed again after losing a node it could not do
	// without, until its old grant is gone and its new request written.
	Requeue bool `json:"requeue,omitempty"`
	// Deferred is set on a PENDING job whose request is not written yet: its
	// dependencies do not hold, or its array's cap holds it back. The controller writes
	// the request and clears it once they allow.
	Deferred bool `json:"deferred,omitempty"`
	// Held is, while the job is held (HoldUser, HoldAdmin: hold.go), who holds it;
	// Deferred is set too.
	Held Hold `json:"held,omitempty"`
	// StepsEnded lists the nodes whose step of this placement ended and said so: a node
	// the job ran on that is missing here when every step is gone lost its step without
	// a word (the node died, or was cut off).
	StepsEnded []string `json:"steps_ended,omitempty"`
	// Started is when it first ran, Ended when it ended.
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	// ExitCode is the job's exit code once final: 0, or the root cause's (128+N for
	// signal N), as `gangrun run` exits.
	ExitCode int `json:"exit_code"`
	// Restarts counts the restarts of the job's own failures (they use up --max-restarts);
	// NodeFailures those caused by a lost node (they do not).
	Restarts     int `json:"restarts"`
	NodeFailures int `json:"node_failures"`
	// RestartsByCause counts every restart of the gang (a new attempt after one that
	// ended), node failures included, by the class of the failure before it (one of
	// RestartCauses): gangrun_job_restarts_total.
	RestartsByCause map[string]int `json:"restarts_by_cause,omitempty"`
	// Checkpoint is the newest complete checkpoint in the job's checkpoint directory as
	// the agent exporting the job's metrics (its node rank 0's) last saw it.
	Checkpoint *CheckpointSeen `json:"checkpoint,omitempty"`
	// Attempts are the job's rendezvous rounds, oldest first; LostNodes the nodes it lost.
	Attempts  []Attempt  `json:"attempts,omitempty"`
	LostNodes []LostNode `json:"lost_nodes,omitempty"`
	// PlacedAt is when the job's current (or last) placement started running: a
	// pre-emption's exempt time and the time limit count from it.
	PlacedAt time.Time `json:"placed_at,omitzero"`
	// Signals are the signals users sent the job while it ran (scancel --signal),
	// oldest first, the newest maxSignalsKept (signal.go).
	Signals []SignalRequest `json:"signals,omitempty"`
	// Preemptions are the job's pre-emptions, oldest first (preempt.go).
	Preemptions []Preemption `json:"preemptions,omitempty"`
	// PreemptedBy names, while the job waits PENDING after a pre-emption (reason
	// BeginTime), the job that pre-empted it: its request is written once that job has
	// started (or ended, or waited PreemptorWait), so that its own new request cannot
	// take back the GPUs it was stopped for.
	PreemptedBy string `json:"preempted_by,omitempty"`
	// TimeLimit is, while the job runs, the time limit scontrol update gave it since it
	// started (0: UNLIMITED); nil: its spec's. Its steps move their limit to it.
	TimeLimit *time.Duration `json:"time_limit,omitempty"`
	// PreemptFailures counts the failures of the job's run that its pre-emptions caused
	// (a gang stopped in the middle of a round): like NodeFailures, they do not use up
	// --max-restarts.
	PreemptFailures int `json:"preempt_failures,omitempty"`
}

// SlurmRestarts is the job's restart count as Slurm shows it (scontrol show job's
// Restarts, sacct's Restarts) and as SLURM_RESTART_COUNT gives it: the job's own
// restarts (Restarts) and its requeues, the placements after its first (scontrol
// requeue, a lost node, a pre-emption) — or, where more, the nodes it lost (a spare
// replacing one restarts the gang without a requeue).
func (s State) SlurmRestarts() int {
	return s.Restarts + max(s.Placement-1, s.NodeFailures, 0)
}

// Preemption is one pre-emption of a job.
type Preemption struct {
	// By is the job that pre-empted it, of partition Partition.
	By        string `json:"by"`
	Partition string `json:"partition,omitempty"`
	// At is when the controller pre-empted it; Requeued when its steps had all stopped
	// and it went back to PENDING (zero until then).
	At       time.Time `json:"at"`
	Requeued time.Time `json:"requeued,omitzero"`
	// Signal is what its workers got first (syscall number), Grace the time before they
	// were stopped.
	Signal int           `json:"signal"`
	Grace  time.Duration `json:"grace"`
	// RunFailures is its run's failure count when it was pre-empted: the failures
	// counted beyond it by the time it is requeued were the pre-emption's.
	RunFailures int `json:"run_failures"`
}

// maxAttemptsKept bounds the attempts a job's state keeps (the newest): a month-long job
// restarted every few hours keeps its history, and its key stays small.
const maxAttemptsKept = 256

// ErrNotFound means there is no such job.
var ErrNotFound = errors.New("no such job")

// Job is a job's spec and state, as read together.
type Job struct {
	Spec  Spec
	State State
	// Index is the state key's index (for a check-and-set); SpecIndex the spec key's.
	Index     uint64
	SpecIndex uint64
	// Idle are the nodes' marks that the job's GPUs there stay idle (IdleMark), by node.
	Idle []IdleMark
	// Auth is who submitted it, proven (auth.go); nil when its record has none.
	// AuthIndex is the auth key's index (0: none).
	Auth      *Auth
	AuthIndex uint64
}

// Read returns job id; ErrNotFound when there is none. A job whose spec, state or
// auth a newer gangrun wrote is an error wrapping schema.ErrNewer ("job 7: job spec
// written by a newer gangrun (schema 2; this one reads up to 1)"): this gangrun neither
// runs it nor changes it.
func Read(ctx context.Context, s store.Store, id string) (*Job, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	entries, _, err := s.List(ctx, jobsPrefix+id+"/")
	if err != nil {
		return nil, err
	}
	return decode(id, entries)
}

// decode builds a Job from its keys.
func decode(id string, entries []store.Entry) (*Job, error) {
	j, err := decodeAll(id, entries)
	if err != nil {
		return nil, err
	}
	return j, nil
}

// decodeAll is decode that also returns, with an error wrapping schema.ErrNewer, the
// parts of the job it could read (its id always): what `gangrun queue` shows of a job
// a newer gangrun wrote. A newer spec, state or auth refuses the job; a newer step
// record counts as a running step (steps are told by their key's holder), a newer idle
// mark is left out.
func decodeAll(id string, entries []store.Entry) (*Job, error) {
	var j Job
	j.Spec.ID = id
	var haveSpec, haveState bool
	var newer error
	refuse := func(err error) error {
		if errors.Is(err, schema.ErrNewer) {
			if newer == nil {
				newer = fmt.Errorf("job %s: %w", id, err)
			}
			return nil
		}
		return err
	}
	for _, e := range entries {
		switch e.Key {
		case specKey(id):
			var sp Spec
			if err := schema.Unmarshal(schema.JobSpec, e.Value, &sp); err != nil {
				if err := refuse(err); err != nil {
					return nil, fmt.Errorf("job %s: spec: %w", id, err)
				}
			} else {
				j.Spec = sp
			}
			haveSpec, j.SpecIndex = true, e.ModifyIndex
		case stateKey(id):
			if err := schema.Unmarshal(schema.JobState, e.Value, &j.State); err != nil {
				if err := refuse(err); err != nil {
					return nil, fmt.Errorf("job %s: state: %w", id, err)
				}
				j.State.Status = Unknown
			}
			j.Index, haveState = e.ModifyIndex, true
		case authKey(id):
			var a Auth
			if err := schema.Unmarshal(schema.JobAuth, e.Value, &a); err == nil {
				j.Auth, j.AuthIndex = &a, e.ModifyIndex
			} else {
				_ = refuse(err) // an auth that does not parse is none, as before
			}
		default:
			var m IdleMark
			if isIdleKey(id, e.Key) && e.Session != "" && schema.Unmarshal(schema.IdleMark, e.Value, &m) == nil {
				j.Idle = append(j.Idle, m)
			}
		}
	}
	if !haveSpec || !haveState {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if newer != nil {
		return &j, newer
	}
	return &j, nil
}

// update applies change to job id's state with check-and-set, reading it again and
// retrying when another writer won; change returns false to leave the state as it is
// (Update then returns false too). extra operations go in the same transaction, and so
// does the job's accounting record (recordOp) when change makes its state final.
func update(ctx context.Context, s store.Store, id string, change func(j *Job) bool, extra ...store.Op) (*Job, bool, error) {
	for {
		j, err := Read(ctx, s, id)
		if err != nil {
			return nil, false, err
		}
		before, wasFinal := placedOf(j.State), j.State.Status.Final()
		if !change(j) {
			return j, false, nil
		}
		if n := len(j.State.Attempts); n > maxAttemptsKept {
			j.State.Attempts = j.State.Attempts[n-maxAttemptsKept:]
		}
		b, _ := schema.Marshal(schema.JobState, j.State)
		ops := append([]store.Op{{Verb: store.CAS, Key: stateKey(id), Value: b, Index: j.Index}}, extra...)
		ops = append(ops, placedDiff(id, before, placedOf(j.State))...)
		if !wasFinal && j.State.Status.Final() {
			// The job ends: its accounting record goes with its final state, so it is
			// written once (the check-and-set lets one writer end the job) and never lost.
			ops = append(ops, recordOp(*j))
		}
		res, err := s.Txn(ctx, ops)
		if err == nil {
			if res.Index > 0 {
				j.Index = res.Index // the state key's, as written
			}
			return j, true, nil
		}
		if !errors.Is(err, store.ErrStaleIndex) {
			return nil, false, err
		}
	}
}
