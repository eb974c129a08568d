package allocator

import (
	"strings"
	"testing"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// TestCheckInvariantsFindsEachViolation: the checker the end-to-end tests rely on
// reports a double booking and a grant that is not whole, and nothing on a sound
// snapshot (a checker that finds nothing would make their zeros meaningless).
func TestCheckInvariantsFindsEachViolation(t *testing.T) {
	node := store.Entry{Key: nodesPrefix + "n1", Value: mustJSON(NodeRecord{Name: "n1", Devices: []topology.Device{{ID: "0"}, {ID: "1"}, {ID: "2"}}})}
	grant := func(id string, state GrantState, session string, devs ...string) store.Entry {
		return store.Entry{Key: grantsPrefix + id, Session: session,
			Value: mustJSON(Grant{ID: id, State: state, Session: session, Nodes: []GrantNode{{Name: "n1", Devices: devs}}})}
	}
	gpu := func(dev, grant, session string) store.Entry {
		return store.Entry{Key: gpuKey("n1", dev), Value: []byte(grant), Session: session}
	}
	for _, tc := range []struct {
		name    string
		entries []store.Entry
		want    []string // Violation strings, in order
	}{
		{"sound", []store.Entry{node, grant("a", GrantGranted, "sa", "0", "1"), gpu("0", "a", "sa"), gpu("1", "a", "sa"),
			grant("b", GrantGranted, "sb", "2"), gpu("2", "b", "sb")}, nil},
		{"a pending grant is not a grant yet", []store.Entry{node, grant("a", GrantPending, "sa", "0", "1"), gpu("0", "a", "sa")}, nil},
		{"double booked", []store.Entry{node, grant("a", GrantGranted, "sa", "0"), grant("b", GrantGranted, "sb", "0", "1"),
			gpu("0", "a", "sa"), gpu("1", "b", "sb")}, []string{
			"device gangrun/cluster/gpus/n1/0 granted to both a and b",
			`grant b is not whole: gangrun/cluster/gpus/n1/0 names grant "a", locked by session "sa"`,
		}},
		{"a device key missing", []store.Entry{node, grant("a", GrantGranted, "sa", "0", "1"), gpu("0", "a", "sa")}, []string{
			`grant a is not whole: gangrun/cluster/gpus/n1/1 names grant "", locked by session ""`,
		}},
		{"a device key locked by another session", []store.Entry{node, grant("a", GrantGranted, "sa", "0"), gpu("0", "a", "sx")}, []string{
			`grant a is not whole: gangrun/cluster/gpus/n1/0 names grant "a", locked by session "sx"`,
		}},
		{"a device key unlocked", []store.Entry{node, grant("a", GrantGranted, "sa", "0"), gpu("0", "a", "")}, []string{
			`grant a is not whole: gangrun/cluster/gpus/n1/0 names grant "a", locked by session ""`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := CheckInvariants(tc.entries, 7)
			got := make([]string, len(vs))
			for i, v := range vs {
				got[i] = v.String()
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			for _, v := range vs {
				if v.Kind == DoubleBooked && !strings.Contains(tc.name, "double") {
					t.Errorf("%s reported as a double booking", v)
				}
			}
		})
	}
}
