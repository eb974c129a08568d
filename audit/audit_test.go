package audit

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// TestListAndPurge: on both stores, entries come back oldest first, filtered by --since
// and by user (the Unix user or the token's); Purge deletes the days before its cut
// and keeps the rest.
func TestListAndPurge(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		now := time.Now().UTC()
		old := now.Add(-500 * 24 * time.Hour)
		for _, e := range []Entry{
			{At: now.Add(-time.Minute), User: "root", Token: "operator", Host: "h1", Action: ActionDrain, Target: "node n1", Detail: "fan"},
			{At: old, User: "ops", Token: "operator", Host: "h2", Action: ActionResume, Target: "node n2"},
			{At: now.Add(-2 * time.Minute), User: "root", Token: "user:alice", Host: "h1", Action: ActionCancel, Target: "job 7", Owner: "bob"},
		} {
			if err := Write(ctx, s, e); err != nil {
				t.Fatal(err)
			}
		}
		all, err := List(ctx, s, time.Time{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 3 || all[0].Target != "node n2" || all[1].Target != "job 7" || all[2].Target != "node n1" {
			t.Fatalf("List: %+v, want oldest first", all)
		}
		recent, _ := List(ctx, s, now.Add(-time.Hour), "")
		if len(recent) != 2 {
			t.Errorf("List since an hour ago: %d entries, want 2", len(recent))
		}
		if byAlice, _ := List(ctx, s, time.Time{}, "alice"); len(byAlice) != 1 || byAlice[0].Target != "job 7" {
			t.Errorf("List of alice: %+v", byAlice)
		}
		if byOps, _ := List(ctx, s, time.Time{}, "ops"); len(byOps) != 1 || byOps[0].Host != "h2" {
			t.Errorf("List of ops: %+v", byOps)
		}
		n, err := Purge(ctx, s, nil, now.Add(-DefaultRetention))
		if err != nil || n != 1 {
			t.Fatalf("Purge: %d days, %v; want 1", n, err)
		}
		if left, _ := List(ctx, s, time.Time{}, ""); len(left) != 2 {
			t.Errorf("after Purge: %d entries, want 2", len(left))
		}
	})
}
