package slurm

import "context"

func Salloc(ctx context.Context, e *Env, args []string) int { return errorf(e, "salloc", 1, "not yet") }
func Squeue(ctx context.Context, e *Env, args []string) int { return errorf(e, "squeue", 1, "not yet") }
func Scancel(ctx context.Context, e *Env, args []string) int {
	return errorf(e, "scancel", 1, "not yet")
}
func Scontrol(ctx context.Context, e *Env, args []string) int {
	return errorf(e, "scontrol", 1, "not yet")
}
func Sacct(ctx context.Context, e *Env, args []string) int { return errorf(e, "sacct", 1, "not yet") }
func Sinfo(ctx context.Context, e *Env, args []string) int { return errorf(e, "sinfo", 1, "not yet") }

const sbatchHelp = "Usage: sbatch [OPTIONS...] executable [args...]\n"
const srunHelp = "Usage: srun [OPTIONS...] executable [args...]\n"
