package slurm

import (
	"context"
	"fmt"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/job"
	reasons "github.com/gangrun/gangrun/reason"
)

// squeue's formats (squeue(1)): the default, --long's, and --steps'.
const (
	squeueDefault = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
	squeueLong    = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
	squeueSteps   = "%.15i %.8j %.9P %.8u %.9M %N"
)

// squeueLetters are the %-letters squeue takes, with their headers (squeue(1)).
var squeueLetters = map[string]string{
	"i": "JOBID", "j": "NAME", "P": "PARTITION", "u": "USER", "t": "ST", "T": "STATE", "M": "TIME",
	"l": "TIME_LIMIT", "L": "TIME_LEFT", "D": "NODES", "R": "NODELIST(REASON)", "N": "NODELIST",
	"r": "REASON", "a": "ACCOUNT", "C": "CPUS", "b": "TRES_PER_NODE", "Q": "PRIORITY", "V": "SUBMIT_TIME",
	"S": "START_TIME", "e": "END_TIME", "Z": "WORK_DIR", "o": "COMMAND", "A": "JOBID", "F": "ARRAY_JOB_ID",
	"K": "ARRAY_TASK_ID", "U": "UID", "g": "GROUP", "B": "EXEC_HOST", "y": "NICE", "x": "EXC_NODES",
	"n": "REQ_NODES", "f": "FEATURES", "h": "OVER_SUBSCRIBE", "m": "MIN_MEMORY", "E": "DEPENDENCY",
}

// squeueFields are the -O/--Format fields squeue takes (lower case), with their
// headers.
var squeueFields = map[string]string{
	"jobid": "JOBID", "name": "NAME", "partition": "PARTITION", "username": "USER", "statecompact": "ST",
	"state": "STATE", "timeused": "TIME", "timelimit": "TIME_LIMIT", "timeleft": "TIME_LEFT",
	"numnodes": "NODES", "reasonlist": "NODELIST(REASON)", "nodelist": "NODELIST", "reason": "REASON",
	"account": "ACCOUNT", "numcpus": "CPUS", "tres-per-node": "TRES_PER_NODE", "priority": "PRIORITY",
	"submittime": "SUBMIT_TIME", "starttime": "START_TIME", "endtime": "END_TIME", "workdir": "WORK_DIR",
	"command": "COMMAND", "arrayjobid": "ARRAY_JOB_ID", "arraytaskid": "ARRAY_TASK_ID", "userid": "UID",
	"batchhost": "EXEC_HOST", "stepid": "STEPID", "stepname": "STEPNAME",
	"reqnodes": "REQ_NODES", "excnodes": "EXC_NODES", "feature": "FEATURES", "oversubscribe": "OVER_SUBSCRIBE", "minmemory": "MIN_MEMORY",
	"dependency": "DEPENDENCY",
}

// fieldLetter maps -O names onto the % letters they mean.
var fieldLetter = map[string]string{
	"jobid": "i", "name": "j", "partition": "P", "username": "u", "statecompact": "t", "state": "T",
	"timeused": "M", "timelimit": "l", "timeleft": "L", "numnodes": "D", "reasonlist": "R", "nodelist": "N",
	"reason": "r", "account": "a", "numcpus": "C", "tres-per-node": "b", "priority": "Q", "submittime": "V",
	"starttime": "S", "endtime": "e", "workdir": "Z", "command": "o", "arrayjobid": "F", "arraytaskid": "K",
	"userid": "U", "batchhost": "B", "stepid": "i", "stepname": "j",
	"reqnodes": "n", "excnodes": "x", "feature": "f", "oversubscribe": "h", "minmemory": "m", "dependency": "E",
}

// squeueOptions are squeue 22.05's options, those gangrun builds and, refused, the
// rest.
var squeueOptions = []option{
	{long: "all", short: 'a', arg: noArg},
	{long: "array", short: 'r', arg: noArg},
	{long: "format", short: 'o', arg: reqArg},
	{long: "Format", short: 'O', arg: reqArg},
	{long: "help", arg: noArg},
	{long: "jobs", short: 'j', arg: optArg},
	{long: "long", short: 'l', arg: noArg},
	{long: "me", arg: noArg},
	{long: "name", short: 'n', arg: reqArg},
	{long: "noheader", short: 'h', arg: noArg},
	{long: "partition", short: 'p', arg: reqArg},
	{long: "steps", short: 's', arg: optArg},
	{long: "states", short: 't', arg: reqArg},
	{long: "user", short: 'u', arg: reqArg},
	{long: "usage", arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "account", short: 'A', arg: reqArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "federation", arg: noArg, unsupported: notBuilt},
	{long: "hide", arg: noArg, unsupported: notBuilt},
	{long: "iterate", short: 'i', arg: reqArg, unsupported: notBuilt},
	{long: "json", arg: noArg, unsupported: notBuilt},
	{long: "licenses", short: 'L', arg: reqArg, unsupported: notBuilt},
	{long: "local", arg: noArg, unsupported: notBuilt},
	{long: "nodelist", short: 'w', arg: reqArg, unsupported: notBuilt},
	{long: "only-job-state", arg: noArg, unsupported: notBuilt},
	{long: "qos", short: 'q', arg: reqArg, unsupported: notBuilt},
	{long: "reservation", short: 'R', arg: reqArg, unsupported: notBuilt},
	{long: "sibling", arg: noArg, unsupported: notBuilt},
	{long: "sort", short: 'S', arg: reqArg, unsupported: notBuilt},
	{long: "start", arg: noArg, unsupported: notBuilt},
	{long: "yaml", arg: noArg, unsupported: notBuilt},
}

// parseOpts parses a command's options into their values, refusing the
// unsupported ones with code; help, usage and version are answered (done).
func parseOpts(e *Env, cmd string, table []option, args []string, code int, help string) (v values, rest []string, done bool, exit int) {
	ps, rest, err := getopt(cmd, table, args, false, code)
	if err != nil {
		return nil, nil, true, usage(e, cmd, err.(*UsageError))
	}
	v = values{}
	for _, p := range ps {
		if p.unsupported != "" {
			return nil, nil, true, errorf(e, cmd, code, "--%s is %s", p.name, p.unsupported)
		}
		switch p.name {
		case "help":
			fmt.Fprint(e.Stdout, help)
			return nil, nil, true, 0
		case "usage":
			fmt.Fprintf(e.Stdout, "Usage: %s [OPTIONS]\n", cmd)
			return nil, nil, true, 0
		case "version":
			fmt.Fprintln(e.Stdout, Version)
			return nil, nil, true, 0
		}
		if prev, ok := v[p.name]; ok && p.hasValue && (p.name == "jobs" || p.name == "user" || p.name == "states" || p.name == "partition" || p.name == "name") {
			v[p.name] = prev + "," + p.value
		} else {
			v[p.name] = p.value
		}
	}
	return v, rest, false, 0
}

// jobRow is what a job's line shows: the job and, for a step, the step.
type jobRow struct {
	j      job.Job
	reason string
	step   *job.SrunStep // nil: the job; with batch, the batch step
	batch  bool
	now    time.Time
}

// value is the text of squeue letter key for r ("" for a letter it has none for).
func (r jobRow) value(key string) string {
	if f, ok := squeueValues[key]; ok {
		return f(r)
	}
	return ""
}

// squeueValues are what each squeue letter shows of a row (squeue(1)'s -o letters;
// -O fields map onto them through fieldLetter).
var squeueValues = map[string]func(r jobRow) string{
	"i": jobRow.id,
	"A": jobRow.id,
	"j": jobRow.name,
	"P": func(r jobRow) string { return job.PartitionName(r.j.Spec.Partition) },
	"u": func(r jobRow) string { return r.j.Spec.User },
	"U": jobRow.uid,
	"g": jobRow.group,
	"t": func(r jobRow) string { return stateCode(r.j.State.Status) },
	"T": func(r jobRow) string { return string(r.j.State.Status) },
	"M": jobRow.timeUsed,
	"l": func(r jobRow) string {
		if r.j.Spec.TimeLimit == 0 {
			return "UNLIMITED"
		}
		return slurmDuration(r.j.Spec.TimeLimit)
	},
	"L": jobRow.timeLeft,
	"D": jobRow.nodeCount,
	"N": jobRow.nodeList,
	"B": jobRow.execHost,
	"R": func(r jobRow) string {
		if r.j.State.Status == job.Pending || len(r.nodes()) == 0 {
			return "(" + reasonOf(r) + ")"
		}
		return hostlist.Compress(r.nodes())
	},
	"r": reasonOf,
	"a": func(r jobRow) string { return r.j.Spec.Account },
	"C": func(r jobRow) string { return strconv.Itoa(cpusOf(r.j.Spec, len(r.nodes()))) },
	"b": func(r jobRow) string { return tresPerNode(r.j.Spec) },
	"m": func(r jobRow) string { return minMemory(r.j.Spec) },
	"Q": func(r jobRow) string { return strconv.Itoa(r.j.Spec.Priority) },
	"V": func(r jobRow) string { return slurmTime(r.j.Spec.Submitted) },
	"S": func(r jobRow) string {
		if r.j.State.Started.IsZero() {
			return "N/A"
		}
		return slurmTime(r.j.State.PlacedSince())
	},
	"e": jobRow.end,
	"Z": func(r jobRow) string { return r.j.Spec.WorkDir },
	"o": func(r jobRow) string {
		if r.j.Spec.Script != "" {
			return r.j.Spec.WorkDir
		}
		return strings.Join(r.j.Spec.Command, " ")
	},
	"F": func(r jobRow) string {
		if r.j.Spec.Array != nil {
			return r.j.Spec.Array.JobID
		}
		return r.j.Spec.ID
	},
	"K": func(r jobRow) string {
		if r.j.Spec.Array != nil {
			return strconv.Itoa(r.j.Spec.Array.TaskID)
		}
		return "N/A"
	},
	"y": func(r jobRow) string { return strconv.Itoa(r.j.Spec.Nice) },
	"x": func(r jobRow) string { return hostlist.Compress(r.j.Spec.ExcNodes) },
	"n": func(r jobRow) string { return hostlist.Compress(r.j.Spec.NodeList) },
	"f": func(r jobRow) string { return orNull(r.j.Spec.Constraint) },
	"h": func(r jobRow) string { return r.j.Spec.OverSubscribe() },
	// %E: the job's dependencies as scontrol show job's Dependency=, (null) for none.
	"E": func(r jobRow) string { return orNull(job.FormatDependencies(r.j.Spec.Dependency)) },
}

// nodes are the job's nodes as Slurm names them.
func (r jobRow) nodes() []string { return job.SlurmNodes(r.j.State.Nodes) }

// id is %i: the job's id, its step's (JOB.STEP) or its batch step's (JOB.batch).
func (r jobRow) id() string {
	switch {
	case r.batch:
		return r.j.Spec.ID + ".batch"
	case r.step != nil:
		return r.step.ID()
	}
	return r.j.Spec.ID
}

// name is %j: the job's name, its step's, or "batch".
func (r jobRow) name() string {
	switch {
	case r.batch:
		return "batch"
	case r.step != nil:
		return r.step.Request.Name
	}
	return r.j.Spec.Name
}

// uid is %U: the job's user's uid (its name where it has none here).
func (r jobRow) uid() string {
	if u, err := user.Lookup(r.j.Spec.User); err == nil {
		return u.Uid
	}
	return r.j.Spec.User
}

// group is %g: the job's user's group (the user's name where it has none here).
func (r jobRow) group() string {
	if u, err := user.Lookup(r.j.Spec.User); err == nil {
		if g, err := user.LookupGroupId(u.Gid); err == nil {
			return g.Name
		}
	}
	return r.j.Spec.User
}

// timeUsed is %M: how long the step, or the job since it was placed, has run.
func (r jobRow) timeUsed() string {
	st := r.j.State
	if r.step != nil && !r.batch {
		return slurmDuration(r.now.Sub(r.step.Request.Created))
	}
	if st.Started.IsZero() || st.Status == job.Pending {
		return "0:00"
	}
	end := r.now
	if !st.Ended.IsZero() {
		end = st.Ended
	}
	return slurmDuration(end.Sub(st.PlacedSince()))
}

// timeLeft is %L: the job's time limit less what a running job has used.
func (r jobRow) timeLeft() string {
	j, st := r.j, r.j.State
	if j.Spec.TimeLimit == 0 {
		return "UNLIMITED"
	}
	if st.Status != job.Running {
		return slurmDuration(j.Spec.TimeLimit)
	}
	return slurmDuration(j.Spec.TimeLimit - r.now.Sub(st.PlacedSince()))
}

// nodeCount is %D: the step's nodes, 1 for the batch step, the job's nodes (while it
// has none, the fewest it asks for).
func (r jobRow) nodeCount() string {
	if r.step != nil && !r.batch {
		return strconv.Itoa(len(r.step.Request.Nodes))
	}
	if r.batch {
		return "1"
	}
	if nodes := r.nodes(); len(nodes) > 0 {
		return strconv.Itoa(len(nodes))
	}
	return strconv.Itoa(r.j.Spec.MinNodes)
}

// nodeList is %N: the step's nodes, the batch step's host, or the job's nodes.
func (r jobRow) nodeList() string {
	switch {
	case r.batch:
		return r.execHost()
	case r.step != nil:
		return hostlist.Compress(r.step.Request.Nodes)
	}
	return hostlist.Compress(r.nodes())
}

// execHost is %B: the job's first node, where its batch step runs ("n/a": none yet).
func (r jobRow) execHost() string {
	if nodes := r.nodes(); len(nodes) > 0 {
		return nodes[0]
	}
	return "n/a"
}

// end is %e: when the job ended, else when its time limit ends it once started.
func (r jobRow) end() string {
	j, st := r.j, r.j.State
	switch {
	case !st.Ended.IsZero():
		return slurmTime(st.Ended)
	case j.Spec.TimeLimit > 0 && !st.Started.IsZero():
		return slurmTime(st.PlacedSince().Add(j.Spec.TimeLimit))
	}
	return "N/A"
}

// reasonOf is a job's reason as squeue shows it: the scheduler's pending reason
// (Priority, Resources, Dependency ...), "None" for a running job.
func reasonOf(r jobRow) string {
	st := r.j.State
	if st.Status == job.Running || st.Status == job.Completing || st.Status.Final() {
		return "None"
	}
	reason := r.reason
	if reason == "" {
		reason = st.Reason
	}
	if reason == "" {
		return "None"
	}
	if st.ReasonCode() == reasons.Requeued {
		return "BeginTime" // Slurm's for a requeued job
	}
	// gangrun's reasons say more after the code ("Resources: needs 2 nodes ..."):
	// squeue shows the code, as Slurm's.
	code, _, _ := strings.Cut(reason, ":")
	return strings.TrimSpace(code)
}

// cpusOf is the job's CPUs as Slurm counts them: its tasks times --cpus-per-task
// (one task per node for gangrun's own jobs).
func cpusOf(s job.Spec, nodes int) int {
	if nodes == 0 {
		nodes = s.MinNodes
	}
	if s.Batch == nil {
		return nodes
	}
	n := 0
	for _, t := range s.Batch.TasksPerNode(nodes) {
		n += t
	}
	return n * max(s.Batch.CPUsPerTask, 1)
}

// tresPerNode is TRES_PER_NODE: the GPUs asked per node, as Slurm writes a gres; N/A
// for a job of no GPUs.
func tresPerNode(s job.Spec) string {
	if s.GPUsPerNode == 0 {
		return "N/A" // a CPU-only job asks for no gres
	}
	if s.Batch != nil && s.Batch.TresPerNode != "" {
		return s.Batch.TresPerNode
	}
	typ := s.MIGProfile + s.GPUModel
	if typ != "" {
		return fmt.Sprintf("gres:gpu:%s:%d", typ, s.GPUsPerNode)
	}
	return fmt.Sprintf("gres:gpu:%d", s.GPUsPerNode)
}

// squeueUsage is what squeue prints on stdout for a word it does not take (Slurm
// 22.05's squeue/opts.c, _usage).
const squeueUsage = `Usage: squeue [-A account] [--clusters names] [-i seconds] [--job jobid]
              [-n name] [-o format] [-p partitions] [--qos qos]
              [--reservation reservation] [--sort fields] [--start]
              [--step step_id] [-t states] [-u user_name] [--usage]
              [-L licenses] [-w nodes] [--federation] [--local] [--sibling]
	      [-ahjlrsv]
`

// slurmJobStates is the list of job states squeue names after an unknown one (Slurm
// 22.05's job_state_string order, then its extra flags), whether gangrun has each or
// not.
const slurmJobStates = "PENDING,RUNNING,SUSPENDED,COMPLETED,CANCELLED,FAILED,TIMEOUT,NODE_FAIL,PREEMPTED,BOOT_FAIL,DEADLINE,OUT_OF_MEMORY,COMPLETING,CONFIGURING,RESIZING,RESV_DEL_HOLD,REQUEUED,REQUEUE_FED,REQUEUE_HOLD,REVOKED,SIGNALING,SPECIAL_EXIT,STAGE_OUT,STOPPED"

// Squeue is squeue: the jobs (or with -s their steps) in Slurm's columns, formats
// (-o, -O, -l), filters (-j, -u, -t, -p, -n, -A, --me) and header (-h).
func Squeue(ctx context.Context, e *Env, args []string) int {
	v, code, done := squeueArgs(e, args)
	if done {
		return code
	}
	steps := v.has("steps")
	fields, err := squeueFormat(e, v)
	if err != nil {
		return usage(e, "squeue", err.(*UsageError))
	}
	f, err := newJobFilter(v)
	if err != nil {
		code := usage(e, "squeue", err.(*UsageError))
		if strings.Contains(err.Error(), "Invalid job state") {
			fmt.Fprintf(e.Stderr, "squeue: error: Valid job states include: %s\n\n", slurmJobStates)
		}
		return code
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "squeue", 1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure): %v", err)
	}
	defer s.Close()
	jobs, err := job.List(ctx, s)
	if err != nil {
		return errorf(e, "squeue", 1, "slurm_load_jobs error: %v", err)
	}
	if len(f.ids) > 0 && !slices.ContainsFunc(jobs, func(j job.Job) bool { return containsID(f.ids, j) }) {
		// None of the ids asked for is a job gangrun knows (squeue 22.05's answer to an
		// unknown id, which a script's poll reads as "gone").
		fmt.Fprintln(e.Stderr, "slurm_load_jobs error: Invalid job id specified")
		return 1
	}
	var rows []jobRow
	if steps {
		rows = stepRows(ctx, s, jobs, f, splitList(v["steps"]))
	} else {
		rows = queueRows(ctx, s, jobs, f)
	}
	if !v.has("noheader") {
		headers := squeueHeaders(steps)
		fmt.Fprintln(e.Stdout, render(fields, func(k string) string { return headers[k] }))
	}
	for _, r := range rows {
		fmt.Fprintln(e.Stdout, render(fields, r.value))
	}
	return 0
}

// squeueArgs reads squeue's options into their values. done is true, with the exit
// code, where the command ends here: help, version, a refused option or a word that
// is none.
func squeueArgs(e *Env, args []string) (v values, code int, done bool) {
	v, rest, done, code := parseOpts(e, "squeue", squeueOptions, args, 1, "Usage: squeue [OPTIONS]\n")
	if done {
		return nil, code, true
	}
	// -j and -s take their list as an optional argument, or as the next word
	// (squeue's opts.c: "squeue -j 3" lists job 3, as "squeue -j3" does).
	if len(rest) > 0 && v.has("jobs") {
		v["jobs"], rest = rest[0], rest[1:]
	}
	if len(rest) > 0 && v.has("steps") {
		v["steps"], rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		fmt.Fprint(e.Stdout, squeueUsage)
		return nil, errorf(e, "squeue", 1, "Unrecognized option: %s", rest[0]), true
	}
	return v, 0, false
}

// squeueFormat is the columns squeue writes: -O's fields (those it does not know
// reported on stderr and left out, as squeue does), else -o's format, else --steps's,
// --long's or the default one. Errors are *UsageError.
func squeueFormat(e *Env, v values) ([]field, error) {
	if v.has("Format") {
		fields, bad := parseFieldsLenient(v["Format"], squeueFields)
		for _, b := range bad {
			fmt.Fprintf(e.Stderr, "squeue: error: Invalid job format specification: %s\n", b)
		}
		for i := range fields {
			fields[i].key = fieldLetter[fields[i].key]
		}
		return fields, nil
	}
	format := squeueDefault
	switch {
	case v.has("steps"):
		format = squeueSteps
	case v.has("long"):
		format = squeueLong
	}
	if v.has("format") {
		format = v["format"]
	}
	return parseFormat(format, squeueLetters)
}

// queueRows are the rows of the jobs f selects, in Slurm's default order for jobs,
// "P,t,-p" (squeue(1), --sort): partition name, then the compact state as text (so F
// before PD before R), then priority, highest first.
func queueRows(ctx context.Context, s Store, jobs []job.Job, f jobFilter) []jobRow {
	sched, _ := allocator.ReadStatus(ctx, s)
	now := time.Now()
	var rows []jobRow
	for _, j := range jobs {
		if f.match(j, false) {
			rows = append(rows, jobRow{j: j, reason: sched.Pending[j.Spec.ID], now: now})
		}
	}
	sort.SliceStable(rows, func(a, b int) bool {
		if pa, pb := rows[a].value("P"), rows[b].value("P"); pa != pb {
			return pa < pb
		}
		if ta, tb := rows[a].value("t"), rows[b].value("t"); ta != tb {
			return ta < tb
		}
		return rows[a].j.Spec.Priority > rows[b].j.Spec.Priority
	})
	return rows
}

// stepRows are the rows of the running steps (srun's, then the batch step) of the
// running batch jobs f selects; stepIDs (JOB.STEP, JOB.batch), when given, pick
// steps.
func stepRows(ctx context.Context, s Store, jobs []job.Job, f jobFilter, stepIDs []string) []jobRow {
	now := time.Now()
	var rows []jobRow
	for _, j := range jobs {
		if !f.match(j, true) || j.State.Status != job.Running || j.Spec.Batch == nil {
			continue
		}
		ss, _ := job.SrunSteps(ctx, s, j.Spec.ID)
		for i := range ss {
			if ss[i].End == nil && (len(stepIDs) == 0 || slices.Contains(stepIDs, ss[i].ID())) {
				rows = append(rows, jobRow{j: j, step: &ss[i], now: now})
			}
		}
		if !j.Spec.Batch.Allocation && (len(stepIDs) == 0 || slices.Contains(stepIDs, j.Spec.ID+".batch")) {
			rows = append(rows, jobRow{j: j, batch: true, now: now})
		}
	}
	return rows
}

// squeueHeaders are the column headers by letter: with steps, %i and %j are the
// step's (STEPID, NAME).
func squeueHeaders(steps bool) map[string]string {
	if !steps {
		return squeueLetters
	}
	headers := map[string]string{}
	for k, h := range squeueLetters {
		headers[k] = h
	}
	headers["i"], headers["j"] = "STEPID", "NAME"
	return headers
}

// jobFilter is squeue's, scancel's and sacct's selection of jobs.
type jobFilter struct {
	ids, users, parts, names, accounts []string
	states                             []job.Status
	me                                 string
}

// newJobFilter reads -j, -u, -p, -n, -A, -t and --me.
func newJobFilter(v values) (jobFilter, error) {
	f := jobFilter{ids: splitList(v["jobs"]), users: splitList(v["user"]), parts: splitList(v["partition"]),
		names: splitList(v["name"]), accounts: splitList(v["account"])}
	if v.has("me") {
		f.me = currentUser()
	}
	for _, st := range splitList(v["states"]) {
		if strings.EqualFold(st, "all") {
			f.states = nil
			f.states = append(f.states, job.Pending, job.Running, job.Completing, job.Completed, job.Failed,
				job.Cancelled, job.Timeout, job.NodeFail, job.Preempted, job.OutOfMemory)
			continue
		}
		s, ok := parseState(st)
		if !ok {
			return f, &UsageError{Msg: fmt.Sprintf("error: Invalid job state specified: %s", st), Code: 1}
		}
		f.states = append(f.states, s)
	}
	return f, nil
}

// match reports whether j passes the filter; without -t (and -j) squeue shows the
// jobs that have not ended.
func (f jobFilter) match(j job.Job, steps bool) bool {
	if len(f.ids) > 0 && !containsID(f.ids, j) {
		return false
	}
	if len(f.users) > 0 && !slices.Contains(f.users, j.Spec.User) {
		return false
	}
	if f.me != "" && j.Spec.User != f.me {
		return false
	}
	if len(f.parts) > 0 && !slices.Contains(f.parts, job.PartitionName(j.Spec.Partition)) {
		return false
	}
	if len(f.names) > 0 && !slices.Contains(f.names, j.Spec.Name) {
		return false
	}
	if len(f.accounts) > 0 && !slices.Contains(f.accounts, j.Spec.Account) {
		return false
	}
	if len(f.states) > 0 {
		return slices.Contains(f.states, j.State.Status)
	}
	return !j.State.Status.Final()
}
