package bench

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestFabricFailedPairsAndSummary: the failed pairs of a fabric, and the line a node
// other than node rank 0 prints about its own pairs.
func TestFabricFailedPairsAndSummary(t *testing.T) {
	// 4096 bytes in 100 µs on 2 ranks: algbw 0.04096 GB/s, busbw × 2(2−1)/2 = the same.
	row, err := NewRow(AllReduce, 2, 4096, 1024, "float", "sum", -1, true, 100*time.Microsecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok := Result{Op: AllReduce, Ranks: 2, Rows: []Row{row}}
	f := &Fabric{Nodes: []Node{{Name: "node-a"}, {Name: "node-b"}, {Name: "node-c"}}, Rounds: 3, Pairs: []PairResult{
		{Pair: Pair{A: 1, B: 2}, Err: errors.New("exit code 1")},
		{Pair: Pair{A: 0, B: 1}, Result: ok},
	}}
	if got, want := f.FailedPairs(), []string{"node-b–node-c: exit code 1"}; !slices.Equal(got, want) {
		t.Errorf("FailedPairs = %q, want %q", got, want)
	}
	want := "pairwise sweep of 3 nodes done; node-b (node rank 1), busbw with node-c failed (exit code 1), node-a 0.04 GB/s; node rank 0 (node-a) prints the matrix"
	if got := f.NodeSummary(1); got != want {
		t.Errorf("NodeSummary(1) =\n%q, want\n%q", got, want)
	}
	f.Pairs = f.Pairs[1:]
	if got := f.FailedPairs(); got != nil {
		t.Errorf("FailedPairs of a fabric without failures = %q", got)
	}
}
