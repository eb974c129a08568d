package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/slurm"
)

// slurmCluster gives the Slurm front end gangrun's cluster as `gangrun submit` and
// `gangrun cancel` use it: Consul from the CONSUL_* variables, the caller's MUNGE
// credential where the agents check them, a user's token's request box. A Slurm
// command is one process, one caller and one cluster: the caller's token's identity
// and the cluster's MUNGE sealer are found on first use and kept (scancel -u cancels
// job after job; salloc submits, then seals its allocation's release).
type slurmCluster struct {
	e *env

	whoOnce sync.Once
	who     acl.Identity
	whoErr  error

	mungeOnce sync.Once
	munge     *identity.Munge
	mungeErr  error
}

// caller is who the caller's token is (acl.Whoami, asked once; a foreign token is no
// error) and the cluster's MUNGE sealer, which Submit and Cancel act on.
func (c *slurmCluster) caller(ctx context.Context, s slurm.Store) (acl.Identity, *identity.Munge, error) {
	c.whoOnce.Do(func() { c.who, c.whoErr = acl.Whoami(ctx, s) })
	if c.whoErr != nil && !errors.Is(c.whoErr, acl.ErrForeignToken) {
		return acl.Identity{}, nil, c.whoErr
	}
	munge, err := c.Munge(ctx, s)
	return c.who, munge, err
}

// Open implements slurm.Cluster.
func (c *slurmCluster) Open(ctx context.Context) (slurm.Store, error) {
	s, err := store.NewConsulFrom("", "--consul")
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Munge implements slurm.Cluster.
func (c *slurmCluster) Munge(ctx context.Context, s slurm.Store) (*identity.Munge, error) {
	c.mungeOnce.Do(func() { c.munge, c.mungeErr = clusterSealer(ctx, c.e, s) })
	return c.munge, c.mungeErr
}

// Submit implements slurm.Cluster: as `gangrun submit` queues a job.
func (c *slurmCluster) Submit(ctx context.Context, s slurm.Store, spec job.Spec, a *job.Array) (string, []string, error) {
	who, munge, err := c.caller(ctx, s)
	if err != nil {
		return "", nil, err
	}
	return queueJob(ctx, s, who, munge, spec, a)
}

// jobActions is what the Slurm commands do to a job: as job.Asker does it, through the
// user's request box, or as job.Actor does, directly (route).
type jobActions interface {
	Cancel(ctx context.Context, s store.Store, id string) (int, bool, error)
	Hold(ctx context.Context, s store.Store, id string, op job.HoldOp) (int, error)
	Update(ctx context.Context, s store.Store, id string, u job.Update) (int, error)
	Signal(ctx context.Context, s store.Store, id string, sig syscall.Signal, target string) (int, error)
}

// route says how this process's user acts on jobs: through the user's request box
// (job.Asker) where the cluster checks who asks (a user's token, MUNGE), else
// directly (job.Actor).
func (c *slurmCluster) route(ctx context.Context, s slurm.Store) (jobActions, error) {
	who, munge, err := c.caller(ctx, s)
	if err != nil {
		return nil, err
	}
	if who.Role == acl.RoleUser || munge != nil {
		a := asker(munge)
		if who.Role == acl.RoleUser {
			a.User = who.User
		}
		return a, nil
	}
	return actorOf(who), nil
}

// Cancel implements slurm.Cluster: as `gangrun cancel` cancels a job.
func (c *slurmCluster) Cancel(ctx context.Context, s slurm.Store, id string) (int, error) {
	do, err := c.route(ctx, s)
	if err != nil {
		return 0, err
	}
	n, _, err := do.Cancel(ctx, s, id)
	return n, err
}

// Hold implements slurm.Cluster: scontrol hold, uhold, release, requeue and
// requeuehold (route). A job that requeues itself (scontrol requeue $SLURM_JOB_ID in
// its own step, as submitit's and Lightning's signal handlers do) has its processes,
// this scontrol among them, sent SIGTERM as the requeue stops its steps: scontrol then
// ignores SIGTERM, so that it still reports the requeue and exits 0, as Slurm's
// scontrol has its answer from slurmctld before slurmd's SIGTERM reaches the step (the
// step's SIGKILL after the grace still ends it).
func (c *slurmCluster) Hold(ctx context.Context, s slurm.Store, id string, op job.HoldOp) (int, error) {
	if (op == job.OpRequeue || op == job.OpRequeueHold) && id == c.e.getenv("SLURM_JOB_ID") {
		signal.Ignore(syscall.SIGTERM)
	}
	do, err := c.route(ctx, s)
	if err != nil {
		return 0, err
	}
	return do.Hold(ctx, s, id, op)
}

// Update implements slurm.Cluster: scontrol update of a job (route).
func (c *slurmCluster) Update(ctx context.Context, s slurm.Store, id string, u job.Update) (int, error) {
	do, err := c.route(ctx, s)
	if err != nil {
		return 0, err
	}
	return do.Update(ctx, s, id, u)
}

// Signal implements slurm.Cluster: scancel --signal of a running job (route).
func (c *slurmCluster) Signal(ctx context.Context, s slurm.Store, id string, sig syscall.Signal, target string) (int, error) {
	do, err := c.route(ctx, s)
	if err != nil {
		return 0, err
	}
	return do.Signal(ctx, s, id, sig, target)
}

// runSlurm runs the Slurm command name (gangrun called under that name).
func runSlurm(ctx context.Context, e *env, name string, args []string) int {
	se := &slurm.Env{Stdin: e.stdin, Stdout: rawWriter(e.stdout), Stderr: e.stderr, Getenv: e.getenv, Environ: os.Environ,
		Signals: e.signals, Cluster: &slurmCluster{e: e}, Self: e.self}
	if se.Stdin == nil {
		se.Stdin = os.Stdin
	}
	if e.startup != nil && !e.startup.handOver() {
		return exitFailure
	}
	return slurm.Main(ctx, name, se, args)
}

// runSlurmLinks is `gangrun slurm-links DIR`: links named sbatch, srun, squeue, ... in
// DIR to this binary, which answers to those names (as make install makes them).
func runSlurmLinks(_ context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "slurm-links", "DIR")
	force := fs.Bool("force", false, "replace an existing file of one of the names")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(e, "slurm-links", "want DIR, the directory to make the links in")
	}
	dir := fs.Arg(0)
	if fi, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return usageErr(e, "slurm-links", "%s: no such directory (make it first, as ln needs)", dir)
	} else if err != nil || !fi.IsDir() {
		return usageErr(e, "slurm-links", "%s: not a directory", dir)
	}
	self := e.self
	if self == "" {
		return failErr(e, "slurm-links", errors.New("cannot tell where this gangrun binary is"))
	}
	for _, n := range slurm.Names() {
		p := filepath.Join(dir, n)
		if fi, err := os.Lstat(p); err == nil {
			if dest, lerr := os.Readlink(p); lerr == nil && dest == self {
				continue
			}
			if !*force {
				return usageErr(e, "slurm-links", "%s exists (%s): pass --force to replace it", p, fi.Mode().Type())
			}
			if err := os.Remove(p); err != nil {
				return failErr(e, "slurm-links", err)
			}
		}
		if err := os.Symlink(self, p); err != nil {
			return failErr(e, "slurm-links", err)
		}
		fmt.Fprintln(e.stdout, p)
	}
	return exitOK
}

// execWithTaskPID is job.TaskPIDCommand: it replaces this process with argv[0] (looked
// up on this process's PATH, as a shell's exec would) with SLURM_TASK_PID set to this
// pid and every other variable as it came. It returns only on failure: 127 when the
// command is not found, 126 when it cannot be run, as a shell's exec.
func execWithTaskPID(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "gangrun "+job.TaskPIDCommand+": no command")
		return 2
	}
	path, err := exec.LookPath(argv[0])
	if err != nil && !errors.Is(err, exec.ErrDot) {
		fmt.Fprintf(os.Stderr, "slurm_script: %s: not found\n", argv[0])
		return 127
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_TASK_PID=") {
			env = append(env, kv)
		}
	}
	env = append(env, "SLURM_TASK_PID="+strconv.Itoa(os.Getpid()))
	err = syscall.Exec(path, argv, env)
	fmt.Fprintf(os.Stderr, "slurm_script: %s: %v\n", argv[0], err)
	return 126
}
