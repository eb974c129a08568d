package allocator

import (
	"context"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/internal/store"
)

// TestCheckGrantsFindsBreaches writes, by hand, the keys of a double-booked GPU and of a
// granted grant missing one of its locks: CheckGrants names both, and nothing in a
// consistent cluster.
func TestCheckGrantsFindsBreaches(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	sess := func(name string) string {
		id, err := s.CreateSession(ctx, store.SessionOptions{Name: name, TTL: SessionTTL, Behavior: store.DeleteKeys})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b := sess("a"), sess("b")
	grant := func(id, session string, devs ...string) store.Op {
		return store.Op{Verb: store.Lock, Key: grantsPrefix + id, Session: session, Value: mustJSON(Grant{ID: id, State: GrantGranted,
			Session: session, Nodes: []GrantNode{{Name: "n1", Devices: devs}}})}
	}
	lock := func(dev, id, session string) store.Op {
		return store.Op{Verb: store.Lock, Key: gpuKey("n1", dev), Value: []byte(id), Session: session}
	}
	if _, err := s.Txn(ctx, []store.Op{grant("ga", a, "0", "1"), lock("0", "ga", a), lock("1", "ga", a)}); err != nil {
		t.Fatal(err)
	}
	if _, bad, err := CheckGrants(ctx, s); err != nil || len(bad) != 0 {
		t.Fatalf("a whole grant: %v, %v; want no breach", bad, err)
	}
	// Grant gb lists device 1, which ga holds, and device 2, which nobody locked.
	if _, err := s.Txn(ctx, []store.Op{grant("gb", b, "1", "2")}); err != nil {
		t.Fatal(err)
	}
	c, bad, err := CheckGrants(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(bad, "\n")
	for _, want := range []string{
		"device gangrun/cluster/gpus/n1/1 granted to both ga and gb",
		"grant gb is not whole: gangrun/cluster/gpus/n1/1",
		"grant gb is not whole: gangrun/cluster/gpus/n1/2",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("breaches:\n%s\nlack %q", got, want)
		}
	}
	if len(bad) != 3 {
		t.Errorf("%d breaches, want 3:\n%s", len(bad), got)
	}
	if len(c.Grants) != 2 {
		t.Errorf("snapshot has %d grants, want 2", len(c.Grants))
	}
}
