package job

import (
	"errors"
	"fmt"
)

// ErrInvalidNice: a negative nice from a user who is no operator (ESLURM_INVALID_NICE,
// slurmctld's answer to sbatch --nice=-N and salloc's: "Invalid --nice value").
var ErrInvalidNice = errors.New("Invalid --nice value")

// CheckOperatorOnly refuses what only an operator may ask when queueing a job, which
// would put the job ahead of other users': a negative nice (sbatch --nice=-N), which
// slurmctld 22.05 refuses from a user with ErrInvalidNice, and a priority (sbatch
// --priority, gangrun submit --priority above 0), which it takes from an operator only
// (sbatch(1): "Only Slurm operators and administrators can set the priority of a job")
// and silently ignores from a user; gangrun refuses it with ErrAccessDenied ("Access/
// permission denied", what scontrol update answers), as it ignores no option silently.
// Who is an operator is the caller's to say: root's MUNGE credential or the operator's
// token (docs/acl.md). The error names the bad value.
func CheckOperatorOnly(spec Spec) error {
	switch {
	case spec.Priority > 0:
		return fmt.Errorf("--priority=%d: %w (only an operator may set a job's priority)", spec.Priority, ErrAccessDenied)
	case spec.Nice < 0:
		return fmt.Errorf("--nice=%d: %w (only an operator may give a negative nice)", spec.Nice, ErrInvalidNice)
	}
	return nil
}
