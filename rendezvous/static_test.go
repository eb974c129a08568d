package rendezvous

import (
	"context"
	"errors"
	"testing"
)

// TestStaticStoreRound: a node other than node rank 0 asks JoinRequest.StoreRound for
// node rank 0's store at MASTER_ADDR:MASTER_PORT, newer each attempt than its last
// (-1 first), and takes the count it returns as its restart count; node rank 0 never
// asks; an error of the wait is Join's.
func TestStaticStoreRound(t *testing.T) {
	ctx := context.Background()
	env := SlurmEnv{JobID: "42", Nodes: []string{"n1", "n2"}, NodeID: 1, GPUsOnNode: -1}
	s := NewStatic(env, "42", 3)
	var asked []int
	counts := []int{0, 2}
	req := JoinRequest{LocalWorldSize: 2, StoreRound: func(_ context.Context, master string, after int) (int, error) {
		if master != "n1:20042" {
			t.Errorf("StoreRound asked at %q, want n1:20042", master)
		}
		asked = append(asked, after)
		n := counts[0]
		counts = counts[1:]
		return n, nil
	}}
	for i, want := range []int{0, 2} {
		r, err := s.Join(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if a := r.Assignment(); a.RestartCount != want || a.Round != i || a.MasterAddr != "n1" || a.RankOffset != 2 {
			t.Errorf("join %d: %+v, want restart count %d, round %d", i, a, want, i)
		}
	}
	if len(asked) != 2 || asked[0] != -1 || asked[1] != 0 {
		t.Errorf("StoreRound asked after %v, want [-1 0]", asked)
	}
	boom := errors.New("boom")
	req.StoreRound = func(context.Context, string, int) (int, error) { return 0, boom }
	if _, err := s.Join(ctx, req); !errors.Is(err, boom) {
		t.Errorf("Join with a failing wait: %v, want boom", err)
	}
	env.NodeID = 0
	req.StoreRound = func(context.Context, string, int) (int, error) {
		t.Error("node rank 0 asked for its own store")
		return 0, nil
	}
	if _, err := NewStatic(env, "42", 3).Join(ctx, req); err != nil {
		t.Fatal(err)
	}
}
