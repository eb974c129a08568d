package slurm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/job"
)

// sallocOptions are salloc's options gangrun builds (sbatch's that make sense for an
// allocation), and the rest of sbatch's refused.
var sallocOptions = func() []option {
	var out []option
	for _, o := range sbatchOptions {
		switch o.long {
		case "array", "error", "output", "open-mode", "parsable", "wrap", "wait", "requeue", "no-requeue", "export",
			"signal", "gangrun-max-restarts", "gangrun-spare-nodes", "gangrun-checkpoint-dir", "chdir":
			o.unsupported = notBuilt
		}
		out = append(out, o)
	}
	return out
}()

// sallocPoll is how often salloc looks at its pending job.
const sallocPoll = 250 * time.Millisecond

// Salloc is salloc: it queues an allocation (sbatch's node, task and GPU options),
// waits for it ("salloc: Granted job allocation N"), runs the command given (default:
// the user's shell) here with the allocation's variables, where srun starts steps on
// the allocated nodes, then releases the allocation ("Relinquishing job allocation
// N") and exits with the command's exit code; the job ends COMPLETED, or FAILED with
// that code.
func Salloc(ctx context.Context, e *Env, args []string) int {
	spec, command, code, done := sallocRequest(e, args)
	if done {
		return code
	}
	if err := spec.CheckHere(); err != nil {
		return errorf(e, "salloc", 1, "Job submit/allocate failed: %v", err)
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "salloc", 1, "Job submit/allocate failed: %v", err)
	}
	defer s.Close()
	id, err := submit(ctx, e, s, spec, nil)
	if err != nil {
		return submitFailed(e, "salloc", "Job submit/allocate failed", spec, err)
	}
	m, err := e.Cluster.Munge(ctx, s)
	if err != nil {
		return errorf(e, "salloc", 1, "%v", err)
	}
	fmt.Fprintf(e.Stderr, "salloc: Pending job allocation %s\n", id)
	j, code := waitAllocation(ctx, e, s, id)
	if j == nil {
		return code
	}
	fmt.Fprintf(e.Stderr, "salloc: Granted job allocation %s\n", id)
	code, revoked := runAllocated(ctx, e, s, j, command)
	if revoked {
		// Slurm's salloc relinquishes nothing that was revoked.
		return code
	}
	fmt.Fprintf(e.Stderr, "salloc: Relinquishing job allocation %s\n", id)
	releaseAllocation(ctx, e, s, m, id, code)
	return code
}

// sallocRequest reads salloc's command line: the allocation's spec (sbatch's options,
// named "interactive" unless -J names it) and the command to run (default: $SHELL,
// else /bin/sh). done is true, with the exit code, where the command ends here: help,
// version, or options salloc refuses.
func sallocRequest(e *Env, args []string) (spec job.Spec, command []string, code int, done bool) {
	ps, rest, err := getopt("salloc", sallocOptions, args, true, 255)
	if err != nil {
		return spec, nil, usage(e, "salloc", err.(*UsageError)), true
	}
	var o batchOpts
	for _, p := range ps {
		switch p.name {
		case "help", "usage":
			fmt.Fprintln(e.Stdout, "Usage: salloc [OPTIONS...] [command [args...]]")
			return spec, nil, 0, true
		case "version":
			fmt.Fprintln(e.Stdout, Version)
			return spec, nil, 0, true
		}
	}
	if err := o.apply(ps); err != nil {
		var ue *UsageError
		errors.As(err, &ue)
		return spec, nil, usage(e, "salloc", ue), true
	}
	req, err := o.request(e, "", "interactive", nil)
	if err != nil {
		return spec, nil, usage(e, "salloc", err.(*UsageError)), true
	}
	spec = req.Spec
	spec.Batch.Allocation, spec.Batch.Export, spec.Batch.Environ = true, "ALL", nil
	if !o.v.has("job-name") {
		spec.Name = "interactive"
	}
	command = rest
	if len(command) == 0 {
		sh := e.Getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		command = []string{sh}
	}
	return spec, command, 0, false
}

// waitAllocation waits until allocation id runs on its nodes, and returns it; it says
// so if it was said to wait for resources (after a second pending). Where it ends
// first, revoked, or cancelled by ctx or by SIGINT or SIGTERM, it returns nil and the
// exit code.
func waitAllocation(ctx context.Context, e *Env, s Store, id string) (*job.Job, int) {
	told := false
	asked := time.Now()
	for {
		j, err := job.Read(ctx, s, id)
		if err == nil && j.State.Status == job.Running && len(j.State.Nodes) > 0 {
			if told {
				fmt.Fprintf(e.Stderr, "salloc: job %s has been allocated resources\n", id)
			}
			return j, 0
		}
		if err == nil && j.State.Status.Final() {
			return nil, errorf(e, "salloc", 1, "Job allocation %s has been revoked.", id)
		}
		if !told && err == nil && j.State.Status == job.Pending && time.Since(asked) > time.Second {
			fmt.Fprintf(e.Stderr, "salloc: job %s queued and waiting for resources\n", id)
			told = true
		}
		select {
		case <-ctx.Done():
			_, _ = e.Cluster.Cancel(context.WithoutCancel(ctx), s, id)
			fmt.Fprintf(e.Stderr, "salloc: Job allocation %s has been revoked.\n", id)
			return nil, 1
		case sig := <-e.Signals:
			if s2, ok := sig.(syscall.Signal); ok && (s2 == syscall.SIGINT || s2 == syscall.SIGTERM) {
				_, _ = e.Cluster.Cancel(context.WithoutCancel(ctx), s, id)
				fmt.Fprintf(e.Stderr, "salloc: Job allocation %s has been revoked.\n", id)
				return nil, 1
			}
		case <-time.After(sallocPoll):
		}
	}
}

// releaseAllocation ends allocation id with the command's exit code (sealed by m
// where the cluster checks MUNGE credentials), within 30 s even once ctx is done; a
// failure is reported, not returned.
func releaseAllocation(ctx context.Context, e *Env, s Store, m *identity.Munge, id string, code int) {
	var sealer job.Sealer
	if m != nil {
		sealer = m
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := job.ReleaseAllocation(rctx, s, sealer, id, uint32(os.Getuid()), code); err != nil {
		errorf(e, "salloc", 0, "release job allocation %s: %v", id, err)
	}
}

// allocationVars are allocation j's variables, as salloc gives its command (and srun
// --jobid from outside the job its tasks): "KEY=VALUE" entries.
func allocationVars(j *job.Job) []string {
	nodes := job.SlurmNodes(j.State.Nodes)
	nodelist := hostlist.Compress(nodes)
	b := j.Spec.Batch
	tasks := b.TasksPerNode(len(nodes))
	cpus := make([]int, len(tasks))
	for i, t := range tasks {
		cpus[i] = t * max(b.CPUsPerTask, 1)
	}
	var env []string
	add := func(k, v string) { env = append(env, k+"="+v) }
	add("SLURM_CLUSTER_NAME", b.ClusterName)
	add("SLURM_JOBID", j.Spec.ID)
	add("SLURM_JOB_ID", j.Spec.ID)
	add("SLURM_JOB_CPUS_PER_NODE", job.CompressCounts(cpus))
	add("SLURM_JOB_NAME", j.Spec.Name)
	add("SLURM_JOB_NODELIST", nodelist)
	add("SLURM_JOB_NUM_NODES", fmt.Sprint(len(nodes)))
	add("SLURM_JOB_PARTITION", job.PartitionName(j.Spec.Partition))
	add("SLURM_JOB_ACCOUNT", j.Spec.Account)
	add("SLURM_NNODES", fmt.Sprint(len(nodes)))
	add("SLURM_NODELIST", nodelist)
	add("SLURM_NODE_ALIASES", "(null)")
	add("SLURM_SUBMIT_DIR", j.Spec.WorkDir)
	add("SLURM_SUBMIT_HOST", b.SubmitHost)
	add("SLURM_TASKS_PER_NODE", job.CompressCounts(tasks))
	if b.NTasks > 0 || b.NTasksPerNode > 0 {
		n := 0
		for _, t := range tasks {
			n += t
		}
		add("SLURM_NTASKS", fmt.Sprint(n))
		add("SLURM_NPROCS", fmt.Sprint(n))
	}
	if b.NTasksPerNode > 0 {
		add("SLURM_NTASKS_PER_NODE", fmt.Sprint(b.NTasksPerNode))
	}
	if b.CPUsPerTask > 0 {
		add("SLURM_CPUS_PER_TASK", fmt.Sprint(b.CPUsPerTask))
	}
	switch sp := j.Spec; {
	case sp.MemPerCPU > 0:
		add("SLURM_MEM_PER_CPU", fmt.Sprint(sp.MemPerCPU>>20))
	case sp.MemPerGPU > 0:
		add("SLURM_MEM_PER_GPU", fmt.Sprint(sp.MemPerGPU>>20))
	case sp.Mem > 0:
		add("SLURM_MEM_PER_NODE", fmt.Sprint(sp.Mem>>20))
	}
	return env
}

// runAllocated runs command here with allocation j's variables (salloc's), passing it
// the signals salloc gets, and returns its exit code. Should the allocation end first
// (scancel, its time limit), watchAllocation hangs the command up as Slurm's salloc
// does, and revoked is true; the exit code is then Slurm's (salloc.c): the command's
// own where it exited, 0 where SIGHUP, SIGINT, SIGQUIT or SIGKILL ended it, else 1.
func runAllocated(ctx context.Context, e *Env, s Store, j *job.Job, command []string) (code int, revoked bool) {
	env := append(e.Environ(), allocationVars(j)...)
	add := func(k, v string) { env = append(env, k+"="+v) }
	if addr := localAddrToward(s); addr != "" {
		add("GANGRUN_NODE_ADDR", addr)
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, e.Stdin, e.Stdout, e.Stderr
	if err := cmd.Start(); err != nil {
		errorf(e, "salloc", 0, "%s: %v", command[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127, false
		}
		return 126, false
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case sig := <-e.Signals:
				_ = cmd.Process.Signal(sig)
			}
		}
	}()
	var gone atomic.Bool
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		gone.Store(watchAllocation(ctx, e, s, j.Spec.ID, cmd.Process, done))
	}()
	err := cmd.Wait()
	close(done)
	<-watched
	revoked = gone.Load()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			if !revoked {
				return 128 + int(ws.Signal()), false
			}
			switch ws.Signal() {
			case syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGKILL:
				return 0, true
			}
			return 1, true
		}
		return ee.ExitCode(), revoked
	}
	return 0, revoked
}

// watchAllocation polls allocation id until done is closed (its command ended) or the
// allocation ends; then, as Slurm's salloc does on the controller's "job complete"
// (salloc.c, built with SALLOC_KILL_CMD as Debian's is), it prints "Job allocation ID
// has been revoked." (its time limit reached: "Job ID has exceeded its time limit and
// its allocation has been revoked."), hangs up the terminal's foreground group where
// that is not the command's nor salloc's own, and sends the command SIGHUP where
// salloc's input is a terminal, else SIGTERM. It reports whether the allocation ended.
func watchAllocation(ctx context.Context, e *Env, s Store, id string, p *os.Process, done <-chan struct{}) bool {
	for {
		select {
		case <-done:
			return false
		case <-time.After(sallocPoll):
		}
		j, err := job.Read(ctx, s, id)
		if err != nil || !j.State.Status.Final() {
			continue
		}
		if j.State.Status == job.Timeout {
			fmt.Fprintf(e.Stderr, "salloc: Job %s has exceeded its time limit and its allocation has been revoked.\n", id)
		} else {
			fmt.Fprintf(e.Stderr, "salloc: Job allocation %s has been revoked.\n", id)
		}
		sig := syscall.SIGTERM
		if f, ok := e.Stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			sig = syscall.SIGHUP
			if fg, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCGPGRP); err == nil && fg > 0 && fg != p.Pid && fg != syscall.Getpgrp() {
				_ = syscall.Kill(-fg, syscall.SIGHUP)
			}
		}
		_ = p.Signal(sig)
		return true
	}
}

// localAddrToward is this host's address on its route to the cluster's Consul, where
// the allocated nodes reach srun ("" when it cannot be told).
func localAddrToward(s Store) string {
	c, ok := s.(interface{ Addr() (string, string) })
	if !ok {
		return ""
	}
	addr, _ := c.Addr()
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://")
	if addr == "" {
		return ""
	}
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return ""
	}
	defer conn.Close()
	host, _, _ := net.SplitHostPort(conn.LocalAddr().String())
	return host
}
