package slurm

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/job"
)

// submitFailed prints a refused submission (sbatch's "Batch job submission failed",
// salloc's "Job submit/allocate failed": failed) and returns exit 1. A job whose CPUs
// or memory per node no node has reads as Slurm 22.05's slurmctld words it under
// EnforcePartLimits=ALL and a memory-scheduling SelectTypeParameters (CR_Core_Memory),
// which is how gangrun schedules: "More processors requested than permitted";
// "Requested node configuration is not available", after "Memory specification can
// not be satisfied" for a --mem (not a --mem-per-cpu or --mem-per-gpu). The refusal
// comes back from the cluster as text (job.Submit's answer), so it is told by the
// allocator's words.
func submitFailed(e *Env, cmd, failed string, spec job.Spec, err error) int {
	text := err.Error()
	switch {
	case errors.Is(err, allocator.ErrTooManyCPUs) || strings.Contains(text, allocator.ErrTooManyCPUs.Error()):
		text = "More processors requested than permitted"
	case errors.Is(err, allocator.ErrTooMuchMemory) || strings.Contains(text, allocator.ErrTooMuchMemory.Error()):
		if spec.Mem > 0 {
			fmt.Fprintf(e.Stderr, "%s: error: Memory specification can not be satisfied\n", cmd)
		}
		text = "Requested node configuration is not available"
	}
	return errorf(e, cmd, 1, "%s: %s", failed, text)
}
