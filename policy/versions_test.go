package policy

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// TestNewerPolicyAndUsageAreRefused: a stored policy or usage one schema newer than this
// gangrun reads is refused with the reason (Load, LoadUsage, Parse) before its fields
// are looked at, and never written over by Save; a policy document with this
// gangrun's schema, or none, is read.
func TestNewerPolicyAndUsageAreRefused(t *testing.T) {
	ctx := context.Background()
	want := "written by a newer gangrun (schema 2; this one reads up to 1)"
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, schema.ErrNewer) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want the refusal of a newer record", what, err)
		}
	}
	s := store.NewMemory()
	// A newer policy may hold fields this gangrun does not know: the version is what
	// it is refused for, not a field.
	doc := []byte(`{"schema": 2, "priority": {"weights": {"age": 1}}, "tiers": ["new"]}`)
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: Key, Value: doc}}); err != nil {
		t.Fatal(err)
	}
	_, err := Load(ctx, s)
	refused("load the policy", err)
	_, err = Parse(doc)
	refused("parse the policy", err)
	refused("save a policy over it", Save(ctx, s, &Policy{}))
	if e, _ := s.Get(ctx, Key); e == nil || !bytes.Equal(e.Value, doc) {
		t.Errorf("the newer policy was written over: %+v", e)
	}

	u := NewUsage()
	u.Charge("a", "alice", 10)
	b, _ := schema.MarshalVersion(schema.Usage, 2, u)
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: UsageKey, Value: b}}); err != nil {
		t.Fatal(err)
	}
	_, err = LoadUsage(ctx, s)
	refused("load the usage", err)

	// This gangrun's own, and one without a version (before 0.1.0; an operator's file).
	for _, d := range []string{`{"schema": 1, "priority": {"weights": {"age": 5}}}`, `{"priority": {"weights": {"age": 5}}}`} {
		p, err := Parse([]byte(d))
		if err != nil || p.Priority.Weights.Age != 5 {
			t.Errorf("Parse(%s) = %+v, %v", d, p, err)
		}
	}
	for _, d := range []string{`{"schema": 0}`, `{"schema": "1"}`} {
		if _, err := Parse([]byte(d)); err == nil || errors.Is(err, schema.ErrNewer) || !strings.Contains(err.Error(), "schema") {
			t.Errorf("Parse(%s): %v, want an error naming the bad schema", d, err)
		}
	}
	// Saved by this gangrun: with its version first, read back the same.
	s2 := store.NewMemory()
	if err := Save(ctx, s2, &Policy{Priority: Priority{Weights: Weights{Age: 7}}}); err != nil {
		t.Fatal(err)
	}
	e, _ := s2.Get(ctx, Key)
	if v, err := schema.Of(e.Value); err != nil || v != schema.Policy.Version() {
		t.Errorf("the saved policy's schema: %d, %v (%s)", v, err, e.Value)
	}
	if p, err := Load(ctx, s2); err != nil || p.Priority.Weights.Age != 7 {
		t.Errorf("Load after Save: %+v, %v", p, err)
	}
}
