package slurm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/job"
)

// srunConnectTimeout bounds how long srun waits for every node of its step to connect.
const srunConnectTimeout = 60 * time.Second

// srunOptions are srun 22.05's options: those gangrun builds, and the rest refused.
var srunOptions = []option{
	{long: "chdir", short: 'D', arg: reqArg},
	{long: "cpu-bind", arg: reqArg},
	{long: "cpus-per-task", short: 'c', arg: reqArg},
	{long: "export", arg: reqArg},
	{long: "gpus-per-task", arg: reqArg},
	{long: "help", short: 'h', arg: noArg},
	{long: "jobid", arg: reqArg},
	{long: "job-name", short: 'J', arg: reqArg},
	{long: "kill-on-bad-exit", short: 'K', arg: optArg},
	{long: "label", short: 'l', arg: noArg},
	{long: "mpi", arg: reqArg},
	{long: "nodelist", short: 'w', arg: reqArg},
	{long: "nodes", short: 'N', arg: reqArg},
	{long: "ntasks", short: 'n', arg: reqArg},
	{long: "ntasks-per-node", arg: reqArg},
	{long: "open-mode", arg: reqArg},
	{long: "overlap", arg: noArg},
	{long: "pty", arg: noArg},
	{long: "quiet", short: 'Q', arg: noArg},
	{long: "unbuffered", short: 'u', arg: noArg},
	{long: "usage", arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "account", short: 'A', arg: reqArg, unsupported: notBuilt},
	{long: "acctg-freq", arg: reqArg, unsupported: notBuilt},
	{long: "bb", arg: reqArg, unsupported: notBuilt},
	{long: "bbf", arg: reqArg, unsupported: notBuilt},
	{long: "bcast", arg: optArg, unsupported: notBuilt},
	{long: "begin", short: 'b', arg: reqArg, unsupported: notBuilt},
	{long: "comment", arg: reqArg, unsupported: notBuilt},
	{long: "compress", arg: optArg, unsupported: notBuilt},
	{long: "constraint", short: 'C', arg: reqArg, unsupported: notBuilt},
	{long: "container", arg: reqArg, unsupported: notBuilt},
	{long: "cpu-freq", arg: reqArg, unsupported: notBuilt},
	{long: "dependency", short: 'd', arg: reqArg, unsupported: notBuilt},
	{long: "distribution", short: 'm', arg: reqArg, unsupported: notBuilt},
	{long: "error", short: 'e', arg: reqArg},
	{long: "epilog", arg: reqArg, unsupported: notBuilt},
	{long: "exact", arg: noArg, unsupported: notBuilt},
	{long: "exclude", short: 'x', arg: reqArg, unsupported: notBuilt},
	{long: "exclusive", arg: optArg, unsupported: notBuilt},
	{long: "gpus", short: 'G', arg: reqArg, unsupported: notBuilt},
	{long: "gpus-per-node", arg: reqArg, unsupported: notBuilt},
	{long: "gpu-bind", arg: reqArg, unsupported: notBuilt},
	{long: "gres", arg: reqArg, unsupported: notBuilt},
	{long: "hold", short: 'H', arg: noArg, unsupported: notBuilt},
	{long: "immediate", short: 'I', arg: optArg, unsupported: notBuilt},
	{long: "input", short: 'i', arg: reqArg, unsupported: notBuilt},
	{long: "mem", arg: reqArg, unsupported: notBuilt},
	{long: "mem-per-cpu", arg: reqArg, unsupported: notBuilt},
	{long: "multi-prog", arg: noArg, unsupported: notBuilt},
	{long: "no-allocate", short: 'Z', arg: noArg, unsupported: notBuilt},
	{long: "no-kill", short: 'k', arg: optArg, unsupported: notBuilt},
	{long: "output", short: 'o', arg: reqArg},
	{long: "partition", short: 'p', arg: reqArg, unsupported: notBuilt},
	{long: "preserve-env", short: 'E', arg: noArg, unsupported: notBuilt},
	{long: "prolog", arg: reqArg, unsupported: notBuilt},
	{long: "qos", short: 'q', arg: reqArg, unsupported: notBuilt},
	{long: "relative", short: 'r', arg: reqArg, unsupported: notBuilt},
	{long: "signal", arg: reqArg, unsupported: notBuilt},
	{long: "task-epilog", arg: reqArg, unsupported: notBuilt},
	{long: "task-prolog", arg: reqArg, unsupported: notBuilt},
	{long: "time", short: 't', arg: reqArg, unsupported: notBuilt},
	{long: "wait", short: 'W', arg: reqArg, unsupported: notBuilt},
}

// stepLayout is an srun step's nodes and tasks per node.
type stepLayout struct {
	nodes []string
	tasks []int
}

// layout works out an srun step's nodes and tasks from its options (or the variables
// that stand for them: SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_NNODES, as srun
// reads them) within the job's nodes, as Slurm's block distribution lays them out:
// -n tasks over the nodes, as evenly as may be, the first nodes taking one more.
func layout(jobNodes []string, v values, getenv func(string) string) (stepLayout, error) {
	nodes, err := stepNodes(jobNodes, v)
	if err != nil {
		return stepLayout{}, err
	}
	ntasks, haveN, err := stepCount(v, getenv, "ntasks", "SLURM_NTASKS")
	if err != nil {
		return stepLayout{}, err
	}
	perNode, havePer, err := stepCount(v, getenv, "ntasks-per-node", "SLURM_NTASKS_PER_NODE")
	if err != nil {
		return stepLayout{}, err
	}
	nn, haveNN, err := stepNodeCount(v, getenv)
	if err != nil {
		return stepLayout{}, err
	}
	if !haveNN {
		nn = len(nodes)
	}
	if nn > len(nodes) {
		return stepLayout{}, &UsageError{Msg: "error: Unable to create step for job: Requested node configuration is not available", Code: 1}
	}
	var warn string
	if haveN && havePer && ntasks != nn*perNode {
		// srun drops --ntasks-per-node that does not fit the tasks and nodes: with a
		// warning when it was an option, silently when it came from the job's variables.
		if v.has("ntasks-per-node") {
			warn = fmt.Sprintf("srun: Warning: can't honor --ntasks-per-node set to %d which doesn't match the requested tasks %d with the number of requested nodes %d. Ignoring --ntasks-per-node.", perNode, ntasks, nn)
		}
		perNode = 0 // 0: not given
	}
	if haveN && ntasks < nn {
		if haveNN {
			warn = fmt.Sprintf("srun: Warning: can't run %d processes on %d nodes, setting nnodes to %d", ntasks, nn, ntasks)
		}
		nn = ntasks
	}
	tasks, err := spreadTasks(nn, ntasks, perNode)
	if err != nil {
		return stepLayout{}, err
	}
	l := stepLayout{nodes: nodes[:nn], tasks: tasks}
	if warn != "" {
		return l, &warning{msg: warn}
	}
	return l, nil
}

// stepNodes are the nodes a step may run on: --nodelist's (each one of the job's;
// in Slurm's order), else the job's.
func stepNodes(jobNodes []string, v values) ([]string, error) {
	if !v.has("nodelist") {
		return jobNodes, nil
	}
	want, err := hostlist.Expand(v["nodelist"])
	if err != nil {
		return nil, &UsageError{Msg: "error: Invalid node name specified", Code: 1}
	}
	for _, w := range want {
		if !slices.Contains(jobNodes, w) {
			return nil, &UsageError{Msg: "error: Unable to create step for job: Requested node configuration is not available", Code: 1}
		}
	}
	return job.SlurmNodes(want), nil
}

// stepCount reads count option name, else variable env ("": none): the count and
// whether either was given. Errors are srun's "Invalid numeric value" (below 1 too).
func stepCount(v values, getenv func(string) string, name, env string) (int, bool, error) {
	s, ok := v[name]
	if !ok && env != "" {
		if s = getenv(env); s != "" {
			ok = true
		}
	}
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, false, &UsageError{Msg: fmt.Sprintf("error: Invalid numeric value \"%s\" for --%s.", s, name), Code: 1}
	}
	return n, true, nil
}

// stepNodeCount is how many nodes the step asks for: --nodes's minimum, else
// SLURM_NNODES (ignored with --nodelist, or when it is no count), and whether either
// was given.
func stepNodeCount(v values, getenv func(string) string) (int, bool, error) {
	if v.has("nodes") {
		lo, _, err := job.ParseNodes(strings.Replace(v["nodes"], ":", "-", 1))
		if err != nil {
			return 0, false, &UsageError{Msg: fmt.Sprintf("error: \"%s\" is not a valid node count", v["nodes"]), Code: 255}
		}
		return lo, true, nil
	}
	if s := getenv("SLURM_NNODES"); s != "" && !v.has("nodelist") {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n, true, nil
		}
	}
	return 0, false, nil
}

// spreadTasks lays tasks out over nn nodes, as Slurm's block distribution does:
// ntasks at up to perNode a node, every node keeping at least one; ntasks alone as
// evenly as may be, the first nodes taking one more; perNode alone on every node;
// else one a node. 0 is a count not given.
func spreadTasks(nn, ntasks, perNode int) ([]int, error) {
	tasks := make([]int, nn)
	switch {
	case ntasks > 0 && perNode > 0:
		if ntasks > nn*perNode {
			return nil, &UsageError{Msg: "error: Unable to create step for job: Requested node configuration is not available", Code: 1}
		}
		left := ntasks
		for i := range tasks {
			tasks[i] = min(perNode, left-(nn-1-i)) // every node keeps at least one
			left -= tasks[i]
		}
	case ntasks > 0:
		for i := range tasks {
			tasks[i] = ntasks / nn
			if i < ntasks%nn {
				tasks[i]++
			}
		}
	case perNode > 0:
		for i := range tasks {
			tasks[i] = perNode
		}
	default:
		for i := range tasks {
			tasks[i] = 1
		}
	}
	return tasks, nil
}

// warning is a layout that srun warns about but runs.
type warning struct{ msg string }

func (w *warning) Error() string { return w.msg }

// Srun is srun inside a job (an sbatch job's script, or salloc's shell): it starts a
// step across the job's nodes, each task with Slurm's variables and its GPUs, its
// output on srun's own (-l prefixes each line with the task's rank), and exits with
// the highest of the tasks' exit codes (128+N for a task killed by signal N), as
// Slurm's srun. Options: -n, -N, --ntasks-per-node, -w, --gpus-per-task, -c,
// --cpu-bind=none, -l, -K, --export, -D, -J, --jobid, -u, --overlap, --mpi=none, --pty
// (srunpty.go).
func Srun(ctx context.Context, e *Env, args []string) int {
	ps, rest, err := getopt("srun", srunOptions, args, true, 255)
	if err != nil {
		return usage(e, "srun", err.(*UsageError))
	}
	v := values{}
	for _, p := range ps {
		if p.unsupported != "" {
			return errorf(e, "srun", 255, "--%s is %s", p.name, p.unsupported)
		}
		switch p.name {
		case "help", "usage":
			fmt.Fprintln(e.Stdout, "Usage: srun [OPTIONS...] executable [args...]")
			return 0
		case "version":
			fmt.Fprintln(e.Stdout, Version)
			return 0
		}
		v[p.name] = p.value
	}
	if v.has("cpu-bind") && !slices.Contains([]string{"none", "no", "verbose,none", "none,verbose"}, v["cpu-bind"]) {
		return errorf(e, "srun", 255, "--cpu-bind=%s: binding tasks to CPUs is %s; --cpu-bind=none is", v["cpu-bind"], notBuilt)
	}
	if v.has("mpi") && v["mpi"] != "none" {
		return errorf(e, "srun", 255, "--mpi=%s: MPI plugins are %s; --mpi=none is", v["mpi"], notBuilt)
	}
	if err := checkStepPatterns(v); err != nil {
		return usage(e, "srun", err.(*UsageError))
	}
	if len(rest) == 0 {
		return errorf(e, "srun", 1, "No command given to execute.")
	}
	id := v["jobid"]
	if id == "" {
		id = e.Getenv("SLURM_JOB_ID")
	}
	if id == "" {
		id = e.Getenv("SLURM_JOBID")
	}
	if id == "" {
		return errorf(e, "srun", 1, "no job allocation: gangrun's srun runs job steps inside an sbatch or salloc job (run it there, or use salloc first)")
	}
	return runStep(ctx, e, id, v, rest)
}

// runStep runs an srun step of job id.
func runStep(ctx context.Context, e *Env, id string, v values, command []string) int {
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "srun", 1, "%v", err)
	}
	defer s.Close()
	j, err := job.Read(ctx, s, id)
	switch {
	case errors.Is(err, job.ErrNotFound):
		return errorf(e, "srun", 1, "Unable to create step for job %s: Invalid job id specified", id)
	case err != nil:
		return errorf(e, "srun", 1, "Unable to create step for job %s: %v", id, err)
	case j.Spec.Batch == nil:
		return errorf(e, "srun", 1, "Unable to create step for job %s: it is a gangrun job, not a Slurm batch job: srun starts steps in sbatch and salloc jobs", id)
	case j.State.Status == job.Pending:
		// srun 22.05's words for a pending job, its user's or another's (the allocation
		// lookup answers before the owner is checked).
		errorf(e, "srun", 1, "Unable to confirm allocation for job %s: Job is pending execution", id)
		fmt.Fprintf(e.Stderr, "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job %s\n", id)
		return 1
	case j.State.Status != job.Running:
		return errorf(e, "srun", 1, "Unable to create step for job %s: Job/step already completing or completed", id)
	case !stepAllowed(j):
		return errorf(e, "srun", 1, "Unable to create step for job %s: Access/permission denied", id)
	}
	v, getenv := ptyDefaults(v, e.Getenv)
	lay, err := layout(job.SlurmNodes(j.State.Nodes), v, getenv)
	var w *warning
	var ue *UsageError
	switch {
	case errors.As(err, &w):
		fmt.Fprintln(e.Stderr, w.msg)
	case errors.As(err, &ue):
		return usage(e, "srun", ue)
	}
	req, code, ok := stepRequest(e, j, id, v, lay, command)
	if !ok {
		return code
	}
	tty, code, done := ptyRequest(e, v, &req) // srun --pty's terminal
	if done {
		return code
	}
	host := listenHost(e, s)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return errorf(e, "srun", 1, "cannot listen for the step's nodes on %s: %v", host, err)
	}
	defer ln.Close()
	req.Addr = ln.Addr().String()
	req.Host, _ = os.Hostname()
	m, err := e.Cluster.Munge(ctx, s)
	if err != nil {
		return errorf(e, "srun", 1, "%v", err)
	}
	var sealer job.Sealer
	if m != nil {
		sealer = m
	} else {
		req.Secret = job.NewSecret()
	}
	if req, err = job.CreateSrunStep(ctx, s, sealer, req); err != nil {
		return errorf(e, "srun", 1, "Unable to create step for job %s: %v", id, err)
	}
	r := &srunRun{e: e, req: req, m: m, label: v.has("label"), kill: v.has("kill-on-bad-exit") && v["kill-on-bad-exit"] != "0",
		width: len(strconv.Itoa(req.NTasks() - 1)), exits: map[int]job.TaskExit{}}
	if r.files, err = openStepFiles(j, req, v, e.Getenv); err != nil {
		_ = job.EndSrunStep(context.WithoutCancel(ctx), s, id, req.Step, job.SrunState{State: job.Failed, ExitCode: 1, Ended: time.Now().UTC(), Reason: err.Error()})
		return errorf(e, "srun", 1, "%v", err)
	}
	defer r.files.close()
	code, st := r.runTerminal(ctx, ln, tty)
	st = endedWithJob(ctx, s, id, st)
	st.Ended = time.Now().UTC()
	if err := job.EndSrunStep(context.WithoutCancel(ctx), s, id, req.Step, st); err != nil {
		errorf(e, "srun", 0, "record the step's end: %v", err)
	}
	return code
}

// endedWithJob is step end st as Slurm records it when the step's tasks were killed
// because their job ended (scancel of the job, its time limit): CANCELLED, not FAILED,
// as slurmctld marks the steps of a job it cancels. Any other end is st.
func endedWithJob(ctx context.Context, s Store, id string, st job.SrunState) job.SrunState {
	if st.State != job.Failed || st.Signal == 0 {
		return st
	}
	j, err := job.Read(context.WithoutCancel(ctx), s, id)
	if err != nil {
		return st
	}
	switch {
	case j.State.Status == job.Cancelled || j.State.Status == job.Timeout,
		j.State.Status == job.Completing && (j.State.End == job.Cancelled || j.State.End == job.Timeout):
		st.State = job.Cancelled
	}
	return st
}

// stepRequest is the step srun asks of job j's (id's) nodes: its tasks laid out as lay, its
// command, name, GPUs per task, working directory and environment; false with the exit
// code after a message when an option's value is bad.
func stepRequest(e *Env, j *job.Job, id string, v values, lay stepLayout, command []string) (job.StepRequest, int, bool) {
	req := job.StepRequest{Job: id, Name: filepath.Base(command[0]), UID: uint32(os.Getuid()), Nodes: lay.nodes,
		Tasks: lay.tasks, Command: command, Label: v.has("label")}
	if v.has("job-name") {
		req.Name = v["job-name"]
	}
	if s := v["gpus-per-task"]; s != "" || e.Getenv("SLURM_GPUS_PER_TASK") != "" {
		if s == "" {
			s = e.Getenv("SLURM_GPUS_PER_TASK")
		}
		_, n, ok := gpuCount(s)
		if !ok {
			return req, errorf(e, "srun", 255, "Invalid --gpus-per-task specification"), false
		}
		req.GPUsPerTask = n
	}
	req.WorkDir, _ = os.Getwd()
	if v.has("chdir") {
		d := v["chdir"]
		if !filepath.IsAbs(d) {
			d = filepath.Join(req.WorkDir, d)
		}
		req.WorkDir = d
	}
	environ := e.Environ()
	if e.Getenv("SLURM_JOB_ID") != id {
		environ = append(environ, allocationVars(j)...) // srun --jobid from outside the job
	}
	if v.has("cpus-per-task") {
		environ = append(environ, "SLURM_CPUS_PER_TASK="+v["cpus-per-task"])
	}
	var err error
	if req.Env, err = job.ExportEnv(exportMode(v["export"]), environ, loginEnv(currentUser())); err != nil {
		return req, errorf(e, "srun", 255, "%v", err), false
	}
	return req, 0, true
}

// srunRun is one srun step's side of its nodes' connections.
type srunRun struct {
	e     *Env
	req   job.StepRequest
	m     *identity.Munge
	label bool
	kill  bool
	width int
	files *stepFiles // --output and --error; nil: srun's own stdout and stderr

	mu       sync.Mutex
	conns    []net.Conn
	exits    map[int]job.TaskExit
	killed   bool // srun stopped the step (-K, a signal)
	errs     []string
	outMu    sync.Mutex
	partials map[[2]int][]byte
	sendMu   sync.Mutex
	// connected, when set, is told of each node's connection (srun --pty's terminal).
	connected func(net.Conn)
}

// run accepts the nodes, streams their frames, and returns srun's exit code and the
// step's end.
func (r *srunRun) run(ctx context.Context, ln net.Listener) (int, job.SrunState) {
	req := r.req
	type hello struct {
		conn net.Conn
		dec  *json.Decoder
		node string
	}
	accepted := make(chan hello)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(srunDialTimeoutFrame))
				dec := json.NewDecoder(bufio.NewReader(c))
				var f job.Frame
				if err := dec.Decode(&f); err != nil || f.Hello == nil || !r.trusted(ctx, f.Hello) {
					c.Close()
					return
				}
				_ = c.SetReadDeadline(time.Time{})
				accepted <- hello{conn: c, dec: dec, node: f.Hello.Node}
			}()
		}
	}()
	var wg sync.WaitGroup
	done := map[string]bool{}
	deadline := time.After(srunConnectTimeout)
	sigDone := make(chan struct{})
	defer close(sigDone)
	go r.signals(sigDone)
	for len(done) < len(req.Nodes) {
		select {
		case h := <-accepted:
			if done[h.node] || !slices.Contains(req.Nodes, h.node) {
				h.conn.Close()
				continue
			}
			done[h.node] = true
			if killed := r.add(h.conn); killed {
				// The step is being stopped (-K, a signal to srun) and this node
				// connected late: its tasks get what the others got.
				r.send(h.conn, job.Frame{Signal: int(syscall.SIGTERM)})
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.read(h.node, h.dec)
				h.conn.Close()
			}()
		case <-deadline:
			var missing []string
			for _, n := range req.Nodes {
				if !done[n] {
					missing = append(missing, n)
				}
			}
			errorf(r.e, "srun", 0, "Task launch for StepId=%s.%d failed on node %s: the node did not answer within %s",
				req.Job, req.Step, hostlist.Compress(missing), srunConnectTimeout)
			r.stop(syscall.SIGKILL)
			wg.Wait()
			return 1, job.SrunState{State: job.Failed, ExitCode: 1, Reason: "nodes did not answer: " + strings.Join(missing, ",")}
		case <-ctx.Done():
			r.stop(syscall.SIGKILL)
			wg.Wait()
			return 1, job.SrunState{State: job.Cancelled, ExitCode: 1}
		}
	}
	wg.Wait()
	r.flushAll()
	code, sig := 0, 0
	for _, x := range r.exits {
		if x.Code > code {
			code, sig = x.Code, x.Signal
		}
	}
	if len(r.exits) < req.NTasks() && code == 0 {
		code = 1
	}
	st := job.SrunState{State: job.Completed, ExitCode: code, Signal: sig}
	oom := false
	for _, x := range r.exits {
		oom = oom || x.OOM > 0
	}
	switch {
	case oom:
		st.State = job.OutOfMemory // Slurm's, with no "Force Terminated"
	case r.killed:
		st.State = job.Cancelled
		fmt.Fprintf(r.e.Stderr, "srun: Force Terminated StepId=%s.%d\n", req.Job, req.Step)
	case sig != 0:
		st.State = job.Failed
		fmt.Fprintf(r.e.Stderr, "srun: Force Terminated StepId=%s.%d\n", req.Job, req.Step)
	case code != 0:
		st.State = job.Failed
	}
	return code, st
}

// add counts a node's connection c among the step's, tells connected of it, and
// returns whether the step is being stopped.
func (r *srunRun) add(c net.Conn) (killed bool) {
	r.mu.Lock()
	r.conns = append(r.conns, c)
	killed = r.killed
	r.mu.Unlock()
	if r.connected != nil {
		r.connected(c)
	}
	return killed
}

// listenHost is the address srun listens on for its step's nodes: GANGRUN_NODE_ADDR
// (a job's), else this host's toward the cluster's Consul (srun --jobid from outside
// the job), else loopback.
func listenHost(e *Env, s Store) string {
	if host := e.Getenv("GANGRUN_NODE_ADDR"); host != "" {
		return host
	}
	if host := localAddrToward(s); host != "" {
		return host
	}
	return "127.0.0.1"
}

// srunDialTimeoutFrame bounds how long a node's connection may take to say hello.
const srunDialTimeoutFrame = 30 * time.Second

// trusted checks a node's hello: a credential of root's (or of srun's own user) bound
// to this step, node and listener; or, on a cluster that checks no credentials, the
// request's secret.
func (r *srunRun) trusted(ctx context.Context, h *job.Hello) bool {
	if r.m == nil {
		return h.Secret != "" && h.Secret == r.req.Secret
	}
	c, err := r.m.Verify(ctx, h.Credential, job.HelloContent(r.req.Job, r.req.Step, h.Node, r.req.Addr), identity.FreshOrReplayed)
	return err == nil && (c.UID == 0 || c.UID == uint32(os.Getuid()))
}

// read handles one node's frames until it is done.
func (r *srunRun) read(node string, dec *json.Decoder) {
	var ended []int
	var failed bool
	for {
		var f job.Frame
		if err := dec.Decode(&f); err != nil {
			break
		}
		switch {
		case f.Error != "":
			failed = true
			errorf(r.e, "srun", 0, "Task launch for StepId=%s.%d failed on node %s: %s", r.req.Job, r.req.Step, node, f.Error)
		case f.Exit != nil:
			r.mu.Lock()
			r.exits[f.Task] = *f.Exit
			r.mu.Unlock()
			ended = append(ended, f.Task)
			if r.kill && f.Exit.Code != 0 {
				r.killOnBadExit()
			}
		case len(f.Out) > 0:
			r.output(f.Task, f.FD, f.Out)
		}
		if f.Done {
			break
		}
	}
	if failed {
		i := slices.Index(r.req.Nodes, node)
		r.mu.Lock()
		for t := r.req.FirstTask(i); t < r.req.FirstTask(i)+r.req.Tasks[i]; t++ {
			if _, ok := r.exits[t]; !ok {
				r.exits[t] = job.TaskExit{Code: 1}
			}
		}
		r.mu.Unlock()
	}
	r.report(node, ended)
}

// report prints, as srun does, the tasks of node that did not exit 0: one line per
// exit code or signal, the tasks as ranges ("tasks 0-3").
func (r *srunRun) report(node string, ended []int) {
	r.flushAll()
	groups := map[string][]int{}
	var keys []string
	oomTold := false
	r.mu.Lock()
	for _, t := range ended {
		x := r.exits[t]
		var what string
		switch {
		case x.OOM > 0 && oomTold:
			what = "Out Of Memory"
		case x.OOM > 0:
			what, oomTold = "Out Of Memory", true // slurmstepd's line, once for the node
			fmt.Fprintf(r.e.Stderr, "slurmstepd: error: Detected %d oom-kill event(s) in StepId=%s.%d. "+
				"Some of your processes may have been killed by the cgroup out-of-memory handler.\n", x.OOM, r.req.Job, r.req.Step)
		case x.Signal != 0:
			what = signalText(syscall.Signal(x.Signal))
		case x.Code != 0:
			what = fmt.Sprintf("Exited with exit code %d", x.Code)
		default:
			continue
		}
		if _, ok := groups[what]; !ok {
			keys = append(keys, what)
		}
		groups[what] = append(groups[what], t)
	}
	r.mu.Unlock()
	for _, k := range keys {
		ts := groups[k]
		sort.Ints(ts)
		word := "task"
		if len(ts) > 1 {
			word = "tasks"
		}
		fmt.Fprintf(r.e.Stderr, "srun: error: %s: %s %s: %s\n", node, word, taskRanges(ts), k)
	}
}

// taskRanges writes task ranks as Slurm does: "0-3", "0,2".
func taskRanges(ts []int) string {
	var parts []string
	for i := 0; i < len(ts); {
		j := i
		for j+1 < len(ts) && ts[j+1] == ts[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ts[i], ts[j]))
		} else {
			parts = append(parts, strconv.Itoa(ts[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// signalText is strsignal(3)'s text for sig, as srun reports a task it killed.
func signalText(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "Killed"
	case syscall.SIGTERM:
		return "Terminated"
	case syscall.SIGSEGV:
		return "Segmentation fault"
	case syscall.SIGABRT:
		return "Aborted"
	case syscall.SIGINT:
		return "Interrupt"
	case syscall.SIGBUS:
		return "Bus error"
	case syscall.SIGFPE:
		return "Floating point exception"
	case syscall.SIGHUP:
		return "Hangup"
	case syscall.SIGUSR1:
		return "User defined signal 1"
	case syscall.SIGUSR2:
		return "User defined signal 2"
	}
	return proc.SignalName(sig)
}

// output writes a task's output to srun's stdout or stderr, each line prefixed with
// the task's rank under -l ("3: ", padded to the widest rank).
func (r *srunRun) output(task, fd int, data []byte) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	w := r.writer(task, fd)
	if !r.label {
		_, _ = w.Write(data)
		return
	}
	if r.partials == nil {
		r.partials = map[[2]int][]byte{}
	}
	key := [2]int{task, fd}
	buf := append(r.partials[key], data...)
	for {
		i := slices.Index(buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(w, "%*d: %s", r.width, task, buf[:i+1])
		buf = buf[i+1:]
	}
	r.partials[key] = buf
}

// flushAll writes what is left of the tasks' last lines.
func (r *srunRun) flushAll() {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	for key, buf := range r.partials {
		if len(buf) > 0 {
			fmt.Fprintf(r.writer(key[0], key[1]), "%*d: %s\n", r.width, key[0], buf)
		}
		delete(r.partials, key)
	}
}

// killOnBadExit terminates the step once a task failed (-K), as srun's
// "Terminating StepId".
func (r *srunRun) killOnBadExit() {
	r.mu.Lock()
	first := !r.killed
	r.killed = true
	r.mu.Unlock()
	if first {
		fmt.Fprintf(r.e.Stderr, "srun: launch/slurm: _step_signal: Terminating StepId=%s.%d\n", r.req.Job, r.req.Step)
		r.stop(syscall.SIGTERM)
	}
}

// stop sends sig to every node's tasks.
func (r *srunRun) stop(sig syscall.Signal) {
	r.mu.Lock()
	conns := slices.Clone(r.conns)
	r.mu.Unlock()
	for _, c := range conns {
		r.send(c, job.Frame{Signal: int(sig)})
	}
}

// send writes f to a node's connection.
func (r *srunRun) send(c net.Conn, f job.Frame) {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	_ = json.NewEncoder(c).Encode(f)
}

// signals passes the signals srun gets to the step's tasks until done.
func (r *srunRun) signals(done <-chan struct{}) {
	if r.e.Signals == nil {
		return
	}
	for {
		select {
		case <-done:
			return
		case sig := <-r.e.Signals:
			s, ok := sig.(syscall.Signal)
			if !ok {
				continue
			}
			if r.req.Pty != nil {
				s = ptySignal(s)
			}
			if s == syscall.SIGINT || s == syscall.SIGTERM || s == syscall.SIGKILL {
				r.mu.Lock()
				r.killed = true
				r.mu.Unlock()
			}
			r.stop(s)
		}
	}
}
