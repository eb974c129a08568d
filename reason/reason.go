// Package reason holds the reason codes of gangrun's jobs in one place: why a job waits
// PENDING, and why it ended. They are Slurm's names (squeue's REASON column, `scontrol
// show job`'s Reason=; job_state_reason in Slurm's slurm.h and job_reason_string in
// src/common/slurm_protocol_defs.c), so that a tool reading squeue sees what it knows;
// the few that are gangrun's own say so.
//
// A code is the kind of reason: a bounded set that programs switch on and metrics label
// with. The words a person reads (`gangrun show`'s reason, squeue %r for an ended job,
// "requeued: node gpu-b lost: its agent's session ended") go beside it, as Slurm keeps
// state_desc beside state_reason.
package reason

import "slices"

// Code is a job's reason code.
type Code string

// Why a job waits PENDING.
const (
	// None: no reason to give (Slurm's WAIT_NO_REASON); a running job's.
	None Code = "None"
	// Priority: not yet looked at by the scheduler, or behind jobs of higher priority
	// (WAIT_PRIORITY). A submitted job starts with it.
	Priority Code = "Priority"
	// Resources: the scheduler found no placement for it now (WAIT_RESOURCES).
	Resources Code = "Resources"
	// Dependency: a --dependency does not hold yet (WAIT_DEPENDENCY).
	Dependency Code = "Dependency"
	// DependencyNeverSatisfied: a dependency can never hold; the job stays pending until
	// it is cancelled (WAIT_DEP_INVALID; Slurm's default, without kill_invalid_depend).
	DependencyNeverSatisfied Code = "DependencyNeverSatisfied"
	// JobArrayTaskLimit: an array task waits for its array's --array %N cap
	// (WAIT_ARRAY_TASK_LIMIT).
	JobArrayTaskLimit Code = "JobArrayTaskLimit"
	// BeginTime: a job waits for its --begin time (WAIT_TIME), or a pre-empted job for
	// the job that pre-empted it to start (Slurm holds a requeued job back with a begin
	// time too).
	BeginTime Code = "BeginTime"
	// JobHeldUser: held by its user (sbatch --hold, scontrol hold or uhold; WAIT_HELD_USER).
	JobHeldUser Code = "JobHeldUser"
	// JobHeldAdmin: held by an operator (scontrol hold; WAIT_HELD).
	JobHeldAdmin Code = "JobHeldAdmin"
	// Requeued: it ran, lost a node it could not do without (or failed after a node
	// died under it), and waits for its old grant to go. gangrun's own: Slurm shows
	// such a job with BeginTime; gangrun_pending_jobs labels pre-empted jobs with it too.
	Requeued Code = "Requeued"
)

// Why a job waits PENDING under the operator's policy (policy/limits.go gives them).
// `gangrun queue` shows "<code>: <what was reached>".
const (
	// InvalidAccount: the account is not in the policy, or the user not in it
	// (FAIL_ACCOUNT).
	InvalidAccount Code = "InvalidAccount"
	// PartitionConfig: the partition does not allow the account (WAIT_PART_CONFIG).
	PartitionConfig Code = "PartitionConfig"
	// PartitionTimeLimit: --time over the partition's max_time (WAIT_PART_TIME_LIMIT).
	PartitionTimeLimit Code = "PartitionTimeLimit"
	// QOSMaxGRESPerJob: GPUs over the partition's max_gpus_per_job.
	QOSMaxGRESPerJob Code = "QOSMaxGRESPerJob"
	// AssocGrpGRES: the account's grp_gpus reached.
	AssocGrpGRES Code = "AssocGrpGRES"
	// AssocGrpJobsLimit: the account's grp_jobs reached.
	AssocGrpJobsLimit Code = "AssocGrpJobsLimit"
	// AssocGrpGRESMinutes: the account's grp_gpu_hours reached.
	AssocGrpGRESMinutes Code = "AssocGrpGRESMinutes"
	// QOSMaxGRESPerUser: the user's GPUs in the account (or in the job's QOS) at
	// max_gpus_per_user.
	QOSMaxGRESPerUser Code = "QOSMaxGRESPerUser"
	// QOSMaxWallDurationPerJobLimit: the job's --time over its QOS's max_wall.
	QOSMaxWallDurationPerJobLimit Code = "QOSMaxWallDurationPerJobLimit"
	// QOSGrpGRES: the GPUs its QOS's jobs hold at the QOS's grp_gpus.
	QOSGrpGRES Code = "QOSGrpGRES"
	// QOSMaxJobsPerUserLimit: the user's running jobs of the QOS at its
	// max_jobs_per_user.
	QOSMaxJobsPerUserLimit Code = "QOSMaxJobsPerUserLimit"
	// AssocMaxJobsLimit: the user's running jobs at max_jobs_per_user.
	AssocMaxJobsLimit Code = "AssocMaxJobsLimit"
)

// Why a job is stopping (COMPLETING) or ended.
const (
	// NonZeroExitCode: the run failed past its restart budget (FAIL_EXIT_CODE).
	NonZeroExitCode Code = "NonZeroExitCode"
	// TimeLimit: its --time passed (FAIL_TIMEOUT).
	TimeLimit Code = "TimeLimit"
	// NodeDown: it lost a node and could not go on (FAIL_DOWN_NODE).
	NodeDown Code = "NodeDown"
	// Cancelled: `gangrun cancel` or scancel. gangrun's own: Slurm gives a cancelled job
	// no reason (None); the words say who.
	Cancelled Code = "Cancelled"
	// Preempted: a job of a higher tier pre-empted it (Slurm's PREEMPTED state gives
	// no reason of its own); the words name that job.
	Preempted Code = "Preempted"
	// InvalidCredential: the job was refused for its submit credential and ended FAILED
	// without running. gangrun's own; the words say why.
	InvalidCredential Code = "InvalidCredential"
	// OutOfMemory: the OOM killer of the job's cgroup killed a process of it
	// (FAIL_OOM).
	OutOfMemory Code = "OutOfMemory"
)

// All is every code, in the order above: what a reader of a record checks a code
// against (Known).
var All = []Code{
	None, Priority, Resources, Dependency, DependencyNeverSatisfied, JobArrayTaskLimit, BeginTime, JobHeldUser, JobHeldAdmin, Requeued,
	InvalidAccount, PartitionConfig, PartitionTimeLimit, QOSMaxGRESPerJob, AssocGrpGRES, AssocGrpJobsLimit,
	AssocGrpGRESMinutes, QOSMaxGRESPerUser, AssocMaxJobsLimit, QOSMaxWallDurationPerJobLimit, QOSGrpGRES, QOSMaxJobsPerUserLimit,
	NonZeroExitCode, TimeLimit, NodeDown, Cancelled, Preempted, InvalidCredential, OutOfMemory,
}

// Known reports whether c is one of All.
func (c Code) Known() bool { return slices.Contains(All, c) }
