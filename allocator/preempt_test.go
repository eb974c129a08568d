package allocator

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// TestFitCheckCountsTheReleasedGrants: on two 4-GPU nodes, job a holds a whole node and
// jobs b and c two GPUs each of the other; a pending job of 1 node × 4 GPUs fits no
// free GPUs, nor b's or c's alone (two GPUs freed on a node whose other two are held),
// but fits a's, or b's and c's together; policy.SelectVictims over the check takes the
// one job, a. A node kept for another request's reservation does not count.
func TestFitCheckCountsTheReleasedGrants(t *testing.T) {
	s := store.NewMemory()
	ctx := context.Background()
	startCluster(t, s, 2, "pcie-2socket", nil)
	for _, r := range []Request{JobRequest("a", 1, 1, 4, "", "", nil, 0, nil), JobRequest("b", 1, 1, 2, "", "", nil, 0, nil),
		JobRequest("c", 1, 1, 2, "", "", nil, 0, nil)} {
		ops, err := JobRequestOps(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Txn(ctx, ops); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, func() bool {
			g, _, err := ReadGrant(ctx, s, r.ID)
			return err == nil && g != nil && g.State == GrantGranted
		}, "job "+r.ID+"'s grant")
	}
	ops, err := JobRequestOps(JobRequest("p", 1, 1, 4, "", "", nil, 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, ops); err != nil {
		t.Fatal(err)
	}
	c := checkInvariants(t, s)
	nodeOf := func(id string) string { return c.Grants[id].Nodes[0].Name }
	if nodeOf("a") == nodeOf("b") || nodeOf("b") != nodeOf("c") {
		t.Fatalf("placement: a on %s, b on %s, c on %s; want a alone, b and c together", nodeOf("a"), nodeOf("b"), nodeOf("c"))
	}
	if _, ok := NewFitCheck(ctx, s, c, nil, nil, "nope"); ok {
		t.Errorf("a fit check of a request that does not exist")
	}
	fc, ok := NewFitCheck(ctx, s, c, nil, nil, "p")
	if !ok {
		t.Fatal("no fit check for p")
	}
	for _, tc := range []struct {
		release []string
		want    bool
	}{{nil, false}, {[]string{"b"}, false}, {[]string{"c"}, false}, {[]string{"a"}, true}, {[]string{"b", "c"}, true}} {
		if got := fc.Fits(tc.release); got != tc.want {
			t.Errorf("Fits(%v) = %v, want %v", tc.release, got, tc.want)
		}
	}
	cands := []policy.Candidate{{ID: "a", Tier: 1}, {ID: "b", Tier: 1}, {ID: "c", Tier: 1}}
	if got := policy.SelectVictims(cands, fc.Fits); !slices.Equal(got, []string{"a"}) {
		t.Errorf("victims %v, want [a]: one job rather than two", got)
	}
	// A partition the policy defines by labels no node has: nothing fits, whatever goes.
	pol := &policy.Policy{Partitions: map[string]policy.Partition{"": {Nodes: map[string]string{"pool": "none"}}}}
	fc, _ = NewFitCheck(ctx, s, c, pol, nil, "p")
	if fc.Fits([]string{"a", "b", "c"}) {
		t.Errorf("fits on nodes outside its partition")
	}
	// a's node kept for another request's reservation: releasing a is in vain.
	fc, _ = NewFitCheck(ctx, s, c, nil, map[string][]string{"other": {nodeOf("a")}}, "p")
	if fc.Fits([]string{"a"}) || !fc.Fits([]string{"b", "c"}) {
		t.Errorf("with a's node reserved for another request: Fits([a]) %v, Fits([b c]) %v; want false, true", fc.Fits([]string{"a"}), fc.Fits([]string{"b", "c"}))
	}
	fc, _ = NewFitCheck(ctx, s, c, nil, map[string][]string{"p": {nodeOf("a")}}, "p")
	if !fc.Fits([]string{"a"}) {
		t.Errorf("a's node reserved for p itself: Fits([a]) false")
	}
}
