package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/slurm"
)

// exclusiveAlone is what --exclusive given alone reads as (pflag's NoOptDefVal), told
// apart from --exclusive=user.
const exclusiveAlone = "yes"

// nodeChoiceFlags are `gangrun submit`'s options that choose the job's nodes, as
// sbatch's (docs/slurm.md): --exclusive[=user], --constraint, --nodelist, --exclude.
type nodeChoiceFlags struct {
	exclusive, constraint, nodelist, exclude string
}

func (f *nodeChoiceFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.exclusive, "exclusive", "", "take the nodes whole: no other job shares them (=user: only this user's jobs do), as sbatch --exclusive")
	fs.Lookup("exclusive").NoOptDefVal = exclusiveAlone
	fs.StringVarP(&f.constraint, "constraint", "C", "", "node features (labels) the nodes must have: a&b, a|b; a feature is a label name or KEY=VALUE")
	fs.StringVarP(&f.nodelist, "nodelist", "w", "", "the nodes the job runs on, a hostlist (gpu-[1-4])")
	fs.StringVarP(&f.exclude, "exclude", "x", "", "nodes the job never runs on, a hostlist")
}

// choice is the flags' allocator.NodeChoice (slurm.ParseNodeChoice), its error's text
// without sbatch's "error: " and "Batch job submission failed: ".
func (f *nodeChoiceFlags) choice() (allocator.NodeChoice, error) {
	x := f.exclusive
	if x == exclusiveAlone {
		x = ""
	}
	c, err := slurm.ParseNodeChoice(slurm.NodeChoiceArgs{ExclusiveSet: f.exclusive != "", Exclusive: x,
		Constraint: f.constraint, NodeList: f.nodelist, Exclude: f.exclude})
	if err != nil {
		return c, trimmedError{strings.TrimPrefix(strings.TrimPrefix(err.Error(), "error: "), "Batch job submission failed: ")}
	}
	return c, nil
}

// trimmedError is an error whose text is given.
type trimmedError struct{ msg string }

func (e trimmedError) Error() string { return e.msg }

// printNodeChoice writes, for `gangrun show`, the nodes a job chose (with scontrol's
// names for them), when it chose any.
func printNodeChoice(w io.Writer, sp job.Spec) {
	if sp.NodeChoice.Exclusive == "" && sp.Constraint == "" && len(sp.NodeList) == 0 && len(sp.ExcNodes) == 0 {
		return
	}
	fmt.Fprintf(w, "   OverSubscribe=%s Features=%s ReqNodeList=%s ExcNodeList=%s\n", sp.OverSubscribe(), orDash(sp.Constraint),
		orDash(hostlist.Compress(sp.NodeList)), orDash(hostlist.Compress(sp.ExcNodes)))
}
