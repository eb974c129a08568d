package allocator

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// reserve keeps nodes for r, the first request that does not fit, so that requests
// behind it cannot take what it waits for (backfill only what does not delay it). A node
// is eligible when it passes the pipeline's checkers and no other request keeps it
// (taken: node → request, this pass's reservations). It keeps the reservation of an
// earlier pass while its nodes stay eligible; otherwise it picks the eligible nodes with
// the most free GPUs of r's model, then by name. It returns the kept nodes, sorted, or
// nil when fewer than r.Nodes are eligible (r can never fit as things are: nothing is
// kept).
func (sc *Scheduler) reserve(c *Cluster, r PendingRequest, taken map[string]string) []string {
	eligible := func(name string) bool {
		n, ok := c.Nodes[name]
		if !ok {
			return false
		}
		if _, other := taken[name]; other {
			return false
		}
		return sc.pipe.feasible(r.Request, n) == ""
	}
	if prev, ok := sc.reserved[r.ID]; ok {
		all := true
		for _, name := range prev {
			all = all && eligible(name)
		}
		if all {
			return prev
		}
	}
	type cand struct {
		name string
		free int
	}
	var cands []cand
	for name, n := range c.Nodes {
		if eligible(name) {
			cands = append(cands, cand{name, len(matching(n.Free(), r.Request))})
		}
	}
	if len(cands) < r.Nodes {
		delete(sc.reserved, r.ID)
		return nil
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].free != cands[j].free {
			return cands[i].free > cands[j].free
		}
		return cands[i].name < cands[j].name
	})
	kept := make([]string, r.Nodes)
	for i := range kept {
		kept[i] = cands[i].name
	}
	sort.Strings(kept)
	sc.reserved[r.ID] = kept
	return kept
}

// hasReservation reports whether request id kept nodes in an earlier pass.
func (sc *Scheduler) hasReservation(id string) bool {
	_, ok := sc.reserved[id]
	return ok
}

// shapeKey identifies what placement looks at in a request: two requests with the same
// key fit the same nodes. Its own kept nodes are not part of it: a request that kept
// nodes in an earlier pass is not yet in this pass's kept nodes when it is placed.
func shapeKey(r Request) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(r.Nodes))
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(r.MaxNodes))
	b.WriteByte('x')
	b.WriteString(strconv.Itoa(r.GPUsPerNode))
	b.WriteByte('c')
	b.WriteString(strconv.Itoa(r.CPUsPerNode))
	b.WriteByte('m')
	b.WriteString(strconv.FormatInt(r.MemPerNodeMiB, 10))
	b.WriteByte('t') // the time limit decides whether it may backfill a reservation
	b.WriteString(strconv.FormatInt(int64(r.TimeLimit), 10))
	for _, s := range []string{r.GPUModel, r.MIGProfile, r.Partition} {
		b.WriteByte(0)
		b.WriteString(s)
	}
	for _, m := range []map[string]string{r.PartitionNodes, r.Labels, r.ExcludeSession} {
		b.WriteByte(1)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b.WriteString(k + "=" + m[k] + "\x00")
		}
	}
	b.WriteByte(2)
	b.WriteString(strings.Join(r.Exclude, "\x00"))
	b.WriteString(r.NodeChoice.shapeKey() + "\x00" + r.User)
	return b.String()
}

// Backfill by time limit (Slurm's sched/backfill): a reservation is expected to begin
// when the last job holding GPUs on its nodes reaches its time limit; a request with a
// time limit that ends before that may use the kept nodes meanwhile, since it cannot
// delay the reservation. A reservation with a holder that has no time limit (an alloc,
// a job without --time) has no expected start: nothing backfills it.

// reservationStart returns when the GPUs on nodes are expected to be free: the latest
// end (grant time + the request's time limit) of the grants holding them, those made
// earlier in this pass (passGrants: node → requests granted on it at now) included;
// false when a holder has no time limit, or its grant or request is not in c.
func reservationStart(c *Cluster, nodes []string, passGrants map[string][]Request, now time.Time) (time.Time, bool) {
	var start time.Time
	for _, name := range nodes {
		n, ok := c.Nodes[name]
		if !ok {
			return time.Time{}, false
		}
		for _, id := range n.Held {
			g, gok := c.Grants[id]
			r, rok := c.Requests[id]
			if !gok || !rok || r.TimeLimit <= 0 || g.Granted.IsZero() {
				return time.Time{}, false
			}
			start = maxTime(start, g.Granted.Add(r.TimeLimit))
		}
		for _, r := range passGrants[name] {
			if r.TimeLimit <= 0 {
				return time.Time{}, false
			}
			start = maxTime(start, now.Add(r.TimeLimit))
		}
	}
	return maxTime(start, now), true
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
