package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// NodeCondition is a node's state, as `gangrun nodes` shows it (like sinfo's STATE).
type NodeCondition string

// Node states, as `gangrun nodes` shows them (like sinfo's).
const (
	NodeUp      NodeCondition = "up"
	NodeDown    NodeCondition = "down"    // the agent's session is gone
	NodeDrained NodeCondition = "drained" // an administrator drained it
	// NodeInval: the node's record was written by a newer gangrun than this one
	// (schema.NewerError): nothing is known of its devices, and nothing is placed on it
	// by this scheduler. Slurm's sinfo shows "inval" for a node that registered with a
	// configuration slurmctld cannot take.
	NodeInval NodeCondition = "inval"
)

// NodeState is one node in a Cluster snapshot.
type NodeState struct {
	Record NodeRecord
	// Up is true while the node's agent holds its alive key; AliveSession is that
	// agent's session ("" when down).
	Up           bool
	AliveSession string
	// Drain is set when the node is drained.
	Drain *Drain
	// Held maps each held device ID to the grant holding it.
	Held map[string]string
	// UsedCPUs and UsedMemMiB are the CPUs and memory (MiB) the node's grants hold
	// (resources.go), granted or being committed.
	UsedCPUs   int
	UsedMemMiB int64
	// Newer is why the node's record could not be read: written by a newer gangrun
	// (a *schema.NewerError); nil otherwise. Record then holds the node's name only.
	Newer error
}

// State returns NodeInval, NodeUp, NodeDown or NodeDrained (inval wins over all, drained
// over up and down).
func (n *NodeState) State() NodeCondition {
	switch {
	case n.Newer != nil:
		return NodeInval
	case n.Drain != nil:
		return NodeDrained
	case n.Up:
		return NodeUp
	}
	return NodeDown
}

// Free returns the node's devices no grant holds, in device order.
func (n *NodeState) Free() []topology.Device {
	var out []topology.Device
	for _, d := range n.Record.Devices {
		if _, held := n.Held[d.ID]; !held {
			out = append(out, d)
		}
	}
	return out
}

// PendingRequest is a request and its arrival order.
type PendingRequest struct {
	Request
	// Arrival is the store index at which the request was written: arrival order.
	Arrival uint64
	// Alive is false when the request's key is no longer locked by its session (a job's
	// request, held by none, is alive while it exists).
	Alive bool
	// Index is the request key's ModifyIndex: a job's grant is committed only while the
	// request is as read.
	Index uint64
}

// Cluster is a snapshot of the allocator's keys.
type Cluster struct {
	Nodes    map[string]*NodeState
	Requests map[string]PendingRequest
	Grants   map[string]Grant
	// Orphans are GPU keys whose grant no longer exists (a release cut short): key →
	// the session holding it.
	Orphans map[string]string
	// Unknown are GPU keys on nodes that are not registered: key → grant id.
	Unknown map[string]string
	// Newer are the records under gangrun/cluster/ a newer gangrun wrote, which this one
	// cannot read: key → why (a *schema.NewerError). They are left alone: a request is
	// not placed, a grant not released nor its GPU keys taken for orphans, a node not
	// placed on (NodeState.Newer), a drain taken as draining the node.
	Newer map[string]error
	// Index is the store index of the snapshot.
	Index uint64
	// gpuIndex is each GPU key's ModifyIndex in the snapshot: a key deleted on the
	// snapshot's word is deleted only at that index, never after it was deleted and
	// locked again for another grant (a view a little old would otherwise take a GPU
	// from the job now holding it).
	gpuIndex map[string]uint64
}

// gpuDelete returns the operation that deletes GPU key k as c shows it: at its
// ModifyIndex in c, or unconditionally when c does not know it (a Cluster not read
// from the store).
func (c *Cluster) gpuDelete(k string) store.Op {
	if i := c.gpuIndex[k]; i != 0 {
		return store.Op{Verb: store.DeleteCAS, Key: k, Index: i}
	}
	return store.Op{Verb: store.Delete, Key: k}
}

// decodeCache keeps decoded records by key and ModifyIndex, so a scheduler pass decodes
// only the records that changed since the last one.
type decodeCache struct {
	m map[string]cachedRecord
}

type cachedRecord struct {
	modify uint64
	value  any
	err    error
}

func newDecodeCache() *decodeCache { return &decodeCache{m: map[string]cachedRecord{}} }

// parse is parseCluster with the cache; records no longer present are forgotten.
func (d *decodeCache) parse(entries []store.Entry, index uint64) *Cluster {
	seen := make(map[string]cachedRecord, len(d.m))
	c := parseClusterWith(entries, index, func(e store.Entry, k schema.Kind, v any) error {
		if r, ok := d.m[e.Key]; ok && r.modify == e.ModifyIndex {
			seen[e.Key] = r
			if r.err == nil {
				loadCached(v, r.value)
			}
			return r.err
		}
		err := schema.Unmarshal(k, e.Value, v)
		seen[e.Key] = cachedRecord{modify: e.ModifyIndex, value: storeCached(v), err: err}
		return err
	})
	d.m = seen
	return c
}

// storeCached returns the record v points to, by value (maps and slices shared: records
// are never modified once decoded).
func storeCached(v any) any {
	switch p := v.(type) {
	case *NodeRecord:
		return *p
	case *Request:
		return *p
	case *Grant:
		return *p
	case *Drain:
		return *p
	}
	return nil
}

// loadCached sets the record v points to from a value storeCached returned.
func loadCached(v, cached any) {
	switch p := v.(type) {
	case *NodeRecord:
		*p = cached.(NodeRecord)
	case *Request:
		*p = cached.(Request)
	case *Grant:
		*p = cached.(Grant)
	case *Drain:
		*p = cached.(Drain)
	}
}

// parseCluster builds a Cluster from every key under gangrun/cluster/. Keys that do not
// parse are ignored: a snapshot never fails on one bad record. Records a newer gangrun
// wrote are kept in Cluster.Newer.
func parseCluster(entries []store.Entry, index uint64) *Cluster {
	return parseClusterWith(entries, index, func(e store.Entry, k schema.Kind, v any) error { return schema.Unmarshal(k, e.Value, v) })
}

// parseClusterWith is parseCluster with decode(e, kind, &record) doing the decoding.
func parseClusterWith(entries []store.Entry, index uint64, decode func(e store.Entry, k schema.Kind, v any) error) *Cluster {
	c := &Cluster{Nodes: map[string]*NodeState{}, Requests: map[string]PendingRequest{},
		Grants: map[string]Grant{}, Orphans: map[string]string{}, Unknown: map[string]string{}, Newer: map[string]error{}, Index: index,
		gpuIndex: map[string]uint64{}}
	// newer notes a record a newer gangrun wrote, and reports whether err says so.
	newer := func(e store.Entry, err error) bool {
		if errors.Is(err, schema.ErrNewer) {
			c.Newer[e.Key] = err
			return true
		}
		return false
	}
	node := func(name string) *NodeState {
		n, ok := c.Nodes[name]
		if !ok {
			n = &NodeState{Held: map[string]string{}}
			c.Nodes[name] = n
		}
		return n
	}
	type held struct {
		node, dev, grant, session string
		index                     uint64
	}
	var gpus []held
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Key, nodesPrefix):
			var r NodeRecord
			name := strings.TrimPrefix(e.Key, nodesPrefix)
			switch err := decode(e, schema.Node, &r); {
			case newer(e, err):
				n := node(name)
				n.Record, n.Newer = NodeRecord{Name: name}, err
			case err == nil && r.Name == name:
				node(r.Name).Record = r
			}
		case strings.HasPrefix(e.Key, alivePrefix):
			if e.Session != "" {
				n := node(strings.TrimPrefix(e.Key, alivePrefix))
				n.Up, n.AliveSession = true, e.Session
			}
		case strings.HasPrefix(e.Key, drainPrefix):
			var d Drain
			switch err := decode(e, schema.Drain, &d); {
			case newer(e, err):
				// Drained for all this gangrun knows: placing work there could go
				// against what the drain says.
				d = Drain{Reason: err.Error()}
				node(strings.TrimPrefix(e.Key, drainPrefix)).Drain = &d
			case err == nil:
				node(strings.TrimPrefix(e.Key, drainPrefix)).Drain = &d
			}
		case strings.HasPrefix(e.Key, requestsPrefix):
			var r Request
			if err := decode(e, schema.Request, &r); err == nil {
				c.Requests[r.ID] = PendingRequest{Request: r, Arrival: e.CreateIndex, Alive: requestHeld(e, r), Index: e.ModifyIndex}
			} else {
				newer(e, err)
			}
		case strings.HasPrefix(e.Key, grantsPrefix):
			var g Grant
			if err := decode(e, schema.Grant, &g); err == nil {
				c.Grants[g.ID] = g
			} else {
				newer(e, err)
			}
		case strings.HasPrefix(e.Key, gpusPrefix):
			if n, d, ok := parseGPUKey(e.Key); ok && e.Session != "" {
				gpus = append(gpus, held{n, d, string(e.Value), e.Session, e.ModifyIndex})
			}
		}
	}
	for name, n := range c.Nodes {
		if n.Record.Name == "" {
			// Keys for a node that never registered (or was deregistered).
			delete(c.Nodes, name)
		}
	}
	for _, h := range gpus {
		key := gpuKey(h.node, h.dev)
		c.gpuIndex[key] = h.index
		if _, ok := c.Grants[h.grant]; !ok && c.Newer[grantsPrefix+h.grant] == nil {
			c.Orphans[key] = h.session
		}
		if n, ok := c.Nodes[h.node]; ok {
			n.Held[h.dev] = h.grant
		} else {
			c.Unknown[key] = h.grant
		}
	}
	c.countUsage()
	return c
}

// requestHeld reports whether request r, read from entry e, still stands: held by its
// requester's session, or, a job's durable request, held by none.
func requestHeld(e store.Entry, r Request) bool {
	if r.Durable() {
		return e.Session == ""
	}
	return e.Session != "" && e.Session == r.Session
}

// Snapshot reads the cluster's state with one consistent read.
func Snapshot(ctx context.Context, s store.Store) (*Cluster, error) {
	entries, idx, err := s.List(ctx, ClusterPrefix)
	if err != nil {
		return nil, err
	}
	return parseCluster(entries, idx), nil
}

// NodeStatus is one row of `gangrun nodes` (JSON fields are stable; docs/cluster.md, "Commands").
type NodeStatus struct {
	Name      string        `json:"name"`
	State     NodeCondition `json:"state"`
	GPUsTotal int           `json:"gpus_total"`
	GPUsFree  int           `json:"gpus_free"`
	// GPUsUsed counts the devices a grant holds (a job's or an allocation's), whatever
	// the node's state; Grants are the holding grants' ids (a job's grant id is the
	// job id), sorted.
	GPUsUsed int      `json:"gpus_used"`
	Grants   []string `json:"grants"`
	// CPUsTotal and MemoryMiB are the node's CPUs and memory (MiB), 0 when its record
	// does not know them; CPUsUsed and MemoryUsedMiB what its grants hold
	// (resources.go). A CPU-only grant holds no GPU but is among Grants.
	CPUsTotal     int               `json:"cpus_total,omitempty"`
	CPUsUsed      int               `json:"cpus_used,omitempty"`
	MemoryMiB     int64             `json:"memory_mib,omitempty"`
	MemoryUsedMiB int64             `json:"memory_used_mib,omitempty"`
	Labels        map[string]string `json:"labels"`
	Addr          string            `json:"addr,omitempty"`
	Model         string            `json:"gpu_model,omitempty"`
	// Reason is the drain reason, or for a node in state inval why its record could
	// not be read ("node record written by a newer gangrun (schema 2; this one reads up
	// to 1)").
	Reason string `json:"reason,omitempty"`
	// Auth is how the node's agent knows who submits jobs (NodeRecord.Auth).
	Auth string `json:"auth,omitempty"`
	// Version is the gangrun release of the node's agent (NodeRecord.Release); "" for an
	// agent that does not say (older than 0.1.0, or a record this gangrun cannot read).
	Version string `json:"version,omitempty"`
}

// NodeList lists the registered nodes, sorted by name. GPUsTotal counts allocatable
// devices; GPUsFree those no grant holds (0 on a node that is down or drained);
// GPUsUsed those a grant holds.
func (c *Cluster) NodeList() []NodeStatus {
	out := make([]NodeStatus, 0, len(c.Nodes))
	cpuOnly := c.cpuOnlyGrants()
	for _, n := range c.Nodes {
		st := NodeStatus{Name: n.Record.Name, State: n.State(), GPUsTotal: len(n.Record.Devices),
			Labels: n.Record.Labels, Addr: n.Record.Addr, Auth: n.Record.Auth, Version: n.Record.Release,
			CPUsTotal: n.Record.CPUs, CPUsUsed: n.UsedCPUs, MemoryMiB: n.Record.MemoryMiB, MemoryUsedMiB: n.UsedMemMiB}
		if st.Labels == nil {
			st.Labels = map[string]string{}
		}
		if st.State == NodeUp {
			st.GPUsFree = len(n.Free())
		}
		st.Grants = append([]string{}, cpuOnly[n.Record.Name]...)
		for _, d := range n.Record.Devices {
			if id, held := n.Held[d.ID]; held {
				st.GPUsUsed++
				if !slices.Contains(st.Grants, id) {
					st.Grants = append(st.Grants, id)
				}
			}
		}
		slices.Sort(st.Grants)
		if len(n.Record.Devices) > 0 {
			st.Model = n.Record.Devices[0].Model
		}
		if n.Drain != nil {
			st.Reason = n.Drain.Reason
		}
		if n.Newer != nil {
			// Its devices are unknown: what grants hold there is all that can be told.
			st.Reason = n.Newer.Error()
			for _, id := range n.Held {
				st.GPUsUsed++
				if !slices.Contains(st.Grants, id) {
					st.Grants = append(st.Grants, id)
				}
			}
			slices.Sort(st.Grants)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// QueueEntry is one row of `gangrun queue`: a grant or a pending request.
type QueueEntry struct {
	ID          string      `json:"id"`
	State       GrantState  `json:"state"` // "granted", "pending" (waiting), "refused"
	Nodes       int         `json:"nodes"`
	GPUsPerNode int         `json:"gpus_per_node"`
	Priority    int         `json:"priority"`
	Holder      string      `json:"holder"`
	Submitted   string      `json:"submitted"`
	Reason      string      `json:"reason,omitempty"`
	Granted     []GrantNode `json:"granted_nodes,omitempty"`
}

// Queue lists grants and pending requests: pending first in scheduling order
// (priority, then arrival), then grants by id. reasons are the scheduler's pending
// reasons (SchedulerStatus.Pending), may be nil.
func (c *Cluster) Queue(reasons map[string]string) []QueueEntry {
	var pending, granted []QueueEntry
	for _, r := range c.ordered() {
		g, hasGrant := c.Grants[r.ID]
		e := QueueEntry{ID: r.ID, Nodes: r.Nodes, GPUsPerNode: r.GPUsPerNode, Priority: r.Priority,
			Holder: r.Holder, Submitted: r.Submitted.UTC().Format("2006-01-02T15:04:05Z")}
		switch {
		case hasGrant && g.State == GrantGranted:
			e.State, e.Granted = GrantGranted, g.Nodes
			granted = append(granted, e)
		case hasGrant && g.State == GrantRefused:
			e.State, e.Reason = GrantRefused, g.Reason
			pending = append(pending, e)
		default:
			e.State, e.Reason = "pending", reasons[r.ID]
			pending = append(pending, e)
		}
	}
	sort.Slice(granted, func(i, j int) bool { return granted[i].ID < granted[j].ID })
	return append(pending, granted...)
}

// ordered returns live requests by --priority (higher first), then arrival, then id.
func (c *Cluster) ordered() []PendingRequest { return c.orderedBy(nil) }

// ReadStatus returns the scheduler's last published status (empty when none).
func ReadStatus(ctx context.Context, s store.Store) (SchedulerStatus, error) {
	var st SchedulerStatus
	e, err := s.Get(ctx, statusKey)
	if err != nil || e == nil {
		return st, err
	}
	if err := schema.Unmarshal(schema.Status, e.Value, &st); err != nil {
		return SchedulerStatus{}, fmt.Errorf("%s: %w", statusKey, err)
	}
	return st, nil
}

// Snapshotter builds Clusters from entries read under gangrun/cluster/ (a watch's),
// decoding only the records that changed since its last Parse (by ModifyIndex). Not safe
// for concurrent use.
type Snapshotter struct{ cache *decodeCache }

// NewSnapshotter returns an empty Snapshotter.
func NewSnapshotter() *Snapshotter { return &Snapshotter{cache: newDecodeCache()} }

// Parse returns the Cluster of entries (every key under ClusterPrefix) read at index.
// The records in it are shared with later Parses and must not be modified.
func (s *Snapshotter) Parse(entries []store.Entry, index uint64) *Cluster {
	return s.cache.parse(entries, index)
}

// RegisteredNodes reads the registered nodes' records only (no liveness, drains,
// requests, grants or GPU keys): what CheckFeasible needs, at a cost that does not grow
// with the queue. Every node in it is reported down.
func RegisteredNodes(ctx context.Context, s store.Store) (*Cluster, error) {
	entries, idx, err := s.List(ctx, nodesPrefix)
	if err != nil {
		return nil, err
	}
	return parseCluster(entries, idx), nil
}

// NodeRecords keeps the registered nodes' records between reads, for a caller that
// checks many requests (a long-lived submitter): Registered answers what
// RegisteredNodes would, and reads the records again only when a key under
// gangrun/cluster/nodes/ was written or deleted since (store.Keys: the same names at the
// same index), so that a submit costs a list of the node names instead of every record.
// Safe for concurrent use; the zero value is ready.
type NodeRecords struct {
	mu    sync.Mutex
	keys  []string
	index uint64
	c     *Cluster
}

// Registered returns the registered nodes, as RegisteredNodes reads them now: the
// records kept when nothing under gangrun/cluster/nodes/ changed since they were read,
// else those read again. The Cluster is shared with other callers and must not be
// modified.
func (r *NodeRecords) Registered(ctx context.Context, s store.Store) (*Cluster, error) {
	r.mu.Lock()
	kept, keys, index := r.c, r.keys, r.index
	r.mu.Unlock()
	if kept != nil {
		now, idx, err := s.Keys(ctx, nodesPrefix)
		if err != nil {
			return nil, err
		}
		if idx == index && slices.Equal(now, keys) {
			return kept, nil
		}
	}
	entries, idx, err := s.List(ctx, nodesPrefix)
	if err != nil {
		return nil, err
	}
	c := parseCluster(entries, idx)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Key
	}
	sort.Strings(names)
	r.mu.Lock()
	r.c, r.keys, r.index = c, names, idx // checked again at every use: the last read is kept
	r.mu.Unlock()
	return c, nil
}

// NodeAddr returns the address node's agent registered ("" when it has not registered
// or gave none).
func NodeAddr(ctx context.Context, s store.Store, node string) (string, error) {
	r, err := nodeRecord(ctx, s, node)
	if err != nil || r == nil {
		return "", err
	}
	return r.Addr, nil
}

// nodeRecord reads node's record; nil when it has not registered.
func nodeRecord(ctx context.Context, s store.Store, node string) (*NodeRecord, error) {
	e, err := s.Get(ctx, nodesPrefix+node)
	if err != nil || e == nil {
		return nil, err
	}
	var r NodeRecord
	if err := schema.Unmarshal(schema.Node, e.Value, &r); err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	return &r, nil
}

// NodeLabels returns the labels node's agent registered, or nil when it has not
// registered (a cluster without agents is fine: gangrun run works without them).
func NodeLabels(ctx context.Context, s store.Store, node string) (map[string]string, error) {
	r, err := nodeRecord(ctx, s, node)
	if err != nil || r == nil {
		return nil, err
	}
	return r.Labels, nil
}
