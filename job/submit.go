package job

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/reason"
)

// ErrInvalid marks a spec Submit refuses as the user's to fix: a bad value, or one no
// registered node could ever satisfy (an unknown partition, more GPUs per node than any
// node has). Nothing is queued then. The error's text is the reason alone.
var ErrInvalid = errors.New("invalid job")

// invalid is an error marked ErrInvalid whose text is err's.
type invalid struct{ err error }

func (e *invalid) Error() string   { return e.err.Error() }
func (e *invalid) Unwrap() []error { return []error{ErrInvalid, e.err} }

// request is the allocator request that places job spec: its nodes and spares, away
// from the exclude nodes. The first placement waits for the spares too (they are
// reserved with the job); a placement again (after the job lost nodes) takes them when
// they are free, and runs without.
func request(spec Spec, again bool, exclude []string) allocator.Request {
	least, spares := spec.MinNodes+spec.SpareNodes, spec.SpareNodes
	if again {
		least, spares = spec.MinNodes, 0
	}
	r := allocator.JobRequest(spec.ID, least, spec.MaxNodes+spec.SpareNodes, spec.GPUsPerNode,
		spec.Partition, spec.GPUModel, nil, sitePriority(spec), exclude)
	r.Spares, r.Nice = spares, spec.Nice
	r.MIGProfile = spec.MIGProfile
	r.NodeChoice = spec.NodeChoice
	r.CPUsPerNode, r.MemPerNodeMiB = spec.NodeCPUs(), (spec.NodeMem()+1<<20-1)>>20
	// Who and what the policy counts (limits, fair-share); the age factor counts from
	// the submission, a placement again included.
	r.User, r.Account, r.TimeLimit, r.QOS = spec.User, spec.Account, spec.TimeLimit, spec.QOS
	if !spec.Submitted.IsZero() {
		r.Submitted = spec.Submitted
	}
	return r
}

// sitePriority is the priority job spec brings to the policy's sum (Site): its
// --priority less its --nice, as Slurm subtracts a job's nice from its priority,
// held within ±MaxPriority.
func sitePriority(spec Spec) int {
	return max(min(spec.Priority-spec.Nice, MaxPriority), -MaxPriority)
}

// applyPolicy fills what spec leaves to the operator's policy p (nil: none) and
// refuses what the policy never allows: the account defaults to the user's default
// account (else the user's name, as when there is no policy), the partition to the
// default partition, --time to the partition's default_time (else its max_time); an
// account the user may not charge, a partition that does not allow it, or a --qos the
// policy has not (policy.ErrInvalidQOS) is ErrInvalid. Limits that running jobs reach are not checked here: the job waits for
// them PENDING, with the limit's reason (policy.Policy.Check).
func applyPolicy(p *policy.Policy, spec *Spec) error {
	if p == nil {
		if spec.Account == "" {
			spec.Account = spec.User
		}
		if spec.QOS != "" {
			return &invalid{fmt.Errorf("--qos %q: %w (the cluster has no policy, and no QOS)", spec.QOS, policy.ErrInvalidQOS)}
		}
		return nil
	}
	if spec.Account == "" {
		spec.Account = p.DefaultAccount(spec.User)
	}
	if spec.Partition == "" {
		spec.Partition = p.DefaultPartition()
	}
	if spec.TimeLimit == 0 {
		spec.TimeLimit = p.DefaultTime(spec.Partition)
	}
	if err := p.Admit(allocator.PolicyJob(request(*spec, false, nil))); err != nil {
		return &invalid{err}
	}
	return nil
}

// Submit queues spec as a new job and returns its id: it checks the spec and that the
// cluster's registered nodes could run it (allocator.CheckFeasible), that the jobs its
// --dependency names exist, takes the next job id, and writes the spec, the state
// (PENDING) and the job's request in one transaction, so a job is queued whole or not
// at all. A job with dependencies is written without its request (State.Deferred): the
// controller writes it once they hold. Errors wrapping ErrInvalid are the user's;
// others mean the store could not be asked. Submits through one store client keep the
// node records while they do not change and the id sequence as the client last wrote it
// (clientCache): a client that submits many jobs reads the node names instead of their
// records, and not the sequence, for each, and its concurrent submits take their turns
// at the sequence instead of racing for it.
func Submit(ctx context.Context, s store.Store, spec Spec) (string, error) {
	return submit(ctx, s, spec, nil, nil)
}

// SubmitSealed is Submit with the submitter's MUNGE credential, made by sealer for the
// job as queued (its id and spec: auth.go), written with it: what a cluster whose
// agents check credentials (--auth munge) requires. Errors: Submit's, and sealer's
// (munged not answering).
func SubmitSealed(ctx context.Context, s store.Store, spec Spec, sealer Sealer) (string, error) {
	return submit(ctx, s, spec, nil, sealed(sealer))
}

// alsoOps, when not nil, gives operations to apply in the transaction that queues job
// id (an array's first one): what must happen with the submit or not at all.
type alsoOps func(id string) []store.Op

// submit is Submit with also's operations in its transaction.
func submit(ctx context.Context, s store.Store, spec Spec, also alsoOps, auth authFor) (string, error) {
	cc := cacheFor(s)
	spec, err := prepareSubmit(ctx, s, cc, spec)
	if err != nil {
		return "", err
	}
	cc.seqMu.Lock()
	defer cc.seqMu.Unlock()
	for tries := 0; ; {
		id, seqOp, err := cc.nextID(ctx, s)
		if err != nil {
			return "", err
		}
		spec.ID = id
		st := newState(EvSubmit, "")
		var reqOps []store.Op
		if spec.Hold {
			st = newState(EvSubmitHold, "")
		} else if len(spec.Dependency) > 0 {
			st = newState(EvSubmitHeld, reason.Dependency)
		} else if spec.Begin.After(time.Now()) {
			st = newState(EvSubmitHeld, reason.BeginTime)
		} else if reqOps, err = allocator.JobRequestOps(request(spec, false, nil)); err != nil {
			return "", err
		}
		aops, err := authOps(ctx, auth, spec)
		if err != nil {
			return "", err
		}
		ops := append(append(append([]store.Op{seqOp}, jobOps(spec, st)...), aops...), reqOps...)
		if also != nil {
			ops = append(ops, also(id)...)
		}
		if err := store.CheckTxn(ops); err != nil {
			return "", &invalid{fmt.Errorf("the job's spec is too large to queue: %w", err)}
		}
		res, err := s.Txn(ctx, ops)
		cc.claimed(seqOp, res, err)
		if err == nil {
			return id, nil
		}
		if tries++; tries >= maxIDTries || !errors.Is(err, store.ErrTxnRejected) || !idTaken(err, id) {
			return "", fmt.Errorf("submit job %s: %w", id, err)
		}
		// Another submit took the id meanwhile, or a record holds it: the next one.
		cc.skip(seqOp, err)
	}
}

// maxIDTries bounds how many job ids one submit tries before it gives up: each try
// lost to another submit, or to a record written past gangrun.
const maxIDTries = 1000

// skip, after the rejection err of the transaction that claimed an id with seqOp,
// moves this client's next id past that one when the sequence itself did not move (the
// id's keys exist without the sequence having reached it: a record written past
// gangrun), so the next try takes the id after it; when the sequence moved (another
// submit), the next try reads it again. Called with seqMu held.
func (c *clientCache) skip(seqOp store.Op, err error) {
	var te *store.TxnError
	if !errors.As(err, &te) {
		return
	}
	for _, oe := range te.Errors {
		if oe.Key == seqKey {
			return
		}
	}
	if n, perr := strconv.ParseUint(string(seqOp.Value), 10, 64); perr == nil {
		c.seqValue, c.seqIndex = n, seqOp.Index
	}
}

// idTaken reports whether the rejection err of the transaction that queues job id
// failed on the id only (the sequence's check-and-set, or the job's keys written
// meanwhile): another submit took it, and the next id may be tried. A rejection on an
// operation of also's (a request answered or withdrawn meanwhile) is the caller's to
// judge: trying the next id would fail the same way for ever.
func idTaken(err error, id string) bool {
	var te *store.TxnError
	if !errors.As(err, &te) {
		return false
	}
	for _, oe := range te.Errors {
		if oe.Key != seqKey && !strings.HasPrefix(oe.Key, jobsPrefix+id+"/") && !strings.HasPrefix(oe.Key, jobsPrefix+id+"_") &&
			oe.Key != allocator.RequestKey(id) {
			return false
		}
	}
	return true
}

// prepareSubmit fills spec's defaults and makes Submit's checks: the spec's own, the
// cluster's (allocator.CheckFeasible, against the node records as they are now, kept in
// cc while they do not change) and that its dependencies name jobs that exist.
func prepareSubmit(ctx context.Context, s store.Store, cc *clientCache, spec Spec) (Spec, error) {
	if spec.Output == "" && spec.Batch == nil { // a batch job's is sbatch's (BatchFiles)
		spec.Output = DefaultOutput
	}
	spec.fitNodeList()
	if err := spec.Validate(); err != nil {
		return spec, &invalid{err}
	}
	// The policy and the node records are read side by side: two round trips for the
	// time of one.
	type nodesRead struct {
		c   *allocator.Cluster
		err error
	}
	nodes := make(chan nodesRead, 1)
	go func() {
		c, err := cc.nodes.Registered(ctx, s)
		nodes <- nodesRead{c, err}
	}()
	pol, err := policy.Load(ctx, s)
	if err != nil {
		return spec, err
	}
	if err := applyPolicy(pol, &spec); err != nil {
		return spec, err
	}
	read := <-nodes
	if read.err != nil {
		return spec, read.err
	}
	c := read.c
	pre := request(spec, false, nil)
	if pol != nil {
		pre.PartitionNodes, _ = pol.PartitionNodes(spec.Partition)
	}
	if err := allocator.CheckFeasible(c, pre); err != nil {
		if errors.Is(err, allocator.ErrInfeasible) {
			return spec, &invalid{err}
		}
		return spec, err
	}
	if err := checkDependencies(ctx, s, spec.Dependency); err != nil {
		return spec, err
	}
	if spec.Submitted.IsZero() {
		spec.Submitted = time.Now().UTC()
	}
	return spec, nil
}

// jobOps are the operations that write a new job: its spec (where none is) and state.
func jobOps(spec Spec, st State) []store.Op {
	specJSON, _ := schema.Marshal(schema.JobSpec, spec)
	stJSON, _ := schema.Marshal(schema.JobState, st)
	return []store.Op{
		{Verb: store.CheckNotExists, Key: specKey(spec.ID)},
		{Verb: store.Set, Key: specKey(spec.ID), Value: specJSON},
		{Verb: store.Set, Key: stateKey(spec.ID), Value: stJSON},
	}
}

// checkDependencies checks that every job deps names exists (a job, an array task, or
// an array's tasks): an unknown one is the user's error, as sbatch refuses it.
func checkDependencies(ctx context.Context, s store.Store, deps []Dependency) error {
	for _, d := range deps {
		for _, id := range d.IDs {
			_, err := Read(ctx, s, id)
			if err == nil {
				continue
			}
			if !errors.Is(err, ErrNotFound) {
				return err
			}
			if !strings.Contains(id, "_") {
				tasks, _, err := s.List(ctx, jobsPrefix+id+"_")
				if err != nil {
					return err
				}
				if len(tasks) > 0 {
					continue
				}
			}
			return &invalid{fmt.Errorf("--dependency %s: no job %s (gangrun queue --all lists them)", d, id)}
		}
	}
	return nil
}

// SubmitArray queues spec as the job array a (--array) and returns the array's id A
// and its tasks' ids (A_i, one per index), after Submit's checks. Each task is a job of
// its own with a copy of spec, written without its request (State.Deferred): the
// controller writes the requests as the tasks' dependencies and the array's cap allow.
// The tasks are written in as few transactions as Consul's limits allow, the first of
// which takes the id; a submit that fails after it leaves the tasks written so far
// (`gangrun cancel A` removes them), and says how many.
func SubmitArray(ctx context.Context, s store.Store, spec Spec, a Array) (string, []string, error) {
	return submitArray(ctx, s, spec, a, nil, nil)
}

// SubmitArraySealed is SubmitArray with the submitter's MUNGE credential for each task,
// made by sealer (SubmitSealed).
func SubmitArraySealed(ctx context.Context, s store.Store, spec Spec, a Array, sealer Sealer) (string, []string, error) {
	return submitArray(ctx, s, spec, a, nil, sealed(sealer))
}

// submitArray is SubmitArray with also's operations in its first transaction, and the
// tasks' Auth made by auth (none when nil).
func submitArray(ctx context.Context, s store.Store, spec Spec, a Array, also alsoOps, auth authFor) (string, []string, error) {
	if err := a.Validate(); err != nil {
		return "", nil, &invalid{err}
	}
	cc := cacheFor(s)
	spec, err := prepareSubmit(ctx, s, cc, spec)
	if err != nil {
		return "", nil, err
	}
	// An array task is held back (by its array's cap) until the controller lets it
	// through; one with a --dependency by that first.
	st := newState(EvSubmitHeld, reason.Priority)
	if spec.Hold {
		st = newState(EvSubmitHold, "")
	} else if len(spec.Dependency) > 0 {
		st = newState(EvSubmitHeld, reason.Dependency)
	} else if spec.Begin.After(time.Now()) {
		st = newState(EvSubmitHeld, reason.BeginTime)
	}
	cc.seqMu.Lock()
	defer cc.seqMu.Unlock()
	for tries := 0; ; {
		id, seqOp, err := cc.nextID(ctx, s)
		if err != nil {
			return "", nil, err
		}
		var batches [][]store.Op
		var ids []string
		cur, total := []store.Op{seqOp}, 0
		if also != nil {
			cur = append(cur, also(id)...)
		}
		head := len(cur)
		for _, i := range a.Indices {
			ts := spec
			ts.ID = TaskID(id, i)
			ts.Array = &ArrayTask{JobID: id, TaskID: i, Count: len(a.Indices), Min: a.Indices[0], Max: a.Indices[len(a.Indices)-1], Step: a.Step, Limit: a.Limit}
			ops := jobOps(ts, st)
			aops, err := authOps(ctx, auth, ts)
			if err != nil {
				return "", nil, err
			}
			ops = append(ops, aops...)
			total += len(ops[1].Value)
			if total > maxArrayBytes {
				return "", nil, &invalid{fmt.Errorf("--array %s: its %d tasks' specs would take over %d MiB (a smaller script, or fewer tasks)", a, len(a.Indices), maxArrayBytes>>20)}
			}
			if err := store.CheckTxn(ops); err != nil {
				return "", nil, &invalid{fmt.Errorf("the job's spec is too large to queue: %w", err)}
			}
			if store.CheckTxn(append(cur[:len(cur):len(cur)], ops...)) != nil {
				batches, cur = append(batches, cur), nil
			}
			cur = append(cur, ops...)
			ids = append(ids, ts.ID)
		}
		batches = append(batches, cur)
		res, err := s.Txn(ctx, batches[0])
		cc.claimed(seqOp, res, err)
		if err != nil {
			if tries++; tries < maxIDTries && errors.Is(err, store.ErrTxnRejected) && idTaken(err, id) {
				cc.skip(seqOp, err) // another submit took the id meanwhile, or a record holds it
				continue
			}
			return "", nil, fmt.Errorf("submit job array %s: %w", id, err)
		}
		perTask := 3
		if auth != nil {
			perTask = 4 // and the task's credential
		}
		written := (len(batches[0]) - head) / perTask
		for _, b := range batches[1:] {
			if _, err := s.Txn(ctx, b); err != nil {
				return id, ids[:written], fmt.Errorf("submit job array %s: wrote %d of its %d tasks (gangrun cancel %s removes them): %w", id, written, len(ids), id, err)
			}
			written += len(b) / perTask
		}
		return id, ids, nil
	}
}

// Cancel cancels job id, as scancel does: a pending job ends CANCELLED at once, its
// request goes and its accounting record is written with it; a granted or running one goes COMPLETING: every step stops its workers (SIGTERM, the grace, SIGKILL),
// gives its GPUs back and exits, and the job ends CANCELLED. A job that already ended
// is no error: Cancel reports false then. also's operations (an audit entry) are
// applied in the transaction that cancels it, and only if it does.
func Cancel(ctx context.Context, s store.Store, id string, also ...store.Op) (bool, error) {
	for {
		j, err := Read(ctx, s, id)
		if err != nil {
			return false, err
		}
		st := j.State
		var extra []store.Op
		switch {
		case st.Status.Final(), st.Status == Completing:
			return false, nil
		case st.Status == Pending:
			// Not granted yet: the request goes with the cancel, in one transaction, and
			// only while there is no grant (a grant made meanwhile makes it a running
			// job's cancel, below).
			if err := st.apply(Transition{Event: EvCancelPending, Words: "cancelled while pending"}); err != nil {
				return false, err
			}
			st.Ended = time.Now().UTC()
			extra = []store.Op{{Verb: store.CheckNotExists, Key: allocator.GrantKey(id)}, {Verb: store.Delete, Key: allocator.RequestKey(id)},
				recordOp(Job{Spec: j.Spec, State: st})}
		default:
			if err := st.apply(Transition{Event: EvCancel, Words: "cancelled"}); err != nil {
				return false, err
			}
		}
		b, _ := schema.Marshal(schema.JobState, st)
		_, err = s.Txn(ctx, append(append([]store.Op{{Verb: store.CAS, Key: stateKey(id), Value: b, Index: j.Index}}, extra...), also...))
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, store.ErrTxnRejected) {
			return false, err
		}
		if errors.Is(err, store.ErrKeyExists) {
			// Granted meanwhile: stop it as a running job.
			if _, changed, err := update(ctx, s, id, func(j *Job) bool {
				return j.State.apply(Transition{Event: EvCancel, Words: "cancelled"}) == nil
			}, also...); err != nil || changed {
				return changed, err
			}
			return false, nil
		}
	}
}

// List returns every job, oldest first; jobs a newer gangrun wrote are left out
// (ListAll has them).
func List(ctx context.Context, s store.Store) ([]Job, error) {
	jobs, _, err := ListAll(ctx, s)
	return jobs, err
}

// Newer is a job a newer gangrun wrote: what this one could read of it (its id at
// least; State.Status Unknown when its state is unreadable too), and why it cannot read
// the rest (an error wrapping schema.ErrNewer).
type Newer struct {
	Job
	Err error
}

// ListAll returns every job this gangrun reads, oldest first, and the jobs a newer
// gangrun wrote, which it leaves alone.
func ListAll(ctx context.Context, s store.Store) ([]Job, []Newer, error) {
	entries, _, err := s.List(ctx, jobsPrefix)
	if err != nil {
		return nil, nil, err
	}
	byID := map[string][]store.Entry{}
	for _, e := range entries {
		rest := e.Key[len(jobsPrefix):]
		for i := 0; i < len(rest); i++ {
			if rest[i] == '/' {
				byID[rest[:i]] = append(byID[rest[:i]], e)
				break
			}
		}
	}
	var out []Job
	var newer []Newer
	for id, es := range byID {
		j, err := decodeAll(id, es)
		switch {
		case errors.Is(err, schema.ErrNewer):
			newer = append(newer, Newer{Job: *j, Err: err})
		case err == nil:
			out = append(out, *j)
		} // else a job being written or removed
	}
	sortJobs(out)
	sort.Slice(newer, func(a, b int) bool { return jobLess(newer[a].Spec.ID, newer[b].Spec.ID) })
	return out, newer, nil
}

// sortJobs sorts jobs oldest first (by their numeric ids, an array's tasks by index).
func sortJobs(jobs []Job) {
	sort.Slice(jobs, func(a, b int) bool { return jobLess(jobs[a].Spec.ID, jobs[b].Spec.ID) })
}

// Tasks returns the tasks of job array id (the jobs A_i), by index; none when id is no
// array's.
func Tasks(ctx context.Context, s store.Store, id string) ([]Job, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	entries, _, err := s.List(ctx, jobsPrefix+id+"_")
	if err != nil {
		return nil, err
	}
	jobs, _ := newJobCache().parse(entries)
	return jobs, nil
}

// CancelArray cancels every task of job array id not yet ended (Cancel) and returns
// how many it cancelled; ErrNotFound when id has no tasks.
func CancelArray(ctx context.Context, s store.Store, id string) (int, error) {
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, fmt.Errorf("job array %s: %w", id, ErrNotFound)
	}
	n := 0
	for _, t := range tasks {
		changed, err := Cancel(ctx, s, t.Spec.ID)
		if err != nil {
			return n, err
		}
		if changed {
			n++
		}
	}
	return n, nil
}

// Steps returns the nodes whose step of job id runs now (their step key is held).
func Steps(ctx context.Context, s store.Store, id string) (map[string]StepRecord, error) {
	entries, _, err := s.List(ctx, stepsPrefix(id))
	if err != nil {
		return nil, err
	}
	out := map[string]StepRecord{}
	for _, e := range entries {
		node := e.Key[len(stepsPrefix(id)):]
		if r, ok := stepOf(e, node); ok {
			out[node] = r
		}
	}
	return out, nil
}

// stepOf reads the step key e of node: a running step's record when a session holds
// it. A record a newer gangrun wrote is a running step all the same (the key's holder
// says so), of which only the node is known.
func stepOf(e store.Entry, node string) (StepRecord, bool) {
	if e.Session == "" {
		return StepRecord{}, false
	}
	var r StepRecord
	switch err := schema.Unmarshal(schema.JobStep, e.Value, &r); {
	case err == nil:
		return r, true
	case errors.Is(err, schema.ErrNewer):
		return StepRecord{Node: node}, true
	}
	return StepRecord{}, false
}

// StepRecord is a step's key: who runs it.
type StepRecord struct {
	Node    string    `json:"node"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Placement is the job's placement the step runs (State.Placement).
	Placement int `json:"placement"`
}
