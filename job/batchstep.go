package job

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/checkpoint"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// Timing of a batch job's step.
const (
	// batchKillWait is the SIGTERM to SIGKILL grace of a batch job's processes when it
	// is stopped and gave no --term-timeout: Slurm's KillWait default, 30 s.
	batchKillWait = 30 * time.Second
	// srunDialTimeout bounds a node's connection to srun's listener.
	srunDialTimeout = 10 * time.Second
	// batchRestartDelay is the pause before a supervised batch script starts again.
	batchRestartDelay = time.Second
)

// batchStep is a batch job's step on one node: the batch script on the batch host,
// and on every node the srun steps' tasks. Everything it starts runs as the job's user
// in one cgroup of the job's on the node, watched by the guardian.
type batchStep struct {
	st    *step
	gn    allocator.GrantNode
	nodes []string // the job's nodes, Slurm's order
	log   *zap.Logger
	place proc.Placement
	cg    *cgroup.Step
	guard *proc.Guardian
	grace time.Duration

	mu    sync.Mutex
	batch *proc.Process          // the batch script, while it runs
	tasks map[*proc.Process]bool // srun tasks running on this node
	// termed are the processes sent SIGTERM already (signal): a stop reaches a task
	// both from this step and from the batch script's srun, which forwards the SIGTERM
	// it got too; a second SIGTERM would end a `gangrun run` task at once (its second
	// signal kills), before its --term-timeout.
	termed map[*proc.Process]bool
	// oomAt is each srun task's count of its cgroup's OOM kills when it started.
	oomAt   map[*proc.Process]uint64
	byStep  map[int][]*proc.Process // the same, by srun step
	stopped bool                    // stop began: nothing new starts
	steps   sync.WaitGroup          // srun steps being served
	seen    map[int]bool            // srun steps handled (or refused) here
}

// runBatch runs job st.job's batch step on this node (RunStep, once the node's GPUs and
// the job's user are the step's) and returns the step's exit code.
func (st *step) runBatch(ctx context.Context, gn allocator.GrantNode) int {
	j := st.job
	bs := &batchStep{st: st, gn: gn, nodes: SlurmNodes(j.State.Nodes), log: st.log,
		tasks: map[*proc.Process]bool{}, byStep: map[int][]*proc.Process{}, seen: map[int]bool{}, grace: j.Spec.TermTimeout,
		termed: map[*proc.Process]bool{}}
	if bs.grace <= 0 {
		bs.grace = batchKillWait
	}
	if len(bs.nodes) == 0 {
		return 1
	}
	if len(st.cfg.GuardianArgv) > 0 {
		g, err := proc.StartGuardian(st.cfg.GuardianArgv)
		if err != nil {
			st.log.Warn("no guardian: a step killed outright may leave its processes", zap.Error(err))
		} else {
			bs.guard = g
			defer g.Close()
		}
	}
	bs.confine()
	defer bs.unconfine()
	st.stop = make(chan os.Signal, 8)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	st.stopSupervisor = func() {} // a fenced batch step stops its processes through st.stop
	go st.watch(wctx)
	go bs.gatherUsage(wctx)
	sctx, stopServing := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() {
		defer close(served)
		bs.serve(sctx)
	}()

	batchHost := st.cfg.Node == bs.nodes[0] // an allocation's: where its release is recorded
	var code int
	var end Status
	var why string
	switch {
	case batchHost && j.Spec.Batch.Allocation:
		code, end, why = bs.waitRelease(ctx)
	case batchHost:
		code, end, why = bs.runScript(ctx)
	default:
		bs.waitStop(ctx)
	}
	bs.stopAll()
	stopServing()
	<-served // no srun step starts past here: steps.Add is done before steps.Wait
	bs.steps.Wait()
	st.mu.Lock()
	ending, fenced := st.ending, st.fenced
	st.mu.Unlock()
	if fenced {
		st.log.Warn("the step's lease is over: its processes have stopped; the step ends without recording how")
		return code
	}
	defer st.markEnded(ctx)
	if batchHost && ending == "" {
		_ = st.recordEnd(ctx, end, code, why)
	}
	return code
}

// confine makes the job's cgroup on this node (memory limit, the granted GPUs only);
// unconfined where cgroups cannot be used, as `gangrun run --cgroup auto`.
func (bs *batchStep) confine() {
	spec := bs.st.job.Spec
	inv := bs.st.cfg.Inventory
	var lim cgroup.Limits
	lim.MemoryBytes, lim.PidsLimit = spec.NodeMem(), cgroup.DefaultPidsLimit
	if inv != nil {
		var devs []topology.Device
		for _, d := range inv.Allocatable() {
			if slices.Contains(bs.gn.Devices, d.ID) {
				devs = append(devs, d)
			}
		}
		lim.Devices = cgroup.GPUDeviceRules(inv, devs)
	}
	name := "gangrun-" + safeSegment(spec.ID) + "-" + strconv.Itoa(os.Getpid()) + "-" + randomSuffix()
	cg, err := cgroup.New(name, lim)
	if err != nil {
		bs.log.Info("running the job's processes unconfined: " + err.Error())
		return
	}
	bs.cg, bs.place = cg, cg
	for _, d := range cg.Dirs() {
		_ = bs.guard.RemoveCgroupOnDeath(d)
	}
}

func (bs *batchStep) unconfine() {
	if bs.cg != nil {
		if err := bs.cg.Delete(); err != nil {
			bs.log.Warn("remove the job's cgroup", zap.Error(err))
		}
	}
}

// start starts argv as the job's user in the job's cgroup, in dir with env, its
// output to stdout and stderr, stdin /dev/null; the guardian watches its group.
func (bs *batchStep) start(argv, env []string, dir string, stdout, stderr io.Writer) (*proc.Process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, stdout, stderr
	return bs.startCmd(cmd)
}

// startCmd starts cmd (its SysProcAttr, if any, a terminal's session: proc.Start) as
// the job's user in the job's cgroup; the guardian watches its group.
func (bs *batchStep) startCmd(cmd *exec.Cmd) (*proc.Process, error) {
	bs.mu.Lock()
	stopped := bs.stopped
	bs.mu.Unlock()
	if stopped {
		return nil, errors.New("the job is ending")
	}
	if u := bs.st.user; u != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Credential = u.Credential()
	}
	p, _, err := proc.StartPlaced(cmd, nil, bs.place)
	if err != nil {
		return nil, err
	}
	_ = bs.guard.Watch(p.Pid())
	return p, nil
}

// release reaps p, forgetting its group in the guardian.
func (bs *batchStep) release(p *proc.Process) proc.ExitStatus {
	st, _ := p.Release()
	_ = bs.guard.Forget(p.Pid())
	return st
}

// TaskPIDCommand is the hidden gangrun command `gangrun __taskpid -- COMMAND [ARG...]`
// that execs COMMAND (found on the PATH of its own environment) with SLURM_TASK_PID
// set to its own pid, the same process, and the rest of its environment exactly as
// given (slurmstepd sets SLURM_TASK_PID to the task's pid). cmd/gangrun serves it
// before anything else runs.
const TaskPIDCommand = "__taskpid"

// taskPIDShim is the argv prefix that starts a command through TaskPIDCommand of
// the running gangrun binary. A shell would do it in one line, but /bin/sh (dash)
// drops the variables whose names are no shell names, bash's exported functions
// among them (BASH_FUNC_module%%, which a job script's `module load` needs).
func taskPIDShim() []string {
	exe, err := os.Executable()
	if err != nil {
		return []string{"/bin/sh", "-c", `SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$@"`, "slurm_script"}
	}
	return []string{exe, TaskPIDCommand, "--"}
}

// runScript runs the batch script on the batch host, again after a failure while a
// supervised job has restarts left, and returns its exit code and the job's end.
func (bs *batchStep) runScript(ctx context.Context) (int, Status, string) {
	st := bs.st
	j := st.job
	spec := j.Spec
	path, cleanup, err := writeScript(spec, st.user)
	if err != nil {
		bs.failEarly(err)
		return 1, Failed, err.Error()
	}
	st.cleanup = append(st.cleanup, cleanup)
	restarts := 0
	for attempt := 0; ; attempt++ {
		out, errOut, err := bs.openFiles(attempt == 0)
		if err != nil {
			bs.log.Error("open the job's output", zap.Error(err))
			return 1, Failed, err.Error()
		}
		resume := ""
		if ckpt := spec.CheckpointPath(); ckpt != "" && spec.Batch.Supervised {
			if c, err := checkpoint.Latest(ckpt, checkpoint.Options{}); err == nil {
				resume = c.Path
			}
		}
		env := bs.batchEnv(restarts, resume)
		argv := append(append(append(taskPIDShim(), Interpreter(spec.Script)...), path), spec.Command...)
		var stderr io.Writer = out
		if errOut != nil {
			stderr = errOut
		}
		dir := spec.WorkDir
		if err := bs.userDir(dir); err != nil {
			fmt.Fprintf(stderr, "slurmstepd: error: couldn't chdir to `%s': %v: going to /tmp instead\n", spec.WorkDir, err)
			dir = "/tmp"
		}
		started := time.Now().UTC()
		bs.noteAttempt(ctx, attempt, started, resume)
		oomBase := bs.oomKills()
		p, err := bs.start(argv, env, dir, out, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "slurmstepd: error: execve(): %s: %v\n", Interpreter(spec.Script)[0], err)
			closeFiles(out, errOut)
			code := 2
			if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
				code = 127
			}
			return code, Failed, "batch script: " + err.Error()
		}
		bs.mu.Lock()
		bs.batch = p
		bs.mu.Unlock()
		status := bs.wait(ctx, p)
		bs.mu.Lock()
		bs.batch = nil
		bs.mu.Unlock()
		st.mu.Lock()
		stoppedAs := st.ending
		st.mu.Unlock()
		if line := cancelledLine(spec.ID, st.cfg.Node, stoppedAs, time.Now()); line != "" {
			fmt.Fprintln(stderr, line)
		}
		oom := bs.oomKills() - oomBase
		if oom > 0 {
			fmt.Fprintln(stderr, oomLine(spec.ID, oom))
		}
		closeFiles(out, errOut)
		code := status.ShellCode()
		cause := "batch script: " + status.String()
		bs.endAttempt(ctx, attempt, exitKind(status), cause)
		st.mu.Lock()
		ending := st.ending
		st.mu.Unlock()
		switch {
		case ending != "":
			return code, ending, cause
		case oom > 0:
			return code, OutOfMemory, "OutOfMemory: " + strings.TrimPrefix(oomLine(spec.ID, oom), "slurmstepd: error: ")
		case status.Success():
			return 0, Completed, ""
		case spec.Batch.Supervised && restarts < spec.MaxRestarts:
			restarts++
			bs.log.Warn("the batch script failed: starting it again", zap.String("cause", status.String()),
				zap.Int("restart", restarts), zap.Int("max_restarts", spec.MaxRestarts))
			bs.stopTasks() // its srun steps go with it
			if !bs.pause(batchRestartDelay) {
				return code, Failed, cause
			}
			continue
		}
		return code, Failed, cause
	}
}

// oomKills is how many processes the OOM killer has killed in the job's cgroup on
// this node (0 where it has none).
func (bs *batchStep) oomKills() uint64 {
	if bs.cg == nil {
		return 0
	}
	return bs.cg.OOMKills()
}

// oomLine is the line slurmstepd writes into a batch job's error output when the
// cgroup's OOM killer killed n of its processes (Slurm 22.05's task/cgroup plugin).
func oomLine(id string, n uint64) string {
	return fmt.Sprintf("slurmstepd: error: Detected %d oom-kill event(s) in StepId=%s.batch. "+
		"Some of your processes may have been killed by the cgroup out-of-memory handler.", n, id)
}

// cancelledLine is the line slurmstepd writes into a batch job's error output when the
// job is stopped (Slurm 22.05's "slurmstepd-NODE: error: *** JOB ID ON NODE CANCELLED
// AT TIME ***", named as a slurmd started with -N NODE names itself, as the task
// launch errors here are; with "DUE TO
// TIME LIMIT", "DUE TO PREEMPTION" or "DUE TO NODE FAILURE" where that is why), which
// users and tools look for; "" for an end that stopped nothing (why "").
func cancelledLine(id, node string, why Status, at time.Time) string {
	due := ""
	switch why {
	case "":
		return ""
	case Timeout:
		due = " DUE TO TIME LIMIT"
	case Preempted:
		due = " DUE TO PREEMPTION"
	case NodeFail:
		due = " DUE TO NODE FAILURE"
	case Completed:
		return ""
	}
	return fmt.Sprintf("slurmstepd-%s: error: *** JOB %s ON %s CANCELLED AT %s%s ***", node, id, node, at.Format("2006-01-02T15:04:05"), due)
}

// failEarly writes why the batch script could not start into the job's output.
func (bs *batchStep) failEarly(err error) {
	if out, errOut, oerr := bs.openFiles(true); oerr == nil {
		w := io.Writer(out)
		if errOut != nil {
			w = errOut
		}
		fmt.Fprintf(w, "slurmstepd: error: %v\n", err)
		closeFiles(out, errOut)
	}
}

// pause waits d unless the step is told to stop meanwhile; false when it was.
func (bs *batchStep) pause(d time.Duration) bool {
	select {
	case sig := <-bs.st.stop:
		if sig == syscall.SIGTERM {
			return false
		}
		return true
	case <-time.After(d):
		return true
	}
}

// userDir checks the job's user can enter dir.
func (bs *batchStep) userDir(dir string) error {
	return proc.AsUser(bs.st.user, func() error {
		fd, err := unix.Open(dir+"/.", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	})
}

// noteAttempt records the batch script's attempt in the job's state (show's attempts,
// the restarts count).
func (bs *batchStep) noteAttempt(ctx context.Context, attempt int, started time.Time, resume string) {
	_, _, _ = update(context.WithoutCancel(ctx), bs.st.cfg.Store, bs.st.cfg.Job, func(j *Job) bool {
		if j.State.Status != Running {
			return false
		}
		j.State.Attempts = append(j.State.Attempts, Attempt{Number: len(j.State.Attempts), Nodes: bs.nodes,
			Started: started, WorkersStarted: started, ResumeFrom: resume})
		if attempt > 0 {
			j.State.Restarts++
		}
		return true
	})
}

// endAttempt closes the batch script's attempt with a failure of kind ("" for a
// success) described by cause.
func (bs *batchStep) endAttempt(ctx context.Context, attempt int, kind failure.Kind, cause string) {
	now := time.Now().UTC()
	_, _, _ = update(context.WithoutCancel(ctx), bs.st.cfg.Store, bs.st.cfg.Job, func(j *Job) bool {
		n := len(j.State.Attempts)
		if n == 0 || !j.State.Attempts[n-1].Ended.IsZero() {
			return false
		}
		if cause == "batch script: exit code 0" {
			cause = "succeeded"
		}
		j.State.Attempts[n-1].Ended, j.State.Attempts[n-1].Cause, j.State.Attempts[n-1].Failure = now, cause, kind
		j.State.countRestarts()
		return true
	})
}

// exitKind is the kind of failure a batch script's exit status is: failure.Signal when
// a signal killed it, failure.Exit for a non-zero code, "" for a success.
func exitKind(st proc.ExitStatus) failure.Kind {
	switch {
	case st.Signal != 0:
		return failure.Signal
	case st.Success():
		return ""
	}
	return failure.Exit
}

// wait waits for the batch script to exit, acting meanwhile on the step's signals: a
// SIGTERM stops the job (every process: SIGTERM, the grace, SIGKILL), --signal's
// warning goes where Slurm sends it (the batch shell with B:, else the srun steps'
// tasks), another signal goes to the batch shell's group and the tasks.
func (bs *batchStep) wait(ctx context.Context, p *proc.Process) proc.ExitStatus {
	spec := bs.st.job.Spec
	for {
		select {
		case <-p.Exited():
			return bs.release(p)
		case sig := <-bs.st.stop:
			if t, ok := sig.(targeted); ok {
				bs.signalTargeted(t, p)
				continue
			}
			s, _ := sig.(syscall.Signal)
			switch {
			case s == syscall.SIGTERM:
				bs.stopAll()
				return bs.release(p)
			case s == spec.Signal && spec.Batch.SignalBatch:
				_ = p.SignalLeader(s)
			case s == spec.Signal:
				bs.signalTasks(s)
			default:
				_ = p.Signal(s)
				bs.signalTasks(s)
			}
		}
	}
}

// waitRelease waits, on an allocation's first node, for salloc to release it (or the
// step to be stopped), and returns the job's end: COMPLETED when salloc's command
// exited 0, else FAILED with its code.
func (bs *batchStep) waitRelease(ctx context.Context) (int, Status, string) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	released := make(chan int, 1)
	go func() {
		if code, ok := bs.watchRelease(rctx); ok {
			released <- code
		}
	}()
	stopped := make(chan struct{})
	go func() {
		bs.waitStop(rctx)
		close(stopped)
	}()
	select {
	case code := <-released:
		if code == 0 {
			return 0, Completed, ""
		}
		return code, Failed, "NonZeroExitCode: salloc's command exited " + strconv.Itoa(code)
	case <-stopped:
		return 0, Cancelled, ""
	}
}

// waitStop waits, on a node other than the batch host, until the step is told to stop
// (the job ended, was cancelled, or moved), passing other signals to the tasks.
func (bs *batchStep) waitStop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-bs.st.stop:
			if t, ok := sig.(targeted); ok {
				bs.signalTargeted(t, nil)
				continue
			}
			s, _ := sig.(syscall.Signal)
			if s == syscall.SIGTERM {
				return
			}
			if s == bs.st.job.Spec.Signal && bs.st.job.Spec.Batch.SignalBatch {
				continue // the batch shell's alone
			}
			bs.signalTasks(s)
		}
	}
}

// stopAll stops everything the step started here: SIGCONT and SIGTERM to the batch
// shell's group and every task, SIGKILL after the grace (Slurm's KillWait).
func (bs *batchStep) stopAll() {
	bs.mu.Lock()
	bs.stopped = true
	var ps []*proc.Process
	if bs.batch != nil {
		ps = append(ps, bs.batch)
	}
	for p := range bs.tasks {
		ps = append(ps, p)
	}
	bs.mu.Unlock()
	terminate(ps, bs.grace, bs.signal)
}

// signal sends sig to process p's group, but SIGTERM only once (termed).
func (bs *batchStep) signal(p *proc.Process, sig syscall.Signal) {
	if sig == syscall.SIGTERM {
		bs.mu.Lock()
		done := bs.termed[p]
		bs.termed[p] = true
		bs.mu.Unlock()
		if done {
			return
		}
	}
	_ = p.Signal(sig)
}

// stopTasks stops the srun steps' tasks (the batch script restarts without them).
func (bs *batchStep) stopTasks() {
	terminate(bs.liveTasks(), bs.grace, bs.signal)
}

// liveTasks is the srun steps' tasks running on this node now.
func (bs *batchStep) liveTasks() []*proc.Process {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return slices.Collect(maps.Keys(bs.tasks))
}

// terminate sends SIGCONT and SIGTERM to each process group of ps through signal, and
// SIGKILL to those still there after grace (at once, with no SIGTERM, for grace 0); it
// returns once every leader has exited.
func terminate(ps []*proc.Process, grace time.Duration, signal func(*proc.Process, syscall.Signal)) {
	if len(ps) == 0 {
		return
	}
	if grace <= 0 {
		for _, p := range ps {
			_ = p.Signal(syscall.SIGKILL)
		}
		for _, p := range ps {
			<-p.Exited()
		}
		return
	}
	for _, p := range ps {
		signal(p, syscall.SIGCONT)
		signal(p, syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range ps {
		select {
		case <-p.Exited():
		case <-deadline:
			for _, q := range ps {
				_ = q.Signal(syscall.SIGKILL)
			}
			<-p.Exited()
		}
	}
}

// signalTargeted gives a user's signal request t (scancel --signal) to this node's
// processes, as Slurm 22.05's scancel sends it: SignalSteps to the srun steps' tasks,
// SignalBatch to the batch shell alone (not its children), SignalFull to the batch
// shell's process group and the tasks. batch is the batch script (nil where it does not
// run: another node, an allocation). The tasks get it as sent, a SIGTERM too, which
// does not count as the stop's (termed): a task a user sent SIGTERM still gets its
// stop's SIGTERM, as on Slurm.
func (bs *batchStep) signalTargeted(t targeted, batch *proc.Process) {
	switch {
	case batch != nil && t.target == SignalBatch:
		_ = batch.SignalLeader(t.sig)
	case batch != nil && t.target == SignalFull:
		_ = batch.Signal(t.sig)
	}
	if t.target == SignalBatch {
		return
	}
	for _, p := range bs.liveTasks() {
		_ = p.Signal(t.sig)
	}
}

// signalTasks sends sig to every srun task on this node.
func (bs *batchStep) signalTasks(sig syscall.Signal) {
	for _, p := range bs.liveTasks() {
		bs.signal(p, sig)
	}
}

// openFiles opens the batch script's output (and error) file as the job's user:
// truncated at a placement's start unless --open-mode=append, appended to otherwise.
func (bs *batchStep) openFiles(first bool) (out, errOut *os.File, err error) {
	spec := bs.st.job.Spec
	outPath, errPath := spec.BatchFiles(bs.st.cfg.Node)
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND | syscall.O_CLOEXEC | syscall.O_NONBLOCK
	if first && spec.Batch.OpenMode != "append" {
		flags |= os.O_TRUNC
	}
	open := func(path string) (f *os.File, err error) {
		err = proc.AsUser(bs.st.user, func() error {
			f, err = os.OpenFile(path, flags, 0o644)
			return err
		})
		if errors.Is(err, syscall.ENXIO) {
			err = errors.New("a named pipe that no one reads: want a file")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if fi, err := f.Stat(); err != nil || !(fi.Mode().IsRegular() || fi.Mode()&os.ModeCharDevice != 0) {
			f.Close()
			return nil, fmt.Errorf("%s: is not a file: want a file (or /dev/null)", path)
		}
		return f, nil
	}
	if out, err = open(outPath); err != nil {
		return nil, nil, err
	}
	if errPath != "" {
		if errOut, err = open(errPath); err != nil {
			out.Close()
			return nil, nil, err
		}
	}
	return out, errOut, nil
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// batchEnv is the batch script's environment on this node.
func (bs *batchStep) batchEnv(restarts int, resume string) []string {
	st := bs.st
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	if st.user != nil {
		uid, gid = st.user.UID, st.user.GID
	}
	addr, _ := allocator.NodeAddr(context.Background(), st.cfg.Store, st.cfg.Node)
	return BatchEnv(BatchEnvConfig{Job: st.job, Nodes: bs.nodes, Node: st.cfg.Node, GPUs: gpuIndices(bs.gn),
		UID: uid, GID: gid, Restarts: restarts, ResumeFrom: resume, ConsulAddr: st.cfg.ConsulAddr, LaunchAddr: addr})
}

// gpuIndices are the node's granted devices as CUDA_VISIBLE_DEVICES names them.
func gpuIndices(gn allocator.GrantNode) []string { return slices.Clone(gn.Devices) }

// serve runs the srun steps that name this node until ctx ends: it watches the job's
// srun keys and starts each new step's tasks here.
func (bs *batchStep) serve(ctx context.Context) {
	id := bs.st.cfg.Job
	w := store.NewWatcher(bs.st.cfg.Store, srunPrefix(id))
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return
		}
		for _, s := range stepsOf(id, entries) {
			n := s.Request.Step
			bs.mu.Lock()
			handled := bs.seen[n]
			bs.seen[n] = true
			var cancelled []*proc.Process
			if s.End != nil && s.End.State == Cancelled {
				cancelled = bs.byStep[n] // scancel JOB.STEP: its tasks here stop
				delete(bs.byStep, n)
			}
			bs.mu.Unlock()
			if len(cancelled) > 0 {
				grace := bs.grace
				if s.End.Signal == int(syscall.SIGKILL) {
					grace = 0 // scancel JOB.STEP: SIGKILL at once, as slurmstepd does
				}
				go terminate(cancelled, grace, bs.signal)
			}
			if handled || s.End != nil || !slices.Contains(s.Request.Nodes, bs.st.cfg.Node) {
				continue
			}
			bs.steps.Add(1)
			go func() {
				defer bs.steps.Done()
				bs.runStep(ctx, s.Request, s.credential)
			}()
		}
	}
}

// stepUID is the uid the job's processes run as.
func (bs *batchStep) stepUID() uint32 {
	if bs.st.user != nil {
		return bs.st.user.UID
	}
	return uint32(os.Geteuid())
}

// runStep runs srun step r's tasks on this node: it checks srun's credential, connects
// back to srun, starts the tasks and streams their output and ends.
func (bs *batchStep) runStep(ctx context.Context, r StepRequest, cred string) {
	node := bs.st.cfg.Node
	log := bs.log.With(zap.String("srun_step", r.Job+"."+strconv.Itoa(r.Step)))
	refusal := bs.checkSrun(ctx, r, cred)
	if refusal != "" {
		log.Warn("refusing an srun step", zap.String("why", refusal))
	}
	conn, err := net.DialTimeout("tcp", r.Addr, srunDialTimeout)
	if err != nil {
		log.Warn("cannot reach srun: the step's tasks do not start here", zap.String("addr", r.Addr), zap.Error(err))
		_ = EndSrunStep(context.WithoutCancel(ctx), bs.st.cfg.Store, r.Job, r.Step, SrunState{State: Cancelled, ExitCode: 1,
			Ended: time.Now().UTC(), Reason: "node " + node + " could not reach srun at " + r.Addr})
		return
	}
	defer conn.Close()
	c := &srunConn{enc: json.NewEncoder(conn)}
	hello := &Hello{Node: node, Secret: r.Secret}
	if p := bs.st.cfg.Prover; p != nil && refusal == "" {
		if hello.Credential, err = p.SealFor(ctx, HelloContent(r.Job, r.Step, node, r.Addr), r.UID); err != nil {
			refusal = "this node cannot make its MUNGE credential: " + err.Error()
		}
	}
	c.send(Frame{Hello: hello})
	if refusal != "" {
		c.send(Frame{Error: refusal})
		c.send(Frame{Done: true})
		return
	}
	i := slices.Index(r.Nodes, node)
	first, count := r.FirstTask(i), r.Tasks[i]
	gpus := gpuIndices(bs.gn)
	if r.GPUsPerTask > 0 && r.GPUsPerTask*count > len(gpus) {
		c.send(Frame{Error: fmt.Sprintf("%d tasks with %d GPUs each need %d GPUs, and the job has %d on %s", count, r.GPUsPerTask, r.GPUsPerTask*count, len(gpus), node)})
		c.send(Frame{Done: true})
		return
	}
	if r.Pty != nil {
		bs.runPty(ctx, r, c, conn, i, gpus)
		return
	}
	from := followSrun(conn, bs.signal, nil)
	var wg sync.WaitGroup
	for k := 0; k < count; k++ {
		taskGPUs := gpus
		if r.GPUsPerTask > 0 {
			taskGPUs = gpus[k*r.GPUsPerTask : (k+1)*r.GPUsPerTask]
		}
		rank := first + k
		stdout, stderr := c.writer(rank, 1), c.writer(rank, 2)
		p, err := bs.startTask(r, bs.taskEnv(r, i, rank, k, gpus, taskGPUs), stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "slurmstepd-%s: error: execve(): %s: %s\n", node, r.Command[0], execError(err))
			stderr.Flush()
			c.send(Frame{Task: rank, Exit: &TaskExit{Code: 2}})
			continue
		}
		from.add(p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			exit := bs.awaitTask(r, p, from)
			stdout.Flush()
			stderr.Flush()
			c.send(Frame{Task: rank, Exit: exit})
		}()
	}
	wg.Wait()
	c.send(Frame{Done: true})
	// Only a loss that ended tasks here ends the step for every node: srun closes this
	// node's connection as soon as it has read Done, and taking that for a loss
	// recorded the step cancelled while other nodes' tasks still ran, and they were
	// stopped (TestSrunAgainstSlurm, a task "Terminated" now and then).
	if from.gone.Load() {
		_ = EndSrunStep(context.WithoutCancel(ctx), bs.st.cfg.Store, r.Job, r.Step, SrunState{State: Cancelled, ExitCode: 1,
			Ended: time.Now().UTC(), Reason: "srun ended before its tasks"})
	}
}

// checkSrun checks srun's credential cred for step r, where the node checks
// credentials: "" when it proves the job's user (or root), else why it is refused.
func (bs *batchStep) checkSrun(ctx context.Context, r StepRequest, cred string) string {
	p := bs.st.cfg.Prover
	if p == nil {
		return ""
	}
	caller, err := p.Verify(ctx, cred, srunContent(r), identity.FreshOrReplayed)
	switch {
	case err != nil:
		return "srun's credential is refused: " + err.Error()
	case caller.UID != bs.stepUID() && caller.UID != 0:
		return fmt.Sprintf("srun's credential is uid %d's, and the job is uid %d's", caller.UID, bs.stepUID())
	case caller.UID != r.UID:
		return fmt.Sprintf("srun's credential is uid %d's, and its request says uid %d", caller.UID, r.UID)
	}
	return ""
}

// srunFeed is what srun's connection tells a node's tasks of a step: srun's signals,
// given to every task started and to each started later, and srun's end (lost closes).
type srunFeed struct {
	lost chan struct{}
	gone atomic.Bool // a task here was stopped because srun was lost

	mu        sync.Mutex
	procs     []*proc.Process
	signalled []syscall.Signal // srun's signals so far, for the tasks not yet started
	signal    func(*proc.Process, syscall.Signal)
}

// followSrun reads srun's frames from conn until it closes, giving srun's signals to
// the tasks through signal, and a --pty step's input and window size to tty (nil for
// a step without one).
func followSrun(conn net.Conn, signal func(*proc.Process, syscall.Signal), tty *ptyFeed) *srunFeed {
	f := &srunFeed{lost: make(chan struct{}), signal: signal}
	go func() {
		dec := json.NewDecoder(bufio.NewReader(conn))
		for {
			var fr Frame
			if err := dec.Decode(&fr); err != nil {
				close(f.lost)
				tty.close()
				return
			}
			tty.take(fr)
			if fr.Signal > 0 {
				f.mu.Lock()
				f.signalled = append(f.signalled, syscall.Signal(fr.Signal))
				for _, p := range f.procs {
					f.signal(p, syscall.Signal(fr.Signal))
				}
				f.mu.Unlock()
			}
		}
	}()
	return f
}

// add has task p follow srun's signals: a signal that came before it started (srun -K,
// a Ctrl-C, while the node was still starting its tasks) reaches it too.
func (f *srunFeed) add(p *proc.Process) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs = append(f.procs, p)
	for _, sig := range f.signalled {
		f.signal(p, sig)
	}
}

// startTask starts one task of step r with environment env and the given output, and
// counts it among the step's.
func (bs *batchStep) startTask(r StepRequest, env []string, stdout, stderr io.Writer) (*proc.Process, error) {
	err := findCommand(r.Command[0], env, r.WorkDir)
	var p *proc.Process
	if err == nil {
		p, err = bs.start(append(taskPIDShim(), r.Command...), env, r.WorkDir, stdout, stderr)
	}
	if err != nil {
		return nil, err
	}
	bs.track(r, p)
	return p, nil
}

// track counts task p among step r's.
func (bs *batchStep) track(r StepRequest, p *proc.Process) {
	bs.mu.Lock()
	bs.tasks[p] = true
	bs.byStep[r.Step] = append(bs.byStep[r.Step], p)
	if bs.oomAt == nil {
		bs.oomAt = map[*proc.Process]uint64{}
	}
	bs.oomAt[p] = bs.oomKills()
	bs.mu.Unlock()
}

// awaitTask waits for task p of step r to exit (stopping it if srun is lost first),
// forgets it, and returns its exit as srun reports it (128+N for signal N).
func (bs *batchStep) awaitTask(r StepRequest, p *proc.Process, from *srunFeed) *TaskExit {
	select {
	case <-p.Exited():
	case <-from.lost:
		// srun is gone (killed): the step goes with it, as Slurm's does.
		from.gone.Store(true)
		terminate([]*proc.Process{p}, bs.grace, bs.signal)
	}
	return bs.forget(r, p)
}

// forget reaps task p of step r (bs.release), no longer counts it among the step's,
// and returns its exit as srun reports it (128+N for signal N).
func (bs *batchStep) forget(r StepRequest, p *proc.Process) *TaskExit {
	status := bs.release(p)
	bs.mu.Lock()
	delete(bs.tasks, p)
	delete(bs.termed, p)
	oomAt := bs.oomAt[p]
	delete(bs.oomAt, p)
	bs.byStep[r.Step] = slices.DeleteFunc(bs.byStep[r.Step], func(q *proc.Process) bool { return q == p })
	bs.mu.Unlock()
	exit := &TaskExit{Code: status.Code}
	if status.Signal != 0 {
		exit.Code, exit.Signal = 128+int(status.Signal), int(status.Signal)
	}
	if n := bs.oomKills(); status.Signal == syscall.SIGKILL && n > oomAt {
		exit.OOM = n - oomAt
	}
	return exit
}

// taskEnv is the environment of task rank (local index k on node i of the step):
// the request's, then Slurm's per-task variables as slurmstepd sets them.
func (bs *batchStep) taskEnv(r StepRequest, i, rank, k int, nodeGPUs, taskGPUs []string) []string {
	m := newEnv(r.Env)
	set := m.set
	node := r.Nodes[i]
	var gtids []string
	for t := r.FirstTask(i); t < r.FirstTask(i)+r.Tasks[i]; t++ {
		gtids = append(gtids, strconv.Itoa(t))
	}
	stepList := hostlist.Compress(r.Nodes)
	n := strconv.Itoa(r.NTasks())
	set("SLURMD_NODENAME", node)
	set("SLURM_TOPOLOGY_ADDR", node)
	set("SLURM_PROCID", strconv.Itoa(rank))
	set("SLURM_LOCALID", strconv.Itoa(k))
	set("SLURM_NODEID", strconv.Itoa(i))
	set("SLURM_GTIDS", strings.Join(gtids, ","))
	set("SLURM_STEPID", strconv.Itoa(r.Step))
	set("SLURM_STEP_ID", strconv.Itoa(r.Step))
	set("SLURM_STEP_NODELIST", stepList)
	set("SLURM_STEP_NUM_NODES", strconv.Itoa(len(r.Nodes)))
	set("SLURM_STEP_NUM_TASKS", n)
	set("SLURM_STEP_TASKS_PER_NODE", CompressCounts(r.Tasks))
	set("SLURM_NNODES", strconv.Itoa(len(r.Nodes)))
	set("SLURM_NTASKS", n)
	set("SLURM_NPROCS", n)
	set("SLURM_TASKS_PER_NODE", CompressCounts(r.Tasks))
	set("SLURM_DISTRIBUTION", "block")
	set("SLURM_STEP_GPUS", strings.Join(nodeGPUs, ","))
	// This node's own share of the job, as slurmstepd sets it on each node (srun's
	// environment carries the batch host's).
	set("SLURM_JOB_GPUS", strings.Join(nodeGPUs, ","))
	set("SLURM_GPUS_ON_NODE", strconv.Itoa(len(nodeGPUs)))
	if b := bs.st.job.Spec.Batch; b != nil {
		if j := slices.Index(bs.nodes, node); j >= 0 {
			if per := b.TasksPerNode(len(bs.nodes)); j < len(per) {
				set("SLURM_CPUS_ON_NODE", strconv.Itoa(per[j]*max(b.CPUsPerTask, 1)))
			}
		}
	}
	host, port, _ := net.SplitHostPort(r.Addr)
	set("SLURM_SRUN_COMM_HOST", host)
	set("SLURM_SRUN_COMM_PORT", port)
	set("SLURM_STEP_LAUNCHER_PORT", port)
	set("SLURM_LAUNCH_NODE_IPADDR", host)
	set("SLURM_UMASK", "0022")
	if r.Label {
		set("SLURM_LABELIO", "1")
	}
	if v, ok := m.vals["SLURM_JOB_CPUS_PER_NODE"]; ok {
		set("SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0", v)
	}
	set("SRUN_DEBUG", "3")
	if r.GPUsPerTask > 0 {
		set("SLURM_GPUS_PER_TASK", strconv.Itoa(r.GPUsPerTask))
	}
	gpus := strings.Join(taskGPUs, ",")
	for _, key := range []string{"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"} {
		set(key, gpus)
	}
	if bs.st.job.Spec.GPUsPerNode == 0 {
		m.unsetGPUs()
	}
	return m.list()
}

// srunConn is a node's side of its connection to srun: frames sent one at a time.
type srunConn struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

// send writes f; after a write error nothing more is sent.
func (c *srunConn) send(f Frame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = c.enc.Encode(f)
	}
}

// writer returns task rank's output on fd as whole lines to srun.
func (c *srunConn) writer(rank, fd int) *lineWriter {
	return &lineWriter{send: func(b []byte) { c.send(Frame{Task: rank, FD: fd, Out: b}) }}
}

// maxLine bounds a line a task writes before it is sent without its end.
const maxLine = 64 << 10

// lineWriter sends what a task writes in whole lines (a line longer than maxLine in
// pieces): several tasks' lines never interleave mid-line in srun's output.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	send func([]byte)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if i := strings.LastIndexByte(string(w.buf), '\n'); i >= 0 {
		w.send(slices.Clone(w.buf[:i+1]))
		w.buf = w.buf[i+1:]
	}
	for len(w.buf) > maxLine {
		w.send(slices.Clone(w.buf[:maxLine]))
		w.buf = w.buf[maxLine:]
	}
	return len(p), nil
}

// Flush sends what is left without a newline.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.send(slices.Clone(w.buf))
		w.buf = nil
	}
}

// safeSegment is s with what a cgroup name should not hold replaced, at most 64 bytes.
func safeSegment(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// randomSuffix is 3 random bytes in hex.
func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewSecret returns a random secret for a StepRequest (clusters without MUNGE).
func NewSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// execError is how slurmstepd words a task that could not start: strerror's text
// ("No such file or directory", "Permission denied").
func execError(err error) string {
	var errno syscall.Errno
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return "No such file or directory"
	case errors.Is(err, os.ErrPermission):
		return "Permission denied"
	case errors.As(err, &errno):
		s := errno.Error()
		return strings.ToUpper(s[:1]) + s[1:]
	}
	return err.Error()
}

// findCommand finds cmd as execve through the task's PATH would (a name with a '/' as
// it is, relative to dir): an error when there is no such executable file.
func findCommand(cmd string, env []string, dir string) error {
	check := func(p string) error {
		if !strings.HasPrefix(p, "/") {
			p = dir + "/" + p
		}
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			return err
		case fi.IsDir():
			return syscall.EACCES
		case fi.Mode()&0o111 == 0:
			return os.ErrPermission
		}
		return nil
	}
	if strings.Contains(cmd, "/") {
		return check(cmd)
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	err := error(os.ErrNotExist)
	for _, d := range strings.Split(path, ":") {
		if d == "" {
			d = "."
		}
		if e := check(d + "/" + cmd); e == nil {
			return nil
		} else if errors.Is(e, os.ErrPermission) || errors.Is(e, syscall.EACCES) {
			err = os.ErrPermission
		}
	}
	return err
}
