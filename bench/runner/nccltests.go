package runner

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gangrun/gangrun/bench"
)

// RunnerScript is the name of the shell script that runs the nccl-tests binaries one
// after the other, in the run's scratch directory.
const RunnerScript = "nccl-tests.sh"

// ncclTests runs the nccl-tests binaries one after the other, each as one process
// driving all of the node's workers' GPUs (-g), and parses what they print.
func (g gang) ncclTests(ctx context.Context) ([]bench.Result, error) {
	if g.gpus() == 0 {
		return nil, &UsageError{Err: fmt.Errorf("--engine nccl-tests needs GPUs, and this node has none allocatable")}
	}
	plan := g.cfg.Plan
	nproc := g.prepared.Config.NProcPerNode
	outs, script, err := ncclTestsScript(plan, nproc, g.dir)
	if err != nil {
		return nil, err
	}
	runner := filepath.Join(g.dir, RunnerScript)
	if err := os.WriteFile(runner, []byte(script), 0o644); err != nil {
		return nil, fmt.Errorf("write the nccl-tests runner: %w", err)
	}
	lc := g.prepared.Config
	lc.Command = []string{"/bin/sh", runner}
	lc.NProcPerNode = 1 // one nccl-tests process drives every GPU (-g)
	stop := g.progress.tick("nccl-tests " + joinOps(plan.Ops))
	err = g.supervise(ctx, lc)
	stop()
	if err != nil {
		if w := g.prepared.Config.Report; w != nil {
			dumpOutputs(w, outs)
		}
		return nil, err
	}
	var results []bench.Result
	for i, op := range plan.Ops {
		f, err := os.Open(outs[i])
		if err != nil {
			return nil, err
		}
		rs, err := bench.Parse(f, bench.ParseOptions{Op: op})
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op.Program(), err)
		}
		for j := range rs {
			if rs[j].Ranks == 0 {
				rs[j].Ranks = nproc
			}
		}
		results = append(results, rs...)
	}
	return results, nil
}

// ncclTestsScript returns the /bin/sh script that runs plan's nccl-tests binaries on
// gpus GPUs one after the other, each writing to its own file in dir (outs, one per
// operation), stopping at the first that fails. A binary not on PATH is a
// *NotFoundError.
func ncclTestsScript(plan bench.Plan, gpus int, dir string) (outs []string, script string, err error) {
	var sh strings.Builder
	sh.WriteString("set -e\n")
	outs = make([]string, len(plan.Ops))
	for i, op := range plan.Ops {
		if _, err := exec.LookPath(op.Program()); err != nil {
			return nil, "", &NotFoundError{Program: op.Program(), msg: fmt.Sprintf(
				"--engine nccl-tests: %s not found on PATH (build NVIDIA/nccl-tests and put its build/ directory on PATH)", op.Program())}
		}
		outs[i] = filepath.Join(dir, op.Program()+".out")
		sh.WriteString(shellJoin(plan.NCCLTestsArgs(op, gpus)) + " >" + shellQuote(outs[i]) + "\n")
	}
	return outs, sh.String(), nil
}

// dumpOutputs writes what the nccl-tests binaries of a failed run printed, each file
// under a "--- name ---" line.
func dumpOutputs(w io.Writer, outs []string) {
	for _, o := range outs {
		if b, err := os.ReadFile(o); err == nil && len(b) > 0 {
			fmt.Fprintf(w, "--- %s ---\n%s", filepath.Base(o), b)
		}
	}
}

func joinOps(ops []bench.Op) string {
	s := make([]string, len(ops))
	for i, op := range ops {
		s[i] = string(op)
	}
	return strings.Join(s, ",")
}

// shellQuote quotes s for /bin/sh: in single quotes, each ' in s written as a closing
// quote, a backslash-escaped quote and an opening quote.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellJoin quotes each of args for /bin/sh and joins them with spaces.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}
