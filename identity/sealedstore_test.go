package identity_test

import (
	"context"
	"testing"

	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/store"
)

// TestSealedStore: under its prefixes a sealed store reads back what it wrote; a value
// written past it (unsealed), one sealed by an untrusted uid, and one copied from
// another key read as absent, in Get, List and a transaction's Get; a key holding a
// value that reads as absent can still be created by a check-and-set at index 0 (the
// forged value does not block it); keys outside the prefixes pass through unchanged.
func TestSealedStore(t *testing.T) {
	ctx := context.Background()
	m, err := identity.Open(mungetest.Start(t).Socket)
	if err != nil {
		t.Fatal(err)
	}
	raw := store.NewMemory()
	trustNone := func(uint32) bool { return false }
	trustRoot := func(uid uint32) bool { return uid == 0 }
	s := identity.Sealed(raw, m, trustRoot, "jobs/")
	set := func(st store.Store, k, v string) {
		t.Helper()
		if _, err := st.Txn(ctx, []store.Op{{Verb: store.Set, Key: k, Value: []byte(v)}}); err != nil {
			t.Fatal(err)
		}
	}
	set(s, "jobs/7/state", "good")
	set(raw, "jobs/7/forged", "evil")
	set(s, "other/x", "plain")
	if e, err := s.Get(ctx, "jobs/7/state"); err != nil || e == nil || string(e.Value) != "good" {
		t.Errorf("read back: %+v %v", e, err)
	}
	if e, _ := raw.Get(ctx, "jobs/7/state"); e == nil || string(e.Value) == "good" {
		t.Errorf("stored unsealed: %+v", e)
	}
	if e, err := s.Get(ctx, "jobs/7/forged"); err != nil || e != nil {
		t.Errorf("an unsealed value: %+v %v, want absent", e, err)
	}
	if e, _ := raw.Get(ctx, "other/x"); e == nil || string(e.Value) != "plain" {
		t.Errorf("outside the prefixes: %+v, want it as written", e)
	}
	// Copied to another key: bound to its key.
	orig, _ := raw.Get(ctx, "jobs/7/state")
	set(raw, "jobs/8/state", string(orig.Value))
	if e, _ := s.Get(ctx, "jobs/8/state"); e != nil {
		t.Errorf("a sealed value copied to another key: %+v, want absent", e)
	}
	// Sealed, but by a uid the reader does not trust.
	if e, _ := identity.Sealed(raw, m, trustNone, "jobs/").Get(ctx, "jobs/7/state"); e != nil {
		t.Errorf("a value sealed by an untrusted uid: %+v, want absent", e)
	}
	entries, _, err := s.List(ctx, "jobs/")
	if err != nil || len(entries) != 1 || entries[0].Key != "jobs/7/state" || string(entries[0].Value) != "good" {
		t.Errorf("List: %+v %v, want only jobs/7/state", entries, err)
	}
	res, err := s.Txn(ctx, []store.Op{{Verb: store.Get, Key: "jobs/7/forged"}, {Verb: store.Get, Key: "jobs/7/state"}})
	if err != nil || len(res.Entries) != 1 || string(res.Entries[0].Value) != "good" {
		t.Errorf("a transaction's Gets: %+v %v", res.Entries, err)
	}
	// The forged key can be created as if absent.
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: "jobs/7/forged", Value: []byte("mine"), Index: 0}}); err != nil {
		t.Errorf("check-and-set at index 0 over a forged value: %v", err)
	}
	if e, _ := s.Get(ctx, "jobs/7/forged"); e == nil || string(e.Value) != "mine" {
		t.Errorf("after the check-and-set: %+v", e)
	}
}
