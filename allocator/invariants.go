package allocator

import (
	"fmt"
	"sort"

	"github.com/gangrun/gangrun/internal/store"
)

// The invariants CheckInvariants checks, as Violation.Kind.
const (
	// DoubleBooked: one device is listed by two granted grants (or twice by one).
	DoubleBooked = "double-booked"
	// NotWhole: a granted grant lists a device whose key is missing, unlocked, locked by
	// another session than the grant's, or names another grant.
	NotWhole = "not whole"
)

// Violation is one broken allocation invariant in a snapshot of the store.
type Violation struct {
	// Kind is DoubleBooked or NotWhole.
	Kind string
	// Key is the device's key, gangrun/cluster/gpus/<node>/<dev>.
	Key string
	// Grants are the grants involved: both for DoubleBooked, the one for NotWhole.
	Grants []string
	// Holder is what the device's key holds for NotWhole: the grant id it names and the
	// session locking it ("" when the key is absent or unlocked).
	Holder, Session string
}

// String describes the violation in one line, naming the device and the grants.
func (v Violation) String() string {
	if v.Kind == DoubleBooked {
		return fmt.Sprintf("device %s granted to both %s and %s", v.Key, v.Grants[0], v.Grants[1])
	}
	return fmt.Sprintf("grant %s is not whole: %s names grant %q, locked by session %q", v.Grants[0], v.Key, v.Holder, v.Session)
}

// CheckInvariants checks what the allocator promises on entries, every key under
// ClusterPrefix as one consistent read returned them (Store.List, or a Watcher of
// ClusterPrefix), at store index index: no device is held by two granted grants, and
// every granted grant is whole (each device it lists has its key, naming the grant and
// locked by the grant's session, or for a job's grant by the node's: Grant.KeySession).
// A job's grant may lack the keys of a node whose holder died (they went with its
// session) until the job replaces the node; keys it lists that something else holds are
// violations all the same. Pending and refused grants are not grants yet and are not
// checked. It returns the snapshot the entries parse to and the violations, sorted
// by key; none when the invariants hold. Tests call it all along a run, from any
// goroutine.
func CheckInvariants(entries []store.Entry, index uint64) (*Cluster, []Violation) {
	c := parseCluster(entries, index)
	type lock struct{ grant, session string }
	locks := map[string]lock{}
	for _, e := range entries {
		if _, _, ok := parseGPUKey(e.Key); ok {
			locks[e.Key] = lock{string(e.Value), e.Session}
		}
	}
	ids := make([]string, 0, len(c.Grants))
	for id := range c.Grants {
		ids = append(ids, id)
	}
	sort.Strings(ids) // the same snapshot reports the same violations
	var out []Violation
	owner := map[string]string{}
	for _, id := range ids {
		g := c.Grants[id]
		if g.State != GrantGranted {
			continue
		}
		for _, gn := range g.Nodes {
			for _, d := range gn.Devices {
				key := gpuKey(gn.Name, d)
				if prev, dup := owner[key]; dup {
					out = append(out, Violation{Kind: DoubleBooked, Key: key, Grants: []string{prev, id}})
				}
				owner[key] = id
				l, ok := locks[key]
				if !ok && g.Session == "" {
					// A job's grant: the node's keys went with the session that held them
					// (the node or its step died); the job replaces the node. Nothing else
					// holds them, which is what matters.
					continue
				}
				if !ok || l.grant != id || l.session != g.KeySession(gn) || l.session == "" {
					out = append(out, Violation{Kind: NotWhole, Key: key, Grants: []string{id}, Holder: l.grant, Session: l.session})
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return c, out
}
