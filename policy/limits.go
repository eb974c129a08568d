package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/gangrun/gangrun/reason"
)

// A limit's pending reason is "<code>: <what was reached>", the code one of the
// reason package's (Slurm's names, squeue's REASON column); `gangrun queue` shows it.

// Job is what the policy needs of a pending or running job (or allocation).
type Job struct {
	ID        string
	User      string
	Account   string
	Partition string
	// GPUs the job holds or asks for (nodes × GPUs per node).
	GPUs int
	// TimeLimit is --time; 0: none.
	TimeLimit time.Duration
	// Submitted is when it was queued (the age factor counts from it).
	Submitted time.Time
	// Site is the job's own --priority, added to the multifactor sum as Slurm's site
	// factor.
	Site int
	// QOS is the job's --qos ("": its account's QOS).
	QOS string
}

// assoc is an (account, user) pair.
type assoc struct{ account, user string }

// Held tallies what running jobs hold, per account, per user in an account and per QOS: the
// scheduler builds one per pass from the grants and adds each grant it makes.
type Held struct {
	accountGPUs map[string]int
	accountJobs map[string]int
	userGPUs    map[assoc]int
	userJobs    map[assoc]int
	// qosGPUs, qosUserGPUs and qosUserJobs count per QOS, the job's (QOSOf: its --qos,
	// else its account's under pol).
	qosGPUs     map[string]int
	qosUserGPUs map[assoc]int // {qos, user}
	qosUserJobs map[assoc]int
	pol         *Policy
}

// NewHeld returns an empty tally for p's limits (Check with p): the jobs it counts
// are counted in their QOS as p gives it (QOSOf).
func (p *Policy) NewHeld() *Held {
	return &Held{accountGPUs: map[string]int{}, accountJobs: map[string]int{}, userGPUs: map[assoc]int{}, userJobs: map[assoc]int{},
		qosGPUs: map[string]int{}, qosUserGPUs: map[assoc]int{}, qosUserJobs: map[assoc]int{}, pol: p}
}

// Add counts running job j (its GPUs and one job).
func (h *Held) Add(j Job) {
	a := assoc{j.Account, j.User}
	h.accountGPUs[j.Account] += j.GPUs
	h.accountJobs[j.Account]++
	h.userGPUs[a] += j.GPUs
	h.userJobs[a]++
	q := assoc{h.pol.QOSOf(j), j.User}
	h.qosGPUs[q.account] += j.GPUs
	h.qosUserGPUs[q] += j.GPUs
	h.qosUserJobs[q]++
}

// Admit checks, at submission, what no change of the running jobs can cure: the
// account exists and lets the user in, and the partition allows the account. The error
// names the value (Slurm refuses such a job at submission too).
func (p *Policy) Admit(j Job) error {
	if _, ok := p.QOS[j.QOS]; j.QOS != "" && !ok {
		return fmt.Errorf("--qos %q: %w (gangrun policy show lists the QOS)", j.QOS, ErrInvalidQOS)
	}
	if why := p.membership(j); why != "" {
		return fmt.Errorf("--account %q: %s", j.Account, why)
	}
	if why := p.partitionAllows(j); why != "" {
		return fmt.Errorf("--partition %q: %s", j.Partition, why)
	}
	return nil
}

// ErrInvalidQOS is a --qos the policy has not: Slurm's words ("Invalid qos
// specification"), with which sbatch refuses the job.
var ErrInvalidQOS = fmt.Errorf("Invalid qos specification")

// QOSOf is the name of job j's QOS: its --qos, else its account's ("" none).
func (p *Policy) QOSOf(j Job) string {
	if j.QOS != "" {
		return j.QOS
	}
	return p.Accounts[j.Account].QOS
}

// checkQOS returns why pending job j may not start now under its QOS's limits, given
// what running jobs hold (h, p.NewHeld's), or "".
func (p *Policy) checkQOS(j Job, h *Held) string {
	name := p.QOSOf(j)
	q, ok := p.QOS[name]
	if !ok {
		return ""
	}
	// What the jobs of the QOS hold: those that named it and those whose accounts give it.
	gpus, userGPUs, userJobs := h.qosGPUs[name], h.qosUserGPUs[assoc{name, j.User}], h.qosUserJobs[assoc{name, j.User}]
	switch max := time.Duration(q.MaxWall); {
	case max > 0 && (j.TimeLimit == 0 || j.TimeLimit > max):
		return fmt.Sprintf("%s: --time %s over QOS %s's max_wall %s", string(reason.QOSMaxWallDurationPerJobLimit), limitWords(j.TimeLimit), name, max)
	case q.GrpGPUs > 0 && gpus+j.GPUs > q.GrpGPUs:
		return fmt.Sprintf("%s: QOS %s holds %d of %d GPUs, the job wants %d (grp_gpus)", string(reason.QOSGrpGRES), name, gpus, q.GrpGPUs, j.GPUs)
	case q.MaxGPUsPerUser > 0 && userGPUs+j.GPUs > q.MaxGPUsPerUser:
		return fmt.Sprintf("%s: %s holds %d of %d GPUs in QOS %s, the job wants %d (max_gpus_per_user)", string(reason.QOSMaxGRESPerUser), j.User, userGPUs, q.MaxGPUsPerUser, name, j.GPUs)
	case q.MaxJobsPerUser > 0 && userJobs >= q.MaxJobsPerUser:
		return fmt.Sprintf("%s: %s runs %d of %d jobs in QOS %s (max_jobs_per_user)", string(reason.QOSMaxJobsPerUserLimit), j.User, userJobs, q.MaxJobsPerUser, name)
	}
	return ""
}

// limitWords is a --time for a reason: the duration, or UNLIMITED for none.
func limitWords(d time.Duration) string {
	if d == 0 {
		return "UNLIMITED"
	}
	return d.String()
}

// membership says why j's user may not charge j's account, "" when it may.
func (p *Policy) membership(j Job) string {
	if len(p.Accounts) == 0 {
		return ""
	}
	a, ok := p.Accounts[j.Account]
	if !ok {
		return fmt.Sprintf("no such account in the policy (gangrun policy show lists them; %s's default is %q)", j.User, p.DefaultAccount(j.User))
	}
	if _, ok := a.Users[j.User]; len(a.Users) > 0 && !ok {
		return fmt.Sprintf("user %s is not a user of the account", j.User)
	}
	return ""
}

// partitionAllows says why j's partition refuses j's account, "" when it does not.
func (p *Policy) partitionAllows(j Job) string {
	pt, ok := p.Partitions[j.Partition]
	if !ok || len(pt.AllowAccounts) == 0 || slices.Contains(pt.AllowAccounts, j.Account) {
		return ""
	}
	return fmt.Sprintf("account %q is not allowed (allow_accounts %v)", j.Account, pt.AllowAccounts)
}

// Check returns why pending job j may not start now under the policy, given what
// running jobs hold (h) and the recorded usage (u, may be nil), or "" when no limit
// stops it. The reason is Slurm's name, a colon, and what was reached:
// "QOSMaxGRESPerUser: alice holds 8 of 8 GPUs in account ml (max_gpus_per_user)".
// Limits are checked in Slurm's order of scope: the association, the partition, the
// account's group limits, then the user's.
func (p *Policy) Check(j Job, h *Held, u *Usage) string {
	if why := p.membership(j); why != "" {
		return string(reason.InvalidAccount) + ": account " + j.Account + ": " + why
	}
	if why := p.partitionAllows(j); why != "" {
		return string(reason.PartitionConfig) + ": partition " + j.Partition + ": " + why
	}
	if pt, ok := p.Partitions[j.Partition]; ok {
		if max := time.Duration(pt.MaxTime); max > 0 && (j.TimeLimit == 0 || j.TimeLimit > max) {
			limit := "UNLIMITED"
			if j.TimeLimit > 0 {
				limit = j.TimeLimit.String()
			}
			return fmt.Sprintf("%s: --time %s over partition %s's max_time %s", string(reason.PartitionTimeLimit), limit, j.Partition, max)
		}
		if pt.MaxGPUsPerJob > 0 && j.GPUs > pt.MaxGPUsPerJob {
			return fmt.Sprintf("%s: %d GPUs over partition %s's max_gpus_per_job %d", string(reason.QOSMaxGRESPerJob), j.GPUs, j.Partition, pt.MaxGPUsPerJob)
		}
	}
	if why := p.checkQOS(j, h); why != "" {
		return why
	}
	a, ok := p.Accounts[j.Account]
	if !ok {
		return ""
	}
	if a.GrpGPUs > 0 && h.accountGPUs[j.Account]+j.GPUs > a.GrpGPUs {
		return fmt.Sprintf("%s: account %s holds %d of %d GPUs, the job wants %d (grp_gpus)", string(reason.AssocGrpGRES), j.Account, h.accountGPUs[j.Account], a.GrpGPUs, j.GPUs)
	}
	if a.GrpJobs > 0 && h.accountJobs[j.Account] >= a.GrpJobs {
		return fmt.Sprintf("%s: account %s runs %d of %d jobs (grp_jobs)", string(reason.AssocGrpJobsLimit), j.Account, h.accountJobs[j.Account], a.GrpJobs)
	}
	if a.GrpGPUHours > 0 && u != nil {
		if used := u.Accounts[j.Account] / 3600; used >= a.GrpGPUHours {
			return fmt.Sprintf("%s: account %s used %.1f of %g GPU-hours (grp_gpu_hours, decayed with a half-life of %s)", string(reason.AssocGrpGRESMinutes), j.Account, used, a.GrpGPUHours, p.HalfLife())
		}
	}
	user := a.Users[j.User]
	k := assoc{j.Account, j.User}
	maxGPUs, gpuField := a.MaxGPUsPerUser, "max_gpus_per_user"
	if user.MaxGPUs > 0 {
		maxGPUs, gpuField = user.MaxGPUs, "users."+j.User+".max_gpus"
	}
	if maxGPUs > 0 && h.userGPUs[k]+j.GPUs > maxGPUs {
		return fmt.Sprintf("%s: %s holds %d of %d GPUs in account %s, the job wants %d (%s)", string(reason.QOSMaxGRESPerUser), j.User, h.userGPUs[k], maxGPUs, j.Account, j.GPUs, gpuField)
	}
	maxJobs, jobField := a.MaxJobsPerUser, "max_jobs_per_user"
	if user.MaxJobs > 0 {
		maxJobs, jobField = user.MaxJobs, "users."+j.User+".max_jobs"
	}
	if maxJobs > 0 && h.userJobs[k] >= maxJobs {
		return fmt.Sprintf("%s: %s runs %d of %d jobs in account %s (%s)", string(reason.AssocMaxJobsLimit), j.User, h.userJobs[k], maxJobs, j.Account, jobField)
	}
	return ""
}
