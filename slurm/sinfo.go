package slurm

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/job"
)

// sinfo's formats (sinfo(1)): the default (one line per partition and state), -N's
// (one per node) and -l's.
const (
	sinfoDefault = "%9P %.5a %.10l %.6D %.6t %N"
	sinfoNodes   = "%10N %.5D %.9P %6t"
	sinfoLong    = "%9P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
)

// sinfoLetters are the %-letters sinfo takes, with their headers.
var sinfoLetters = map[string]string{
	"P": "PARTITION", "R": "PARTITION", "a": "AVAIL", "l": "TIMELIMIT", "D": "NODES", "t": "STATE", "T": "STATE",
	"N": "NODELIST", "n": "HOSTNAMES", "G": "GRES", "c": "CPUS", "m": "MEMORY", "f": "AVAIL_FEATURES",
	"E": "REASON", "s": "JOB_SIZE", "r": "ROOT", "h": "OVERSUBSCRIBE", "g": "GROUPS", "o": "NODE_ADDR",
	"F": "NODES(A/I/O/T)", "A": "NODES(A/I)", "C": "CPUS(A/I/O/T)", "e": "FREE_MEM",
}

// sinfoFields are the -O fields sinfo takes (lower case).
var sinfoFields = map[string]string{
	"partition": "P", "partitionname": "R", "available": "a", "timelimit": "l", "nodes": "D",
	"statecompact": "t", "statelong": "T", "nodelist": "N", "nodehost": "n", "gres": "G", "cpus": "c",
	"memory": "m", "features": "f", "reason": "E", "nodeaddr": "o", "nodeaiot": "F", "nodeai": "A",
	"cpusstate": "C", "freemem": "e",
}

var sinfoOptions = []option{
	{long: "all", short: 'a', arg: noArg},
	{long: "format", short: 'o', arg: reqArg},
	{long: "Format", short: 'O', arg: reqArg},
	{long: "help", arg: noArg},
	{long: "long", short: 'l', arg: noArg},
	{long: "Node", short: 'N', arg: noArg},
	{long: "nodes", short: 'n', arg: reqArg},
	{long: "noheader", short: 'h', arg: noArg},
	{long: "partition", short: 'p', arg: reqArg},
	{long: "states", short: 't', arg: reqArg},
	{long: "usage", arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "dead", short: 'd', arg: noArg, unsupported: notBuilt},
	{long: "exact", short: 'e', arg: noArg, unsupported: notBuilt},
	{long: "federation", arg: noArg, unsupported: notBuilt},
	{long: "hide", arg: noArg, unsupported: notBuilt},
	{long: "iterate", short: 'i', arg: reqArg, unsupported: notBuilt},
	{long: "json", arg: noArg, unsupported: notBuilt},
	{long: "list-reasons", short: 'R', arg: noArg, unsupported: notBuilt},
	{long: "local", arg: noArg, unsupported: notBuilt},
	{long: "noconvert", arg: noArg, unsupported: notBuilt},
	{long: "responding", short: 'r', arg: noArg, unsupported: notBuilt},
	{long: "reservation", short: 'T', arg: noArg, unsupported: notBuilt},
	{long: "sort", short: 'S', arg: reqArg, unsupported: notBuilt},
	{long: "summarize", short: 's', arg: noArg, unsupported: notBuilt},
	{long: "yaml", arg: noArg, unsupported: notBuilt},
}

// nodeCode is a node state's sinfo code (%t): idle, mix, alloc, drain, drng, down.
func nodeCode(long string) string {
	switch long {
	case "IDLE":
		return "idle"
	case "MIXED":
		return "mix"
	case "ALLOCATED":
		return "alloc"
	case "DRAINED":
		return "drain"
	case "DRAINING":
		return "drng"
	case "n/a":
		return "n/a"
	}
	return "down"
}

// sinfoRow is one line: a partition's nodes in one state (or one node, -N).
type sinfoRow struct {
	part  string
	def   bool
	state string
	nodes []allocator.NodeStatus
}

func (r sinfoRow) value(key string) string {
	var names []string
	gpus := map[int]bool{}
	for _, n := range r.nodes {
		names = append(names, n.Name)
		gpus[n.GPUsTotal] = true
	}
	names = job.SlurmNodes(names)
	switch key {
	case "P":
		if r.def {
			return r.part + "*"
		}
		return r.part
	case "R":
		return r.part
	case "a":
		return "up"
	case "l":
		return "infinite"
	case "D":
		return strconv.Itoa(len(r.nodes))
	case "t":
		return nodeCode(r.state)
	case "T":
		return strings.ToLower(r.state)
	case "N", "n":
		return hostlist.Compress(names)
	case "o":
		var addrs []string
		for _, n := range r.nodes {
			addrs = append(addrs, n.Addr)
		}
		return strings.Join(addrs, ",")
	case "G":
		var g []string
		for _, c := range slices.Sorted(maps.Keys(gpus)) {
			g = append(g, "gpu:"+strconv.Itoa(c))
		}
		return strings.Join(g, ",")
	case "c":
		return minPlus(r.nodes, func(n allocator.NodeStatus) int64 { return int64(n.CPUsTotal) })
	case "m":
		return minPlus(r.nodes, func(n allocator.NodeStatus) int64 { return n.MemoryMiB })
	case "e":
		return freeMem(r.nodes)
	case "C":
		return cpuStates(r.nodes)
	case "f":
		return nodeFeatures(r.nodes)
	case "E":
		for _, n := range r.nodes {
			if n.Reason != "" {
				return n.Reason
			}
		}
		return "none"
	case "s":
		return "1-infinite"
	case "r":
		return "no"
	case "h":
		return "NO"
	case "g":
		return "all"
	case "F", "A":
		alloc, idle := 0, 0
		for _, n := range r.nodes {
			if n.GPUsUsed > 0 || n.CPUsUsed > 0 {
				alloc++
			} else if n.State == allocator.NodeUp {
				idle++
			}
		}
		if key == "A" {
			return fmt.Sprintf("%d/%d", alloc, idle)
		}
		return fmt.Sprintf("%d/%d/%d/%d", alloc, idle, len(r.nodes)-alloc-idle, len(r.nodes))
	}
	return ""
}

// Sinfo is sinfo: the partitions' nodes by state (-N: node by node), in Slurm's
// formats (-o, -O, -l) and filters (-p, -t, -n), with or without the header (-h). A
// node's partition is its partition label (gangrun's), "gangrun" for nodes without
// one; a node's state counts its GPUs: idle (none in use), mix, alloc (all), drain,
// drng, down.
func Sinfo(ctx context.Context, e *Env, args []string) int {
	v, rest, done, code := parseOpts(e, "sinfo", sinfoOptions, args, 1, "Usage: sinfo [OPTIONS]\n")
	if done {
		return code
	}
	if len(rest) > 0 {
		return errorf(e, "sinfo", 1, "Unrecognized option: %s", rest[0])
	}
	format := sinfoDefault
	switch {
	case v.has("Node"):
		format = sinfoNodes
	case v.has("long"):
		format = sinfoLong
	}
	if v.has("format") {
		format = v["format"]
	}
	var fields []field
	var err error
	if v.has("Format") {
		fields, err = parseFields(v["Format"], sinfoFields)
		for i := range fields {
			fields[i].key = sinfoFields[fields[i].key]
		}
	} else {
		fields, err = parseFormat(format, sinfoLetters)
	}
	if err != nil {
		return usage(e, "sinfo", err.(*UsageError))
	}
	var states []string
	for _, st := range splitList(v["states"]) {
		states = append(states, strings.ToLower(st))
	}
	var wantNodes []string
	if v.has("nodes") {
		if wantNodes, err = hostlist.Expand(v["nodes"]); err != nil {
			return errorf(e, "sinfo", 1, "Invalid node name specified")
		}
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "sinfo", 1, "slurm_load_partitions: Unable to contact slurm controller (connect failure): %v", err)
	}
	defer s.Close()
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		return errorf(e, "sinfo", 1, "slurm_load_node: %v", err)
	}
	nodes := c.NodeList()
	parts := partitions(nodes, defaultPartition(ctx, s, nodes))
	var rows []sinfoRow
	for _, p := range parts {
		if v.has("partition") && !slices.Contains(splitList(v["partition"]), p.name) {
			continue
		}
		byState := map[string][]allocator.NodeStatus{}
		var order []string
		for _, n := range p.nodes {
			if len(wantNodes) > 0 && !slices.Contains(wantNodes, n.Name) {
				continue
			}
			st := nodeState(n)
			if len(states) > 0 && !slices.Contains(states, nodeCode(st)) && !slices.Contains(states, strings.ToLower(st)) {
				continue
			}
			if v.has("Node") {
				rows = append(rows, sinfoRow{part: p.name, def: p.def, state: st, nodes: []allocator.NodeStatus{n}})
				continue
			}
			if _, ok := byState[st]; !ok {
				order = append(order, st)
			}
			byState[st] = append(byState[st], n)
		}
		for _, st := range order {
			rows = append(rows, sinfoRow{part: p.name, def: p.def, state: st, nodes: byState[st]})
		}
		if len(order) == 0 && !v.has("Node") {
			// A partition none of whose nodes is in the states asked for is still a
			// line, of 0 nodes in state n/a (as sinfo -t prints it).
			rows = append(rows, sinfoRow{part: p.name, def: p.def, state: "n/a"})
		}
	}
	if !v.has("noheader") {
		fmt.Fprintln(e.Stdout, render(fields, func(k string) string { return sinfoLetters[k] }))
	}
	for _, r := range rows {
		fmt.Fprintln(e.Stdout, render(fields, r.value))
	}
	return 0
}

// minPlus is sinfo's text for a count of a row's nodes (%c CPUs, %m memory in MiB):
// the count where the nodes agree, else the least followed by "+" (sinfo's
// _build_min_max_32_string without a range).
func minPlus(nodes []allocator.NodeStatus, count func(allocator.NodeStatus) int64) string {
	if len(nodes) == 0 {
		return "0"
	}
	lo, hi := nodeSpan(nodes, count)
	if lo == hi {
		return strconv.FormatInt(lo, 10)
	}
	return strconv.FormatInt(lo, 10) + "+"
}

// nodeSpan is the least and the most of count over nodes (at least one).
func nodeSpan(nodes []allocator.NodeStatus, count func(allocator.NodeStatus) int64) (lo, hi int64) {
	lo, hi = count(nodes[0]), count(nodes[0])
	for _, n := range nodes[1:] {
		lo, hi = min(lo, count(n)), max(hi, count(n))
	}
	return lo, hi
}

// freeMem is sinfo's %e for a row's nodes: the memory (MiB) no job holds, "MIN-MAX"
// where the nodes differ, as sinfo writes its range. Slurm's is the memory the node's
// OS has free; gangrun's nodes report none, so this is the memory not allocated.
func freeMem(nodes []allocator.NodeStatus) string {
	if len(nodes) == 0 {
		return "N/A"
	}
	lo, hi := nodeSpan(nodes, func(n allocator.NodeStatus) int64 { return max(n.MemoryMiB-n.MemoryUsedMiB, 0) })
	if lo == hi {
		return strconv.FormatInt(lo, 10)
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

// cpuStates is sinfo's %C for a row's nodes: CPUs allocated, idle, other (those of
// drained and down nodes) and in all, "A/I/O/T".
func cpuStates(nodes []allocator.NodeStatus) string {
	var a, i, o, t int
	for _, n := range nodes {
		t += n.CPUsTotal
		switch st := nodeState(n); {
		case strings.HasPrefix(st, "DOWN"), st == "DRAINED", st == "DRAINING":
			o += n.CPUsTotal - n.CPUsUsed
			a += n.CPUsUsed
		default:
			a += n.CPUsUsed
			i += n.CPUsTotal - n.CPUsUsed
		}
	}
	return fmt.Sprintf("%d/%d/%d/%d", a, i, o, t)
}

// nodeFeatures is sinfo's %f for a row's nodes: their features (node labels,
// allocator.Features), those of every node of the row as sinfo groups by them;
// "(null)" for none.
func nodeFeatures(nodes []allocator.NodeStatus) string {
	seen := map[string]bool{}
	var out []string
	for _, n := range nodes {
		for _, f := range strings.Split(allocator.Features(n.Labels), ",") {
			if f != "" && !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return orNull(strings.Join(out, ","))
}
