package allocator

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gangrun/gangrun/internal/store"
)

// The invariants CheckInvariants checks, as Violation.Kind.
const (
	// DoubleBooked: one device is listed by two granted grants (or twice by one).
	DoubleBooked = "double-booked"
	// NotWhole: a granted grant lists a device whose key is missing, unlocked, locked by
	// another session than the grant's, or names another grant.
	NotWhole = "not whole"
	// Overcommitted: the granted grants on one node hold more CPUs or memory than the
	// node's record says it has (resources.go).
	Overcommitted = "overcommitted"
)

// Violation is one broken allocation invariant in a snapshot of the store.
type Violation struct {
	// Kind is DoubleBooked, NotWhole or Overcommitted.
	Kind string
	// Key is the device's key, gangrun/cluster/gpus/<node>/<dev>; for Overcommitted
	// the node's, gangrun/cluster/nodes/<node>.
	Key string
	// Grants are the grants involved: both for DoubleBooked, the one for NotWhole,
	// every granted grant on the node for Overcommitted, sorted.
	Grants []string
	// What, for Overcommitted, says what is held of what the node has ("12 of 8 CPUs").
	What string
	// Holder is what the device's key holds for NotWhole: the grant id it names and the
	// session locking it ("" when the key is absent or unlocked).
	Holder, Session string
}

// String describes the violation in one line, naming the device and the grants.
func (v Violation) String() string {
	if v.Kind == Overcommitted {
		return fmt.Sprintf("node %s overcommitted: grants %s hold %s", strings.TrimPrefix(v.Key, nodesPrefix), strings.Join(v.Grants, ", "), v.What)
	}
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
	out = append(out, overcommitted(c, ids)...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return c, out
}

// overcommitted returns a violation for each node of c whose granted grants (ids, in
// order) hold more CPUs or memory than its record says it has (a node that does not
// know its CPUs or memory is not checked for them).
func overcommitted(c *Cluster, ids []string) []Violation {
	type use struct {
		cpus   int
		mem    int64
		grants []string
	}
	used := map[string]*use{}
	for _, id := range ids {
		g := c.Grants[id]
		if g.State != GrantGranted {
			continue
		}
		for _, gn := range g.Nodes {
			u := used[gn.Name]
			if u == nil {
				u = &use{}
				used[gn.Name] = u
			}
			u.cpus, u.mem, u.grants = u.cpus+gn.CPUs, u.mem+gn.MemoryMiB, append(u.grants, id)
		}
	}
	var out []Violation
	for name, u := range used {
		n, ok := c.Nodes[name]
		if !ok {
			continue
		}
		var what []string
		if cpus := n.Record.CPUs; cpus > 0 && u.cpus > cpus {
			what = append(what, fmt.Sprintf("%d of %d CPUs", u.cpus, cpus))
		}
		if mem := n.Record.MemoryMiB; mem > 0 && u.mem > mem {
			what = append(what, fmt.Sprintf("%dM of %dM of memory", u.mem, mem))
		}
		if len(what) > 0 {
			out = append(out, Violation{Kind: Overcommitted, Key: nodesPrefix + name, Grants: u.grants, What: strings.Join(what, " and ")})
		}
	}
	return out
}
