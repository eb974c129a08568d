// Package policy is the operator's scheduling policy, kept as data in Consul: partitions
// (which nodes, default and maximum --time, GPUs per job, allowed accounts, priority
// tier), QOS levels, and accounts with their users, shares and limits, and the weights of
// Slurm's multifactor priority (priority_multifactor). It also holds the decayed usage
// the elected scheduler accumulates for fair-share.
//
// The policy is one JSON document (Parse; docs/policy.md describes every field) under
// Key, written by `gangrun policy set FILE` and read by the scheduler on every change:
// a changed limit takes effect on its next pass. The package is pure arithmetic on
// plain values (Job, Held, Usage); the scheduler (allocator) and the submit path (job)
// feed it.
//
// Keys:
//
//	gangrun/policy/config   the Policy (JSON), written by `gangrun policy set`
//	gangrun/policy/usage    Usage: decayed GPU-seconds per account and per user, written
//	                        by the elected scheduler (UsageFlushInterval)
package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/gangrun/gangrun/internal/jsonfile"
	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Keys of the policy and of the usage in the coordination store.
const (
	// Key holds the Policy as JSON.
	Key = "gangrun/policy/config"
	// UsageKey holds the Usage as JSON.
	UsageKey = "gangrun/policy/usage"
)

// Defaults, as Slurm's (slurm.conf: PriorityMaxAge=7-0, PriorityDecayHalfLife=7-0,
// FairShareDampeningFactor=1; sacctmgr: Fairshare=1).
const (
	DefaultMaxAge        = 7 * 24 * time.Hour
	DefaultDecayHalfLife = 7 * 24 * time.Hour
	DefaultDampening     = 1.0
	DefaultShares        = 1
)

// MaxWeight bounds each priority weight, share, QOS priority and count of the policy:
// Slurm keeps them as 32-bit unsigned integers (PriorityWeight*, Fairshare, a QOS's
// Priority, GrpTRES counts), and five weights of at most this much cannot overflow a
// job's int64 priority.
const MaxWeight = 1<<32 - 1

// MaxTier bounds a partition's tier: Slurm's PriorityTier and PriorityJobFactor are
// 16-bit, at most 65533.
const MaxTier = 65533

// MaxPolicyBytes bounds the policy document: it is one Consul value (512 KiB at most).
const MaxPolicyBytes = 256 << 10

// Duration is a time.Duration written in JSON as Go's duration text ("90m", "168h").
type Duration time.Duration

// MarshalJSON writes the duration as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration written as text ("90m"); a number is refused (the
// unit would be a guess).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s: want text such as \"90m\" or \"168h\"", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: want text such as \"90m\" or \"168h\"", s)
	}
	*d = Duration(v)
	return nil
}

// Policy is the operator's scheduling policy. The zero Policy has no partitions, no
// accounts and zero weights: jobs are ordered by --priority then submission, and no
// limit applies, as with no policy at all.
type Policy struct {
	// Priority holds the multifactor weights and their parameters.
	Priority Priority `json:"priority"`
	// Partitions by name. A partition the policy does not name keeps the default
	// meaning: the nodes labelled partition=<name>, no limits.
	Partitions map[string]Partition `json:"partitions,omitempty"`
	// QOS levels by name; an account's QOS gives its jobs the QOS factor.
	QOS map[string]QOS `json:"qos,omitempty"`
	// Accounts by name. When there is at least one, only the accounts named here (and
	// their users, where an account lists users) may submit.
	Accounts map[string]Account `json:"accounts,omitempty"`
	// Preemption says whether and how a pending job of a higher tier stops running jobs
	// of lower tiers to take their GPUs (preempt.go). Default: never.
	Preemption Preemption `json:"preemption,omitzero"`
}

// Priority is the multifactor priority's configuration (Slurm's PriorityWeight*,
// PriorityMaxAge, PriorityDecayHalfLife, PriorityFavorSmall, FairShareDampeningFactor).
type Priority struct {
	Weights Weights `json:"weights"`
	// MaxAge is the queue time at which the age factor reaches 1 (default 7 days).
	MaxAge Duration `json:"max_age,omitempty"`
	// DecayHalfLife is the half-life of recorded usage (default 7 days).
	DecayHalfLife Duration `json:"decay_half_life,omitempty"`
	// FavorSmall gives smaller jobs the larger job-size factor.
	FavorSmall bool `json:"favor_small,omitempty"`
	// Dampening is FairShareDampeningFactor (default 1): F = 2^(-UE/S/Dampening).
	Dampening float64 `json:"dampening,omitempty"`
}

// Weights multiply each factor (each between 0 and 1) in a job's priority.
type Weights struct {
	Age       int64 `json:"age,omitempty"`
	FairShare int64 `json:"fairshare,omitempty"`
	JobSize   int64 `json:"job_size,omitempty"`
	Partition int64 `json:"partition,omitempty"`
	QOS       int64 `json:"qos,omitempty"`
}

// Partition is one partition of the policy (slurm.conf's PartitionName lines).
type Partition struct {
	// Nodes selects the partition's nodes by label: a node is in the partition when it
	// has every label given. Default: partition=<name>.
	Nodes map[string]string `json:"nodes,omitempty"`
	// Default makes it the partition of jobs submitted without --partition.
	Default bool `json:"default,omitempty"`
	// DefaultTime is the --time of a job that gives none (else MaxTime).
	DefaultTime Duration `json:"default_time,omitempty"`
	// MaxTime is the longest --time a job may ask for: a longer one waits with
	// PartitionTimeLimit. 0: no limit.
	MaxTime Duration `json:"max_time,omitempty"`
	// MaxGPUsPerJob caps a job's GPUs (nodes × GPUs per node): a larger one waits with
	// QOSMaxGRESPerJob. 0: no limit.
	MaxGPUsPerJob int `json:"max_gpus_per_job,omitempty"`
	// AllowAccounts, when set, are the only accounts that may use the partition.
	AllowAccounts []string `json:"allow_accounts,omitempty"`
	// Tier is the partition's priority (Slurm's PriorityJobFactor), normalised by the
	// highest tier into the partition factor; with pre-emption on, also its
	// PriorityTier: a job of a higher tier may pre-empt one of a lower tier.
	Tier int `json:"tier,omitempty"`
	// PreemptMode is ModeRequeue ("" too: the partition's jobs may be pre-empted, and are
	// requeued) or ModeOff (they never are), as Slurm's per-partition PreemptMode.
	PreemptMode string `json:"preempt_mode,omitempty"`
}

// QOS is one quality of service level (sacctmgr's QOS): its priority, normalised by
// the highest, is the QOS factor; its limits hold for the jobs of that QOS (a job's
// --qos, else its account's QOS), 0 meaning none.
type QOS struct {
	Priority int `json:"priority"`
	// MaxWall caps a job's --time (MaxWall): a longer one (or none) waits with
	// QOSMaxWallDurationPerJobLimit.
	MaxWall Duration `json:"max_wall,omitempty"`
	// MaxGPUsPerUser caps the GPUs each user's jobs of the QOS hold at once
	// (MaxTRESPerUser=gres/gpu=N): QOSMaxGRESPerUser.
	MaxGPUsPerUser int `json:"max_gpus_per_user,omitempty"`
	// GrpGPUs caps the GPUs all the QOS's jobs hold at once (GrpTRES=gres/gpu=N):
	// QOSGrpGRES.
	GrpGPUs int `json:"grp_gpus,omitempty"`
	// MaxJobsPerUser caps each user's running jobs of the QOS (MaxJobsPerUser):
	// QOSMaxJobsPerUserLimit.
	MaxJobsPerUser int `json:"max_jobs_per_user,omitempty"`
}

// Account is one account (project), with its users and limits (sacctmgr's
// association limits; 0 means no limit).
type Account struct {
	// Shares is the account's fair-share (default 1).
	Shares int `json:"shares,omitempty"`
	// QOS names the QOS of the account's jobs ("" none).
	QOS string `json:"qos,omitempty"`
	// GrpGPUs caps the GPUs the account's jobs hold at once (GrpTRES=gres/gpu=N):
	// AssocGrpGRES.
	GrpGPUs int `json:"grp_gpus,omitempty"`
	// GrpJobs caps the account's running jobs (GrpJobs): AssocGrpJobsLimit.
	GrpJobs int `json:"grp_jobs,omitempty"`
	// GrpGPUHours caps the account's decayed usage, in GPU-hours (GrpTRESMins=gres/gpu
	// divided by 60): once reached, its jobs wait with AssocGrpGRESMinutes until the
	// usage decays below it.
	GrpGPUHours float64 `json:"grp_gpu_hours,omitempty"`
	// MaxGPUsPerUser caps the GPUs each user of the account holds at once
	// (MaxTRESPerUser=gres/gpu=N): QOSMaxGRESPerUser.
	MaxGPUsPerUser int `json:"max_gpus_per_user,omitempty"`
	// MaxJobsPerUser caps each user's running jobs in the account (MaxJobs):
	// AssocMaxJobsLimit.
	MaxJobsPerUser int `json:"max_jobs_per_user,omitempty"`
	// Users may charge the account, by name. Empty: any user may.
	Users map[string]User `json:"users,omitempty"`
}

// User is one user's association with an account.
type User struct {
	// Shares is the user's fair-share within the account (default 1).
	Shares int `json:"shares,omitempty"`
	// MaxGPUs and MaxJobs replace the account's per-user limits for this user (0: the
	// account's).
	MaxGPUs int `json:"max_gpus,omitempty"`
	MaxJobs int `json:"max_jobs,omitempty"`
	// Default makes this account the user's default (submit without --account).
	Default bool `json:"default,omitempty"`
}

// Parse reads a policy document and checks it (Validate). An unknown field is an
// error, so a misspelt limit is not silently ignored. The document may carry its schema
// version, "schema" (as the stored policy does: schema.Policy); one newer than this
// gangrun reads is refused (schema.ErrNewer) before its fields are looked at.
func Parse(data []byte) (*Policy, error) {
	switch t := bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\xEF\xBB\xBF"))); {
	case len(t) == 0:
		return nil, errors.New("the policy is empty: give a JSON object ({} for no partitions, accounts or limits)")
	case t[0] != '{':
		return nil, fmt.Errorf("the policy must be a JSON object, not %s", quote.Q(string(t[:min(len(t), 20)])))
	}
	// A byte-order mark, a key given twice, a misspelt field, a value of the wrong type:
	// each named with its line, column and field as the file spells it.
	if err := schema.Check(schema.Policy, data); errors.Is(err, schema.ErrNewer) {
		return nil, err
	}
	var doc struct {
		Schema *int `json:"schema,omitempty"` // newer: refused above; not a number: named by Decode
		Policy
	}
	if err := jsonfile.Decode(data, &doc); err != nil {
		return nil, err
	}
	if doc.Schema != nil && *doc.Schema < 1 {
		return nil, fmt.Errorf("schema %d: want a whole number of at least 1", *doc.Schema)
	}
	p := doc.Policy
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate checks the policy: names of printable text without '/', no negative weight,
// limit, share or duration, default_time within max_time, QOS and allowed accounts that
// exist, at most one default partition and one default account per user, a known
// pre-emption type, signal and preempt_mode. The error names the field and the value.
func (p *Policy) Validate() error {
	if err := p.Priority.validate(); err != nil {
		return err
	}
	if err := p.validatePartitions(); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(p.QOS)) {
		if err := checkName("qos", name); err != nil {
			return err
		}
		q := p.QOS[name]
		if q.Priority < 0 || q.Priority > MaxWeight {
			return fmt.Errorf("qos.%s.priority %d: want 0 to %d", name, q.Priority, int64(MaxWeight))
		}
		for _, l := range []struct {
			field string
			v     int64
		}{{"max_wall", int64(q.MaxWall)}, {"max_gpus_per_user", int64(q.MaxGPUsPerUser)}, {"grp_gpus", int64(q.GrpGPUs)}, {"max_jobs_per_user", int64(q.MaxJobsPerUser)}} {
			if l.v < 0 || l.field != "max_wall" && l.v > MaxWeight {
				return fmt.Errorf("qos.%s.%s %d: want 0 (no limit) to %d", name, l.field, l.v, int64(MaxWeight))
			}
		}
	}
	if err := p.validateAccounts(); err != nil {
		return err
	}
	return p.validatePreemption()
}

// validate checks the priority section: weights of 0 to MaxWeight, max_age and
// decay_half_life 0 or at least a minute, no negative dampening.
func (pr *Priority) validate() error {
	w := pr.Weights
	for _, f := range []struct {
		name string
		v    int64
	}{{"age", w.Age}, {"fairshare", w.FairShare}, {"job_size", w.JobSize}, {"partition", w.Partition}, {"qos", w.QOS}} {
		if f.v < 0 || f.v > MaxWeight {
			return fmt.Errorf("priority.weights.%s %d: want 0 to %d (Slurm's PriorityWeight* are 32-bit)", f.name, f.v, int64(MaxWeight))
		}
	}
	if pr.MaxAge < 0 || pr.DecayHalfLife < 0 {
		return fmt.Errorf("priority.max_age %s, decay_half_life %s: must not be negative", time.Duration(pr.MaxAge), time.Duration(pr.DecayHalfLife))
	}
	for _, f := range []struct {
		name string
		d    Duration
	}{{"max_age", pr.MaxAge}, {"decay_half_life", pr.DecayHalfLife}} {
		if f.d > 0 && time.Duration(f.d) < time.Minute {
			return fmt.Errorf("priority.%s %s: want 0 (the default, 7 days) or at least 1m (Slurm takes it in minutes)", f.name, time.Duration(f.d))
		}
	}
	if pr.Dampening < 0 {
		return fmt.Errorf("priority.dampening %g: must not be negative", pr.Dampening)
	}
	return nil
}

// validatePartitions checks each partition, in name order: its name and node labels,
// its times, limits and tier, that its allowed accounts exist, and that at most one
// partition is the default.
func (p *Policy) validatePartitions() error {
	defaults := 0
	for _, name := range slices.Sorted(maps.Keys(p.Partitions)) {
		pt := p.Partitions[name]
		at := "partitions." + name
		if err := checkName("partition", name); err != nil {
			return err
		}
		for k, v := range pt.Nodes {
			if err := checkName(at+".nodes label", k); err != nil {
				return err
			}
			if err := checkText(at+".nodes."+k, v); err != nil {
				return err
			}
		}
		switch {
		case pt.DefaultTime < 0 || pt.MaxTime < 0:
			return fmt.Errorf("%s: default_time %s, max_time %s: must not be negative", at, time.Duration(pt.DefaultTime), time.Duration(pt.MaxTime))
		case pt.MaxTime > 0 && pt.DefaultTime > pt.MaxTime:
			return fmt.Errorf("%s.default_time %s: longer than max_time %s", at, time.Duration(pt.DefaultTime), time.Duration(pt.MaxTime))
		case pt.MaxGPUsPerJob < 0:
			return fmt.Errorf("%s.max_gpus_per_job %d: must not be negative", at, pt.MaxGPUsPerJob)
		case pt.Tier < 0 || pt.Tier > MaxTier:
			return fmt.Errorf("%s.tier %d: want 0 to %d (Slurm's PriorityTier)", at, pt.Tier, MaxTier)
		}
		for _, a := range pt.AllowAccounts {
			if _, ok := p.Accounts[a]; !ok && len(p.Accounts) > 0 {
				return fmt.Errorf("%s.allow_accounts: account %q is not in accounts", at, a)
			}
		}
		if pt.Default {
			defaults++
			if defaults > 1 {
				return fmt.Errorf("%s.default: another partition is the default already", at)
			}
		}
	}
	return nil
}

// validateAccounts checks each account, in name order: its name, shares and limits,
// that its QOS exists, and its users (validateUsers), across accounts at most one
// default account per user.
func (p *Policy) validateAccounts() error {
	defaultOf := map[string]string{} // user → their default account
	for _, name := range slices.Sorted(maps.Keys(p.Accounts)) {
		a := p.Accounts[name]
		at := "accounts." + name
		if err := checkName("account", name); err != nil {
			return err
		}
		for _, f := range []struct {
			name string
			v    int
		}{{"shares", a.Shares}, {"grp_gpus", a.GrpGPUs}, {"grp_jobs", a.GrpJobs}, {"max_gpus_per_user", a.MaxGPUsPerUser}, {"max_jobs_per_user", a.MaxJobsPerUser}} {
			if f.v < 0 || f.v > MaxWeight {
				return fmt.Errorf("%s.%s %d: want 0 to %d", at, f.name, f.v, int64(MaxWeight))
			}
		}
		if a.GrpGPUHours < 0 {
			return fmt.Errorf("%s.grp_gpu_hours %g: must not be negative", at, a.GrpGPUHours)
		}
		if _, ok := p.QOS[a.QOS]; a.QOS != "" && !ok {
			return fmt.Errorf("%s.qos %q: not in qos", at, a.QOS)
		}
		if err := validateUsers(name, a, defaultOf); err != nil {
			return err
		}
	}
	return nil
}

// validateUsers checks the users of account name, in name order: their names, shares
// and limits, and that none is made the default of a second account; defaultOf (user →
// default account) records the defaults seen so far.
func validateUsers(name string, a Account, defaultOf map[string]string) error {
	at := "accounts." + name
	for _, u := range slices.Sorted(maps.Keys(a.Users)) {
		if err := checkName(at+".users: user", u); err != nil {
			return err
		}
		uu := a.Users[u]
		if uu.Shares < 0 || uu.MaxGPUs < 0 || uu.MaxJobs < 0 || uu.Shares > MaxWeight || uu.MaxGPUs > MaxWeight || uu.MaxJobs > MaxWeight {
			return fmt.Errorf("%s.users.%s: shares %d, max_gpus %d, max_jobs %d: want 0 to %d each", at, u, uu.Shares, uu.MaxGPUs, uu.MaxJobs, int64(MaxWeight))
		}
		if uu.Default {
			if other, ok := defaultOf[u]; ok {
				return fmt.Errorf("%s.users.%s.default: account %q is %s's default already", at, u, other, u)
			}
			defaultOf[u] = name
		}
	}
	return nil
}

// checkName refuses an empty name, or one with '/', a space, or a character that is
// not printable: names are key segments and table cells.
func checkName(what, s string) error {
	if s == "" || strings.ContainsAny(s, "/ ") {
		return fmt.Errorf("%s %q: want a non-empty name without '/' or spaces", what, s)
	}
	return checkText(what, s)
}

// checkText refuses control and format characters (they would show raw in a table).
func checkText(what, s string) error {
	if strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) >= 0 {
		return fmt.Errorf("%s %q: only printable text is allowed", what, s)
	}
	return nil
}

// MaxAge returns the age at which the age factor reaches 1.
func (p *Policy) MaxAge() time.Duration {
	if p.Priority.MaxAge == 0 {
		return DefaultMaxAge
	}
	return time.Duration(p.Priority.MaxAge)
}

// HalfLife returns the usage decay half-life.
func (p *Policy) HalfLife() time.Duration {
	if p.Priority.DecayHalfLife == 0 {
		return DefaultDecayHalfLife
	}
	return time.Duration(p.Priority.DecayHalfLife)
}

// PartitionNodes returns the label selector of partition name, and whether the policy
// names the partition.
func (p *Policy) PartitionNodes(name string) (map[string]string, bool) {
	pt, ok := p.Partitions[name]
	if !ok {
		return nil, false
	}
	if len(pt.Nodes) == 0 {
		return map[string]string{"partition": name}, true
	}
	return pt.Nodes, true
}

// DefaultPartition returns the default partition ("" when none).
func (p *Policy) DefaultPartition() string {
	for _, name := range slices.Sorted(maps.Keys(p.Partitions)) {
		if p.Partitions[name].Default {
			return name
		}
	}
	return ""
}

// DefaultAccount returns user's default account: the account that marks the user
// default, else the only account listing the user, else the user's name (Slurm's
// default account, and an account per user where the policy says nothing).
func (p *Policy) DefaultAccount(user string) string {
	var member []string
	for _, name := range slices.Sorted(maps.Keys(p.Accounts)) {
		if u, ok := p.Accounts[name].Users[user]; ok {
			if u.Default {
				return name
			}
			member = append(member, name)
		}
	}
	if len(member) == 1 {
		return member[0]
	}
	return user
}

// DefaultTime returns the --time a job without one gets in partition name: its
// default_time, else its max_time, else 0 (none).
func (p *Policy) DefaultTime(partition string) time.Duration {
	pt := p.Partitions[partition]
	if pt.DefaultTime > 0 {
		return time.Duration(pt.DefaultTime)
	}
	return time.Duration(pt.MaxTime)
}

// Load reads the policy from the store: nil (and no error) when none is set.
func Load(ctx context.Context, s store.Store) (*Policy, error) {
	e, err := s.Get(ctx, Key)
	if err != nil || e == nil {
		return nil, err
	}
	p, err := Parse(e.Value)
	if err != nil {
		return nil, fmt.Errorf("the policy in %s: %w", Key, err)
	}
	return p, nil
}

// Save writes p (after Validate) as the policy; the scheduler applies it on its next
// pass. also's operations (an audit entry) are applied in the same transaction. A
// stored policy a newer gangrun wrote is not replaced (Guard).
func Save(ctx context.Context, s store.Store, p *Policy, also ...store.Op) error {
	guard, err := Guard(ctx, s)
	if err != nil {
		return err
	}
	ops, _, err := SaveOps(p)
	if err != nil {
		return err
	}
	if _, err := s.Txn(ctx, append(append(guard, ops...), also...)); err != nil {
		return fmt.Errorf("write %s: %w", Key, err)
	}
	return nil
}

// Guard returns the check to put before SaveOps' operations so that they replace the
// stored policy only as it is now; an error wrapping schema.ErrNewer when a newer
// gangrun wrote it, which this one must not overwrite.
func Guard(ctx context.Context, s store.Store) ([]store.Op, error) {
	e, err := s.Get(ctx, Key)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return []store.Op{{Verb: store.CheckNotExists, Key: Key}}, nil
	}
	if err := schema.Check(schema.Policy, e.Value); errors.Is(err, schema.ErrNewer) {
		return nil, fmt.Errorf("the policy in %s: %w: set it with that gangrun", Key, err)
	}
	return []store.Op{{Verb: store.CheckIndex, Key: Key, Index: e.ModifyIndex}}, nil
}

// SaveOps are the operations that write p (after Validate) as the policy, and p's
// summary ("2 partitions, 3 accounts") as the audit log and `gangrun policy set` say it.
func SaveOps(p *Policy) ([]store.Op, string, error) {
	if err := p.Validate(); err != nil {
		return nil, "", err
	}
	b, err := schema.Marshal(schema.Policy, p)
	if err != nil {
		return nil, "", err
	}
	var out bytes.Buffer
	_ = json.Indent(&out, b, "", "  ") // consul kv get shows it as written: indented
	return []store.Op{{Verb: store.Set, Key: Key, Value: out.Bytes()}}, Summary(p), nil
}

// Summary is p's size as the audit log records a policy change: "N partitions, M
// accounts".
func Summary(p *Policy) string {
	return fmt.Sprintf("%d partitions, %d accounts", len(p.Partitions), len(p.Accounts))
}
