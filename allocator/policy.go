package allocator

import (
	"context"
	"errors"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// The scheduler under an operator's policy (package policy): it orders pending requests
// by Slurm's multifactor priority instead of --priority alone, holds back a request
// that a limit stops with the limit's Slurm reason, and keeps each account's and user's
// decayed GPU usage for fair-share.

// Intervals of the scheduler's policy work.
const (
	// PolicyRecalc is the longest time between two passes while a policy is set, so the
	// age factor and the usage move on without any change in the cluster (Slurm's
	// PriorityCalcPeriod, 5 minutes by default, is shorter here: a pass is cheap).
	PolicyRecalc = 30 * time.Second
	// UsageFlushInterval is how often the scheduler writes the usage it accumulates to
	// policy.UsageKey: a new scheduler after a fail-over loses at most this much.
	UsageFlushInterval = 30 * time.Second
)

// SetPolicy makes p the policy of the next passes (nil: none), for a caller that drives
// Pass itself; Run takes the policy from its watch of policy.Key instead.
func (sc *Scheduler) SetPolicy(p *policy.Policy) { sc.pol = p }

// PolicyJob is the policy's view of request r: its user and account (the user's name
// when no account is given), partition, GPUs (the least nodes it asks for × GPUs per
// node), time limit, submission and --priority.
func PolicyJob(r Request) policy.Job {
	account := r.Account
	if account == "" {
		account = r.User
	}
	return policy.Job{ID: r.ID, User: r.User, Account: account, Partition: r.Partition, GPUs: r.Nodes * r.GPUsPerNode,
		TimeLimit: r.TimeLimit, Submitted: r.Submitted, Site: r.Priority, QOS: r.QOS}
}

// TotalGPUs counts the allocatable devices of every registered node: the job-size
// factor's denominator.
func (c *Cluster) TotalGPUs() int {
	n := 0
	for _, ns := range c.Nodes {
		n += len(ns.Record.Devices)
	}
	return n
}

// Priorities returns the multifactor priority of every live request of c without a
// grant, under p with usage u (nil: none), at now.
func Priorities(p *policy.Policy, u *policy.Usage, c *Cluster, now time.Time) map[string]policy.Factors {
	var accounts []string
	seen := map[string]bool{}
	for _, r := range c.Requests {
		if a := PolicyJob(r.Request).Account; !seen[a] {
			seen[a] = true
			accounts = append(accounts, a)
		}
	}
	fs := policy.NewFairShare(p, u, accounts)
	total := c.TotalGPUs()
	out := make(map[string]policy.Factors, len(c.Requests))
	for id, r := range c.Requests {
		if g, ok := c.Grants[id]; r.Alive && (!ok || g.State == GrantPending) {
			out[id] = p.Factors(PolicyJob(r.Request), now, fs, total)
		}
	}
	return out
}

// orderedBy returns the live requests by priority (higher first), then arrival, then
// id; a request prio lacks (granted already) sorts by its --priority.
func (c *Cluster) orderedBy(prio map[string]policy.Factors) []PendingRequest {
	out := make([]PendingRequest, 0, len(c.Requests))
	for _, r := range c.Requests {
		if r.Alive {
			out = append(out, r)
		}
	}
	key := func(r PendingRequest) int64 {
		if f, ok := prio[r.ID]; ok {
			return f.Priority
		}
		return int64(r.Priority)
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := key(out[i]), key(out[j]); a != b {
			return a > b
		}
		if out[i].Arrival != out[j].Arrival {
			return out[i].Arrival < out[j].Arrival
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// heldBy tallies what c's grants hold, per account, user and QOS, for pol's limits.
func heldBy(c *Cluster, pol *policy.Policy) *policy.Held {
	h := pol.NewHeld()
	for id, g := range c.Grants {
		if g.State == GrantRefused {
			continue
		}
		if r, ok := c.Requests[id]; ok {
			j := PolicyJob(r.Request)
			j.GPUs = g.DeviceCount()
			h.Add(j)
		}
	}
	return h
}

// account brings the usage up to now: it reads the last record on the first pass,
// decays it (policy.Usage.Decay), charges every granted grant its GPUs × the seconds it
// held them since the last pass (from its grant time when later), and writes the record
// every UsageFlushInterval, fenced like every write of the scheduler. A grant released
// between two passes loses the time since the last pass: passes come at least every
// PolicyRecalc while a policy is set. A stored usage a newer gangrun wrote is left as
// it is: the passes count from nothing, and write nothing.
func (sc *Scheduler) account(ctx context.Context, now time.Time, c *Cluster) error {
	if sc.usage == nil {
		u, err := policy.LoadUsage(ctx, sc.s)
		if errors.Is(err, schema.ErrNewer) {
			sc.log.Warn("fair-share counts from now, and the usage is not written: "+err.Error(), zap.String("key", policy.UsageKey))
			u, sc.usageNewer = policy.NewUsage(), err
		} else if err != nil {
			return err
		}
		sc.usage, sc.usageSaved = u, now
	}
	last := sc.usage.Updated
	sc.usage.Decay(now, sc.pol.HalfLife())
	if !last.IsZero() {
		for id, g := range c.Grants {
			if g.State != GrantGranted {
				continue
			}
			r, ok := c.Requests[id]
			if !ok || r.User == "" {
				continue
			}
			from := last
			if g.Granted.After(from) {
				from = g.Granted
			}
			if now.After(from) {
				j := PolicyJob(r.Request)
				sc.usage.Charge(j.Account, j.User, float64(g.DeviceCount())*now.Sub(from).Seconds())
			}
		}
	}
	if now.Sub(sc.usageSaved) < UsageFlushInterval || sc.usageNewer != nil {
		return nil
	}
	b, err := schema.Marshal(schema.Usage, sc.usage)
	if err != nil {
		return err
	}
	if err := sc.txn(ctx, []store.Op{{Verb: store.Set, Key: policy.UsageKey, Value: b}}); err != nil {
		if errors.Is(err, ErrNotLeader) {
			return err
		}
		sc.log.Warn("write the usage", zap.Error(err))
		return nil
	}
	sc.usageSaved = now
	return nil
}
