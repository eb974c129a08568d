package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRounds(t *testing.T) {
	for n := 0; n <= 17; n++ {
		rounds := Rounds(n)
		wantRounds := n - 1
		if n%2 == 1 {
			wantRounds = n
		}
		if n < 2 {
			wantRounds = 0
		}
		if len(rounds) != wantRounds {
			t.Errorf("Rounds(%d): %d rounds, want %d", n, len(rounds), wantRounds)
		}
		seen := map[Pair]int{}
		for r, round := range rounds {
			if len(round) != n/2 {
				t.Errorf("Rounds(%d) round %d: %d pairs, want %d", n, r, len(round), n/2)
			}
			busy := map[int]bool{}
			for _, p := range round {
				if p.A >= p.B || p.A < 0 || p.B >= n {
					t.Errorf("Rounds(%d) round %d: bad pair %v", n, r, p)
				}
				if busy[p.A] || busy[p.B] {
					t.Errorf("Rounds(%d) round %d: node in two pairs: %v", n, r, round)
				}
				busy[p.A], busy[p.B] = true, true
				seen[p]++
			}
		}
		if want := n * (n - 1) / 2; len(seen) != want && n >= 2 {
			t.Errorf("Rounds(%d): %d distinct pairs, want %d", n, len(seen), want)
		}
		for p, k := range seen {
			if k != 1 {
				t.Errorf("Rounds(%d): pair %v scheduled %d times", n, p, k)
			}
		}
	}
}

// simFabric simulates nodes whose pair benchmarks run all_reduce across 2 nodes of 8
// GPUs: a pair's busbw is the slower node's NIC speed times its link's factor.
type simFabric struct {
	nodeGBps map[string]float64    // per node
	linkMul  map[[2]string]float64 // per pair of names (sorted), default 1
	fail     map[[2]string]error
	nodes    []Node

	mu     sync.Mutex
	rounds [][]Pair
}

func (s *simFabric) run(ctx context.Context, round []Pair) ([]PairResult, error) {
	s.mu.Lock()
	s.rounds = append(s.rounds, round)
	s.mu.Unlock()
	var out []PairResult
	for _, p := range round {
		a, b := s.nodes[p.A].Name, s.nodes[p.B].Name
		key := [2]string{a, b}
		if err := s.fail[key]; err != nil {
			out = append(out, PairResult{Pair: Pair{p.B, p.A}, Err: err}) // reversed on purpose
			continue
		}
		mul, ok := s.linkMul[key]
		if !ok {
			mul = 1
		}
		bus := min(s.nodeGBps[a], s.nodeGBps[b]) * mul
		res := Result{Op: AllReduce, Ranks: 16}
		for _, size := range []int64{1 << 20, 1 << 26, 1 << 28} {
			f, _ := AllReduce.BusFactor(16)
			alg := bus / f
			// Small messages are latency-bound; only the largest reaches bus.
			if size < 1<<28 {
				alg /= 4
			}
			tm := time.Duration(float64(size) / (alg * GB) * float64(time.Second))
			row, err := NewRow(AllReduce, 16, size, size/4, "float", "sum", -1, false, tm, nil)
			if err != nil {
				return nil, err
			}
			res.Rows = append(res.Rows, row)
		}
		out = append(out, PairResult{Pair: p, Result: res})
	}
	return out, nil
}

func newSim(names ...string) *simFabric {
	s := &simFabric{nodeGBps: map[string]float64{}, linkMul: map[[2]string]float64{}, fail: map[[2]string]error{}}
	for i, n := range names {
		s.nodes = append(s.nodes, Node{Name: n, NICs: []string{fmt.Sprintf("mlx5_%d", i)}})
		s.nodeGBps[n] = 48
	}
	return s
}

func TestSweepDiagnose(t *testing.T) {
	cases := []struct {
		name  string
		nodes []string
		setup func(*simFabric)
		want  []string // "kind:nodes" of each finding
		note  bool
	}{
		{name: "healthy", nodes: []string{"n1", "n2", "n3", "n4"}, setup: func(*simFabric) {}},
		{name: "one slow node", nodes: []string{"n1", "n2", "n3", "n4"},
			setup: func(s *simFabric) { s.nodeGBps["n3"] = 24 }, want: []string{"node:n3"}},
		{name: "slightly slow node within threshold", nodes: []string{"n1", "n2", "n3", "n4"},
			setup: func(s *simFabric) { s.nodeGBps["n3"] = 40 }},
		{name: "one slow link", nodes: []string{"n1", "n2", "n3", "n4"},
			setup: func(s *simFabric) { s.linkMul[[2]string{"n2", "n4"}] = 0.5 }, want: []string{"link:n2–n4"}},
		{name: "failed link", nodes: []string{"n1", "n2", "n3", "n4", "n5"},
			setup: func(s *simFabric) { s.fail[[2]string{"n1", "n5"}] = errors.New("NCCL timeout") }, want: []string{"link:n1–n5"}},
		{name: "slow node and a slow link elsewhere", nodes: []string{"a", "b", "c", "d", "e", "f"},
			setup: func(s *simFabric) {
				s.nodeGBps["a"] = 10
				s.linkMul[[2]string{"c", "e"}] = 0.3
			}, want: []string{"node:a", "link:c–e"}},
		{name: "three nodes, one slow", nodes: []string{"x", "y", "z"},
			setup: func(s *simFabric) { s.nodeGBps["x"] = 20 }, want: []string{"node:x"}},
		{name: "two nodes", nodes: []string{"x", "y"}, setup: func(s *simFabric) { s.nodeGBps["x"] = 1 }, note: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(c.nodes...)
			c.setup(s)
			var calls []string
			f, err := Sweep(context.Background(), s.nodes, s.run, func(r, n int, pairs []Pair) {
				calls = append(calls, fmt.Sprintf("%d/%d:%d", r, n, len(pairs)))
			})
			if err != nil {
				t.Fatal(err)
			}
			n := len(c.nodes)
			if len(f.Pairs) != n*(n-1)/2 || len(s.rounds) != f.Rounds || len(calls) != f.Rounds {
				t.Fatalf("%d pairs in %d rounds (%d run, callbacks %v)", len(f.Pairs), f.Rounds, len(s.rounds), calls)
			}
			d, err := Diagnose(f, DefaultSlowThreshold)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, fd := range d.Slow {
				got = append(got, fd.Kind+":"+strings.Join(fd.Nodes, "–"))
				if fd.Below <= DefaultSlowThreshold || fd.Culprit == "" || len(fd.NICs) == 0 {
					t.Errorf("finding %+v: below %v, culprit %q, NICs %v", fd, fd.Below, fd.Culprit, fd.NICs)
				}
			}
			if strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Errorf("findings %v, want %v (median %v)", got, c.want, d.Median)
			}
			if (d.Note != "") != c.note {
				t.Errorf("note %q", d.Note)
			}
			for _, fd := range d.Slow {
				if fd.Kind == "node" && !strings.Contains(fd.Culprit, "NIC "+fd.NICs[0]) {
					t.Errorf("node culprit %q does not name its NIC %s", fd.Culprit, fd.NICs[0])
				}
			}
		})
	}
}

func TestFabricOutput(t *testing.T) {
	s := newSim("node-a", "node-b", "node-c", "node-d")
	s.nodeGBps["node-c"] = 12
	f, err := Sweep(context.Background(), s.nodes, s.run, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Diagnose(f, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := WriteFabric(&table, Table, AllReduce, f, d); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	for _, want := range []string{
		"            node-a    node-b    node-c    node-d\n",
		"node-a           -     48.00     12.00     48.00\n",
		"node-c       12.00     12.00         -     12.00\n",
		"# median 48.00 GB/s",
		"# SLOW node node-c: 12.00 GB/s, 75% below the median; node node-c: 3 of its 3 pairs are slow; likely its NIC mlx5_2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "SLOW") != 1 {
		t.Errorf("want one SLOW line:\n%s", out)
	}
	var js bytes.Buffer
	if err := WriteFabric(&js, JSON, AllReduce, f, d); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Nodes     []Node       `json:"nodes"`
		Matrix    [][]*float64 `json:"busbw_gbps"`
		Diagnosis Diagnosis    `json:"diagnosis"`
		Pairs     []struct {
			A, B  string
			Slow  bool
			BusBW float64 `json:"busbw_gbps"`
		} `json:"pairs"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON: %v\n%s", err, js.String())
	}
	if len(back.Matrix) != 4 || back.Matrix[0][0] != nil || *back.Matrix[0][2] != 12 || len(back.Pairs) != 6 || len(back.Diagnosis.Slow) != 1 {
		t.Errorf("JSON: %s", js.String())
	}
	slow := 0
	for _, p := range back.Pairs {
		if p.Slow {
			slow++
			if p.A != "node-c" && p.B != "node-c" {
				t.Errorf("pair %s–%s marked slow", p.A, p.B)
			}
		}
	}
	if slow != 3 {
		t.Errorf("%d slow pairs in JSON, want 3", slow)
	}
	var csvOut bytes.Buffer
	if err := WriteFabric(&csvOut, CSV, AllReduce, f, d); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(csvOut.String()), "\n"); len(lines) != 7 || lines[0] != "node_a,node_b,busbw_gbps,slow,error" {
		t.Errorf("CSV:\n%s", csvOut.String())
	}
}

func TestSweepErrors(t *testing.T) {
	s := newSim("a", "b", "c")
	ctx := context.Background()
	if _, err := Sweep(ctx, s.nodes[:1], s.run, nil); err == nil {
		t.Error("one node: no error")
	}
	if _, err := Sweep(ctx, []Node{{Name: "a"}, {Name: "a"}}, s.run, nil); err == nil {
		t.Error("duplicate names: no error")
	}
	boom := func(context.Context, []Pair) ([]PairResult, error) { return nil, errors.New("boom") }
	if _, err := Sweep(ctx, s.nodes, boom, nil); err == nil || !strings.Contains(err.Error(), "round 1 of 3: boom") {
		t.Errorf("runner error: %v", err)
	}
	missing := func(context.Context, []Pair) ([]PairResult, error) { return nil, nil }
	if _, err := Sweep(ctx, s.nodes, missing, nil); err == nil || !strings.Contains(err.Error(), "no result for pair") {
		t.Errorf("missing pair: %v", err)
	}
	stranger := func(context.Context, []Pair) ([]PairResult, error) { return []PairResult{{Pair: Pair{0, 7}}}, nil }
	if _, err := Sweep(ctx, s.nodes, stranger, nil); err == nil || !strings.Contains(err.Error(), "not in the round") {
		t.Errorf("stranger pair: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Sweep(cancelled, s.nodes, s.run, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	f, _ := Sweep(ctx, s.nodes, s.run, nil)
	for _, th := range []float64{0, 1, -0.1, 1.5} {
		if _, err := Diagnose(f, th); err == nil {
			t.Errorf("threshold %v: no error", th)
		}
	}
}
