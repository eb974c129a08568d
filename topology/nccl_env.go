package topology

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// EnvVar is one environment variable for the workers of a node.
type EnvVar struct {
	Name  string
	Value string
}

// String returns NAME=value.
func (e EnvVar) String() string { return e.Name + "=" + e.Value }

// SocketIfnameExclude is the NCCL_SOCKET_IFNAME value gangrun hands out: NCCL's
// exclusion syntax ("^" then prefixes) for loopback, Docker bridges, veth pairs and
// libvirt bridges, so NCCL's bootstrap and socket transport use a real interface
// whatever it is called on each node.
const SocketIfnameExclude = "^lo,docker,veth,virbr"

// NCCLEnv returns what this node's NCCL should use, sorted by name; `gangrun topo
// --nccl-env` prints it and the rendezvous hands it to workers (a user's own NCCL_*
// variables win there). The rules, with NCCL's syntax (NCCL user guide, "Environment
// Variables"; parsing in src/misc/utils.cc parseStringList/matchIfList):
//
//   - NCCL_IB_HCA names every RDMA port in state ACTIVE as device:port, behind the "="
//     prefix that makes NCCL match names exactly: "=mlx5_0:1,mlx5_1:1". Without "=",
//     NCCL matches prefixes and mlx5_1 would also select mlx5_10 and mlx5_11. Absent
//     when no port is active (including on a node without RDMA).
//   - NCCL_IB_GID_INDEX, only when an active port is RoCE (Ethernet link layer): the
//     smallest GID index that holds a RoCE v2 GID with an IPv4-mapped address
//     (::ffff:a.b.c.d) on every active RoCE port. Absent when the ports disagree or
//     none has one, which leaves NCCL's own GID selection in charge.
//   - NCCL_SOCKET_IFNAME is always SocketIfnameExclude.
//
// Nothing about InfiniBand appears on a node without RDMA devices.
func (inv *Inventory) NCCLEnv() []EnvVar {
	var env []EnvVar
	if idx, ok := inv.roceV2GIDIndex(); ok {
		env = append(env, EnvVar{"NCCL_IB_GID_INDEX", strconv.Itoa(idx)})
	}
	if hcas := inv.activeHCAPorts(); len(hcas) > 0 {
		env = append(env, EnvVar{"NCCL_IB_HCA", "=" + strings.Join(hcas, ",")})
	}
	env = append(env, EnvVar{"NCCL_SOCKET_IFNAME", SocketIfnameExclude})
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	return env
}

// activeHCAPorts lists "device:port" for every ACTIVE port, devices in natural order.
func (inv *Inventory) activeHCAPorts() []string {
	devs := append([]RDMADevice(nil), inv.RDMADevices...)
	sort.Slice(devs, func(i, j int) bool { return naturalLess(devs[i].Name, devs[j].Name) })
	var out []string
	for _, d := range devs {
		for _, p := range d.Ports {
			if p.State == PortActive {
				out = append(out, fmt.Sprintf("%s:%d", d.Name, p.Port))
			}
		}
	}
	return out
}

// roceV2GIDIndex returns the GID index for NCCL_IB_GID_INDEX (see NCCLEnv).
func (inv *Inventory) roceV2GIDIndex() (int, bool) {
	var common map[int]bool
	for _, d := range inv.RDMADevices {
		for _, p := range d.Ports {
			if p.State != PortActive || p.LinkLayer != LinkLayerEthernet {
				continue
			}
			here := map[int]bool{}
			for _, g := range p.GIDs {
				if g.Type == GIDTypeRoCEv2 && isIPv4Mapped(g.GID) {
					here[g.Index] = true
				}
			}
			if common == nil {
				common = here
				continue
			}
			for i := range common {
				if !here[i] {
					delete(common, i)
				}
			}
		}
	}
	best := -1
	for i := range common {
		if best < 0 || i < best {
			best = i
		}
	}
	return best, best >= 0
}

func isIPv4Mapped(gid string) bool {
	a, err := netip.ParseAddr(gid)
	return err == nil && a.Is4In6()
}

// NCCLList is a parsed NCCL device or interface list, the syntax of NCCL_IB_HCA and
// NCCL_SOCKET_IFNAME: an optional "^" (exclude what matches), then an optional "="
// (match names exactly instead of as prefixes), then comma-separated entries, each a
// name optionally followed by ":port".
type NCCLList struct {
	// Exclude is set by a leading "^".
	Exclude bool
	// Exact is set by "=" (after "^", if any).
	Exact bool
	// Entries are the list's entries, empty ones dropped, in order.
	Entries []NCCLListEntry
}

// NCCLListEntry is one entry of an NCCLList.
type NCCLListEntry struct {
	// Name is the device or interface name (or prefix).
	Name string
	// Port is the port number; -1 when the entry names none (any port matches).
	Port int
}

// maxNCCLListEntries bounds the entries NCCL keeps (MAX_IB_DEVS in src/transport/net_ib.cc).
const maxNCCLListEntries = 32

// ParseNCCLList parses an NCCL list as NCCL does. NCCL itself never rejects a list: a
// port that is not a number counts as port 0 there (atoi). ParseNCCLList is stricter
// and returns an error naming a port that is not a non-negative number, an entry with
// "^" or "=" inside it, or a list of more than 32 entries, so gangrun can refuse a
// value NCCL would silently misread.
func ParseNCCLList(s string) (NCCLList, error) {
	var l NCCLList
	if strings.HasPrefix(s, "^") {
		l.Exclude = true
		s = s[1:]
	}
	if strings.HasPrefix(s, "=") {
		l.Exact = true
		s = s[1:]
	}
	for _, item := range strings.Split(s, ",") {
		name, portText, hasPort := strings.Cut(item, ":")
		if name == "" {
			continue
		}
		if strings.ContainsAny(name, "^=") {
			return NCCLList{}, fmt.Errorf("NCCL list entry %q: ^ and = may only start the list", item)
		}
		e := NCCLListEntry{Name: name, Port: -1}
		if hasPort {
			p, err := strconv.Atoi(portText)
			if err != nil || p < 0 {
				return NCCLList{}, fmt.Errorf("NCCL list entry %q: port %q is not a non-negative number", item, portText)
			}
			e.Port = p
		}
		l.Entries = append(l.Entries, e)
	}
	if len(l.Entries) > maxNCCLListEntries {
		return NCCLList{}, fmt.Errorf("NCCL list has %d entries; NCCL reads at most %d", len(l.Entries), maxNCCLListEntries)
	}
	return l, nil
}

// String formats the list in NCCL's syntax; parsing the result gives the same list.
func (l NCCLList) String() string {
	var b strings.Builder
	if l.Exclude {
		b.WriteByte('^')
	}
	if l.Exact {
		b.WriteByte('=')
	}
	for i, e := range l.Entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Name)
		if e.Port >= 0 {
			fmt.Fprintf(&b, ":%d", e.Port)
		}
	}
	return b.String()
}

// Selects reports whether NCCL would use the device or interface name (port -1 for an
// interface or "any port") under this list: a name is selected when it matches an entry (exactly with "=", by prefix without) and
// the ports agree (either side -1, or equal), inverted by "^". As in NCCL, an empty
// list matches everything, so "^" alone excludes everything.
func (l NCCLList) Selects(name string, port int) bool {
	if len(l.Entries) == 0 {
		return !l.Exclude
	}
	matched := false
	for _, e := range l.Entries {
		nameOK := name == e.Name
		if !l.Exact {
			nameOK = strings.HasPrefix(name, e.Name)
		}
		portOK := port == -1 || e.Port == -1 || port == e.Port
		if nameOK && portOK {
			matched = true
			break
		}
	}
	return matched != l.Exclude
}
