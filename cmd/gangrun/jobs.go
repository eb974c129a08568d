package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/slurm"
	"github.com/gangrun/gangrun/topology"
)

// stepCommand is the hidden subcommand an agent starts for a job's step on its node.
const stepCommand = "__step"

// submitFlags are `gangrun submit`'s options, which a script may also give on #GANGRUN
// lines (the command line wins).
type submitFlags struct {
	nodes, name, partition, account, timeLimit, signal, checkpointDir, output, uid string
	dependency, array                                                              string
	begin, qos                                                                     string
	nice                                                                           int
	priority, spares                                                               int
	gpus                                                                           string
	termTimeout                                                                    time.Duration
	mem                                                                            int64
	env                                                                            []string
	asJSON, hold                                                                   bool
	consul                                                                         *string
	// supervision is `gangrun run`'s supervision flags, registered by the same function.
	supervision supervisionFlags
	choice      nodeChoiceFlags // --exclusive, --constraint, --nodelist, --exclude
}

func (f *submitFlags) register(fs *pflag.FlagSet) {
	f.consul = consulFlag(fs)
	fs.StringVar(&f.nodes, "nodes", "1", "nodes, N or MIN:MAX (the job takes as many as are free, and shrinks within them)")
	fs.StringVar(&f.gpus, "gpus-per-node", "1", "[TYPE:]COUNT devices on each node: 8, h100:8 (a GPU model), 3g.40gb:2 (MIG devices of that profile); 0 for a CPU-only job (one worker per node, one CPU)")
	fs.StringVar(&f.name, "name", "", "the job's name (%x in --output; default: the command's or script's base name)")
	fs.StringVar(&f.partition, "partition", "", "run on nodes of this partition (their partition label)")
	fs.StringVar(&f.account, "account", "", "the account (project) the job is charged to (default: the user's default account in the policy, else the user's name)")
	fs.StringVar(&f.uid, "uid", "", "submit as this user (root only, as sbatch --uid)")
	fs.IntVar(&f.priority, "priority", 0, "higher goes first")
	fs.StringVar(&f.timeLimit, "time", "", "time limit: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or a duration (90m); the job ends TIMEOUT")
	fs.StringVar(&f.signal, "signal", "", "SIG@DUR: send SIG to the workers DUR (seconds or a duration) before the time limit")
	fs.IntVar(&f.spares, "spare-nodes", 0, "nodes granted with the job, idle until one of its nodes fails")
	fs.StringVar(&f.checkpointDir, "checkpoint-dir", "", "where the trainer writes checkpoints; every attempt resumes from the newest complete one")
	f.supervision.register(fs)
	f.choice.register(fs)
	durationVar(fs, &f.termTimeout, "term-timeout", launcher.DefaultTermTimeout, durationFlag{max: maxGrace},
		"SIGTERM to SIGKILL grace when the job is stopped (at most 24h)")
	fs.StringVar(&f.output, "output", job.DefaultOutput, "output file pattern (%j job id, %x name, %n node, %u user), relative to the submit directory")
	fs.StringArrayVar(&f.env, "env", nil, "extra worker environment KEY=VAL (repeatable)")
	memVar(fs, &f.mem, "memory limit per node (the step's cgroup), Slurm's --mem syntax: 4G, 500M, 1024 (megabytes); 0 is none")
	fs.BoolVar(&f.hold, "hold", false, "queue the job held (JobHeldUser) until scontrol release, as sbatch --hold")
	fs.StringVar(&f.begin, "begin", "", "start no sooner than this (Slurm's forms: now+1hour, 16:00, midnight, 2026-04-01T08:30, ...); it waits PENDING (BeginTime)")
	fs.IntVar(&f.nice, "nice", 0, "lower the job's priority by this much (negative: an operator's only), as sbatch --nice")
	fs.StringVar(&f.qos, "qos", "", "the job's QOS, one of the policy's (its priority and limits; default the account's)")
	fs.StringVar(&f.dependency, "dependency", "", "wait for other jobs: afterok:ID[:ID...], afterany:, afternotok:, aftercorr:, after:ID[+MIN] (started), singleton; ',' all must hold, '?' any one")
	fs.StringVar(&f.array, "array", "", fmt.Sprintf("a job array: indices 0-15, 1,3,5-7 or 0-15:2 (0 to %d), %%N caps the tasks running at once", job.MaxArraySize-1))
	fs.BoolVar(&f.asJSON, "json", false, `print {"id"} ({"id", "tasks"} for an array)`)
}

func runSubmit(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "submit", "[FLAGS] (-- COMMAND [ARGS...] | SCRIPT [ARGS...])")
	fs.SetInterspersed(false)
	var f submitFlags
	f.register(fs)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usageErr(e, "submit", "no command: give one after --, as in gangrun submit -- python train.py, or a script")
	}
	var script string
	command := rest
	if fs.ArgsLenAtDash() != 0 {
		// A script, as sbatch takes one: its #GANGRUN lines are options the command
		// line overrides; the job runs the script's text as it is now.
		data, err := userfile.ReadFile(rest[0], job.MaxScriptBytes)
		if err != nil {
			return usageErr(e, "submit", "script %v", err) // err names the path
		}
		script = string(data)
		if !job.HasCommand(script) {
			return usageErr(e, "submit", "script %s has no command, only comments: nothing to run", rest[0])
		}
		if slurm.HasDirectives(script) {
			// A Slurm batch script: its #SBATCH lines are sbatch's options, its #GANGRUN
			// lines and this command line's gangrun's; it runs once, as Slurm's batch
			// step (docs/slurm.md).
			se := &slurm.Env{Environ: os.Environ, Getenv: e.getenv}
			req, err := slurm.ParseBatch(se, script, rest[0], rest[1:], args[:len(args)-len(rest)], nil)
			if err != nil {
				return usageErr(e, "submit", "%s: %s", rest[0], strings.TrimPrefix(err.Error(), "error: "))
			}
			if code := checkSubmit(e, req.Spec, ""); code != exitOK {
				return code
			}
			return submitSpec(ctx, e, &f, req.Spec, req.Array)
		}
		directives, err := job.ScriptOptions(script)
		if err != nil {
			return usageErr(e, "submit", "%s: %v", rest[0], err)
		}
		flagArgs := args[:len(args)-len(rest)]
		all := newFlagSet(e, "submit", "")
		f = submitFlags{}
		f.register(all)
		if done, code := parseFlags(e, all, append(append([]string{}, directives...), flagArgs...)); done {
			return code
		}
		if all.NArg() > 0 {
			return usageErr(e, "submit", "%s: a %s line holds %q, which is no option", rest[0], job.Directive, all.Arg(0))
		}
		command = rest[1:]
	}
	spec, err := f.spec(command, script, scriptName(rest, script))
	if err != nil {
		return usageErr(e, "submit", "%v", err)
	}
	if code := checkSubmit(e, spec, f.timeLimit); code != exitOK {
		return code
	}
	var array *job.Array
	if f.array != "" {
		a, err := job.ParseArray(f.array)
		if err != nil {
			return usageErr(e, "submit", "%v", err)
		}
		array = &a
	}
	return submitSpec(ctx, e, &f, spec, array)
}

// submitSpec queues spec, checked already (checkSubmit), and array's tasks when array
// is set, as submit's flags f say (--consul, --uid, --json), and prints its id.
func submitSpec(ctx context.Context, e *env, f *submitFlags, spec job.Spec, array *job.Array) int {
	s, code := openStore(e, "submit", *f.consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	who, code := identify(ctx, e, "submit", s)
	if code != exitOK {
		return code
	}
	// Where the agents check MUNGE credentials, the job carries its submitter's
	// (docs/acl.md#identity).
	munge, err := clusterSealer(ctx, e, s)
	if err != nil {
		return sealerErr(e, "submit", err)
	}
	if spec.Batch != nil {
		spec.Batch.ClusterName = slurm.ClusterName(ctx, s)
		if spec.Partition == "" {
			spec.Partition = slurm.DefaultPartition(ctx, s)
		}
	}
	if who.Role == acl.RoleUser {
		if f.uid != "" && f.uid != who.User {
			return usageErr(e, "submit", "permission denied: --uid %q: your token is %s, and a user's token submits only as its user", f.uid, who.Name())
		}
		if spec.User != who.User {
			fmt.Fprintf(e.stderr, "gangrun submit: submitting as %s, your token's user (not as %s)\n", who.User, spec.User)
		}
	}
	id, tasks, err := queueJob(ctx, s, who, munge, spec, array)
	if errors.Is(err, job.ErrInvalid) || errors.Is(err, job.ErrDenied) {
		return usageErr(e, "submit", "%v", err)
	}
	if errors.Is(err, identity.ErrNoDaemon) || errors.Is(err, identity.ErrNoMunge) {
		return sealerErr(e, "submit", err)
	}
	if err != nil {
		return failErr(e, "submit", err)
	}
	switch {
	case f.asJSON && array != nil:
		return printJSON(e, map[string]any{"id": id, "tasks": tasks})
	case f.asJSON:
		return printJSON(e, map[string]string{"id": id})
	}
	fmt.Fprintln(e.stdout, id)
	return exitOK
}

// queueJob queues spec (array's tasks, when array is set) as who submits it, sealed
// with munge's credential where the agents check them (munge nil: they check none),
// and returns its id (and the tasks'): through the request box of a user's token,
// which writes only that box (the elected agent queues the job as the token's user:
// docs/acl.md), else directly. `gangrun submit` and sbatch queue jobs through it.
func queueJob(ctx context.Context, s store.Store, who acl.Identity, munge *identity.Munge, spec job.Spec, array *job.Array) (string, []string, error) {
	var sealer job.Sealer
	var prover job.Prover
	if munge != nil { // a nil *identity.Munge is no nil interface
		sealer, prover = munge, munge
		if os.Geteuid() != 0 {
			// Under MUNGE the operator is root: the elected agent would refuse the job
			// (job.CheckOperatorOnly); say so now, as slurmctld answers sbatch.
			if err := job.CheckOperatorOnly(spec); err != nil {
				return "", nil, fmt.Errorf("%w: %w", job.ErrInvalid, err)
			}
		}
	}
	switch {
	case who.Role == acl.RoleUser:
		return job.Asker{User: who.User, Prover: prover, Wait: job.DefaultRequestWait}.Submit(ctx, s, spec, array)
	case array != nil:
		return job.SubmitArraySealed(ctx, s, spec, *array, sealer)
	}
	id, err := job.SubmitSealed(ctx, s, spec, sealer)
	return id, nil, err
}

// scriptName is the name a job defaults to: the script's base name, else the command's.
func scriptName(rest []string, script string) string {
	if script != "" || len(rest) > 0 {
		return filepath.Base(rest[0])
	}
	return "job"
}

// spec builds the job's spec from the flags; command follows the script when there is
// one (the script's arguments).
func (f *submitFlags) spec(command []string, script, name string) (job.Spec, error) {
	lo, hi, err := job.ParseNodes(f.nodes)
	if err != nil {
		return job.Spec{}, err
	}
	limit := time.Duration(0)
	if f.timeLimit != "" {
		if limit, err = job.ParseTime(f.timeLimit); err != nil {
			return job.Spec{}, err
		}
	}
	var sig syscall.Signal
	var before time.Duration
	if f.signal != "" {
		if sig, before, err = job.ParseSignal(f.signal); err != nil {
			return job.Spec{}, err
		}
	}
	env, err := lastEnv(f.env)
	if err != nil {
		return job.Spec{}, err
	}
	deps, err := job.ParseDependency(f.dependency)
	if err != nil {
		return job.Spec{}, err
	}
	var begin time.Time
	if f.begin != "" {
		if begin, err = job.ParseBegin(f.begin, time.Now()); err != nil {
			return job.Spec{}, err
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return job.Spec{}, fmt.Errorf("the submit directory: %w", err)
	}
	var gpus int
	var profile, model string
	if f.gpus != "0" { // 0: a CPU-only job, one worker per node
		if gpus, profile, model, err = allocator.ParseGPUs(f.gpus); err != nil {
			return job.Spec{}, err
		}
	}
	sup, err := f.supervision.supervision()
	if err != nil {
		return job.Spec{}, err
	}
	choice, err := f.choice.choice()
	if err != nil {
		return job.Spec{}, err
	}
	submitter := currentUser()
	if f.uid != "" && f.uid != submitter {
		if os.Geteuid() != 0 {
			return job.Spec{}, fmt.Errorf("--uid %q: only root may submit as another user", f.uid)
		}
		if err := store.CheckSegment("--uid", f.uid); err != nil {
			return job.Spec{}, err
		}
		// Slurm's sbatch --uid takes a name or a number known to the submitting host.
		u, err := proc.LookupUser(f.uid)
		if errors.Is(err, proc.ErrUnknownUser) {
			return job.Spec{}, fmt.Errorf("--uid %q: %w", f.uid, proc.ErrUnknownUser)
		} else if err != nil {
			return job.Spec{}, fmt.Errorf("--uid: %w", err) // LookupUser's error names the user
		}
		submitter = u.Name // a uid is recorded by its user's name, as sbatch does
	}
	spec := job.Spec{Name: f.name, User: submitter, Account: f.account, Partition: f.partition,
		MinNodes: lo, MaxNodes: hi, GPUsPerNode: gpus, GPUModel: model, MIGProfile: profile, Priority: f.priority, TimeLimit: limit,
		Signal: sig, SignalBefore: before, SpareNodes: f.spares, CheckpointDir: f.checkpointDir,
		Supervision: sup, TermTimeout: f.termTimeout, Output: f.output, Env: env, Mem: f.mem,
		Command: command, Script: script, WorkDir: wd, Dependency: deps, Hold: f.hold, Begin: begin, Nice: f.nice, QOS: f.qos,
		NodeChoice: choice}
	if spec.Name == "" {
		spec.Name = name
	}
	if script != "" {
		// The script's own arguments, after it (sbatch script.sh ARGS).
		spec.Command = command
	}
	return spec, nil
}

// gpusPerNode renders a spec's --gpus-per-node as given: COUNT, or TYPE:COUNT.
func gpusPerNode(sp job.Spec) string {
	if t := sp.MIGProfile + sp.GPUModel; t != "" {
		return t + ":" + strconv.Itoa(sp.GPUsPerNode)
	}
	return strconv.Itoa(sp.GPUsPerNode)
}

// lastEnv checks --env entries and keeps the last of a variable given twice (a script's
// #GANGRUN line first, the command line's after it, wins).
func lastEnv(env []string) ([]string, error) {
	var out []string
	seen := map[string]int{}
	for _, kv := range env {
		if _, err := launcher.ParseEnvFlag(kv); err != nil {
			return nil, err
		}
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[name]; ok {
			out[i] = kv
			continue
		}
		seen[name] = len(out)
		out = append(out, kv)
	}
	return out, nil
}

// currentUser is the Unix user running gangrun, as Slurm takes the submitter.
func currentUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return strconv.Itoa(os.Getuid())
}

func runLogs(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "logs", "JOBID [--follow]")
	consul := consulFlag(fs)
	follow := fs.BoolP("follow", "f", false, "go on printing what the job writes until it ends")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(e, "logs", "want exactly one job id")
	}
	if err := store.CheckSegment("job id", fs.Arg(0)); err != nil {
		return usageErr(e, "logs", "%v", err)
	}
	s, code := openReader(ctx, e, "logs", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	err := job.Logs(ctx, s, fs.Arg(0), *follow, rawWriter(e.stdout))
	if errors.Is(err, job.ErrNotFound) {
		if tasks, terr := job.Tasks(ctx, s, fs.Arg(0)); terr == nil && len(tasks) > 0 {
			return usageErr(e, "logs", "%s is a job array of %d tasks: give one task, %s (gangrun show %s lists them)",
				fs.Arg(0), len(tasks), tasks[0].Spec.ID, fs.Arg(0))
		}
		return usageErr(e, "logs", "no job %q (gangrun queue --all lists them; an ended job's records go after the agents' --min-job-age)", fs.Arg(0))
	}
	if err != nil {
		return failErr(e, "logs", err)
	}
	return exitOK
}

// printJobs prints the queue as squeue does.
func printJobs(e *env, entries []job.Entry) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOBID\tNAME\tUSER\tPARTITION\tSTATE\tTIME\tNODES\tGPUS/NODE\tRESTARTS\tIDLE\tNODELIST(REASON)")
	for _, q := range entries {
		where := hostlist.Compress(q.Nodes)
		if q.State == job.Pending || where == "" {
			where = "(" + orDash(q.Reason) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", q.ID, q.Name, q.User, orDash(q.Partition), q.State,
			elapsed(q.Elapsed), q.NumNodes, q.GPUsPerNode, q.Restarts, idleColumn(q), where)
	}
	tw.Flush()
}

// idleColumn is the queue's IDLE column: "-", or the job's idle GPUs and for how long
// ("8 gpus 12:05"), as its nodes' agents found them (--waste-threshold, --waste-after).
func idleColumn(q job.Entry) string {
	if q.IdleGPUs == 0 {
		return "-"
	}
	since, err := time.Parse(time.RFC3339, q.IdleSince)
	if err != nil {
		return fmt.Sprintf("%d gpus", q.IdleGPUs)
	}
	return fmt.Sprintf("%d gpus %s", q.IdleGPUs, elapsed(int64(time.Since(since)/time.Second)))
}

// elapsed prints seconds as squeue's TIME: [D-]H:MM:SS, or M:SS under an hour.
func elapsed(s int64) string {
	d, h, m, sec := s/86400, s/3600%24, s/60%60, s%60
	switch {
	case d > 0:
		return fmt.Sprintf("%d-%02d:%02d:%02d", d, h, m, sec)
	case h > 0:
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}

// showJob prints a job's whole record, as scontrol show job does.
func showJob(e *env, j *job.Job, asJSON bool) int {
	if asJSON {
		return printJSON(e, jobJSON(j))
	}
	sp, st := j.Spec, j.State
	w := e.stdout
	fmt.Fprintf(w, "JobId=%s JobName=%s UserId=%s Account=%s Partition=%s\n", sp.ID, sp.Name, sp.User, orDash(sp.Account), orDash(sp.Partition))
	fmt.Fprintf(w, "   JobState=%s Reason=%s ExitCode=%d Restarts=%d NodeFailures=%d\n", st.Status, orDash(st.Reason), st.ExitCode, st.Restarts, st.NodeFailures)
	fmt.Fprintf(w, "   SubmitTime=%s StartTime=%s EndTime=%s TimeLimit=%s\n", stampOr(sp.Submitted), stampOr(st.Started), stampOr(st.Ended), limitOr(sp.TimeLimit))
	fmt.Fprintf(w, "   NumNodes=%s GPUsPerNode=%s SpareNodes=%d MaxRestarts=%d\n", nodesRange(sp), gpusPerNode(sp), sp.SpareNodes, sp.MaxRestarts)
	fmt.Fprintf(w, "   NodeList=%s Spares=%s\n", orDash(hostlist.Compress(st.Nodes)), orDash(hostlist.Compress(st.Spares)))
	printNodeChoice(w, sp)
	if len(sp.Dependency) > 0 {
		fmt.Fprintf(w, "   Dependency=%s\n", job.FormatDependencies(sp.Dependency))
	}
	if a := sp.Array; a != nil {
		fmt.Fprintf(w, "   ArrayJobId=%s ArrayTaskId=%d ArrayTaskCount=%d ArrayTaskThrottle=%d\n", a.JobID, a.TaskID, a.Count, a.Limit)
	}
	command := strings.Join(sp.Command, " ")
	if sp.Script != "" {
		command = strings.TrimSpace("(the script) " + command)
	}
	fmt.Fprintf(w, "   Command=%s\n", command)
	if sp.Script != "" {
		fmt.Fprintf(w, "   Script=%d bytes (kept with the job)\n", len(sp.Script))
	}
	fmt.Fprintf(w, "   WorkDir=%s\n   StdOut=%s\n", sp.WorkDir, strings.Join(job.OutputFiles(j), ","))
	if sp.CheckpointDir != "" {
		fmt.Fprintf(w, "   CheckpointDir=%s\n", sp.CheckpointDir)
	}
	for _, a := range st.Attempts {
		fmt.Fprintf(w, "   Attempt %d: nodes %s, started %s, ended %s, %s", a.Number, orDash(strings.Join(a.Nodes, ",")),
			stampOr(a.Started), stampOr(a.Ended), orDash(a.Cause))
		if a.ResumeFrom != "" {
			fmt.Fprintf(w, ", resumed from %s", a.ResumeFrom)
		}
		fmt.Fprintln(w)
	}
	for _, l := range st.LostNodes {
		fmt.Fprintf(w, "   Lost node %s at %s: %s\n", l.Node, stampOr(l.At), l.Why)
	}
	for _, p := range st.Preemptions {
		fmt.Fprintf(w, "   Preempted by job %s (partition %s) at %s: SIG%s, grace %s, requeued %s\n", p.By, orDash(p.Partition),
			stampOr(p.At), p.SignalName(), p.Grace, stampOr(p.Requeued))
	}
	printSupervision(w, j)
	if n, _ := j.IdleGPUs(); n > 0 {
		for _, m := range j.Idle {
			fmt.Fprintf(w, "   GPUWaste=node %s GPUs %s under %g%% utilisation since %s (%s; highest now %g%%)\n", m.Node, intList(m.GPUs),
				m.Threshold, stampOr(m.Since), time.Since(m.Since).Round(time.Second), m.MaxUtil)
		}
	}
	return exitOK
}

// printSupervision prints the job's supervision, as its rank-0 node's agent exports it:
// restarts by cause, the last restart's time from failure to workers started, the newest
// checkpoint its agent saw, and the effective training time ratio.
func printSupervision(w io.Writer, j *job.Job) {
	st := &j.State
	if len(st.RestartsByCause) > 0 {
		var parts []string
		for _, c := range job.RestartCauses() {
			if n := st.RestartsByCause[c]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s=%d", c, n))
			}
		}
		fmt.Fprintf(w, "   RestartsByCause=%s\n", strings.Join(parts, ","))
	}
	if d, ok := st.Recovery(); ok {
		fmt.Fprintf(w, "   LastRestart=%s from failure to workers started\n", d.Round(time.Millisecond))
	}
	if c := st.Checkpoint; c != nil {
		fmt.Fprintf(w, "   NewestCheckpoint=%s at %s (age %s when seen %s)\n", c.Path, stampOr(c.Time), c.Seen.Sub(c.Time).Round(time.Second), stampOr(c.Seen))
	}
	if r, ok := st.ETTR(j.Spec.CheckpointDir, time.Now()); ok {
		fmt.Fprintf(w, "   ETTR=%.3f (productive time over wall time since it started)\n", r)
	}
}

// jobJSON is `gangrun show ID --json` for a job: the queue's fields plus "exit_code",
// "nodes" as [{"name", "gpus"}], "attempts", "lost_nodes", "preemptions" (and
// "preempted_by" while it waits for the job that pre-empted it), and the supervision's
// "restarts_by_cause", "last_restart_seconds", "checkpoint" and "ettr" when known.
func jobJSON(j *job.Job) any {
	e := job.EntryOf(*j, "", time.Now())
	type node struct {
		Name string `json:"name"`
		GPUs int    `json:"gpus"`
	}
	out := struct {
		job.Entry
		Nodes     []node         `json:"nodes"`
		ExitCode  int            `json:"exit_code"`
		Attempts  []job.Attempt  `json:"attempts"`
		LostNodes []job.LostNode `json:"lost_nodes"`
		// Preemptions and PreemptedBy: the job's pre-emptions, and the job it waits for
		// (PENDING, BeginTime) after the last one.
		Preemptions []job.Preemption `json:"preemptions"`
		PreemptedBy string           `json:"preempted_by,omitempty"`
		Spares      []string         `json:"spares"`
		Spec        job.Spec         `json:"spec"`
		Ended       string           `json:"ended"`
		// The supervision (printSupervision): absent when unknown.
		RestartsByCause    map[string]int      `json:"restarts_by_cause,omitempty"`
		LastRestartSeconds *float64            `json:"last_restart_seconds,omitempty"`
		Checkpoint         *job.CheckpointSeen `json:"checkpoint,omitempty"`
		ETTR               *float64            `json:"ettr,omitempty"`
	}{RestartsByCause: j.State.RestartsByCause, Checkpoint: j.State.Checkpoint, Entry: e, ExitCode: j.State.ExitCode, Spec: j.Spec, Spares: append([]string{}, j.State.Spares...),
		LostNodes: append([]job.LostNode{}, j.State.LostNodes...), Nodes: []node{},
		Preemptions: append([]job.Preemption{}, j.State.Preemptions...), PreemptedBy: j.State.PreemptedBy, Attempts: append([]job.Attempt{}, j.State.Attempts...)}
	for _, n := range j.State.Nodes {
		out.Nodes = append(out.Nodes, node{Name: n, GPUs: j.Spec.GPUsPerNode})
	}
	if d, ok := j.State.Recovery(); ok {
		v := d.Seconds()
		out.LastRestartSeconds = &v
	}
	if r, ok := j.State.ETTR(j.Spec.CheckpointDir, time.Now()); ok {
		out.ETTR = &r
	}
	if !j.State.Ended.IsZero() {
		out.Ended = j.State.Ended.UTC().Format(time.RFC3339)
	}
	return out
}

// intList prints GPU indexes as "0,1,2".
func intList(v []int) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func stampOr(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func limitOr(d time.Duration) string {
	if d == 0 {
		return "UNLIMITED"
	}
	return d.String()
}

func nodesRange(s job.Spec) string {
	if s.MinNodes == s.MaxNodes {
		return strconv.Itoa(s.MinNodes)
	}
	return fmt.Sprintf("%d:%d", s.MinNodes, s.MaxNodes)
}

// runStep is the hidden `gangrun __step --consul ADDR [--topology-file F] JOB NODE` an
// agent starts for a job's step on its node.
func runStep(ctx context.Context, e *env, args []string) int {
	// Descriptors the agent inherited without close-on-exec (from its own starter) must
	// not reach the job's workers, which run as another user: Slurm's tasks get 0-2
	// only. Linux 5.11's close_range flag; an older kernel keeps them.
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	fs := newFlagSet(e, stepCommand, "--consul ADDR [--topology-file F] [--auth munge|none] JOB NODE")
	consul := consulFlag(fs)
	topoFile := fs.String("topology-file", "", "the node's recorded inventory (as its agent's)")
	authMode := fs.String("auth", authNone, "as the agent's --auth: munge checks the job's attestation before anything runs")
	stateDir := fs.String("state-dir", "", "the agent's state directory: the step writes its outcome in the node's ledger there")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() != 2 {
		return usageErr(e, stepCommand, "want JOB NODE")
	}
	id, node := fs.Arg(0), fs.Arg(1)
	log, _ := launcher.NewLogger("text", e.stderr)
	s, code := openStore(e, stepCommand, *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	var inv *topology.Inventory
	if *topoFile != "" {
		var err error
		if inv, err = topology.LoadFile(*topoFile); err != nil {
			return usageErr(e, stepCommand, "%v", topology.FlagError(err))
		}
		inv.Node = node
	}
	addr := *consul
	if addr == "" {
		addr = os.Getenv("CONSUL_HTTP_ADDR")
	}
	var guardian []string
	if e.self != "" {
		guardian = []string{e.self, guardianCommand}
	}
	var prover job.Prover
	switch *authMode {
	case authMunge:
		m, err := identity.Open(identity.SocketFrom(e.getenv))
		if err != nil {
			return failErr(e, stepCommand, err)
		}
		prover = m
	case authNone, authACL:
	default:
		return usageErr(e, stepCommand, "--auth %q: want munge, acl or none", *authMode)
	}
	if !e.startup.handOver() {
		return exitFailure // stopped by a signal while starting: main says so
	}
	return job.RunStep(ctx, job.StepConfig{Store: s, ConsulAddr: addr, Job: id, Node: node, Inventory: inv,
		GuardianArgv: guardian, Subreaper: e.self != "", Signals: e.signals, Log: log, Prover: prover, StateDir: *stateDir})
}

// stepArgv is the command that runs job id's step on node (agent.Config.StepArgv):
// this binary's hidden step command with the agent's Consul address, topology file
// (made absolute: the step runs in /), how it tells users apart and its state
// directory.
func stepArgv(e *env, consul, topoFile, node, auth, stateDir, id string) ([]string, error) {
	if e.self == "" {
		return nil, errors.New("no gangrun binary to start the step with")
	}
	args := []string{e.self, stepCommand, "--auth", auth, "--state-dir", stateDir}
	if consul != "" {
		args = append(args, "--consul", consul)
	}
	if topoFile != "" {
		abs, err := filepath.Abs(topoFile)
		if err != nil {
			return nil, err
		}
		args = append(args, "--topology-file", abs)
	}
	return append(args, id, node), nil
}

// showArray prints every task of a job array, as scontrol show job A does: each
// task's record in turn, or with --json a list of show's objects.
func showArray(e *env, tasks []job.Job, asJSON bool) int {
	if asJSON {
		out := make([]any, len(tasks))
		for i := range tasks {
			out[i] = jobJSON(&tasks[i])
		}
		return printJSON(e, out)
	}
	for i := range tasks {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		showJob(e, &tasks[i], false)
	}
	return exitOK
}
