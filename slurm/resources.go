package slurm

import (
	"errors"
	"fmt"
	"math"
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
	case errors.Is(err, job.ErrAccessDenied) || strings.Contains(text, job.ErrAccessDenied.Error()):
		text = job.ErrAccessDenied.Error() // the words alone (sbatch --priority by a user)
	case errors.Is(err, job.ErrInvalidNice) || strings.Contains(text, job.ErrInvalidNice.Error()):
		text = job.ErrInvalidNice.Error() // slurmctld's words alone (sbatch --nice=-N by a user)
	}
	return errorf(e, cmd, 1, "%s: %s", failed, text)
}

// slurmMem writes mib MiB as Slurm's commands do (convert_num_unit): in the largest
// unit (M, G, T, P) reached by dividing by 1024 while the value is a multiple of 512,
// whole ("2G", "1500M") or with two decimals ("1.50G"); 0 as "0".
func slurmMem(mib int64) string {
	if mib == 0 {
		return "0"
	}
	const units = "MGTPE"
	f, i := float64(mib), 0
	for f >= 1024 && math.Mod(f, 512) == 0 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == math.Trunc(f) {
		return fmt.Sprintf("%d%c", int64(f), units[i])
	}
	return fmt.Sprintf("%.2f%c", f, units[i])
}

// minMemory is squeue's MIN_MEMORY (%m, -O minmemory) of spec: its --mem, or its
// --mem-per-cpu (per CPU, as Slurm shows it), in MiB; "0" for none, and for a
// --mem-per-gpu, which Slurm keeps apart (MemPerTres).
func minMemory(spec job.Spec) string {
	if spec.MemPerCPU > 0 {
		return slurmMem(spec.MemPerCPU >> 20)
	}
	return slurmMem(spec.Mem >> 20)
}
