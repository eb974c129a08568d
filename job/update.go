package job

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// scontrol update of a job (Slurm 22.05's update_job, src/slurmctld/job_mgr.c): its
// time limit, name, partition, dependencies, node count, priority, nice and begin
// time. A pending job's spec is changed, its request withdrawn and the job left
// PENDING held back as after a release (EvUpdate): the controller writes its request
// again, from the new spec, once its dependencies allow. A held job stays held, its
// spec changed. A running job's name, priority and nice change, and its time limit:
// written to its state too (State.TimeLimit), which its steps follow; its partition,
// dependencies and begin time are ErrNotPending, its node count ErrNotSupported (as
// slurmctld where jobs are not resized). Who may: a job's user for their own jobs, an
// operator for any; as Slurm, only an operator raises a time limit or a priority, or
// gives a negative nice.

// The errors of an update, in Slurm's words where slurmctld has them (scontrol prints
// "WORDS for job ID").
var (
	// ErrAccessDenied: a user raising a time limit or a priority, or changing
	// another user's job (ESLURM_ACCESS_DENIED).
	ErrAccessDenied = errors.New("Access/permission denied")
	// ErrInvalidPartition: a partition the cluster does not have, or that refuses the
	// job's account (ESLURM_INVALID_PARTITION_NAME).
	ErrInvalidPartition = errors.New("Invalid partition name specified")
	// ErrDependency: a dependency that does not parse or names no job
	// (ESLURM_DEPENDENCY).
	ErrDependency = errors.New("Job dependency problem")
	// ErrNodeConfig: a node count the cluster's nodes cannot meet
	// (ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE).
	ErrNodeConfig = errors.New("Requested node configuration is not available")
	// ErrTimeLimit: a time limit past gangrun's (ESLURM_INVALID_TIME_LIMIT); one past its
	// partition's max_time is set, and the job waits (PartitionTimeLimit), as at submit.
	ErrTimeLimit = errors.New("Requested time limit is invalid (missing or exceeds some limit)")
	// ErrNotSupported: a running job's node count (ESLURM_NOT_SUPPORTED, slurmctld's
	// answer where jobs are not resized).
	ErrNotSupported = errors.New("Requested operation not supported on this system")
	// ErrUpdateNotBuilt: a change Slurm makes that gangrun does not (the time limit of
	// a job that is stopping; a job not yet accepted by a cluster that checks MUNGE
	// credentials). The error's text says which.
	ErrUpdateNotBuilt = errors.New("not built in gangrun")
)

// Update is what scontrol update changes: each field set (not nil) is set.
type Update struct {
	// TimeLimit is TimeLimit= (0: UNLIMITED).
	TimeLimit *time.Duration `json:"time_limit,omitempty"`
	// Name is JobName= (Name=).
	Name *string `json:"name,omitempty"`
	// Partition is Partition= ("" names the default one).
	Partition *string `json:"partition,omitempty"`
	// Dependency is Dependency=, in --dependency's form ("" clears them).
	Dependency *string `json:"dependency,omitempty"`
	// MinNodes and MaxNodes are NumNodes=MIN[-MAX] (both set together).
	MinNodes *int `json:"min_nodes,omitempty"`
	MaxNodes *int `json:"max_nodes,omitempty"`
	// Priority is Priority=.
	Priority *int `json:"priority,omitempty"`
	// Nice is Nice=N (Nice alone: DefaultNice); negative an operator's only.
	Nice *int `json:"nice,omitempty"`
	// Begin is StartTime= (--begin; ParseBegin).
	Begin *time.Time `json:"begin,omitempty"`
}

// String is the update as scontrol's words, for the audit log: "TimeLimit=10:00 JobName=x".
func (u Update) String() string {
	var w []string
	if u.TimeLimit != nil {
		w = append(w, "TimeLimit="+FormatSlurmTime(*u.TimeLimit))
	}
	if u.Name != nil {
		w = append(w, "JobName="+*u.Name)
	}
	if u.Partition != nil {
		w = append(w, "Partition="+*u.Partition)
	}
	if u.Dependency != nil {
		w = append(w, "Dependency="+*u.Dependency)
	}
	if u.MinNodes != nil && u.MaxNodes != nil {
		w = append(w, fmt.Sprintf("NumNodes=%d-%d", *u.MinNodes, *u.MaxNodes))
	}
	if u.Priority != nil {
		w = append(w, fmt.Sprintf("Priority=%d", *u.Priority))
	}
	if u.Nice != nil {
		w = append(w, fmt.Sprintf("Nice=%d", *u.Nice))
	}
	if u.Begin != nil {
		w = append(w, "StartTime="+u.Begin.UTC().Format(time.RFC3339))
	}
	return strings.Join(w, " ")
}

// pendingOnly says whether u changes what only a pending job may change (Slurm's
// ESLURM_JOB_NOT_PENDING for the others).
func (u Update) pendingOnly() bool {
	return u.Partition != nil || u.Dependency != nil || u.MinNodes != nil || u.Begin != nil
}

// Reseal makes a job's attestation again for its changed spec (Auth's UID, GID and
// credential kept): the elected agent's, which accepted it. nil where no credentials
// are checked.
type Reseal func(ctx context.Context, spec Spec, a Auth) (string, error)

// DoUpdate makes update u of job id, or of every task of job array id, for an operator
// (admin) or the job's user, its attestation made again by reseal (nil: none checked).
// also's operations (an audit entry) go with the first change. Errors: ErrNotFound,
// ErrFinished, ErrNotPending, ErrNotSupported, ErrAccessDenied, ErrInvalidPartition, ErrDependency,
// ErrNodeConfig, ErrTimeLimit, ErrUpdateNotBuilt, store errors.
func DoUpdate(ctx context.Context, s store.Store, id string, u Update, admin bool, reseal Reseal, also ...store.Op) (int, error) {
	if err := checkID(id); err != nil {
		return 0, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		if err := updateOne(ctx, s, id, u, admin, reseal, also...); err != nil {
			return 0, err
		}
		return 1, nil
	}
	n := 0
	for _, t := range tasks {
		if err := updateOne(ctx, s, t.Spec.ID, u, admin, reseal, also...); err != nil {
			return n, err
		}
		n++
		also = nil
	}
	return n, nil
}

// updateAttestTries and updateAttestWait bound how long an update waits for a job just
// submitted to be attested by the cluster (its first check, auth.go), as slurmctld takes
// an update at once: 100 × 100 ms.
const (
	updateAttestTries = 100
	updateAttestWait  = 100 * time.Millisecond
)

// errNotAttested: the job's record has a credential the cluster has not checked yet.
var errNotAttested = errors.New("the cluster has not accepted the job yet")

// updateOne makes update u of job id (DoUpdate).
func updateOne(ctx context.Context, s store.Store, id string, u Update, admin bool, reseal Reseal, also ...store.Op) error {
	for tries := 0; ; tries++ {
		j, err := Read(ctx, s, id)
		if err != nil {
			return err
		}
		spec, err := updatedSpec(ctx, s, j, u, admin)
		if err != nil {
			return fmt.Errorf("job %s: %w", id, err)
		}
		ops, err := updateOps(ctx, j, spec, reseal)
		if errors.Is(err, errNotAttested) && tries < updateAttestTries {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(updateAttestWait):
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("job %s: %w", id, err)
		}
		_, err = s.Txn(ctx, append(ops, also...))
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrKeyExists):
			return fmt.Errorf("job %s: %w", id, ErrNotPending) // granted meanwhile
		case !errors.Is(err, store.ErrStaleIndex):
			return err
		}
	}
}

// updatedSpec is job j's spec with update u, checked: what j's state and the asker
// (admin or not) allow, and what the cluster could run.
func updatedSpec(ctx context.Context, s store.Store, j *Job, u Update, admin bool) (Spec, error) {
	spec, st := j.Spec, j.State
	switch h := st.Hold(); {
	case st.Status.Final():
		return spec, ErrFinished
	case st.Status != Pending && u.MinNodes != nil:
		return spec, ErrNotSupported
	case st.Status != Pending && u.pendingOnly():
		return spec, ErrNotPending
	case st.Status == Pending && (h == HoldRequeue || h == HoldPreempted):
		return spec, ErrNotPending // its old steps are stopping: it is not yet pending again
	}
	if u.TimeLimit != nil {
		// As slurmctld: only an operator raises it (0 is UNLIMITED, above any).
		raise := spec.TimeLimit != 0 && (*u.TimeLimit == 0 || *u.TimeLimit > spec.TimeLimit)
		switch {
		case raise && !admin:
			return spec, ErrAccessDenied
		case st.Status != Pending && st.Status != Running && *u.TimeLimit != spec.TimeLimit:
			return spec, fmt.Errorf("the time limit of a job that is stopping (%w)", ErrUpdateNotBuilt)
		}
		spec.TimeLimit = *u.TimeLimit
	}
	if u.Priority != nil {
		if *u.Priority > spec.Priority && !admin {
			return spec, ErrAccessDenied
		}
		spec.Priority = *u.Priority
	}
	if u.Nice != nil {
		if *u.Nice < 0 && !admin {
			return spec, ErrAccessDenied // slurmctld: "Attempt to modify nice"
		}
		spec.Nice = *u.Nice
	}
	if u.Name != nil {
		spec.Name = *u.Name
	}
	if u.MinNodes != nil && u.MaxNodes != nil {
		spec.MinNodes, spec.MaxNodes = *u.MinNodes, *u.MaxNodes
	}
	if u.Dependency != nil {
		deps, err := ParseDependency(*u.Dependency)
		if err != nil {
			return spec, fmt.Errorf("%w: %v", ErrDependency, err)
		}
		if err := checkDependencies(ctx, s, deps); err != nil {
			return spec, fmt.Errorf("%w: %v", ErrDependency, err)
		}
		if err := checkCycle(ctx, s, spec.ID, deps); err != nil {
			return spec, err
		}
		spec.Dependency = deps
	}
	if u.Partition != nil {
		spec.Partition = *u.Partition
	}
	if u.Begin != nil {
		spec.Begin = *u.Begin
	}
	return spec, checkUpdated(ctx, s, spec, u)
}

// checkUpdated checks changed spec as submit does: valid, admitted by the policy, and
// feasible on the cluster's nodes; the error says which of u's changes is at fault.
func checkUpdated(ctx context.Context, s store.Store, spec Spec, u Update) error {
	if err := spec.Validate(); err != nil {
		if u.TimeLimit != nil {
			return fmt.Errorf("%w: %v", ErrTimeLimit, err)
		}
		return fmt.Errorf("%w: %v", ErrNodeConfig, err)
	}
	pol, err := policy.Load(ctx, s)
	if err != nil {
		return err
	}
	if pol != nil {
		if spec.Partition == "" {
			spec.Partition = pol.DefaultPartition()
		}
		if err := pol.Admit(allocator.PolicyJob(request(spec, false, nil))); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidPartition, err)
		}
	}
	c, err := cacheFor(s).nodes.Registered(ctx, s) // as a submit's check: the node records alone
	if err != nil {
		return err
	}
	pre := request(spec, false, nil)
	if pol != nil {
		pre.PartitionNodes, _ = pol.PartitionNodes(spec.Partition)
	}
	if err := allocator.CheckFeasible(c, pre); err != nil {
		if !errors.Is(err, allocator.ErrInfeasible) {
			return err
		}
		if u.Partition != nil && u.MinNodes == nil {
			return fmt.Errorf("%w: %v", ErrInvalidPartition, err)
		}
		return fmt.Errorf("%w: %v", ErrNodeConfig, err)
	}
	return nil
}

// updateOps are the operations that write job j's new spec: a check-and-set of its
// spec, its attestation made again (reseal), and of its state: a pending job's request
// withdrawn, unless granted meanwhile (EvUpdate), a held or running one's state checked
// unchanged.
func updateOps(ctx context.Context, j *Job, spec Spec, reseal Reseal) ([]store.Op, error) {
	id := j.Spec.ID
	b, err := schema.Marshal(schema.JobSpec, spec)
	if err != nil {
		return nil, err
	}
	ops := []store.Op{{Verb: store.CAS, Key: specKey(id), Value: b, Index: j.SpecIndex}}
	if a := j.Auth; a != nil && a.Credential != "" {
		switch {
		case a.Attestation == "":
			return nil, fmt.Errorf("%w: try again in a few seconds (%w)", errNotAttested, ErrUpdateNotBuilt)
		case reseal == nil:
			return nil, fmt.Errorf("a job whose record the cluster attested changes through the elected agent (a MUNGE credential where the agents check them) (%w)", ErrUpdateNotBuilt)
		}
		att, err := reseal(ctx, spec, *a)
		if err != nil {
			return nil, fmt.Errorf("the job's attestation: %w", err)
		}
		acc := *a
		acc.Attestation = att
		ab, _ := schema.Marshal(schema.JobAuth, acc)
		ops = append(ops, store.Op{Verb: store.CAS, Key: authKey(id), Value: ab, Index: j.AuthIndex})
	}
	st := j.State
	if h := st.Hold(); st.Status == Pending && (h == HoldNone || h == HoldDeferred) {
		if err := st.apply(Transition{Event: EvUpdate}); err != nil {
			return nil, err
		}
		return append(ops, stateOp(id, st, j.Index), store.Op{Verb: store.CheckNotExists, Key: allocator.GrantKey(id)},
			store.Op{Verb: store.Delete, Key: allocator.RequestKey(id)}), nil
	}
	if st.Status == Running && spec.TimeLimit != j.Spec.TimeLimit {
		// Its steps move their limit to it (they follow the state, not the spec).
		tl := spec.TimeLimit
		st.TimeLimit = &tl
		return append(ops, stateOp(id, st, j.Index)), nil
	}
	return append(ops, store.Op{Verb: store.CheckIndex, Key: stateKey(id), Index: j.Index}), nil
}

// updateErrors are the update's errors an answer names by their words (Answer.Slurm).
var updateErrors = []error{ErrAccessDenied, ErrNotSupported, ErrInvalidPartition, ErrDependency, ErrCircular, ErrNodeConfig, ErrTimeLimit,
	ErrUpdateNotBuilt, ErrFinished, ErrNotPending, ErrNotFound}

// Update makes update u of job id (or of array id's tasks) through as's box: the job
// must be as's user's, unless as is root (an operator). It returns how many jobs
// changed. Errors: *NotYoursError (ErrNotYours), DoUpdate's, ErrNoAnswer.
func (as Asker) Update(ctx context.Context, s store.Store, id string, u Update) (int, error) {
	ans, err := ask(ctx, s, as, Request{Kind: requestUpdate, Job: id, Update: &u})
	if err != nil {
		return 0, err
	}
	switch {
	case ans.Owner != "":
		return 0, &NotYoursError{ID: id, Owner: ans.Owner, User: as.User, By: ans.By}
	case ans.Slurm != "":
		for _, e := range updateErrors {
			if e.Error() == ans.Slurm {
				if ans.Error != "" {
					return ans.Updated, fmt.Errorf("job %s: %w: %s", id, e, ans.Error)
				}
				return ans.Updated, fmt.Errorf("job %s: %w", id, e)
			}
		}
		return ans.Updated, fmt.Errorf("job %s: %s: %s", id, ans.Slurm, ans.Error)
	case ans.Denied:
		return 0, &deniedError{ans.Error}
	case ans.Error != "":
		return 0, errors.New(ans.Error)
	}
	return ans.Updated, nil
}

// Update makes update u of job id, or of every task of job array id, for a (DoUpdate),
// with its audit entry, the change's or, when refused, the refusal's, whoever's the
// job is: every update is written to the audit log.
func (a Actor) Update(ctx context.Context, s store.Store, id string, u Update) (int, error) {
	owner, _ := ownerOf(ctx, s, id)
	var also []store.Op
	if a.Entry != nil {
		also = []store.Op{audit.Op(a.Entry(audit.ActionUpdate, "job "+id, owner, u.String()))}
	}
	n, err := DoUpdate(ctx, s, id, u, a.Admin, nil, also...)
	if err != nil && n == 0 && a.Entry != nil && !errors.Is(err, ErrNotFound) {
		if werr := audit.Write(ctx, s, a.Entry(audit.ActionUpdate, "job "+id, owner, u.String()+": refused: "+err.Error())); werr != nil {
			return n, fmt.Errorf("%w (and its audit entry: %v)", err, werr)
		}
	}
	return n, err
}

// updateFor makes update u of job id (or array id's tasks) for who: the job must be
// who's, unless who is root. Every update is audited, the change with it, a refusal
// with its answer.
func (sv *server) updateFor(ctx context.Context, who asker, id string, u *Update) (Answer, []store.Op, error) {
	if checkID(id) != nil || u == nil {
		return Answer{Slurm: ErrNotFound.Error(), Error: fmt.Sprintf("no job %q", id)}, nil, nil
	}
	owner, _ := ownerOf(ctx, sv.s, id)
	if owner == "" {
		return Answer{Slurm: ErrNotFound.Error(), Error: fmt.Sprintf("no job %q", id)}, nil, nil
	}
	entry := func(detail string) store.Op {
		return audit.Op(sealEntry(ctx, sv.prover, audit.Entry{User: who.user, Token: "munge", Action: audit.ActionUpdate,
			Target: "job " + id, Owner: owner, Detail: detail}))
	}
	if owner != who.user && !who.root {
		return Answer{Owner: owner}, []store.Op{entry(u.String() + ": refused: the job is " + owner + "'s (" + who.by + ")")}, nil
	}
	var reseal Reseal
	if p := sv.prover; p != nil {
		reseal = func(ctx context.Context, spec Spec, a Auth) (string, error) {
			return p.Seal(ctx, attestContent(spec, a.UID, a.GID, a.Credential))
		}
	}
	n, err := DoUpdate(ctx, sv.s, id, *u, who.root, reseal, entry(u.String()))
	if err == nil {
		return Answer{Updated: n}, nil, nil
	}
	for _, e := range updateErrors {
		if errors.Is(err, e) {
			detail := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "job "+id+": "), e.Error())
			detail = strings.TrimPrefix(detail, ": ")
			ans := Answer{Updated: n, Slurm: e.Error(), Error: detail}
			if n > 0 {
				return ans, nil, nil // audited with its first change
			}
			return ans, []store.Op{entry(u.String() + ": refused: " + err.Error())}, nil
		}
	}
	return Answer{}, nil, err
}
