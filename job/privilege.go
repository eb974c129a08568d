package job

import "fmt"

// CheckOperatorOnly refuses what only an operator may ask when queueing a job: a
// priority (sbatch --priority, gangrun submit --priority above 0) and a negative nice
// (sbatch --nice=-N), which would put the job ahead of other users'. slurmctld refuses
// both from a user who is no operator with ESLURM_ACCESS_DENIED, "Access/permission
// denied" (Slurm's sbatch(1): "Only Slurm operators and administrators can set the
// priority of a job"). Who is an operator is the caller's to say: root's MUNGE
// credential or the operator's token (docs/acl.md). The error wraps ErrAccessDenied
// and names the bad value.
func CheckOperatorOnly(spec Spec) error {
	switch {
	case spec.Priority > 0:
		return fmt.Errorf("--priority=%d: %w (only an operator may set a job's priority)", spec.Priority, ErrAccessDenied)
	case spec.Nice < 0:
		return fmt.Errorf("--nice=%d: %w (only an operator may give a negative nice)", spec.Nice, ErrAccessDenied)
	}
	return nil
}
