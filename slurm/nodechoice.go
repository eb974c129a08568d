package slurm

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/job"
)

// NodeChoiceArgs are the options that choose a job's nodes as given, for
// ParseNodeChoice: Exclusive is --exclusive's argument ("" alone, "user"), used only
// when ExclusiveSet; the rest as typed ("" when not).
type NodeChoiceArgs struct {
	ExclusiveSet                             bool
	Exclusive, Constraint, NodeList, Exclude string
}

// ParseNodeChoice reads sbatch's, salloc's and `gangrun submit`'s --exclusive[=user],
// -C/--constraint, -w/--nodelist and -x/--exclude into an allocator.NodeChoice: the
// hostlists expanded (hostlist.Expand, duplicates dropped). What gangrun cannot
// honour is refused in one line, as a *UsageError with sbatch's exit code:
// --exclusive=mcs (255, an option's error), and a value not --exclusive's in sbatch's
// words ("Invalid --exclusive specification", 255); a node list read from a file
// (Slurm's -w with a '/', 255); a hostlist that does not parse (1, "Batch job
// submission failed: Invalid node name specified", as Slurm 22.05 says of one). The constraint's
// syntax is checked with the job (job.Spec.Validate, allocator.ParseConstraint).
func ParseNodeChoice(a NodeChoiceArgs) (allocator.NodeChoice, error) {
	var c allocator.NodeChoice
	if a.ExclusiveSet {
		x, err := allocator.ParseExclusive(a.Exclusive)
		switch {
		case err != nil && a.Exclusive == "mcs":
			return c, badf("%v", err) // Slurm takes it; gangrun cannot honour it
		case err != nil:
			return c, bad("exclusive") // sbatch's words for a value it does not know
		}
		c.Exclusive = x
	}
	c.Constraint = a.Constraint
	for _, l := range []struct {
		name, arg string
		to        *[]string
	}{{"nodelist", a.NodeList, &c.NodeList}, {"exclude", a.Exclude, &c.ExcNodes}} {
		if l.arg == "" {
			continue
		}
		if strings.Contains(l.arg, "/") {
			return c, badf("--%s=%s: a file of node names is %s; give a hostlist", l.name, quote.Q(l.arg), notBuilt)
		}
		hosts, err := hostlist.Expand(l.arg)
		if err != nil {
			return c, &UsageError{Msg: fmt.Sprintf("error: Batch job submission failed: Invalid node name specified: --%s=%s: %v", l.name, quote.Q(l.arg), err), Code: 1}
		}
		var names []string
		for _, h := range hosts {
			if !slices.Contains(names, h) {
				names = append(names, h)
			}
		}
		*l.to = names
	}
	return c, nil
}

// nodeChoice sets spec's node choice from the options (ParseNodeChoice).
func (o *batchOpts) nodeChoice(spec *job.Spec) error {
	v := o.v
	c, err := ParseNodeChoice(NodeChoiceArgs{ExclusiveSet: v.has("exclusive"), Exclusive: v["exclusive"],
		Constraint: v["constraint"], NodeList: v["nodelist"], Exclude: v["exclude"]})
	spec.NodeChoice = c
	return err
}

// nodeChoiceAlias returns the #GANGRUN (and `gangrun submit`) option o as sbatch's
// own where it is one of the node choice's: -C, -w, -x and --exclusive's optional
// argument, as `gangrun submit` takes them; any other o as it is.
func nodeChoiceAlias(o option) option {
	switch o.long {
	case "exclusive", "constraint", "nodelist", "exclude":
		for _, so := range sbatchOptions {
			if so.long == o.long {
				o.short, o.arg = so.short, so.arg
			}
		}
	}
	return o
}
