package main

import (
	"fmt"

	"github.com/gangrun/gangrun/job"
)

// checkSubmit refuses, before Consul is asked anything, a spec that `gangrun run` would
// refuse or that could only fail on its nodes (job.Spec.CheckHere), and says how a
// --time whose fields run past their clock range was read (job.TimeNote): sbatch's
// reading, said rather than taken silently.
func checkSubmit(e *env, spec job.Spec, timeLimit string) int {
	if err := spec.CheckHere(); err != nil {
		return usageErr(e, "submit", "%v", err)
	}
	if n := job.TimeNote(timeLimit); n != "" {
		fmt.Fprintf(e.stderr, "gangrun submit: note: %s\n", oneLine(n))
	}
	return exitOK
}
