package job

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// TestNodeUsages: the usage each node's step wrote is read back by node while its
// session holds it; a record no session holds (a step that ended) and one a newer
// gangrun wrote are left out.
func TestNodeUsages(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "step", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	u := NodeUsage{Node: "a", Usage: cgroup.Usage{PeakBytes: 100 << 20, CPU: time.Second}, MaxBytes: 100 << 20, Sampled: time.Now().UTC()}
	if err := writeUsage(ctx, s, sess, "7", u); err != nil {
		t.Fatal(err)
	}
	set(t, s, usageKey("7", "b"), newer(t, schema.StepUsage, NodeUsage{Node: "b"}), sess)
	old, _ := schema.Marshal(schema.StepUsage, NodeUsage{Node: "c", MaxBytes: 1})
	set(t, s, usageKey("7", "c"), old, "")
	got, err := NodeUsages(ctx, s, "7")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a"].MaxBytes != 100<<20 || got["a"].CPU != time.Second {
		t.Errorf("NodeUsages: %+v, want node a's alone", got)
	}
	if _, err := NodeUsages(ctx, s, "../x"); err == nil {
		t.Error("a bad job id was read")
	}
}
