package policy

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Factors are one job's multifactor priority, as sprio shows it: each factor between
// 0 and 1, the job's own --priority (Site), and the sum (Priority).
//
// The formula is Slurm's (priority_multifactor.html, "Job Priority Factors In
// General"):
//
//	Priority = Site + W_age×Age + W_fairshare×FairShare + W_jobsize×JobSize
//	              + W_partition×Partition + W_qos×QOS
//
// truncated to an integer, as slurmctld truncates it.
type Factors struct {
	Site      int     `json:"site"`
	Age       float64 `json:"age"`
	FairShare float64 `json:"fairshare"`
	JobSize   float64 `json:"job_size"`
	Partition float64 `json:"partition"`
	QOS       float64 `json:"qos"`
	Priority  int64   `json:"priority"`
}

// Factors computes job j's factors at now: fs gives the fair-share factor (nil: 0),
// totalGPUs is the cluster's GPU count (the job-size factor's denominator).
//
//   - Age: time queued over MaxAge, at most 1 ("Age Factor").
//   - JobSize: GPUs asked over totalGPUs; with FavorSmall, 1 − (GPUs−1)/totalGPUs, so
//     a 1-GPU job gets 1 ("Job Size Factor", PriorityFavorSmall).
//   - Partition: the partition's tier over the highest tier ("Partition Factor",
//     PriorityJobFactor).
//   - QOS: the account's QOS priority over the highest ("Quality of Service (QOS)
//     Factor").
func (p *Policy) Factors(j Job, now time.Time, fs *FairShare, totalGPUs int) Factors {
	f := Factors{Site: j.Site}
	if age := now.Sub(j.Submitted); age > 0 {
		f.Age = math.Min(float64(age)/float64(p.MaxAge()), 1)
	}
	if totalGPUs > 0 {
		g := float64(min(j.GPUs, totalGPUs))
		if p.Priority.FavorSmall {
			f.JobSize = 1 - (g-1)/float64(totalGPUs)
		} else {
			f.JobSize = g / float64(totalGPUs)
		}
		f.JobSize = math.Max(0, math.Min(f.JobSize, 1))
	}
	if top := p.maxTier(); top > 0 {
		f.Partition = float64(p.Partitions[j.Partition].Tier) / float64(top)
	}
	if top := p.maxQOS(); top > 0 {
		if q := p.QOSOf(j); q != "" {
			f.QOS = float64(p.QOS[q].Priority) / float64(top)
		}
	}
	if fs != nil {
		f.FairShare = fs.Factor(j.Account, j.User)
	}
	w := p.Priority.Weights
	sum := float64(w.Age)*f.Age + float64(w.FairShare)*f.FairShare + float64(w.JobSize)*f.JobSize +
		float64(w.Partition)*f.Partition + float64(w.QOS)*f.QOS
	f.Priority = saturatingAdd(int64(j.Site), sum)
	return f
}

// saturatingAdd returns site + sum truncated to an integer, held within int64: a sum
// past the limit stays at the limit instead of wrapping around to a negative priority
// (the policy's weights are bounded, MaxWeight; a job's own --priority is not this
// package's to bound).
func saturatingAdd(site int64, sum float64) int64 {
	var add int64
	switch {
	case sum >= math.MaxInt64: // float64(MaxInt64) is 2^63: beyond every int64
		add = math.MaxInt64
	case sum > 0:
		add = int64(sum)
	}
	if site > 0 && add > math.MaxInt64-site {
		return math.MaxInt64
	}
	return site + add
}

func (p *Policy) maxTier() int {
	top := 0
	for _, pt := range p.Partitions {
		top = max(top, pt.Tier)
	}
	return top
}

func (p *Policy) maxQOS() int {
	top := 0
	for _, q := range p.QOS {
		top = max(top, q.Priority)
	}
	return top
}

// FairShare computes Slurm's classic fair-share factor (classic_fair_share.html; the
// priority_multifactor page's "Fairshare Factor" before Fair Tree) on a two-level tree:
// the accounts under the root, each account's users under it.
//
//	S  = (S_user / S_siblings) × (S_account / S_accounts)    normalised shares
//	U  = usage / total usage                                 normalised usage (decayed)
//	UE = U_user + (UE_account − U_user) × S_user / S_siblings  effective usage
//	UE_account = U_account                                   (children of the root)
//	F  = 2^(−UE / S / dampening)
//
// A user the account does not list (an account open to every user) gets the account's
// own factor, 2^(−U_account/S_account/dampening). Accounts the policy does not name
// (jobs charged to their user's name) have 1 share each. With no usage at all every
// factor is 1.
type FairShare struct {
	p         *Policy
	u         *Usage
	total     float64 // all accounts' usage
	shares    map[string]float64
	allShares float64
	cache     map[assoc]float64
}

// NewFairShare prepares the factors for usage u (nil: none) over the policy's accounts,
// those u records and accounts (the accounts of the jobs to rank).
func NewFairShare(p *Policy, u *Usage, accounts []string) *FairShare {
	f := &FairShare{p: p, u: u, shares: map[string]float64{}, cache: map[assoc]float64{}}
	add := func(a string) {
		if _, ok := f.shares[a]; ok {
			return
		}
		s := float64(DefaultShares)
		if acc, ok := p.Accounts[a]; ok && acc.Shares > 0 {
			s = float64(acc.Shares)
		}
		f.shares[a] = s
		f.allShares += s
	}
	for a := range p.Accounts {
		add(a)
	}
	for _, a := range accounts {
		add(a)
	}
	if u != nil {
		for a, v := range u.Accounts {
			add(a)
			f.total += v
		}
	}
	return f
}

// Factor returns the fair-share factor of user in account, between 0 and 1.
func (f *FairShare) Factor(account, user string) float64 {
	k := assoc{account, user}
	if v, ok := f.cache[k]; ok {
		return v
	}
	v := f.factor(account, user)
	f.cache[k] = v
	return v
}

func (f *FairShare) factor(account, user string) float64 {
	return f.Share(account, user).Factor
}

// Share is one association of the fair-share tree as sshare shows it: an account
// under the root, or a user in an account (sshare(1)'s columns).
type Share struct {
	// RawShares is the association's shares; Parent marks a user the account does not
	// list, who takes the account's shares and usage (Slurm's "parent").
	RawShares int
	Parent    bool
	// NormShares is its share of the whole tree, S: the account's shares over all the
	// accounts', times a listed user's over the account's users'.
	NormShares float64
	// RawUsage is its decayed usage in GPU-seconds; NormUsage that over every
	// account's, U.
	RawUsage, NormUsage float64
	// EffectvUsage is UE: the account's U, a listed user's U_user + (U_account −
	// U_user) × S_user / S_siblings.
	EffectvUsage float64
	// Factor is the fair-share factor, 2^(−UE / S / dampening); 0 with no shares.
	Factor float64
}

// Share returns the association of user in account ("" user: the account's own);
// see FairShare for the formula.
func (f *FairShare) Share(account, user string) Share {
	sa, ok := f.shares[account]
	if !ok {
		sa = DefaultShares
	}
	all := f.allShares
	if !ok {
		all += sa
	}
	sh := Share{RawShares: int(sa), NormShares: sa / all}
	var uAcct, uUser float64
	if f.total > 0 && f.u != nil {
		uAcct = f.u.Accounts[account] / f.total
		uUser = f.u.Users[account+"/"+user] / f.total
	}
	if f.u != nil {
		sh.RawUsage = f.u.Accounts[account]
	}
	sh.NormUsage, sh.EffectvUsage = uAcct, uAcct
	if user != "" {
		sh.Parent = true
		if f.u != nil {
			sh.RawUsage = f.u.Users[account+"/"+user]
		}
		sh.NormUsage = uUser
	}
	if acc, ok := f.p.Accounts[account]; ok && user != "" {
		if me, listed := acc.Users[user]; listed {
			siblings := 0.0
			for _, other := range acc.Users {
				siblings += float64(sharesOf(other.Shares))
			}
			part := float64(sharesOf(me.Shares)) / siblings
			sh.Parent, sh.RawShares = false, sharesOf(me.Shares)
			sh.EffectvUsage = uUser + (uAcct-uUser)*part
			sh.NormShares *= part
		}
	}
	if sh.NormShares <= 0 {
		return sh
	}
	d := f.p.Priority.Dampening
	if d <= 0 {
		d = DefaultDampening
	}
	sh.Factor = math.Exp2(-sh.EffectvUsage / sh.NormShares / d)
	return sh
}

// Accounts returns the accounts of the tree: the policy's, those usage records and
// those NewFairShare was given, in name order.
func (f *FairShare) Accounts() []string {
	return slices.Sorted(maps.Keys(f.shares))
}

func sharesOf(n int) int {
	if n <= 0 {
		return DefaultShares
	}
	return n
}
