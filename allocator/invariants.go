package allocator

import (
	"context"
	"fmt"
	"sort"

	"github.com/gangrun/gangrun/internal/store"
)

// CheckGrants reads the allocator's keys in one consistent read and returns the
// snapshot and every breach of the grant invariants it shows:
//   - a device is held by at most one granted grant;
//   - a granted grant is whole: every device it lists is locked by the grant's session
//     and names the grant.
//
// Grants still pending are not counted, as everywhere (the package documentation says
// why). It can be called at any time on a live cluster, from any goroutine; the tests
// call it all along while they grant, kill holders and kill Consul servers. An error
// means the store could not be read (a Consul cluster without a leader, say): nothing
// was checked.
func CheckGrants(ctx context.Context, s store.Store) (*Cluster, []string, error) {
	entries, idx, err := s.List(ctx, clusterPrefix)
	if err != nil {
		return nil, nil, fmt.Errorf("check grants: %w", err)
	}
	c := parseCluster(entries, idx)
	type lock struct{ grant, session string }
	locks := map[string]lock{}
	for _, e := range entries {
		if _, _, ok := parseGPUKey(e.Key); ok {
			locks[e.Key] = lock{string(e.Value), e.Session}
		}
	}
	var bad []string
	owner := map[string]string{}
	for _, id := range sortedKeys(c.Grants) {
		g := c.Grants[id]
		if g.State != GrantGranted {
			continue
		}
		for _, gn := range g.Nodes {
			for _, d := range gn.Devices {
				key := gpuKey(gn.Name, d)
				if prev, dup := owner[key]; dup {
					bad = append(bad, fmt.Sprintf("device %s granted to both %s and %s", key, prev, id))
				}
				owner[key] = id
				l, ok := locks[key]
				if !ok || l.grant != id || l.session != g.Session || l.session == "" {
					bad = append(bad, fmt.Sprintf("grant %s is not whole: %s is %+v (present %v)", id, key, l, ok))
				}
			}
		}
	}
	return c, bad, nil
}

// sortedKeys returns m's keys in order, so reports read the same from run to run.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
