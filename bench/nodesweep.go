package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Defaults of a pairwise sweep across nodes (NodeSweep).
const (
	// DefaultPairTimeout bounds one pair's benchmark on each of its two nodes: joining
	// the pair's gang, running it and stopping it.
	DefaultPairTimeout = 10 * time.Minute
	// DefaultJoinTimeout bounds how long the nodes take to meet: torch's dynamic
	// rendezvous uses the same default for its join_timeout (600 s,
	// torch/distributed/elastic/rendezvous/dynamic_rendezvous.py).
	DefaultJoinTimeout = 10 * time.Minute
	// DefaultRoundGrace is how long past the pair timeout a node waits for the other
	// pairs of a round before it counts a pair with no outcome as failed.
	DefaultRoundGrace = time.Minute
)

// SweepPrefix is where pairwise sweeps keep their keys in the coordination store, one
// directory per job id. Under gangrun/bench/<job>/:
//
//	sweep                   the sweep: {"status": "gathering"}, then {"status": "ready",
//	                        "nodes": [...]} with the node list in node-rank order (node rank 0)
//	nodes/<node rank>       one node's check-in: {"name", "nics"} (each node)
//	pairs/<a>/<b>           a pair's outcome: {"round", "a", "b", "result"} or {..., "error"}
//	rounds/<round>/<a>/<b>  "ok" or "failed": the pair's outcome is published
//
// a and b are node names in sweep order; rounds count from 1. Node rank 0 deletes the
// job's directory when a sweep starts, so a job id may be used again; the keys of the
// last sweep stay for inspection (consul kv get -recurse gangrun/bench/<job>/).
const SweepPrefix = "gangrun/bench/"

// PairTask is one pair of a sweep across nodes, as one of its two nodes sees it.
type PairTask struct {
	// Round is the round the pair runs in, counting from 1.
	Round int
	// Pair indexes the sweep's node list; Self and Partner are this node and the other.
	Pair          Pair
	Self, Partner Node
	// JobID is the job id the pair's gang meets under: "<job>.r<round>.<a>-<b>", with a
	// and b the two nodes' places in the sweep (letters, digits, '-', '_' and '.' only,
	// as job ids allow).
	JobID string
}

// PairRunner runs this node's side of one pair: a gang of the two nodes whose ranks
// time the collective together. It returns the pair's result on the side that holds it
// (the pair gang's rank 0, which writes the results), nil and no error on the other
// side of a pair that succeeded, or the error that made the pair fail. ctx ends at the
// pair timeout, or as soon as the pair's outcome has been published by the other side;
// the runner then stops its workers and returns.
type PairRunner func(ctx context.Context, t PairTask) (*Result, error)

// NodeSweep is one node's part of a pairwise sweep that every node of the sweep runs
// at the same time, meeting in the coordination store (Consul; SweepPrefix gives the
// keys). The nodes first agree on who is in the sweep through a rendezvous round, which
// gives each its node rank; then they:
//
//  1. meet: node rank 0 clears the job's keys and opens the sweep, every node checks in
//     with its name and NICs, and node rank 0 publishes the node list in node-rank order;
//  2. play every round of Rounds(NNodes): a node with a partner in the round runs its
//     side of the pair (RunPair); the side that holds the result publishes it, a side
//     that failed publishes the error, and the first outcome published for a pair
//     stands. Then every node waits for every pair of the round (blocking queries),
//     so rounds do not overlap;
//  3. node rank 0 reads every pair's outcome into the Fabric (Sweep); the other nodes
//     read only their own pairs.
//
// Every wait is bounded: meeting by JoinTimeout; a pair by PairTimeout on each of its
// nodes (its outcome is then "no result within the pair timeout"); a round by
// PairTimeout + RoundGrace, after which a pair nobody published is recorded as failed.
type NodeSweep struct {
	// Store is the coordination store the nodes share.
	Store store.Store
	// JobID names the sweep; its keys go under SweepPrefix + JobID + "/". It follows
	// the rules of job ids: letters, digits, '-', '_' and '.'.
	JobID string
	// Self is this node: its name (unique in the sweep) and RDMA NICs.
	Self Node
	// NodeRank and NNodes come from the sweep's rendezvous round (its Assignment).
	NodeRank, NNodes int
	// Since is MarkSweep's index, read before this node joined the rendezvous round: a
	// sweep key no newer than it is left over from an earlier sweep of the job.
	Since uint64
	// RunPair runs this node's side of a pair.
	RunPair PairRunner
	// PairTimeout, JoinTimeout and RoundGrace bound the waits (see above);
	// DefaultPairTimeout, DefaultJoinTimeout and DefaultRoundGrace when zero.
	PairTimeout, JoinTimeout, RoundGrace time.Duration
	// OnRound, when non-nil, is called before each round with its number (from 1), the
	// number of rounds, its pairs and the sweep's nodes: for a progress line.
	OnRound func(round, rounds int, pairs []Pair, nodes []Node)
}

// MarkSweep returns the store index a node passes as NodeSweep.Since: the modify
// index of the job's sweep key, 0 when there is none. Call it before joining the
// sweep's rendezvous round.
func MarkSweep(ctx context.Context, s store.Store, jobID string) (uint64, error) {
	if err := validJobID(jobID); err != nil {
		return 0, err
	}
	e, err := s.Get(ctx, sweepKeys{jobID}.sweep())
	if err != nil {
		return 0, fmt.Errorf("pairwise sweep %s: read the sweep key: %w", jobID, err)
	}
	if e == nil {
		return 0, nil
	}
	return e.ModifyIndex, nil
}

// validJobID applies the rule of job ids (allocator.ValidName, rendezvous): letters,
// digits, '-', '_' and '.', so that a job id is one key segment.
func validJobID(id string) error {
	if id == "" {
		return errors.New("pairwise sweep: empty job id")
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("pairwise sweep: job id %q: only letters, digits, '-', '_' and '.' are allowed", id)
		}
	}
	return nil
}

// sweepKeys names the keys of one job's sweep.
type sweepKeys struct{ job string }

func (k sweepKeys) dir() string             { return SweepPrefix + k.job + "/" }
func (k sweepKeys) sweep() string           { return k.dir() + "sweep" }
func (k sweepKeys) nodes() string           { return k.dir() + "nodes/" }
func (k sweepKeys) node(rank int) string    { return k.nodes() + strconv.Itoa(rank) }
func (k sweepKeys) pair(a, b string) string { return k.dir() + "pairs/" + a + "/" + b }
func (k sweepKeys) round(r int) string      { return k.dir() + "rounds/" + strconv.Itoa(r) + "/" }
func (k sweepKeys) mark(r int, a, b string) string {
	return k.round(r) + a + "/" + b
}

// Sweep statuses, in the sweep key.
const (
	sweepGathering = "gathering" // node rank 0 opened the sweep; nodes check in
	sweepReady     = "ready"     // the node list is final
)

// sweepRecord is the sweep key.
type sweepRecord struct {
	Status string `json:"status"`
	NNodes int    `json:"nnodes"`
	Nodes  []Node `json:"nodes,omitempty"`
}

// checkIn is a node's nodes/<rank> key.
type checkIn struct {
	Node
	NodeRank int `json:"node_rank"`
}

// outcome is a pair's pairs/<a>/<b> key.
type outcome struct {
	Round  int     `json:"round"`
	A      string  `json:"a"`
	B      string  `json:"b"`
	Result *Result `json:"result,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// Marker values of rounds/<round>/<a>/<b>.
const (
	markOK     = "ok"
	markFailed = "failed"
)

func (n *NodeSweep) validate() error {
	if err := validJobID(n.JobID); err != nil {
		return err
	}
	switch {
	case n.Store == nil:
		return errors.New("pairwise sweep: no store")
	case n.RunPair == nil:
		return errors.New("pairwise sweep: no pair runner")
	case n.Self.Name == "":
		return errors.New("pairwise sweep: this node has no name")
	case n.NNodes < 2:
		return fmt.Errorf("pairwise sweep: %d nodes: need at least 2", n.NNodes)
	case n.NodeRank < 0 || n.NodeRank >= n.NNodes:
		return fmt.Errorf("pairwise sweep: node rank %d: want 0..%d", n.NodeRank, n.NNodes-1)
	case n.PairTimeout < 0 || n.JoinTimeout < 0 || n.RoundGrace < 0:
		return errors.New("pairwise sweep: negative timeout")
	}
	return nil
}

func (n *NodeSweep) keys() sweepKeys { return sweepKeys{n.JobID} }

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Run takes part in the sweep until its last round and returns the fabric: on node
// rank 0 every pair's outcome, on the other nodes only this node's own pairs. A pair
// that failed is a PairResult with Err, not an error; Run fails when the nodes do not
// meet within JoinTimeout, when the store cannot be reached, or when ctx ends.
func (n *NodeSweep) Run(ctx context.Context) (*Fabric, error) {
	if err := n.validate(); err != nil {
		return nil, err
	}
	nodes, err := n.meet(ctx)
	if err != nil {
		return nil, err
	}
	rounds := Rounds(len(nodes))
	if n.NodeRank == 0 {
		r := 0
		return Sweep(ctx, nodes, func(ctx context.Context, pairs []Pair) ([]PairResult, error) {
			r++
			if n.OnRound != nil {
				n.OnRound(r, len(rounds), pairs, nodes)
			}
			return n.round(ctx, r, pairs, nodes, true)
		}, nil)
	}
	f := &Fabric{Nodes: nodes, Rounds: len(rounds)}
	for i, pairs := range rounds {
		if n.OnRound != nil {
			n.OnRound(i+1, len(rounds), pairs, nodes)
		}
		got, err := n.round(ctx, i+1, pairs, nodes, false)
		if err != nil {
			return nil, fmt.Errorf("pairwise sweep, round %d of %d: %w", i+1, len(rounds), err)
		}
		f.Pairs = append(f.Pairs, got...)
	}
	return f, nil
}

// meet runs the sweep's opening: node rank 0 clears the job's keys and opens the
// sweep; every node checks in once the sweep is open; node rank 0 publishes the node
// list once all have. It returns the node list in node-rank order.
func (n *NodeSweep) meet(ctx context.Context) ([]Node, error) {
	timeout := orDefault(n.JoinTimeout, DefaultJoinTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	k := n.keys()
	fail := func(what string, err error) ([]Node, error) {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("pairwise sweep %s: %s: not done within the join timeout (%s)", n.JobID, what, timeout)
		}
		return nil, fmt.Errorf("pairwise sweep %s: %s: %w", n.JobID, what, err)
	}
	if n.NodeRank == 0 {
		b, _ := schema.Marshal(schema.BenchSweep, sweepRecord{Status: sweepGathering, NNodes: n.NNodes})
		if _, err := n.Store.Txn(ctx, []store.Op{
			{Verb: store.DeleteTree, Key: k.dir()},
			{Verb: store.Set, Key: k.sweep(), Value: b},
		}); err != nil {
			return fail("open the sweep", err)
		}
	}
	// Wait for this sweep's key: one newer than Since, which node rank 0 wrote after
	// the rendezvous round closed, hence after every node read Since.
	sw := store.NewWatcher(n.Store, k.sweep())
	rec, err := n.awaitSweep(ctx, sw, sweepGathering)
	if err != nil {
		return fail("wait for node rank 0 to open the sweep", err)
	}
	if rec.NNodes != n.NNodes {
		return nil, fmt.Errorf("pairwise sweep %s: node rank 0 opened a sweep of %d nodes, this node was told %d", n.JobID, rec.NNodes, n.NNodes)
	}
	b, _ := schema.Marshal(schema.BenchNode, checkIn{Node: n.Self, NodeRank: n.NodeRank})
	if _, err := n.Store.Txn(ctx, []store.Op{{Verb: store.Set, Key: k.node(n.NodeRank), Value: b}}); err != nil {
		return fail("check in", err)
	}
	if n.NodeRank == 0 {
		nodes, err := n.gather(ctx)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return nil, fmt.Errorf("pairwise sweep %s: node ranks %s never checked in within the join timeout (%s)", n.JobID, missingRanks(nodes), timeout)
		}
		if err != nil {
			return fail("gather the nodes", err)
		}
		b, _ := schema.Marshal(schema.BenchSweep, sweepRecord{Status: sweepReady, NNodes: n.NNodes, Nodes: nodes})
		if _, err := n.Store.Txn(ctx, []store.Op{{Verb: store.Set, Key: k.sweep(), Value: b}}); err != nil {
			return fail("publish the node list", err)
		}
	}
	if rec.Status != sweepReady {
		if rec, err = n.awaitSweep(ctx, sw, sweepReady); err != nil {
			return fail("wait for node rank 0 to publish the node list", err)
		}
	}
	if len(rec.Nodes) != n.NNodes || rec.Nodes[n.NodeRank].Name != n.Self.Name {
		return nil, fmt.Errorf("pairwise sweep %s: the published node list (%d nodes) does not have this node (%s) at node rank %d",
			n.JobID, len(rec.Nodes), n.Self.Name, n.NodeRank)
	}
	return rec.Nodes, nil
}

// awaitSweep waits until the sweep key is newer than Since and has reached status
// (gathering comes before ready).
func (n *NodeSweep) awaitSweep(ctx context.Context, w *store.Watcher, status string) (sweepRecord, error) {
	key := n.keys().sweep()
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return sweepRecord{}, err
		}
		for _, e := range entries {
			if e.Key != key || e.ModifyIndex <= n.Since {
				continue
			}
			var rec sweepRecord
			if err := schema.Unmarshal(schema.BenchSweep, e.Value, &rec); err != nil {
				return sweepRecord{}, fmt.Errorf("sweep key %s: %w", key, err)
			}
			if rec.Status == status || rec.Status == sweepReady {
				return rec, nil
			}
		}
	}
}

// gather waits until every node rank has checked in and returns the nodes in node-rank
// order (node rank 0 only); when it fails, the nodes that checked in so far.
func (n *NodeSweep) gather(ctx context.Context) ([]Node, error) {
	w := store.NewWatcher(n.Store, n.keys().nodes())
	nodes := make([]Node, n.NNodes)
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return nodes, err
		}
		for _, e := range entries {
			var c checkIn
			if err := schema.Unmarshal(schema.BenchNode, e.Value, &c); err != nil {
				return nil, fmt.Errorf("check-in %s: %w", e.Key, err)
			}
			if c.NodeRank < 0 || c.NodeRank >= n.NNodes || e.Key != n.keys().node(c.NodeRank) {
				return nil, fmt.Errorf("check-in %s: node rank %d out of 0..%d", e.Key, c.NodeRank, n.NNodes-1)
			}
			nodes[c.NodeRank] = c.Node
		}
		if missingRanks(nodes) == "" {
			seen := map[string]int{}
			for i, nd := range nodes {
				if j, dup := seen[nd.Name]; dup {
					return nil, fmt.Errorf("node name %s checked in at node ranks %d and %d", nd.Name, j, i)
				}
				seen[nd.Name] = i
			}
			return nodes, nil
		}
	}
}

// missingRanks lists the node ranks with no node yet, "" when none.
func missingRanks(nodes []Node) string {
	var m []string
	for i, nd := range nodes {
		if nd.Name == "" {
			m = append(m, strconv.Itoa(i))
		}
	}
	return strings.Join(m, ", ")
}

// pairJobID is the job id a pair's gang meets under.
func pairJobID(job string, round int, p Pair) string {
	return fmt.Sprintf("%s.r%d.%d-%d", job, round, p.A, p.B)
}

// round plays round r: this node's pair, if it has one, then the wait for every pair
// of the round. It returns the outcomes of every pair (all) or of this node's own.
func (n *NodeSweep) round(ctx context.Context, r int, pairs []Pair, nodes []Node, all bool) ([]PairResult, error) {
	pairTimeout := orDefault(n.PairTimeout, DefaultPairTimeout)
	grace := orDefault(n.RoundGrace, DefaultRoundGrace)
	deadline := time.Now().Add(pairTimeout + grace)
	for _, p := range pairs {
		if p.A == n.NodeRank || p.B == n.NodeRank {
			if err := n.play(ctx, r, p, nodes, pairTimeout); err != nil {
				return nil, err
			}
		}
	}
	// Wait for every pair of the round; one still silent at the deadline (both its
	// nodes gone) is recorded as failed, by whichever node gets there first.
	wctx, cancel := context.WithDeadline(ctx, deadline)
	missing, err := n.awaitRound(wctx, r, pairs, nodes)
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	for _, p := range missing {
		failure := fmt.Errorf("no outcome published within %s (the pair timeout plus %s): neither %s nor %s reported one",
			pairTimeout+grace, grace, nodes[p.A].Name, nodes[p.B].Name)
		if _, err := n.post(ctx, r, p, nodes, nil, failure); err != nil {
			return nil, err
		}
	}
	var out []PairResult
	for _, p := range pairs {
		if !all && p.A != n.NodeRank && p.B != n.NodeRank {
			continue
		}
		pr, err := n.read(ctx, p, nodes)
		if err != nil {
			return nil, err
		}
		out = append(out, pr)
	}
	return out, nil
}

// play runs this node's side of pair p and publishes its outcome when this side has
// one to give.
func (n *NodeSweep) play(ctx context.Context, r int, p Pair, nodes []Node, timeout time.Duration) error {
	self, partner := p.A, p.B
	if n.NodeRank == p.B {
		self, partner = p.B, p.A
	}
	t := PairTask{Round: r, Pair: p, Self: nodes[self], Partner: nodes[partner], JobID: pairJobID(n.JobID, r, p)}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Stop this side as soon as the pair's outcome is published (by the partner).
	published := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if n.awaitMark(pctx, r, p, nodes) == nil {
			close(published)
			cancel()
		}
	}()
	res, err := n.RunPair(pctx, t)
	timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
	cancel()
	<-watchDone
	select {
	case <-published:
		return nil // the partner's outcome stands
	default:
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if res == nil && err == nil {
		return nil // succeeded on the side without the result: the partner publishes
	}
	if err != nil && timedOut {
		err = fmt.Errorf("no result within the pair timeout (%s): the partner did not join the pair's gang, or the benchmark ran longer: %w", timeout, err)
	}
	_, perr := n.post(ctx, r, p, nodes, res, err)
	return perr
}

// post publishes pair p's outcome unless one is published already (the first stands).
// A result without rows (the operation unsupported by the backend) is published as a
// failure. It reports whether this outcome was the one published.
func (n *NodeSweep) post(ctx context.Context, r int, p Pair, nodes []Node, res *Result, failure error) (bool, error) {
	a, b := nodes[p.A].Name, nodes[p.B].Name
	o := outcome{Round: r, A: a, B: b, Result: res}
	if failure != nil {
		o.Result, o.Error = nil, failure.Error()
	} else if res != nil && len(res.Rows) == 0 {
		o.Result, o.Error = nil, fmt.Sprintf("%s gave no figure", opName(res.Op))
		if res.Unsupported != "" {
			o.Error = fmt.Sprintf("%s: %s", opName(res.Op), res.Unsupported)
		}
	}
	mark := markOK
	if o.Error != "" {
		mark = markFailed
	}
	val, err := schema.Marshal(schema.BenchPair, o)
	if err != nil {
		return false, fmt.Errorf("pair %s–%s: encode the outcome: %w", a, b, err)
	}
	k := n.keys()
	_, err = n.Store.Txn(ctx, []store.Op{
		{Verb: store.CheckNotExists, Key: k.mark(r, a, b)},
		{Verb: store.Set, Key: k.pair(a, b), Value: val},
		{Verb: store.Set, Key: k.mark(r, a, b), Value: []byte(mark)},
	})
	if errors.Is(err, store.ErrTxnRejected) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pair %s–%s: publish the outcome: %w", a, b, err)
	}
	return true, nil
}

// awaitMark waits until pair p's outcome of round r is published; it returns ctx's
// error when it is not.
func (n *NodeSweep) awaitMark(ctx context.Context, r int, p Pair, nodes []Node) error {
	key := n.keys().mark(r, nodes[p.A].Name, nodes[p.B].Name)
	w := store.NewWatcher(n.Store, key)
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(entries, func(e store.Entry) bool { return e.Key == key }) {
			return nil
		}
	}
}

// awaitRound waits until every pair of round r has published its outcome. When ctx
// reaches its deadline first, it returns the pairs still missing and no error; it fails
// when ctx is cancelled or the store cannot be read.
func (n *NodeSweep) awaitRound(ctx context.Context, r int, pairs []Pair, nodes []Node) ([]Pair, error) {
	k := n.keys()
	missing := func(entries []store.Entry) []Pair {
		have := map[string]bool{}
		for _, e := range entries {
			have[e.Key] = true
		}
		var m []Pair
		for _, p := range pairs {
			if !have[k.mark(r, nodes[p.A].Name, nodes[p.B].Name)] {
				m = append(m, p)
			}
		}
		return m
	}
	w := store.NewWatcher(n.Store, k.round(r))
	for {
		entries, err := w.Next(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			// The round's time is up: read what is there once more.
			entries, _, err = n.Store.List(context.WithoutCancel(ctx), k.round(r))
			if err != nil {
				return nil, fmt.Errorf("round %d: read the outcomes: %w", r, err)
			}
			return missing(entries), nil
		}
		if err != nil {
			return nil, err
		}
		if m := missing(entries); len(m) == 0 {
			return nil, nil
		}
	}
}

// read returns pair p's published outcome.
func (n *NodeSweep) read(ctx context.Context, p Pair, nodes []Node) (PairResult, error) {
	a, b := nodes[p.A].Name, nodes[p.B].Name
	e, err := n.Store.Get(ctx, n.keys().pair(a, b))
	if err != nil {
		return PairResult{}, fmt.Errorf("pair %s–%s: read the outcome: %w", a, b, err)
	}
	if e == nil {
		return PairResult{}, fmt.Errorf("pair %s–%s: marked done, but its outcome %s is missing", a, b, n.keys().pair(a, b))
	}
	var o outcome
	if err := schema.Unmarshal(schema.BenchPair, e.Value, &o); err != nil {
		return PairResult{}, fmt.Errorf("pair %s–%s: outcome %s: %w", a, b, e.Key, err)
	}
	pr := PairResult{Pair: p}
	switch {
	case o.Error != "":
		pr.Err = errors.New(o.Error)
	case o.Result == nil:
		pr.Err = errors.New("published without a result or an error")
	default:
		pr.Result = *o.Result
	}
	return pr, nil
}
