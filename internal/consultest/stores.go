package consultest

import (
	"testing"

	"github.com/gangrun/gangrun/internal/store"
)

// EachStore runs fn as two subtests, "memory" on a fresh in-memory store and "consul"
// on a real Consul dev agent started for it: the logic written once against
// store.Store must behave the same on both.
func EachStore(t *testing.T, fn func(t *testing.T, s store.Store)) {
	t.Run("memory", func(t *testing.T) { fn(t, store.NewMemory()) })
	t.Run("consul", func(t *testing.T) { fn(t, ConsulStore(t, Start(t))) })
}

// ConsulStore returns a store.Consul talking to agent a; the test's cleanup closes it.
func ConsulStore(t testing.TB, a *Agent) *store.Consul {
	t.Helper()
	s, err := store.NewConsul(a.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
