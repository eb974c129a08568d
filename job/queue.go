package job

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Entry is one line of `gangrun queue` (squeue): a job, or an allocation of `gangrun
// alloc` (Kind "alloc"), which squeue would show as a job too. Its JSON fields are the
// ones tools rely on (docs/jobs.md, "`queue --json` and `show --json`"); more may be added, none renamed.
type Entry struct {
	ID        string   `json:"id"`
	Kind      string   `json:"kind"` // "job" or "alloc"
	Name      string   `json:"name"`
	User      string   `json:"user"`
	Account   string   `json:"account"`
	Partition string   `json:"partition"`
	State     Status   `json:"state"`
	Reason    string   `json:"reason"`
	Nodes     []string `json:"nodes"`
	// NumNodes is len(Nodes) once placed; before, the nodes asked for (the least).
	NumNodes int `json:"num_nodes"`
	// GPUsPerNode and Priority as asked.
	GPUsPerNode int `json:"gpus_per_node"`
	Priority    int `json:"priority"`
	// Restarts counts the job's own restarts; NodeFailures the nodes it lost.
	Restarts     int    `json:"restarts"`
	NodeFailures int    `json:"node_failures"`
	Submitted    string `json:"submitted"`
	Started      string `json:"started"`
	// Elapsed is how long it has run (until it ended), in seconds.
	Elapsed int64 `json:"elapsed_seconds"`
	// IdleGPUs counts the running job's GPUs its nodes found idle (under the agents'
	// --waste-threshold for --waste-after: IdleMark), since IdleSince; 0 and "" when none.
	IdleGPUs  int    `json:"idle_gpus"`
	IdleSince string `json:"idle_since,omitempty"`
}

// Queue lists the jobs not yet ended (or, with all, every job) in submission order,
// then the allocations of `gangrun alloc`, for `gangrun queue`. A pending job's reason is
// the scheduler's (allocator.ReadStatus) when it has one. Jobs and allocations a newer
// gangrun wrote are listed too (NewerEntries), with why this one leaves them alone as
// their reason.
func Queue(ctx context.Context, s store.Store, all bool) ([]Entry, error) {
	jobs, newer, err := ListAll(ctx, s)
	if err != nil {
		return nil, err
	}
	st, err := allocator.ReadStatus(ctx, s)
	if errors.Is(err, schema.ErrNewer) {
		st = allocator.SchedulerStatus{} // a newer scheduler's: its pending reasons are not shown
	} else if err != nil {
		return nil, err
	}
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		return nil, err
	}
	return append(QueueOf(jobs, st, c, all, time.Now()), NewerEntries(jobs, newer, c, all, time.Now())...), nil
}

// NewerEntries are the queue entries of the jobs a newer gangrun wrote (newer, from
// ListAll), and of the requests under gangrun/cluster/ a newer one wrote that are no
// job's (of jobs or newer): what
// could be read of each, its reason why this gangrun leaves it alone, its state Unknown
// when the state itself could not be read. With all false, jobs known to have ended are
// left out, as QueueOf does.
func NewerEntries(jobs []Job, newer []Newer, c *allocator.Cluster, all bool, now time.Time) []Entry {
	out := []Entry{}
	listed := map[string]bool{}
	for _, j := range jobs {
		listed[j.Spec.ID] = true
	}
	for _, n := range newer {
		listed[n.Spec.ID] = true
		if !all && n.State.Status.Final() {
			continue
		}
		e := EntryOf(n.Job, "", now)
		e.Reason = n.Err.Error()
		out = append(out, e)
	}
	for _, key := range slices.Sorted(maps.Keys(c.Newer)) {
		id, ok := strings.CutPrefix(key, allocator.RequestKey(""))
		if !ok || listed[id] {
			continue
		}
		out = append(out, Entry{ID: id, Kind: "alloc", Name: "(alloc)", State: Unknown, Reason: c.Newer[key].Error(), Nodes: []string{}})
	}
	return out
}

// QueueOf is Queue from what the caller read: the jobs (List), the scheduler's status
// and the cluster, at now.
func QueueOf(jobs []Job, st allocator.SchedulerStatus, c *allocator.Cluster, all bool, now time.Time) []Entry {
	out := []Entry{}
	for _, j := range jobs {
		if !all && j.State.Status.Final() {
			continue
		}
		out = append(out, EntryOf(j, st.Pending[j.Spec.ID], now))
	}
	for _, q := range c.Queue(st.Pending) {
		if r, ok := c.Requests[q.ID]; ok && r.Durable() {
			continue // a job's request: listed as the job
		}
		e := Entry{ID: q.ID, Kind: "alloc", Name: "(alloc)", User: q.Holder, State: Pending, Reason: q.Reason,
			Nodes: []string{}, GPUsPerNode: q.GPUsPerNode, Priority: q.Priority, Submitted: q.Submitted}
		if q.State == allocator.GrantGranted {
			e.State = Running
			for _, n := range q.Granted {
				e.Nodes = append(e.Nodes, n.Name)
			}
			if g, ok := c.Grants[q.ID]; ok && !g.Granted.IsZero() {
				e.Started, e.Elapsed = stamp(g.Granted), int64(now.Sub(g.Granted)/time.Second)
			}
		}
		e.NumNodes = len(e.Nodes)
		if e.NumNodes == 0 {
			e.NumNodes = q.Nodes
		}
		out = append(out, e)
	}
	return out
}

// EntryOf is job j's queue entry; reason is the scheduler's pending reason for it.
func EntryOf(j Job, reason string, now time.Time) Entry {
	st := j.State
	e := Entry{ID: j.Spec.ID, Kind: "job", Name: j.Spec.Name, User: j.Spec.User, Account: j.Spec.Account,
		Partition: j.Spec.Partition, State: st.Status, Reason: st.Reason, Nodes: append([]string{}, st.Nodes...),
		GPUsPerNode: j.Spec.GPUsPerNode, Priority: j.Spec.Priority, Restarts: st.Restarts, NodeFailures: st.NodeFailures,
		Submitted: stamp(j.Spec.Submitted), Started: stamp(st.Started)}
	e.NumNodes = len(e.Nodes)
	if e.NumNodes == 0 {
		e.NumNodes = j.Spec.MinNodes
	}
	if n, since := j.IdleGPUs(); n > 0 {
		e.IdleGPUs, e.IdleSince = n, stamp(since)
	}
	if h := st.Hold(); st.Status == Pending && reason != "" && (h == HoldNone || h == HoldPreempted) {
		e.Reason = reason
	}
	if !st.Started.IsZero() {
		end := now
		if !st.Ended.IsZero() {
			end = st.Ended
		}
		e.Elapsed = int64(end.Sub(st.Started) / time.Second)
	}
	return e
}

// stamp is a time as the queue prints it (RFC 3339, UTC), "" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
