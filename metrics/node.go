package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// View reads the cluster's state for the metrics from the store, at most once per TTL
// however many scrapes and collectors ask: the allocator's snapshot (nodes, grants)
// and the jobs holding GPUs.
type View struct {
	s   store.Store
	ttl time.Duration

	mu    sync.Mutex
	at    time.Time
	snap  *allocator.Cluster
	err   error
	specs map[string]*job.Spec // grant id → its job's spec (nil: not a job: an allocation)
}

// NewView returns a view of s whose reads serve ttl (0: DefaultCacheTTL).
func NewView(s store.Store, ttl time.Duration) *View {
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	return &View{s: s, ttl: ttl, specs: map[string]*job.Spec{}}
}

// Cluster returns the allocator's snapshot, read afresh when the last read is older
// than the TTL.
func (v *View) Cluster(ctx context.Context) (*allocator.Cluster, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.snap == nil || time.Since(v.at) >= v.ttl {
		snap, err := allocator.Snapshot(ctx, v.s)
		v.at = time.Now()
		if err != nil {
			v.err = err
			return nil, err
		}
		v.snap, v.err = snap, nil
		// Forget the specs of grants that are gone.
		for id := range v.specs {
			if _, ok := snap.Grants[id]; !ok {
				delete(v.specs, id)
			}
		}
	}
	return v.snap, v.err
}

// spec returns the spec of the job whose grant is id (nil for an allocation's grant),
// read once per grant.
func (v *View) spec(ctx context.Context, id string) (*job.Spec, error) {
	v.mu.Lock()
	sp, ok := v.specs[id]
	v.mu.Unlock()
	if ok {
		return sp, nil
	}
	j, err := job.Read(ctx, v.s, id)
	switch {
	case errors.Is(err, job.ErrNotFound):
		sp = nil
	case err != nil:
		return nil, err
	default:
		sp = &j.Spec
	}
	v.mu.Lock()
	v.specs[id] = sp
	v.mu.Unlock()
	return sp, nil
}

// Holders returns the job holding each GPU of node (by NVML index): for a MIG GPU whose
// devices several jobs hold, the first by device order.
func (v *View) Holders(ctx context.Context, node string) (map[int]JobLabels, error) {
	c, err := v.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	n, ok := c.Nodes[node]
	if !ok {
		return nil, nil
	}
	out := map[int]JobLabels{}
	for _, d := range n.Record.Devices {
		id, held := n.Held[d.ID]
		if _, seen := out[d.GPU]; !held || seen {
			continue
		}
		sp, err := v.spec(ctx, id)
		if err != nil {
			return out, err
		}
		l := JobLabels{ID: id}
		if sp != nil {
			l.User, l.Name, l.IsJob = sp.User, sp.Name, true
		}
		out[d.GPU] = l
	}
	return out, nil
}

// nodeStates are the values of gangrun_node_state's state label.
func nodeStates() []allocator.NodeCondition {
	return []allocator.NodeCondition{allocator.NodeUp, allocator.NodeDrained, allocator.NodeDown}
}

// NodeCollector exports one node's state and GPU counts as the cluster's keys say.
type NodeCollector struct {
	view                     *View
	node                     string
	state, total, free, held *prometheus.Desc
	idle, up                 *prometheus.Desc
}

// NewNodeCollector returns the collector of node's metrics, read through view.
func NewNodeCollector(view *View, node string) *NodeCollector {
	l := []string{"node"}
	return &NodeCollector{view: view, node: node,
		state: prometheus.NewDesc("gangrun_node_state", "The node's state as `gangrun nodes` shows it: 1 for its state (up, drained, down), 0 for the others.", []string{"node", "state"}, nil),
		total: prometheus.NewDesc("gangrun_node_gpus_total", "The node's allocatable GPUs (or MIG devices).", l, nil),
		free:  prometheus.NewDesc("gangrun_node_gpus_free", "The node's GPUs no grant holds (0 while the node is down or drained).", l, nil),
		held:  prometheus.NewDesc("gangrun_node_gpus_held", "The node's GPUs a grant (a job's, an allocation's) holds.", l, nil),
		idle:  prometheus.NewDesc("gangrun_node_idle", "1 when the node is up and nothing is granted on it.", l, nil),
		up:    prometheus.NewDesc("gangrun_cluster_read_up", "1 when the last read of the cluster's state from Consul succeeded.", l, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *NodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.total, c.free, c.held, c.idle, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *NodeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	cl, err := c.view.Cluster(ctx)
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(err == nil), c.node)
	if err != nil {
		return
	}
	var st allocator.NodeStatus
	for _, n := range cl.NodeList() {
		if n.Name == c.node {
			st = n
		}
	}
	if st.Name == "" {
		return // not registered (yet)
	}
	for _, s := range nodeStates() {
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, boolValue(s == st.State), c.node, string(s))
	}
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(st.GPUsTotal), c.node)
	ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(st.GPUsFree), c.node)
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(st.GPUsUsed), c.node)
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, boolValue(st.State == allocator.NodeUp && st.GPUsUsed == 0), c.node)
}
