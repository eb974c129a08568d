package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// simResult is the result a simulated pair reports: one all_reduce row of 1 MiB whose
// busbw is busbw.
func simResult(busbw float64) *Result {
	return &Result{Op: AllReduce, Ranks: 2, Rows: []Row{{Op: AllReduce, SizeBytes: 1 << 20, BusBW: busbw, AlgBW: busbw}}}
}

// sweepNodes runs n simulated nodes of job through NodeSweep.Run at once, each with
// its own runner from runner(node rank), and returns their fabrics and errors by node
// rank. Every node reads MarkSweep before any runs, as each does before its rendezvous.
func sweepNodes(t *testing.T, s store.Store, job string, n int, tune func(*NodeSweep), runner func(rank int) PairRunner) ([]*Fabric, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	since, err := MarkSweep(ctx, s, job)
	if err != nil {
		t.Fatal(err)
	}
	fabrics, errs := make([]*Fabric, n), make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		ns := &NodeSweep{Store: s, JobID: job, Self: Node{Name: fmt.Sprintf("n%d", i), NICs: []string{fmt.Sprintf("mlx5_%d", i)}},
			NodeRank: i, NNodes: n, Since: since, RunPair: runner(i), PairTimeout: 20 * time.Second, RoundGrace: time.Second}
		if tune != nil {
			tune(ns)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			fabrics[i], errs[i] = ns.Run(ctx)
		}(i)
	}
	wg.Wait()
	return fabrics, errs
}

// figureOf is the simulated fabric: 10 GB/s between any two nodes, 4 GB/s for every
// pair with slow (when slow >= 0).
func figureOf(slow int) func(a, b string) float64 {
	return func(a, b string) float64 {
		s := fmt.Sprintf("n%d", slow)
		if a == s || b == s {
			return 4
		}
		return 10
	}
}

// holder says which side of a simulated pair holds its result: the name that sorts first.
func holder(t PairTask) bool { return t.Self.Name < t.Partner.Name }

func TestNodeSweepAcrossNodes(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		const n = 5
		for run, slow := range []int{3, -1} { // a second sweep of the same job id starts afresh
			figure := figureOf(slow)
			var mu sync.Mutex
			var problems []string
			runner := func(rank int) PairRunner {
				return func(_ context.Context, task PairTask) (*Result, error) {
					// Rounds do not overlap: every pair of the previous round is published.
					if task.Round > 1 {
						// (Not ctx: the partner's published outcome may have ended it already.)
						entries, _, err := s.List(context.Background(), fmt.Sprintf("%sjob/rounds/%d/", SweepPrefix, task.Round-1))
						if want := len(Rounds(n)[task.Round-2]); err != nil || len(entries) != want {
							mu.Lock()
							problems = append(problems, fmt.Sprintf("round %d started with %d of %d outcomes of round %d published (%v)", task.Round, len(entries), want, task.Round-1, err))
							mu.Unlock()
						}
					}
					if want := fmt.Sprintf("job.r%d.%d-%d", task.Round, task.Pair.A, task.Pair.B); task.JobID != want || task.Self.Name != fmt.Sprintf("n%d", rank) {
						mu.Lock()
						problems = append(problems, fmt.Sprintf("node %d: task %+v, want job id %s", rank, task, want))
						mu.Unlock()
					}
					if !holder(task) {
						return nil, nil
					}
					return simResult(figure(task.Self.Name, task.Partner.Name)), nil
				}
			}
			fabrics, errs := sweepNodes(t, s, "job", n, nil, runner)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("sweep %d, node %d: %v", run, i, err)
				}
			}
			for _, p := range problems {
				t.Error(p)
			}
			f := fabrics[0]
			if len(f.Nodes) != n || f.Rounds != 5 || len(f.Pairs) != n*(n-1)/2 {
				t.Fatalf("sweep %d: node rank 0's fabric: %d nodes, %d rounds, %d pairs", run, len(f.Nodes), f.Rounds, len(f.Pairs))
			}
			for i, nd := range f.Nodes {
				if nd.Name != fmt.Sprintf("n%d", i) || len(nd.NICs) != 1 || nd.NICs[0] != fmt.Sprintf("mlx5_%d", i) {
					t.Errorf("sweep %d: node %d is %+v", run, i, nd)
				}
			}
			m := f.Matrix()
			for i := 0; i < n; i++ {
				for j := 0; j < n; j++ {
					want := figure(f.Nodes[i].Name, f.Nodes[j].Name)
					if i == j {
						want = math.NaN()
					}
					if got := m[i][j]; !(got == want || math.IsNaN(got) && math.IsNaN(want)) {
						t.Errorf("sweep %d: matrix[%d][%d] = %v, want %v", run, i, j, got, want)
					}
				}
			}
			d, err := Diagnose(f, DefaultSlowThreshold)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case slow >= 0 && (len(d.Slow) != 1 || d.Slow[0].Kind != "node" || d.Slow[0].Nodes[0] != "n3" || d.Slow[0].NICs[0] != "mlx5_3"):
				t.Errorf("sweep %d: diagnosis %+v, want node n3 (NIC mlx5_3) alone", run, d.Slow)
			case slow < 0 && len(d.Slow) != 0:
				t.Errorf("sweep %d: diagnosis %+v, want nothing slow", run, d.Slow)
			}
			// The other nodes hold their own n-1 pairs.
			for i := 1; i < n; i++ {
				if len(fabrics[i].Pairs) != n-1 {
					t.Errorf("sweep %d: node %d holds %d pairs, want its %d", run, i, len(fabrics[i].Pairs), n-1)
				}
				for _, pr := range fabrics[i].Pairs {
					a, b := fabrics[i].Nodes[pr.Pair.A].Name, fabrics[i].Nodes[pr.Pair.B].Name
					if pr.Pair.A != i && pr.Pair.B != i || pr.Err != nil || pr.Figure() != figure(a, b) {
						t.Errorf("sweep %d: node %d holds pair %s–%s: %v GB/s, err %v", run, i, a, b, pr.Figure(), pr.Err)
					}
				}
			}
		}
	})
}

// TestNodeSweepFailedPair: one side of a pair fails at once while the other waits for
// it (as a node waits for its partner to join the pair's gang): the failure is
// published, the waiting side is released by it rather than by the pair timeout, and
// the other pairs are unaffected.
func TestNodeSweepFailedPair(t *testing.T) {
	s := store.NewMemory()
	var mu sync.Mutex
	var waiterErr error
	runner := func(rank int) PairRunner {
		return func(ctx context.Context, task PairTask) (*Result, error) {
			switch {
			case task.Self.Name == "n2" && task.Partner.Name == "n1":
				return nil, errors.New("rank 2 on n2: exit code 1")
			case task.Self.Name == "n1" && task.Partner.Name == "n2":
				<-ctx.Done()
				mu.Lock()
				waiterErr = ctx.Err()
				mu.Unlock()
				return nil, errors.New("stopped")
			case holder(task):
				return simResult(10), nil
			}
			return nil, nil
		}
	}
	fabrics, errs := sweepNodes(t, s, "job", 3, func(ns *NodeSweep) { ns.PairTimeout = 50 * time.Second }, runner)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	if !errors.Is(waiterErr, context.Canceled) {
		t.Errorf("n1's side ended with %v, want context.Canceled (released by n2's published failure)", waiterErr)
	}
	f := fabrics[0]
	if len(f.Pairs) != 3 {
		t.Fatalf("%d pairs, want 3", len(f.Pairs))
	}
	for _, pr := range f.Pairs {
		a, b := f.Nodes[pr.Pair.A].Name, f.Nodes[pr.Pair.B].Name
		if a == "n1" && b == "n2" {
			if pr.Err == nil || pr.Err.Error() != "rank 2 on n2: exit code 1" {
				t.Errorf("pair n1–n2: err %v, want n2's failure", pr.Err)
			}
		} else if pr.Err != nil || pr.Figure() != 10 {
			t.Errorf("pair %s–%s: %v GB/s, err %v", a, b, pr.Figure(), pr.Err)
		}
	}
	// n1 and n2 each see the failed pair among their own.
	for _, i := range []int{1, 2} {
		failed := 0
		for _, pr := range fabrics[i].Pairs {
			if pr.Err != nil {
				failed++
			}
		}
		if failed != 1 {
			t.Errorf("node n%d sees %d failed pairs of its own, want 1", i, failed)
		}
	}
}

// TestNodeSweepTimeouts: a pair whose sides never finish fails at the pair timeout; a
// pair nobody reports (both nodes claim the other holds the result) fails at the
// round's deadline; a result without rows is a failure; the sweep still completes.
func TestNodeSweepTimeouts(t *testing.T) {
	s := store.NewMemory()
	runner := func(rank int) PairRunner {
		return func(ctx context.Context, task PairTask) (*Result, error) {
			names := task.Self.Name + task.Partner.Name
			switch {
			case names == "n0n1" || names == "n1n0":
				<-ctx.Done()
				return nil, errors.New("stopped")
			case names == "n0n2" || names == "n2n0":
				return nil, nil
			case holder(task):
				return &Result{Op: AllReduce, Ranks: 2, Unsupported: "not supported by backend gloo"}, nil
			}
			return nil, nil
		}
	}
	fabrics, errs := sweepNodes(t, s, "job", 3, func(ns *NodeSweep) {
		ns.PairTimeout, ns.RoundGrace = 300*time.Millisecond, 300*time.Millisecond
	}, runner)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	want := map[string]string{
		"n0–n1": "no result within the pair timeout (300ms): the partner did not join the pair's gang, or the benchmark ran longer: stopped",
		"n0–n2": "no outcome published within 600ms (the pair timeout plus 300ms): neither n0 nor n2 reported one",
		"n1–n2": "all_reduce: not supported by backend gloo",
	}
	f := fabrics[0]
	for _, pr := range f.Pairs {
		name := f.Nodes[pr.Pair.A].Name + "–" + f.Nodes[pr.Pair.B].Name
		if pr.Err == nil || pr.Err.Error() != want[name] {
			t.Errorf("pair %s: err %v, want %q", name, pr.Err, want[name])
		}
	}
	if len(f.Pairs) != 3 {
		t.Errorf("%d pairs, want 3", len(f.Pairs))
	}
}

// TestNodeSweepMeetTimeout: a node of the rendezvous round that never checks in stops
// the sweep at the join timeout with an error naming its node rank.
func TestNodeSweepMeetTimeout(t *testing.T) {
	s := store.NewMemory()
	ctx := context.Background()
	since, err := MarkSweep(ctx, s, "job")
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		ns := &NodeSweep{Store: s, JobID: "job", Self: Node{Name: fmt.Sprintf("n%d", i)}, NodeRank: i, NNodes: 3, Since: since,
			JoinTimeout: 300 * time.Millisecond, RunPair: func(context.Context, PairTask) (*Result, error) { return nil, nil }}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = ns.Run(ctx)
		}(i)
	}
	wg.Wait()
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "node ranks 2 never checked in within the join timeout (300ms)") {
		t.Errorf("node rank 0: %v", errs[0])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "wait for node rank 0 to publish the node list: not done within the join timeout (300ms)") {
		t.Errorf("node rank 1: %v", errs[1])
	}
}

// TestNodeSweepIgnoresAnEarlierSweep: keys left by an earlier sweep of the job (a
// ready sweep key with other nodes, outcomes) are not taken for this sweep's.
func TestNodeSweepIgnoresAnEarlierSweep(t *testing.T) {
	s := store.NewMemory()
	ctx := context.Background()
	k := sweepKeys{"job"}
	stale := `{"status":"ready","nnodes":2,"nodes":[{"name":"old0"},{"name":"old1"}]}`
	if _, err := s.Txn(ctx, []store.Op{
		{Verb: store.Set, Key: k.sweep(), Value: []byte(stale)},
		{Verb: store.Set, Key: k.mark(1, "n0", "n1"), Value: []byte(markFailed)},
		{Verb: store.Set, Key: k.pair("n0", "n1"), Value: []byte(`{"round":1,"a":"n0","b":"n1","error":"stale"}`)},
	}); err != nil {
		t.Fatal(err)
	}
	fabrics, errs := sweepNodes(t, s, "job", 2, nil, func(int) PairRunner {
		return func(_ context.Context, task PairTask) (*Result, error) {
			if holder(task) {
				return simResult(7), nil
			}
			return nil, nil
		}
	})
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("errors %v", errs)
	}
	f := fabrics[0]
	if len(f.Pairs) != 1 || f.Pairs[0].Err != nil || f.Pairs[0].Figure() != 7 || f.Nodes[0].Name != "n0" {
		t.Fatalf("fabric %+v, want this sweep's n0–n1 at 7 GB/s", f)
	}
}

func TestNodeSweepRejectsBadConfig(t *testing.T) {
	run := func(context.Context, PairTask) (*Result, error) { return nil, nil }
	good := NodeSweep{Store: store.NewMemory(), JobID: "job", Self: Node{Name: "a"}, NNodes: 2, RunPair: run}
	for _, tc := range []struct {
		name string
		edit func(*NodeSweep)
		want string
	}{
		{"job id with a slash", func(n *NodeSweep) { n.JobID = "a/b" }, `job id "a/b": only letters`},
		{"empty job id", func(n *NodeSweep) { n.JobID = "" }, "empty job id"},
		{"one node", func(n *NodeSweep) { n.NNodes = 1 }, "1 nodes: need at least 2"},
		{"node rank out of range", func(n *NodeSweep) { n.NodeRank = 2 }, "node rank 2: want 0..1"},
		{"no runner", func(n *NodeSweep) { n.RunPair = nil }, "no pair runner"},
		{"no name", func(n *NodeSweep) { n.Self.Name = "" }, "no name"},
		{"negative timeout", func(n *NodeSweep) { n.PairTimeout = -time.Second }, "negative timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := good
			tc.edit(&ns)
			_, err := ns.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := MarkSweep(context.Background(), store.NewMemory(), "a/b"); err == nil {
		t.Error("MarkSweep accepted job id a/b")
	}
}
