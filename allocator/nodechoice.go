package allocator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gangrun/gangrun/internal/quote"
)

// NodeChoice is how a request chooses its nodes by name, feature and sharing, as
// Slurm's sbatch/salloc options do (sbatch(1), slurm 22.05):
//
//   - Exclusive is --exclusive: ExclusiveNode ("" shares) takes the nodes whole, no
//     other grant on them while it holds them, and waits for nodes no grant holds;
//     ExclusiveUser (--exclusive=user) shares them with its own user's grants only.
//     scontrol shows them as OverSubscribe=NO and USER (job_share_string).
//   - Constraint is -C/--constraint: node features joined by '&' (and) and '|' (or),
//     evaluated left to right as Slurm does (checkFeatures); a feature is a node label
//     (checkFeatures says how one matches).
//   - NodeList is -w/--nodelist, the nodes the request must include (expanded from
//     a hostlist by the caller); ExcNodes is -x/--exclude, nodes it never takes.
//
// The zero value chooses nothing: any node, shared.
type NodeChoice struct {
	Exclusive  string   `json:"exclusive,omitempty"`
	Constraint string   `json:"constraint,omitempty"`
	NodeList   []string `json:"nodelist,omitempty"`
	ExcNodes   []string `json:"exc_nodes,omitempty"`
}

// The values of NodeChoice.Exclusive besides "" (sbatch --exclusive[=user|mcs]; mcs,
// Slurm's multi-category security labels, gangrun has not).
const (
	ExclusiveNode = "node"
	ExclusiveUser = "user"
)

// Why a node is out, for the checkers of this file (feasible.go's list has the others).
const (
	reasonFeatures = "without the features (--constraint)"
	reasonNodeList = "not in --nodelist"
	reasonExcNodes = "in --exclude"
	reasonShared   = "in use by another job (--exclusive)"
)

// maxConstraintBytes bounds a --constraint expression, in bytes (Slurm's features are
// short words; a constraint names a few).
const maxConstraintBytes = 1024

// maxChoiceNodes bounds the nodes --nodelist and --exclude name, each: the job's and
// its request's records carry them, and a Consul value holds at most 512 KiB. Both
// lists this long, of names of the longest (128 bytes, 131 written in JSON), take
// 2 × 1024 × 131 bytes, about 268 KB, leaving room for the rest of the record.
const maxChoiceNodes = 1024

// OverSubscribe returns how scontrol show job (OverSubscribe=) and squeue (%h) show
// the choice: NO for --exclusive, USER for --exclusive=user, OK otherwise (Slurm's
// job_share_string for a job that did not ask).
func (c NodeChoice) OverSubscribe() string {
	switch c.Exclusive {
	case ExclusiveNode:
		return "NO"
	case ExclusiveUser:
		return "USER"
	}
	return "OK"
}

// ParseExclusive reads sbatch's --exclusive argument: "" (the option alone) is
// ExclusiveNode, "user" ExclusiveUser; "mcs" is refused (gangrun has no MCS labels)
// and anything else is not --exclusive's.
func ParseExclusive(arg string) (string, error) {
	switch arg {
	case "":
		return ExclusiveNode, nil
	case ExclusiveUser:
		return ExclusiveUser, nil
	case "mcs":
		return "", errors.New("--exclusive=mcs: gangrun has no MCS labels (Slurm's MCSPlugin); --exclusive and --exclusive=user are supported")
	}
	return "", fmt.Errorf("--exclusive=%s: want --exclusive or --exclusive=user", quote.Q(arg))
}

// Validate checks the choice's own fields: an Exclusive of ParseExclusive's, a
// constraint that parses (ParseConstraint), at most maxChoiceNodes node names in each
// list, each of printable text, and no node both in NodeList and ExcNodes.
func (c NodeChoice) Validate() error {
	switch c.Exclusive {
	case "", ExclusiveNode, ExclusiveUser:
	default:
		return fmt.Errorf("--exclusive=%s: want --exclusive or --exclusive=user", quote.Q(c.Exclusive))
	}
	if _, err := ParseConstraint(c.Constraint); err != nil {
		return err
	}
	for _, l := range []struct {
		flag  string
		names []string
	}{{"--nodelist", c.NodeList}, {"--exclude", c.ExcNodes}} {
		if len(l.names) > maxChoiceNodes {
			return fmt.Errorf("%s: %d nodes, want at most %d", l.flag, len(l.names), maxChoiceNodes)
		}
		for _, n := range l.names {
			if n == "" || len(n) > maxNameBytes {
				return fmt.Errorf("%s %s: a node name of 1 to %d bytes", l.flag, quote.Q(n), maxNameBytes)
			}
			if err := checkPrintable(l.flag, n); err != nil {
				return err
			}
		}
	}
	for _, n := range c.NodeList {
		if slices.Contains(c.ExcNodes, n) {
			return fmt.Errorf("--nodelist and --exclude both name node %s", n)
		}
	}
	return nil
}

// featureTerm is one feature of a constraint and the operator that joins it to what
// comes before it ('&' or '|'; '&' for the first).
type featureTerm struct {
	op      byte
	feature string
}

// ParseConstraint parses Slurm's --constraint in the forms gangrun honours: features
// joined by '&' (AND) and '|' (OR), "" for none. Slurm's other forms are refused in
// one line naming them: a matching OR or counts in brackets ("[rack1|rack2]",
// "[a*2&b*4]"), counts ("a*2"), parentheses, and the ',' Slurm takes for AND in
// older releases.
func ParseConstraint(s string) ([]featureTerm, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) > maxConstraintBytes {
		return nil, fmt.Errorf("--constraint %s: longer than %d bytes", quote.Q(s), maxConstraintBytes)
	}
	if err := checkPrintable("--constraint", s); err != nil {
		return nil, err
	}
	if i := strings.IndexAny(s, "[]()*,!"); i >= 0 {
		return nil, fmt.Errorf("--constraint %s: %q is not supported by gangrun (features joined by & and | are)", quote.Q(s), s[i:i+1])
	}
	var terms []featureTerm
	if !eachFeature(s, func(op byte, f string) { terms = append(terms, featureTerm{op: op, feature: f}) }) {
		// Slurm's words for "a&&b", "a b" (ESLURM_INVALID_FEATURE), then the value.
		return nil, fmt.Errorf("Invalid feature specification: --constraint %s", quote.Q(s))
	}
	return terms, nil
}

// eachFeature calls fn, in order, with each feature of constraint s (blanks around it
// trimmed) and the operator that joins it to what comes before it ('&' for the first).
// It returns false, having called fn for the features before it, at a feature that is
// empty, holds a blank or one of the characters ParseConstraint refuses ("a&&b", "a b",
// "[a|b]"), true otherwise. It allocates nothing: the scheduler evaluates constraints
// with it on each node for each request (meets).
func eachFeature(s string, fn func(op byte, feature string)) bool {
	op := byte('&')
	for {
		i := strings.IndexAny(s, "&|")
		f := s
		if i >= 0 {
			f = s[:i]
		}
		f = strings.TrimSpace(f)
		if f == "" || strings.ContainsAny(f, " \t[]()*,!") {
			return false
		}
		fn(op, f)
		if i < 0 {
			return true
		}
		op, s = s[i], s[i+1:]
	}
}

// hasFeature reports whether node n has feature f: a label named f (any value), or,
// for f written KEY=VALUE, the label KEY with that value. Node features are gangrun's
// node labels (`gangrun agent --labels`, docs/slurm.md, "Node features").
func hasFeature(n *NodeState, f string) bool {
	if k, v, ok := strings.Cut(f, "="); ok {
		got, has := n.Record.Labels[k]
		return has && got == v
	}
	_, has := n.Record.Labels[f]
	return has
}

// meets evaluates constraint on node n, left to right without precedence as Slurm
// does ("a|b&c" is (a|b)&c); "" is met by every node, a constraint that does not parse
// (eachFeature) by none. It parses as it goes, allocating nothing.
func meets(constraint string, n *NodeState) bool {
	if constraint == "" {
		return true
	}
	ok, first := true, true
	valid := eachFeature(constraint, func(op byte, f string) {
		has := hasFeature(n, f)
		switch {
		case first:
			ok = has
		case op == '&':
			ok = ok && has
		default:
			ok = ok || has
		}
		first = false
	})
	return valid && ok
}

// checkFeatures rules out a node that does not meet r's --constraint. A constraint
// that does not parse meets no node (Validate refuses it before it gets here).
func checkFeatures(r Request, n *NodeState) string {
	if !meets(r.Constraint, n) {
		return reasonFeatures
	}
	return ""
}

// checkNodeList rules out a node outside r's --nodelist: a request with a nodelist
// takes exactly those nodes (its node count is the list's; the job's submit refuses
// a larger --nodes).
func checkNodeList(r Request, n *NodeState) string {
	if len(r.NodeList) > 0 && !slices.Contains(r.NodeList, n.Record.Name) {
		return reasonNodeList
	}
	return ""
}

// checkExcNodes rules out a node in r's --exclude.
func checkExcNodes(r Request, n *NodeState) string {
	if slices.Contains(r.ExcNodes, n.Record.Name) {
		return reasonExcNodes
	}
	return ""
}

// occupant is a grant on a node, as --exclusive looks at it: its request, user and
// NodeChoice.Exclusive.
type occupant struct {
	id, user, exclusive string
}

// occupants returns, node by node, the grants c holds (all but the refused), with what
// their requests say of sharing (a grant whose request is gone counts as shared, its
// user unknown), and the holders of the node's GPU keys that are no such grant (a
// step of an ended grant still stopping there: its GPUs are not free yet either).
func occupants(c *Cluster) map[string][]occupant {
	out := map[string][]occupant{}
	for id, g := range c.Grants {
		if g.State == GrantRefused {
			continue
		}
		o := occupant{id: id}
		if r, ok := c.Requests[id]; ok {
			o.user, o.exclusive = r.User, r.Exclusive
		}
		for _, gn := range g.Nodes {
			if !slices.ContainsFunc(out[gn.Name], func(x occupant) bool { return x.id == id }) {
				out[gn.Name] = append(out[gn.Name], o)
			}
		}
	}
	for name, n := range c.Nodes {
		for _, id := range n.Held {
			if _, ok := c.Grants[id]; !ok && !slices.ContainsFunc(out[name], func(x occupant) bool { return x.id == id }) {
				out[name] = append(out[name], occupant{id: id})
			}
		}
	}
	return out
}

// sharedWith returns the check of --exclusive against the grants on each node (occ:
// node → its occupants, this pass's grants included): a request that is exclusive
// takes no node another grant holds, and no request takes a node an exclusive grant
// holds; with ExclusiveUser, on either side, grants of the same user share. Slurm's
// pending reason for it is Resources (the node is busy), which waitReason's line is.
func sharedWith(occ map[string][]occupant) Checker {
	return func(r Request, n *NodeState) string {
		for _, o := range occ[n.Record.Name] {
			if o.id == r.ID {
				continue
			}
			sameUser := o.user != "" && o.user == r.User
			for _, x := range []string{r.Exclusive, o.exclusive} {
				if x == ExclusiveNode || x == ExclusiveUser && !sameUser {
					return reasonShared
				}
			}
		}
		return ""
	}
}

// shapeKey writes what of the choice placement looks at, for the request's shapeKey
// (which adds the request's user: --exclusive=user grants share with their user's).
func (c NodeChoice) shapeKey() string {
	return "\x03" + c.Exclusive + "\x00" + c.Constraint + "\x00" + strings.Join(c.NodeList, ",") + "\x00" + strings.Join(c.ExcNodes, ",")
}

// feasibleChoice refuses, for CheckFeasible, a choice no registered node could ever
// meet, in Slurm's words (slurmctld's errors for the job, sbatch exit 1) followed by
// the value: a --nodelist or --exclude node that is not registered ("Invalid node
// name specified", ESLURM_INVALID_NODE_NAME), a --constraint no node meets ("Invalid
// feature specification", ESLURM_INVALID_FEATURE).
func feasibleChoice(c *Cluster, r Request) error {
	for _, l := range []struct {
		flag  string
		names []string
	}{{"--nodelist", r.NodeList}, {"--exclude", r.ExcNodes}} {
		for _, n := range l.names {
			if _, ok := c.Nodes[n]; !ok {
				return fmt.Errorf("Invalid node name specified: %s %s is not a registered node", l.flag, n)
			}
		}
	}
	if r.Constraint == "" {
		return nil
	}
	if _, err := ParseConstraint(r.Constraint); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if meets(r.Constraint, n) {
			return nil
		}
	}
	return fmt.Errorf("Invalid feature specification: --constraint %s: no node has those features (node labels)", quote.Q(r.Constraint))
}

// Features writes a node's labels as Slurm's node features (scontrol show node's
// AvailableFeatures), the features --constraint matches: KEY=VALUE, or KEY alone for
// an empty value, sorted, joined by ','; the labels placement reads itself
// (partition, switch, spine) are left out. "" for none.
func Features(labels map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		switch k {
		case LabelPartition, LabelSwitch, LabelSpine:
			continue
		}
		if labels[k] == "" {
			out = append(out, k)
		} else {
			out = append(out, k+"="+labels[k])
		}
	}
	return strings.Join(out, ",")
}
