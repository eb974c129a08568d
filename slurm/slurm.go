// Package slurm is gangrun's Slurm front end: the gangrun binary acts as sbatch, srun,
// salloc, squeue, scancel, scontrol, sacct, sinfo, sstat, sprio and sshare when run
// under those names (argv[0]; `make install` and `gangrun slurm-links DIR` make the
// links), with Slurm's options, output formats, state codes, messages and exit codes,
// over gangrun's cluster: a job sbatch queues is a gangrun job (package job) with a
// Batch, its script run once as Slurm's batch step on its first node, srun's steps
// across its nodes.
//
// What each command and option does, and what gangrun deliberately does differently,
// is docs/slurm.md. An option of Slurm's that gangrun does not build is refused in
// Slurm's words and with its exit code (255 for sbatch's, srun's and salloc's option
// errors, 1 for the others'), never ignored.
package slurm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// command is one Slurm command of the front end: its name and what runs it.
type command struct {
	name string
	run  func(ctx context.Context, e *Env, args []string) int
}

// commands are the commands the front end answers to, as argv[0]'s base name.
func commands() []command {
	return []command{{"sbatch", Sbatch}, {"srun", Srun}, {"salloc", Salloc}, {"squeue", Squeue},
		{"scancel", Scancel}, {"scontrol", Scontrol}, {"sacct", Sacct}, {"sinfo", Sinfo},
		{"sstat", Sstat}, {"sprio", Sprio}, {"sshare", Sshare}, {"sattach", Sattach}}
}

// Names are the commands the front end answers to, as argv[0]'s base name.
func Names() []string {
	var out []string
	for _, c := range commands() {
		out = append(out, c.name)
	}
	return out
}

// Is reports whether argv0's base name is one of Names.
func Is(argv0 string) bool {
	return slices.Contains(Names(), filepath.Base(argv0))
}

// Cluster is what the front end needs of gangrun's cluster; cmd/gangrun gives it, as
// `gangrun submit` and `gangrun cancel` do the same.
type Cluster interface {
	// Open connects to the cluster's Consul (CONSUL_HTTP_ADDR and the other CONSUL_*
	// variables); the caller closes it.
	Open(ctx context.Context) (Store, error)
	// Munge is this host's munged where the cluster's agents check MUNGE credentials,
	// nil where they check none.
	Munge(ctx context.Context, s Store) (*identity.Munge, error)
	// Submit queues spec (the tasks of array a, when a is not nil) as this process's
	// user and returns its id (and the tasks' ids).
	Submit(ctx context.Context, s Store, spec job.Spec, a *job.Array) (string, []string, error)
	// Cancel cancels job or array id as this process's user, and returns how many jobs
	// it stopped (0: it had ended). Errors wrap job.ErrNotFound, job.ErrNotYours.
	Cancel(ctx context.Context, s Store, id string) (int, error)
	// Hold does op (scontrol hold, uhold, release, requeue, requeuehold) on job or array id as this process's
	// user, and returns how many jobs changed. Errors wrap job.ErrNotFound,
	// job.ErrFinished, job.ErrNotPending, job.ErrHeldByOperator, job.ErrNotYours.
	Hold(ctx context.Context, s Store, id string, op job.HoldOp) (int, error)
	// Update makes scontrol update's change u of job or array id as this process's
	// user, and returns how many jobs changed. Errors wrap job.DoUpdate's and
	// job.ErrNotYours.
	Update(ctx context.Context, s Store, id string, u job.Update) (int, error)
	// Signal sends sig to running job or array id where target says (job.SignalSteps,
	// job.SignalBatch, job.SignalFull) as this process's user, without cancelling it,
	// and returns how many jobs it reached. Errors wrap job.ErrNotFound,
	// job.ErrPending, job.ErrFinished, job.ErrNotRunning, job.ErrNotYours.
	Signal(ctx context.Context, s Store, id string, sig syscall.Signal, target string) (int, error)
}

// Store is the cluster's Consul as the front end uses it: gangrun's store, closed when
// done.
type Store interface {
	store.Store
	Close()
}

// Env is what a command may touch of the outside world.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv reads, and Environ lists, the command's environment.
	Getenv  func(string) string
	Environ func() []string
	// Signals delivers the signals srun and salloc pass to their tasks; nil for none.
	Signals <-chan os.Signal
	// Cluster is gangrun's cluster.
	Cluster Cluster
	// Self is the gangrun binary (salloc's shell and srun find it on PATH as srun).
	Self string
}

// Main runs the Slurm command name (one of Names) with args (without argv[0]) and
// returns its exit code.
func Main(ctx context.Context, name string, e *Env, args []string) int {
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, e, args)
		}
	}
	fmt.Fprintf(e.Stderr, "gangrun: %s is no Slurm command gangrun answers to\n", name)
	return 2
}

// errorf prints "CMD: error: MSG" as Slurm's commands print their errors, and
// returns code.
func errorf(e *Env, cmd string, code int, format string, a ...any) int {
	fmt.Fprintf(e.Stderr, "%s: error: %s\n", cmd, fmt.Sprintf(format, a...))
	return code
}

// usage prints a UsageError's message with the command's name and returns its code.
func usage(e *Env, cmd string, err *UsageError) int {
	if err.Before != "" {
		fmt.Fprintln(e.Stderr, err.Before)
	}
	fmt.Fprintf(e.Stderr, "%s: %s\n", cmd, err.Msg)
	return err.Code
}
