package slurm

import (
	"context"
	"fmt"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/job"
)

// sacctField is one of sacct's fields: its width (negative: left-justified), as
// Slurm's sacct prints it (src/sacct/sacct.c, print_fields.c).
type sacctField struct {
	name  string
	width int
}

// sacctFields are the fields gangrun's sacct prints, by lower-case name.
var sacctFields = map[string]sacctField{
	"jobid": {"JobID", -12}, "jobidraw": {"JobIDRaw", -12}, "jobname": {"JobName", 10}, "partition": {"Partition", 10},
	"account": {"Account", 10}, "alloccpus": {"AllocCPUS", 10}, "state": {"State", 10}, "exitcode": {"ExitCode", 8},
	"elapsed": {"Elapsed", 10}, "elapsedraw": {"ElapsedRaw", 10}, "start": {"Start", 19}, "end": {"End", 19},
	"submit": {"Submit", 19}, "user": {"User", 9}, "uid": {"UID", 6}, "nnodes": {"NNodes", 8},
	"nodelist": {"NodeList", 15}, "alloctres": {"AllocTRES", 10}, "reqtres": {"ReqTRES", 10},
	"timelimit": {"Timelimit", 10}, "workdir": {"WorkDir", 10}, "ntasks": {"NTasks", 8},
	"reqnodes": {"ReqNodes", 8}, "derivedexitcode": {"DerivedExitCode", 15}, "reason": {"Reason", 20},
	"restarts": {"Restarts", 8}, "reqcpus": {"ReqCPUS", 8}, "allocnodes": {"AllocNodes", 10},
	"wckey": {"WCKey", 10},
}

// sacctDefault is sacct's default field list; sacctBrief -b's.
const (
	sacctDefault = "jobid,jobname,partition,account,alloccpus,state,exitcode"
	sacctBrief   = "jobid,state,exitcode"
	sacctLong    = "jobid,jobidraw,jobname,partition,reqcpus,alloccpus,elapsed,state,exitcode,nnodes,nodelist,start,end"
)

// sacctOptions are sacct 22.05's options, those gangrun builds and, refused, the rest.
var sacctOptions = []option{
	{long: "accounts", short: 'A', arg: reqArg},
	{long: "allusers", short: 'a', arg: noArg},
	{long: "allocations", short: 'X', arg: noArg},
	{long: "brief", short: 'b', arg: noArg},
	{long: "endtime", short: 'E', arg: reqArg},
	{long: "format", short: 'o', arg: reqArg},
	{long: "help", short: 'h', arg: noArg},
	{long: "jobs", short: 'j', arg: reqArg},
	{long: "long", short: 'l', arg: noArg},
	{long: "name", arg: reqArg},
	{long: "noheader", short: 'n', arg: noArg},
	{long: "parsable", short: 'p', arg: noArg},
	{long: "parsable2", short: 'P', arg: noArg},
	{long: "partition", short: 'r', arg: reqArg},
	{long: "starttime", short: 'S', arg: reqArg},
	{long: "state", short: 's', arg: reqArg},
	{long: "usage", arg: noArg},
	{long: "user", short: 'u', arg: reqArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "helpformat", short: 'e', arg: noArg},
	{long: "array", arg: noArg, unsupported: notBuilt},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "duplicates", short: 'D', arg: noArg, unsupported: notBuilt},
	{long: "federation", arg: noArg, unsupported: notBuilt},
	{long: "file", short: 'f', arg: reqArg, unsupported: notBuilt},
	{long: "gid", short: 'g', arg: reqArg, unsupported: notBuilt},
	{long: "group", arg: reqArg, unsupported: notBuilt},
	{long: "json", arg: noArg, unsupported: notBuilt},
	{long: "local", short: 'L', arg: noArg, unsupported: notBuilt},
	{long: "nodelist", short: 'N', arg: reqArg, unsupported: notBuilt},
	{long: "qos", short: 'q', arg: reqArg, unsupported: notBuilt},
	{long: "reason", short: 'R', arg: reqArg, unsupported: notBuilt},
	{long: "timelimit-max", short: 'K', arg: reqArg, unsupported: notBuilt},
	{long: "timelimit-min", short: 'k', arg: reqArg, unsupported: notBuilt},
	{long: "truncate", short: 'T', arg: noArg, unsupported: notBuilt},
	{long: "wckeys", short: 'W', arg: reqArg, unsupported: notBuilt},
	{long: "yaml", arg: noArg, unsupported: notBuilt},
}

// acctRow is one line of sacct: a job, its batch step, or an srun step.
type acctRow struct {
	id, name, part, account, user, state, exit, nodes, workdir string
	wckey                                                      string
	cpus, nnodes, tasks, gpus                                  int
	memMiB                                                     int64 // the job's memory on all its nodes
	submit, start, end                                         time.Time
	limit                                                      time.Duration
	reason                                                     string
	restarts                                                   int
}

// value is the text of sacct field key (lower case) for r.
func (r acctRow) value(key string) string {
	switch key {
	case "jobid", "jobidraw":
		return r.id
	case "jobname":
		return r.name
	case "partition":
		return r.part
	case "account":
		return r.account
	case "alloccpus", "reqcpus":
		return strconv.Itoa(r.cpus)
	case "state":
		return r.state
	case "exitcode":
		return r.exit
	case "derivedexitcode":
		return r.exit
	case "elapsed", "elapsedraw":
		var d time.Duration
		if !r.start.IsZero() {
			end := r.end
			if end.IsZero() {
				end = time.Now()
			}
			d = end.Sub(r.start)
		}
		if key == "elapsedraw" {
			return strconv.FormatInt(int64(d/time.Second), 10)
		}
		return job.FormatSlurmTime(d)
	case "start":
		return slurmTime(r.start)
	case "end":
		return slurmTime(r.end)
	case "submit":
		return slurmTime(r.submit)
	case "user":
		return r.user
	case "uid":
		if u, err := user.Lookup(r.user); err == nil {
			return u.Uid
		}
		return ""
	case "nnodes", "allocnodes", "reqnodes":
		return strconv.Itoa(r.nnodes)
	case "nodelist":
		if r.nodes == "" {
			return "None assigned"
		}
		return r.nodes
	case "alloctres", "reqtres":
		tres := fmt.Sprintf("cpu=%d,", r.cpus)
		if r.memMiB > 0 {
			tres += "mem=" + slurmMem(r.memMiB) + "," // Slurm's TRES order: cpu, mem, node, gres
		}
		tres += fmt.Sprintf("node=%d", r.nnodes)
		if r.gpus > 0 {
			tres += fmt.Sprintf(",gres/gpu=%d", r.gpus)
		}
		return tres
	case "timelimit":
		if r.limit == 0 {
			return "UNLIMITED"
		}
		return job.FormatSlurmTime(r.limit)
	case "workdir":
		return r.workdir
	case "ntasks":
		if r.tasks == 0 {
			return ""
		}
		return strconv.Itoa(r.tasks)
	case "reason":
		return r.reason
	case "restarts":
		return strconv.Itoa(r.restarts)
	case "wckey":
		return r.wckey
	}
	return ""
}

// Sacct is sacct over gangrun's accounting records (the jobs that ended) and the jobs
// still queued or running: a line per job, per batch step (ID.batch) and per srun step
// (ID.0, ID.1, ...) of the jobs whose records are still in Consul; Slurm's fields and
// widths (-o, -b, -l), -p/-P's parsable output, -n, -X (jobs alone), and filters -j,
// -u, -a, -A, -s, -r, --name, -S and -E (default: since midnight, as sacct's).
func Sacct(ctx context.Context, e *Env, args []string) int {
	v, rest, done, code := parseOpts(e, "sacct", sacctOptions, args, 1, "Usage: sacct [OPTIONS]\n")
	if done {
		return code
	}
	if len(rest) > 0 {
		return errorf(e, "sacct", 1, "Unknown arguments: %s", strings.Join(rest, " "))
	}
	if v.has("helpformat") {
		var names []string
		for _, f := range sacctFields {
			names = append(names, f.name)
		}
		sort.Strings(names)
		fmt.Fprintln(e.Stdout, strings.Join(names, " "))
		return 0
	}
	cols, err := sacctColumns(v)
	if err != nil {
		return usage(e, "sacct", err.(*UsageError))
	}
	since, until, err := sacctWindow(v, time.Now())
	if err != nil {
		return usage(e, "sacct", err.(*UsageError))
	}
	f, err := sacctFilter(v)
	if err != nil {
		return usage(e, "sacct", err.(*UsageError))
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "sacct", 1, "Problem talking to the database: %v", err)
	}
	defer s.Close()
	rows, err := sacctRows(ctx, s, f, since, until, v.has("allocations"))
	if err != nil {
		return errorf(e, "sacct", 1, "Problem talking to the database: %v", err)
	}
	t := newAcctTable(cols, v)
	if !v.has("noheader") {
		writeAcctHeader(e, t)
	}
	for _, r := range rows {
		fmt.Fprintln(e.Stdout, t.line(func(c sacctCol) string { return r.value(c.key) }))
	}
	return 0
}

// sacctCol is one column sacct writes: its field's key (lower case), the field, and
// its width (negative: left-justified).
type sacctCol struct {
	key   string
	f     sacctField
	width int
}

// sacctColumns are the columns of -o's list (NAME[%WIDTH],...), else -b's, -l's or
// the default one. Errors are *UsageError: sacct's "Invalid field requested".
func sacctColumns(v values) ([]sacctCol, error) {
	list := sacctDefault
	switch {
	case v.has("brief"):
		list = sacctBrief
	case v.has("long"):
		list = sacctLong
	}
	if v.has("format") {
		list = v["format"]
	}
	return acctColumns(list, sacctFields, true)
}

// acctColumns are the columns of a sacct or sstat format list (NAME[%WIDTH],...) over
// fields: a WIDTH replaces the field's, the field's justification kept (a negative
// width in fields is left-justified); a negative WIDTH, where negative allows it (sacct),
// flips it. A width over maxFieldWidth either way is refused: every line is built in
// memory. Errors are *UsageError: "Invalid field requested".
func acctColumns(list string, fields map[string]sacctField, negative bool) ([]sacctCol, error) {
	var cols []sacctCol
	for _, item := range splitList(list) {
		name, w, hasW := strings.Cut(item, "%")
		f, ok := fields[strings.ToLower(name)]
		if !ok {
			return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid field requested: \"%s\"", name), Code: 1}
		}
		c := sacctCol{key: strings.ToLower(name), f: f, width: f.width}
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil || n > maxFieldWidth || n < -maxFieldWidth || n < 0 && !negative {
				return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid field requested: \"%s\"", item), Code: 1}
			}
			c.width = n
			if f.width < 0 {
				c.width = -n
			}
		}
		cols = append(cols, c)
	}
	return cols, nil
}

// sacctWindow is the time window of the jobs sacct lists: -S (default: today's
// midnight, or all time with -j) to -E (default: a minute from now). Errors are
// *UsageError: sacct's "Invalid time specification".
func sacctWindow(v values, now time.Time) (since, until time.Time, err error) {
	since = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.Local)
	until = now.Add(time.Minute)
	if len(splitList(v["jobs"])) > 0 {
		since = time.Time{}
	}
	if v.has("starttime") {
		if since, err = parseSlurmTime(v["starttime"], now); err != nil {
			return since, until, &UsageError{Msg: "error: Invalid time specification (pos 0): " + v["starttime"], Code: 1}
		}
	}
	if v.has("endtime") {
		if until, err = parseSlurmTime(v["endtime"], now); err != nil {
			return since, until, &UsageError{Msg: "error: Invalid time specification (pos 0): " + v["endtime"], Code: 1}
		}
	}
	return since, until, nil
}

// sacctFilter is the jobs sacct lists, from -j, -u, -r, --name, -A and -s: without -a,
// -u or -j, this user's alone (root's: everyone's). Errors are *UsageError.
func sacctFilter(v values) (jobFilter, error) {
	f, err := newJobFilter(values{"jobs": v["jobs"], "user": v["user"], "partition": v["partition"],
		"name": v["name"], "account": v["accounts"], "states": v["state"]})
	if err != nil {
		return f, err
	}
	if !v.has("allusers") && !v.has("user") && len(splitList(v["jobs"])) == 0 {
		if me := currentUser(); me != "root" {
			f.users = []string{me}
		}
	}
	return f, nil
}

// sacctRows are sacct's lines: those of the jobs Consul still holds that f selects
// and that ran in the window (allocations: the jobs' own lines alone), then those of
// the accounting records of the window for the other jobs. An error is the list of
// jobs'; records that cannot be read are left out.
func sacctRows(ctx context.Context, s Store, f jobFilter, since, until time.Time, allocations bool) ([]acctRow, error) {
	jobs, err := job.List(ctx, s)
	if err != nil {
		return nil, err
	}
	var rows []acctRow
	seen := map[string]bool{}
	for _, j := range jobs {
		if !f.matchAny(j) || !inWindow(j.State.Started, j.State.Ended, since, until) {
			continue
		}
		seen[j.Spec.ID] = true
		rows = append(rows, jobRows(ctx, s, j, allocations)...)
	}
	recs, err := job.Records(ctx, s, since, until, job.Filter{})
	if err == nil {
		for _, r := range recs {
			if !seen[r.ID] && f.matchRecord(r) {
				rows = append(rows, recordRow(r))
			}
		}
	}
	return rows, nil
}

// inWindow reports whether a job that started at start and ended at end (zero: not
// yet) ran between since and until.
func inWindow(start, end, since, until time.Time) bool {
	if !end.IsZero() && end.Before(since) {
		return false
	}
	return start.IsZero() || start.Before(until)
}

// recordRow is the line of an ended job's accounting record.
func recordRow(r job.Record) acctRow {
	return acctRow{id: r.ID, name: r.Name, part: job.PartitionName(r.Partition), account: r.Account, user: r.User,
		state: acctState(r.State), exit: exitCode(r.ExitCode, r.Reason), nodes: hostlist.Compress(job.SlurmNodes(r.Nodes)),
		cpus: r.NumNodes, nnodes: r.NumNodes, gpus: r.GPUs, submit: r.Submitted, start: r.Started, end: r.Ended, reason: r.Reason,
		restarts: r.Restarts}
}

// acctTable writes sacct's lines: padded to each column's width, or with parsable
// (-p, -P) joined by "|", with trailing (-p) a "|" after the last column too.
type acctTable struct {
	cols               []sacctCol
	parsable, trailing bool
}

// newAcctTable is the table of cols as the -p/--parsable (a '|' after every field) and
// -P/--parsable2 (between fields) options of sacct, sstat and sshare ask.
func newAcctTable(cols []sacctCol, v values) acctTable {
	return acctTable{cols: cols, parsable: v.has("parsable") || v.has("parsable2"), trailing: v.has("parsable")}
}

// line is one line of t, each column's text from val.
func (t acctTable) line(val func(c sacctCol) string) string {
	var b strings.Builder
	for i, c := range t.cols {
		s := val(c)
		switch {
		case t.parsable:
			b.WriteString(s)
			if i < len(t.cols)-1 || t.trailing {
				b.WriteString("|")
			}
		default:
			w := c.width
			if w < 0 {
				b.WriteString(pad(s, -w, false))
			} else {
				b.WriteString(pad(s, w, true))
			}
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// acctState is a job state as sacct writes it.
func acctState(st job.Status) string {
	if st == job.Cancelled {
		return "CANCELLED"
	}
	return string(st)
}

// jobRows are job j's lines: the job's, then (unless allocations only) its batch
// step's and its srun steps'.
func jobRows(ctx context.Context, s Store, j job.Job, allocations bool) []acctRow {
	spec, st := j.Spec, j.State
	nodes := job.SlurmNodes(st.Nodes)
	if len(nodes) == 0 && len(st.Attempts) > 0 {
		nodes = job.SlurmNodes(st.Attempts[len(st.Attempts)-1].Nodes)
	}
	nn := len(nodes)
	if nn == 0 {
		nn = spec.MinNodes
	}
	base := acctRow{id: spec.ID, name: spec.Name, part: job.PartitionName(spec.Partition), account: spec.Account, user: spec.User,
		state: acctState(st.Status), exit: exitCode(st.ExitCode, st.Reason), nodes: hostlist.Compress(nodes), workdir: spec.WorkDir,
		cpus: cpusOf(spec, nn), nnodes: nn, gpus: nn * spec.GPUsPerNode, memMiB: spec.NodeMem() >> 20 * int64(nn), submit: spec.Submitted, start: st.PlacedSince(), end: st.Ended,
		limit: spec.TimeLimit, reason: st.Reason, restarts: st.SlurmRestarts()}
	if spec.Batch != nil {
		base.wckey = spec.Batch.WCKey
	}
	if st.Status == job.Pending {
		base.start, base.nodes = time.Time{}, ""
	}
	out := []acctRow{base}
	if allocations || spec.Batch == nil || st.Started.IsZero() {
		return out
	}
	if !spec.Batch.Allocation && len(nodes) > 0 {
		b := base
		b.id, b.name, b.part, b.user = spec.ID+".batch", "batch", "", ""
		b.nodes, b.nnodes, b.tasks = nodes[0], 1, 1
		b.cpus = cpusOf(spec, nn) / max(nn, 1)
		if st.Status == job.Cancelled {
			b.state = "CANCELLED"
		}
		out = append(out, b)
	}
	ss, _ := job.SrunSteps(ctx, s, spec.ID)
	for _, x := range ss {
		r := acctRow{id: x.ID(), name: x.Request.Name, account: spec.Account, nodes: hostlist.Compress(x.Request.Nodes),
			nnodes: len(x.Request.Nodes), tasks: x.Request.NTasks(), cpus: x.Request.NTasks() * max(spec.Batch.CPUsPerTask, 1),
			start: x.Request.Created, state: "RUNNING", exit: "0:0", workdir: x.Request.WorkDir, wckey: base.wckey}
		if x.End != nil {
			r.end, r.state, r.reason = x.End.Ended, string(x.End.State), x.End.Reason
			if x.End.Signal != 0 && x.End.State != job.Completed {
				r.exit = fmt.Sprintf("0:%d", x.End.Signal)
			} else {
				r.exit = fmt.Sprintf("%d:0", x.End.ExitCode)
			}
		}
		out = append(out, r)
	}
	return out
}

// matchAny is match for sacct: any state unless -s gives some.
func (f jobFilter) matchAny(j job.Job) bool {
	if len(f.states) == 0 {
		f.states = []job.Status{j.State.Status}
	}
	return f.match(j, false)
}

// matchRecord is match for an accounting record.
func (f jobFilter) matchRecord(r job.Record) bool {
	j := job.Job{Spec: job.Spec{ID: r.ID, User: r.User, Partition: r.Partition, Name: r.Name, Account: r.Account},
		State: job.State{Status: r.State}}
	return f.matchAny(j)
}

// parseSlurmTime reads sacct's -S/-E times: YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS]
// (today), now, now-N[units], midnight, noon, today.
func parseSlurmTime(v string, now time.Time) (time.Time, error) {
	switch strings.ToLower(v) {
	case "now":
		return now, nil
	case "today", "midnight":
		return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.Local), nil
	case "noon":
		return time.Date(now.Year(), now.Month(), now.Day(), 12, 0, 0, 0, time.Local), nil
	}
	if rest, ok := strings.CutPrefix(strings.ToLower(v), "now-"); ok {
		unit := time.Second
		for _, u := range []struct {
			s string
			d time.Duration
		}{{"days", 24 * time.Hour}, {"hours", time.Hour}, {"minutes", time.Minute}, {"seconds", time.Second}} {
			if r, ok := strings.CutSuffix(rest, u.s); ok {
				rest, unit = r, u.d
				break
			}
		}
		n, err := strconv.Atoi(rest)
		if err != nil {
			return time.Time{}, err
		}
		return now.Add(-time.Duration(n) * unit), nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.Local); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"15:04:05", "15:04"} {
		if t, err := time.ParseInLocation(layout, v, time.Local); err == nil {
			return time.Date(now.Year(), now.Month(), now.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.Local), nil
		}
	}
	return time.Time{}, fmt.Errorf("bad time %q", v)
}
