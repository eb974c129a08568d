package store_test

import (
	"context"
	"testing"

	"github.com/gangrun/gangrun/internal/store"
)

// TestOwnWrites: a view covers the client's writes under its prefix only from their
// index on; a reread at or past them keeps them, and one older than a write (a store
// that went back in time) forgets that write and the others it reads past, not those
// of other prefixes.
func TestOwnWrites(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	var w store.OwnWrites
	if !w.Covers("a/", 0) {
		t.Fatal("a view at 0 does not cover a prefix with no writes")
	}
	res, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: "a/x/k", Value: []byte("v")}})
	if err != nil {
		t.Fatal(err)
	}
	w.Wrote("a/x/", res.Index)
	w.Wrote("a/x/", res.Index-1) // an older write changes nothing
	w.Wrote("b/", 1<<40)
	if w.Covers("a/x/", res.Index-1) || !w.Covers("a/x/", res.Index) {
		t.Errorf("Covers of a/x/ at %d and %d: want false, true", res.Index-1, res.Index)
	}
	entries, idx, back, err := w.Reread(ctx, s, "a/")
	if err != nil || back || len(entries) != 1 || idx < res.Index {
		t.Fatalf("Reread(a/) = %v, %d, went back %v, %v; want the key, at %d or later, not gone back", entries, idx, back, err, res.Index)
	}
	if !w.Covers("a/x/", idx) {
		t.Error("the reread's index does not cover the write it read")
	}
	// A store that went back in time: a write of ours at an index it never reached.
	w.Wrote("a/y/", idx+100)
	if _, _, back, err := w.Reread(ctx, s, "a/"); err != nil || !back {
		t.Fatalf("Reread past a write at %d: went back %v, %v; want true", idx+100, back, err)
	}
	if !w.Covers("a/y/", idx) {
		t.Error("the write the store went back past is still waited for")
	}
	if w.Covers("b/", idx) {
		t.Error("a reread of a/ forgot a write under b/")
	}
}
