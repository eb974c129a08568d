package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// pairwiseOutput is `bench nccl --pairwise --json` on node rank 0 (bench.WriteFabric).
type pairwiseOutput struct {
	Op        string          `json:"op"`
	Nodes     []bench.Node    `json:"nodes"`
	Rounds    int             `json:"rounds"`
	Matrix    [][]*float64    `json:"busbw_gbps"`
	Diagnosis bench.Diagnosis `json:"diagnosis"`
	Pairs     []struct {
		A      string        `json:"a"`
		B      string        `json:"b"`
		BusBW  float64       `json:"busbw_gbps"`
		Slow   bool          `json:"slow"`
		Error  string        `json:"error"`
		Result *bench.Result `json:"result"`
	} `json:"pairs"`
}

// TestBenchPairwiseAcrossNodes runs `gangrun bench nccl --pairwise` as three gangrun
// processes standing in for three nodes, against a real Consul agent, each pair a gang
// of two gloo workers. Then it sweeps again under the same job id with node-c's gloo
// pointed at an interface that does not exist, so both its pairs fail.
func TestBenchPairwiseAcrossNodes(t *testing.T) {
	consul := consultest.Start(t).Addr
	mark := testMark(t)
	names := []string{"node-a", "node-b", "node-c"}
	sweep := func(extra map[string][]string) (map[string]*gangrunNode, string) {
		t.Helper()
		nodes := map[string]*gangrunNode{}
		for _, name := range names {
			args := append([]string{"bench", "nccl", "--pairwise", "--coordinator", "consul://" + consul, "--job-id", "sweep",
				"--nnodes", "3", "--node-name", name, "--advertise-addr", "127.0.0.1", "--nproc-per-node", "1",
				"--python", python(t), "--backend", "gloo", "--min-bytes", "1K", "--max-bytes", "4K", "--iters", "2", "--warmup", "1",
				"--json"}, extra[name]...)
			nodes[name] = startNode(t, name, []string{mark}, args...)
		}
		for _, n := range nodes {
			n.wait(t, 2*time.Minute)
		}
		// Exactly one node, node rank 0, prints the matrix.
		rank0 := ""
		for name, n := range nodes {
			if n.stdout.String() != "" {
				if rank0 != "" {
					t.Fatalf("%s and %s both printed results:\n%s\n%s", rank0, name, nodes[rank0].output(), n.output())
				}
				rank0 = name
			}
		}
		if rank0 == "" {
			for _, n := range nodes {
				t.Log(n.name, n.output())
			}
			t.Fatal("no node printed the matrix")
		}
		return nodes, rank0
	}

	t.Run("every pair measured", func(t *testing.T) {
		nodes, rank0 := sweep(nil)
		for name, n := range nodes {
			if n.code != 0 {
				t.Errorf("%s exited %d\n%s", name, n.code, n.output())
			}
			if name != rank0 && !strings.Contains(n.stderr.String(), "pairwise sweep of 3 nodes done; "+name) {
				t.Errorf("%s: no summary of its pairs on stderr:\n%s", name, n.output())
			}
		}
		var out pairwiseOutput
		if err := json.Unmarshal([]byte(nodes[rank0].stdout.String()), &out); err != nil {
			t.Fatalf("node rank 0's output is not the fabric's JSON: %v\n%s", err, nodes[rank0].stdout.String())
		}
		var got []string
		for _, n := range out.Nodes {
			got = append(got, n.Name)
		}
		if out.Op != "all_reduce" || out.Rounds != 3 || len(out.Pairs) != 3 || out.Nodes[0].Name != rank0 || !sameNames(got, names) {
			t.Fatalf("op %s, %d rounds, %d pairs, nodes %v (node rank 0 %s)", out.Op, out.Rounds, len(out.Pairs), got, rank0)
		}
		index := map[string]int{}
		for i, n := range out.Nodes {
			index[n.Name] = i
		}
		for _, p := range out.Pairs {
			if p.Error != "" || p.Result == nil {
				t.Errorf("pair %s–%s failed: %s", p.A, p.B, p.Error)
				continue
			}
			// Every pair is a gang of two ranks that timed 1K, 2K and 4K, and its figure is
			// the busbw of its largest size.
			var sizes []int64
			for _, row := range p.Result.Rows {
				sizes = append(sizes, row.SizeBytes)
			}
			peak, _ := p.Result.PeakBusBW()
			if p.Result.Ranks != 2 || !slices.Equal(sizes, []int64{1024, 2048, 4096}) || p.BusBW <= 0 || p.BusBW != peak {
				t.Errorf("pair %s–%s: ranks %d, sizes %v, busbw %v (peak of its rows %v)", p.A, p.B, p.Result.Ranks, sizes, p.BusBW, peak)
			}
			for _, c := range [][2]int{{index[p.A], index[p.B]}, {index[p.B], index[p.A]}} {
				if v := out.Matrix[c[0]][c[1]]; v == nil || *v != p.BusBW {
					t.Errorf("matrix[%d][%d] = %v, want %v", c[0], c[1], v, p.BusBW)
				}
			}
		}
		for i := range out.Matrix {
			if out.Matrix[i][i] != nil {
				t.Errorf("matrix[%d][%d] = %v, want null", i, i, *out.Matrix[i][i])
			}
		}
		// The outcomes are where docs/bench.md says.
		s, err := store.NewConsul(consul)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		entries, _, err := s.List(context.Background(), "gangrun/bench/sweep/pairs/")
		if err != nil || len(entries) != 3 {
			t.Errorf("%d outcomes under gangrun/bench/sweep/pairs/ (%v), want 3", len(entries), err)
		}
		for _, e := range entries {
			var o struct {
				A, B   string
				Result *bench.Result
			}
			if err := json.Unmarshal(e.Value, &o); err != nil || o.Result == nil || e.Key != "gangrun/bench/sweep/pairs/"+o.A+"/"+o.B {
				t.Errorf("%s: %s (%v)", e.Key, e.Value, err)
			}
		}
	})

	t.Run("a node whose pairs fail", func(t *testing.T) {
		nodes, rank0 := sweep(map[string][]string{"node-c": {"--env", "GLOO_SOCKET_IFNAME=gangrun-no-such-if0",
			"--topology-file", filepath.Join(inventories, "pcie-2socket.json")}})
		// Every node took part in a failed pair (each has one with node-c): exit 1.
		for name, n := range nodes {
			if n.code != 1 {
				t.Errorf("%s exited %d, want 1\n%s", name, n.code, n.output())
			}
		}
		var out pairwiseOutput
		if err := json.Unmarshal([]byte(nodes[rank0].stdout.String()), &out); err != nil {
			t.Fatalf("node rank 0's output is not the fabric's JSON: %v\n%s", err, nodes[rank0].output())
		}
		for _, p := range out.Pairs {
			withC := p.A == "node-c" || p.B == "node-c"
			if withC != (p.Error != "") || withC != p.Slow {
				t.Errorf("pair %s–%s: error %q, slow %v", p.A, p.B, p.Error, p.Slow)
			}
			// The error names the first worker gangrun saw die. node-c's worker fails
			// first, but when it is the pair's rank 0 its death closes the TCPStore and
			// the partner's worker may be reaped before it: either node of the pair can
			// be named. Finding node-c is the matrix diagnosis's job, checked below.
			if withC && !strings.Contains(p.Error, "on "+p.A+": exit code 1") && !strings.Contains(p.Error, "on "+p.B+": exit code 1") {
				t.Errorf("pair %s–%s: error %q, want a worker of the pair as the root cause", p.A, p.B, p.Error)
			}
		}
		slow := out.Diagnosis.Slow
		if len(slow) != 1 || slow[0].Kind != "node" || slow[0].Nodes[0] != "node-c" || !slices.Equal(slow[0].NICs, []string{"mlx5_0", "mlx5_1"}) {
			t.Errorf("diagnosis %+v, want node-c alone, with its NICs mlx5_0 and mlx5_1", slow)
		}
		if !strings.Contains(nodes[rank0].stderr.String(), "2 of 3 pairs failed") {
			t.Errorf("node rank 0 does not say which pairs failed:\n%s", nodes[rank0].output())
		}
	})
}

// sameNames reports whether got holds the names of want, in any order.
func sameNames(got, want []string) bool {
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// TestBenchPairwiseNodeAlone: a node whose partners never come ends at --join-timeout
// with a one-line error (exit 1), and one told to stop while it waits exits 128+15.
func TestBenchPairwiseNodeAlone(t *testing.T) {
	consul := consultest.Start(t).Addr
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	args := func(job string, extra ...string) []string {
		return append([]string{"bench", "nccl", "--pairwise", "--coordinator", "consul://" + consul, "--job-id", job,
			"--nnodes", "2", "--node-name", "node-a", "--advertise-addr", "127.0.0.1", "--nproc-per-node", "1",
			"--python", python(t), "--backend", "gloo"}, extra...)
	}
	t.Run("join timeout", func(t *testing.T) {
		n := startNode(t, "node-a", nil, args("alone", "--join-timeout", "1s")...)
		if code := n.wait(t, time.Minute); code != 1 ||
			!strings.Contains(n.stderr.String(), "gangrun bench nccl: pairwise sweep alone: the nodes did not meet within --join-timeout 1s (--nnodes 2:2)") {
			t.Errorf("exit %d\n%s", code, n.output())
		}
	})
	t.Run("SIGTERM", func(t *testing.T) {
		n := startNode(t, "node-a", nil, args("stopped")...)
		waitUntilFor(t, 30*time.Second, func() bool {
			e, err := s.Get(context.Background(), "gangrun/jobs/stopped/members/node-a")
			return err == nil && e != nil
		}, "node-a waiting in the sweep's rendezvous")
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := n.wait(t, 30*time.Second); code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit %d, want %d\n%s", code, 128+int(syscall.SIGTERM), n.output())
		}
	})
}
