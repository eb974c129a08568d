package job

import (
	"context"
	"sort"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// PriorityEntry is one line of `gangrun queue --priority` (like sprio): a pending
// request's multifactor priority, each factor between 0 and 1 and its weight.
type PriorityEntry struct {
	ID        string         `json:"id"`
	User      string         `json:"user"`
	Account   string         `json:"account"`
	Partition string         `json:"partition"`
	Factors   policy.Factors `json:"factors"`
	Weights   policy.Weights `json:"weights"`
	Reason    string         `json:"reason"`
	// Nice is the job's --nice, which Factors.Priority (and Factors.Site) already
	// have taken off: sprio's NICE column.
	Nice int `json:"nice,omitempty"`
}

// Priorities computes the pending requests' priorities as the scheduler does (the
// policy, the usage it last wrote, the registered GPUs, now), highest first: the order
// of its next pass, but for the usage it accumulated since its last write (at most
// allocator.UsageFlushInterval). With no policy every factor is 0 and the priority is
// --priority.
func Priorities(ctx context.Context, s store.Store) ([]PriorityEntry, error) {
	p, err := policy.Load(ctx, s)
	if err != nil {
		return nil, err
	}
	if p == nil {
		p = &policy.Policy{}
	}
	u, err := policy.LoadUsage(ctx, s)
	if err != nil {
		return nil, err
	}
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		return nil, err
	}
	st, err := allocator.ReadStatus(ctx, s)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	prio := allocator.Priorities(p, u, c, now)
	out := make([]PriorityEntry, 0, len(prio))
	for id, f := range prio {
		r := c.Requests[id]
		j := allocator.PolicyJob(r.Request)
		user := j.User
		if user == "" {
			user = r.Holder
		}
		out = append(out, PriorityEntry{ID: id, User: user, Account: j.Account, Partition: r.Partition, Factors: f,
			Weights: p.Priority.Weights, Reason: st.Pending[id], Nice: r.Nice})
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := out[i].Factors.Priority, out[j].Factors.Priority; a != b {
			return a > b
		}
		return c.Requests[out[i].ID].Arrival < c.Requests[out[j].ID].Arrival
	})
	return out, nil
}
