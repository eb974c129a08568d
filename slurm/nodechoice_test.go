package slurm

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/allocator"
)

func TestParseNodeChoice(t *testing.T) {
	c, err := ParseNodeChoice(NodeChoiceArgs{ExclusiveSet: true, Constraint: "ib&nvlink", NodeList: "gpu-[1-3],gpu-2", Exclude: "gpu-9"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Exclusive != allocator.ExclusiveNode || c.Constraint != "ib&nvlink" || !slices.Equal(c.NodeList, []string{"gpu-1", "gpu-2", "gpu-3"}) || !slices.Equal(c.ExcNodes, []string{"gpu-9"}) {
		t.Errorf("choice %+v", c)
	}
	if c, err := ParseNodeChoice(NodeChoiceArgs{ExclusiveSet: true, Exclusive: "user"}); err != nil || c.OverSubscribe() != "USER" {
		t.Errorf("--exclusive=user: %+v %v", c, err)
	}
	for _, tc := range []struct {
		a    NodeChoiceArgs
		code int
		want string
	}{
		{NodeChoiceArgs{ExclusiveSet: true, Exclusive: "mcs"}, 255, "error: --exclusive=mcs: gangrun has no MCS labels"},
		{NodeChoiceArgs{ExclusiveSet: true, Exclusive: "bogus"}, 255, `error: Invalid --exclusive specification`},
		{NodeChoiceArgs{NodeList: "/etc/hosts"}, 255, `error: --nodelist="/etc/hosts": a file of node names is not supported by gangrun`},
		{NodeChoiceArgs{Exclude: "gpu-[1-"}, 1, `error: Batch job submission failed: Invalid node name specified: --exclude="gpu-[1-"`},
	} {
		_, err := ParseNodeChoice(tc.a)
		var ue *UsageError
		if !errors.As(err, &ue) || ue.Code != tc.code || !strings.HasPrefix(ue.Msg, tc.want) || strings.Contains(ue.Msg, "\n") {
			t.Errorf("%+v: %v, want exit %d and one line %q...", tc.a, err, tc.code, tc.want)
		}
	}
}

// TestNodeChoiceOnScriptLines: #SBATCH and #GANGRUN lines and gangrun submit's command
// line give the node choice, later ones winning, --exclusive without an argument.
func TestNodeChoiceOnScriptLines(t *testing.T) {
	e := &Env{Environ: os.Environ, Getenv: os.Getenv}
	script := "#!/bin/sh\n#SBATCH --gres=gpu:1 -C ib -x gpu-c\n#GANGRUN --exclusive --nodelist gpu-a\ntrue\n"
	req, err := ParseBatch(e, script, "job.sh", nil, []string{"-x", "gpu-b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := req.Spec.NodeChoice
	if c.Exclusive != allocator.ExclusiveNode || c.Constraint != "ib" || !slices.Equal(c.NodeList, []string{"gpu-a"}) || !slices.Equal(c.ExcNodes, []string{"gpu-b"}) {
		t.Errorf("choice %+v", c)
	}
}

// TestSallocTakesTheNodeChoice: salloc takes sbatch's node-choosing options; -w's
// nodes are its node count.
func TestSallocTakesTheNodeChoice(t *testing.T) {
	var out, errOut strings.Builder
	e := &Env{Stdout: &out, Stderr: &errOut, Environ: os.Environ, Getenv: os.Getenv}
	spec, _, code, done := sallocRequest(e, []string{"--exclusive=user", "-w", "gpu-[1-2]", "-C", "ib", "--gres=gpu:1", "true"})
	if done {
		t.Fatalf("salloc ended: exit %d %s", code, errOut.String())
	}
	if spec.Exclusive != allocator.ExclusiveUser || spec.Constraint != "ib" || !slices.Equal(spec.NodeList, []string{"gpu-1", "gpu-2"}) || spec.MinNodes != 2 {
		t.Errorf("spec: exclusive %q constraint %q nodelist %v nodes %d", spec.Exclusive, spec.Constraint, spec.NodeList, spec.MinNodes)
	}
}
