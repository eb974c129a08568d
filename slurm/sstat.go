package slurm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/job"
)

// sstatFields are sstat 22.05's fields (src/sstat/sstat.c's table): name and width
// (negative: left-justified), by lower-case name.
var sstatFields = map[string]sacctField{}

// sstatFieldList is sstat's field table in its order (`sstat -e` lists it so).
var sstatFieldList = []sacctField{
	{"AveCPU", 10}, {"AveCPUFreq", 10}, {"AveDiskRead", 12}, {"AveDiskWrite", 12}, {"AvePages", 10},
	{"AveRSS", 10}, {"AveVMSize", 10}, {"ConsumedEnergy", 14}, {"ConsumedEnergyRaw", 17}, {"JobID", -12},
	{"MaxDiskRead", 12}, {"MaxDiskReadNode", 15}, {"MaxDiskReadTask", 15}, {"MaxDiskWrite", 12},
	{"MaxDiskWriteNode", 16}, {"MaxDiskWriteTask", 16}, {"MaxPages", 8}, {"MaxPagesNode", 12},
	{"MaxPagesTask", 14}, {"MaxRSS", 10}, {"MaxRSSNode", 10}, {"MaxRSSTask", 10}, {"MaxVMSize", 10},
	{"MaxVMSizeNode", 14}, {"MaxVMSizeTask", 14}, {"MinCPU", 10}, {"MinCPUNode", 10}, {"MinCPUTask", 10},
	{"Nodelist", 20}, {"NTasks", 8}, {"Pids", 20}, {"ReqCPUFreq", 13}, {"ReqCPUFreqMin", 13},
	{"ReqCPUFreqMax", 13}, {"ReqCPUFreqGov", 13}, {"TRESUsageInAve", 14}, {"TRESUsageInMax", 14},
	{"TRESUsageInMaxNode", 18}, {"TRESUsageInMaxTask", 18}, {"TRESUsageInMin", 14}, {"TRESUsageInMinNode", 18},
	{"TRESUsageInMinTask", 18}, {"TRESUsageInTot", 14}, {"TRESUsageOutAve", 15}, {"TRESUsageOutMax", 15},
	{"TRESUsageOutMaxNode", 19}, {"TRESUsageOutMaxTask", 19}, {"TRESUsageOutMin", 15}, {"TRESUsageOutMinNode", 19},
	{"TRESUsageOutMinTask", 19}, {"TRESUsageOutTot", 15},
}

func init() {
	for _, f := range sstatFieldList {
		sstatFields[strings.ToLower(f.name)] = f
	}
}

// sstatDefault is sstat's default field list (sstat(1), --format).
const sstatDefault = "JobID,MaxVMSize,MaxVMSizeNode,MaxVMSizeTask,AveVMSize,MaxRSS,MaxRSSNode,MaxRSSTask,AveRSS," +
	"MaxPages,MaxPagesNode,MaxPagesTask,AvePages,MinCPU,MinCPUNode,MinCPUTask,AveCPU,NTasks,AveCPUFreq," +
	"ReqCPUFreqMin,ReqCPUFreqMax,ReqCPUFreqGov,ConsumedEnergy,MaxDiskRead,MaxDiskReadNode,MaxDiskReadTask," +
	"AveDiskRead,MaxDiskWrite,MaxDiskWriteNode,MaxDiskWriteTask,AveDiskWrite,TRESUsageInAve,TRESUsageInMax," +
	"TRESUsageInMaxNode,TRESUsageInMaxTask,TRESUsageInMin,TRESUsageInMinNode,TRESUsageInMinTask,TRESUsageInTot," +
	"TRESUsageOutAve,TRESUsageOutMax,TRESUsageOutMaxNode,TRESUsageOutMaxTask,TRESUsageOutMin,TRESUsageOutMinNode," +
	"TRESUsageOutMinTask,TRESUsageOutTot"

// sstatOptions are sstat 22.05's options, those gangrun builds and, refused, the rest.
var sstatOptions = []option{
	{long: "allsteps", short: 'a', arg: noArg},
	{long: "fields", arg: reqArg},
	{long: "format", short: 'o', arg: reqArg},
	{long: "help", short: 'h', arg: noArg},
	{long: "helpformat", short: 'e', arg: noArg},
	{long: "jobs", short: 'j', arg: reqArg},
	{long: "noheader", short: 'n', arg: noArg},
	{long: "parsable", short: 'p', arg: noArg},
	{long: "parsable2", short: 'P', arg: noArg},
	{long: "usage", arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "noconvert", arg: noArg, unsupported: notBuilt},
	{long: "pidformat", short: 'i', arg: noArg, unsupported: notBuilt},
}

// Sstat is sstat: the usage of running steps, from the cgroup each batch job runs in on
// each of its nodes (job.NodeUsage, written by the job's step there): Slurm's fields
// and widths, -o/--format, -p/-P, -n, -a/--allsteps, -e. What gangrun cannot know
// (virtual memory, disk, energy, CPU frequency, which task) is left blank, as sstat
// leaves a value it has not got.
func Sstat(ctx context.Context, e *Env, args []string) int {
	v, rest, done, code := parseOpts(e, "sstat", sstatOptions, args, 1, "Usage: sstat [options] -j <job(.stepid)>\n")
	if done {
		return code
	}
	if v.has("helpformat") {
		return sstatHelpFormat(e)
	}
	list := v["jobs"]
	if len(rest) > 0 && list == "" {
		list = strings.Join(rest, ",") // sstat takes the jobs as arguments too
	}
	if list == "" {
		return errorf(e, "sstat", 1, "You didn't give me any jobs to stat.")
	}
	format := sstatDefault
	for _, k := range []string{"fields", "format"} {
		if v.has(k) {
			format = v[k]
		}
	}
	cols, err := sstatColumns(format)
	if err != nil {
		return usage(e, "sstat", err.(*UsageError))
	}
	sel, err := parseStepList(list)
	if err != nil {
		return usage(e, "sstat", err.(*UsageError))
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "sstat", 1, "%v", err)
	}
	defer s.Close()
	t := newAcctTable(cols, v)
	if !v.has("noheader") {
		writeAcctHeader(e, t)
	}
	for _, x := range sel {
		rows, msg := sstatRows(ctx, s, x, v.has("allsteps"))
		if msg != "" {
			fmt.Fprintf(e.Stderr, "sstat: error: %s\n", msg)
		}
		for _, r := range rows {
			fmt.Fprintln(e.Stdout, t.line(func(c sacctCol) string { return r.value(c.key) }))
		}
	}
	return 0
}

// sstatHelpFormat is sstat -e: the fields, four to a line, each padded to 19.
func sstatHelpFormat(e *Env) int {
	var b strings.Builder
	for i, f := range sstatFieldList {
		fmt.Fprintf(&b, "%-19s", f.name)
		if i%4 == 3 || i == len(sstatFieldList)-1 {
			b.WriteString("\n")
		} else {
			b.WriteString(" ")
		}
	}
	fmt.Fprint(e.Stdout, b.String())
	return 0
}

// writeAcctHeader writes t's header: the names and, unless parsable, a line of dashes.
func writeAcctHeader(e *Env, t acctTable) {
	fmt.Fprintln(e.Stdout, t.line(func(c sacctCol) string { return c.f.name }))
	if !t.parsable {
		fmt.Fprintln(e.Stdout, t.line(func(c sacctCol) string {
			return strings.Repeat("-", max(c.width, -c.width))
		}))
	}
}

// sstatColumns are the columns of a --format list (NAME[%WIDTH],...). Errors are
// *UsageError: sstat's "Invalid field requested".
func sstatColumns(list string) ([]sacctCol, error) {
	return acctColumns(list, sstatFields, false)
}

// stepSel is one item of sstat -j: a job and, optionally, a step (a number, or
// "batch").
type stepSel struct {
	job, step string
}

// parseStepList reads sstat -j's list: JOB[.STEP],... Errors are *UsageError, in
// sstat's words ("fatal: Bad job/step specified").
func parseStepList(list string) ([]stepSel, error) {
	var out []stepSel
	for _, item := range splitList(list) {
		j, st, hasStep := strings.Cut(item, ".")
		if _, err := strconv.ParseUint(j, 10, 32); err != nil {
			return nil, &UsageError{Msg: fmt.Sprintf("fatal: Bad job/step specified: %s", item), Code: 1}
		}
		if hasStep && st != "batch" {
			if _, err := strconv.ParseUint(st, 10, 32); err != nil {
				return nil, &UsageError{Msg: fmt.Sprintf("fatal: Bad step specified: %s", j), Code: 1}
			}
		}
		out = append(out, stepSel{job: j, step: st})
	}
	return out, nil
}

// statStep is one running step sstat reports: its id, nodes and tasks per node.
type statStep struct {
	id    string
	nodes []string
	tasks map[string]int
}

// sstatRows are the lines of selection x: its step, the job's first running srun step
// (none given: no line when the batch step alone runs, as sstat 22.05 prints none), or
// every running step, the batch step too (all). msg is sstat's error when there is
// none to show.
func sstatRows(ctx context.Context, s Store, x stepSel, all bool) ([]statRow, string) {
	j, err := job.Read(ctx, s, x.job)
	if err != nil {
		if errors.Is(err, job.ErrNotFound) {
			return nil, fmt.Sprintf("couldn't get steps for job %s", x.job)
		}
		return nil, fmt.Sprintf("couldn't get steps for job %s: %v", x.job, err)
	}
	if j.State.Status != job.Running {
		return nil, fmt.Sprintf("No steps running for job %s", x.job)
	}
	if !stepAllowed(j) { // slurmd answers a step's usage to its user and root alone
		return nil, fmt.Sprintf("couldn't get steps for job %s: Access/permission denied", x.job)
	}
	steps := runningSteps(ctx, s, j)
	var pick []statStep
	switch {
	case x.step != "":
		for _, st := range steps {
			if st.id == x.job+"."+x.step {
				pick = append(pick, st)
			}
		}
		if len(pick) == 0 {
			return nil, fmt.Sprintf("StepId=%s.%s not found running.", x.job, x.step)
		}
	case all:
		pick = steps
	default:
		for _, st := range steps {
			if !strings.HasSuffix(st.id, ".batch") {
				pick = append(pick, st)
				break
			}
		}
		if len(pick) == 0 && len(steps) == 0 {
			return nil, fmt.Sprintf("No steps running for job %s", x.job)
		}
		// The batch step alone: Slurm 22.05's sstat picks it and prints nothing.
	}
	usage, _ := job.NodeUsages(ctx, s, x.job)
	var rows []statRow
	for _, st := range pick {
		rows = append(rows, newStatRow(st, usage))
	}
	return rows, ""
}

// runningSteps are job j's running steps: the batch step (on its first node), then
// its srun steps that have not ended, by number.
func runningSteps(ctx context.Context, s Store, j *job.Job) []statStep {
	var out []statStep
	nodes := job.SlurmNodes(j.State.Nodes)
	if b := j.Spec.Batch; b != nil && !b.Allocation && len(nodes) > 0 {
		out = append(out, statStep{id: j.Spec.ID + ".batch", nodes: nodes[:1], tasks: map[string]int{nodes[0]: 1}})
	}
	ss, _ := job.SrunSteps(ctx, s, j.Spec.ID)
	sort.Slice(ss, func(a, b int) bool { return ss[a].Request.Step < ss[b].Request.Step })
	for _, x := range ss {
		if x.End != nil {
			continue
		}
		st := statStep{id: x.ID(), nodes: job.SlurmNodes(x.Request.Nodes), tasks: map[string]int{}}
		for i, n := range x.Request.Nodes {
			if i < len(x.Request.Tasks) {
				st.tasks[n] = x.Request.Tasks[i]
			}
		}
		out = append(out, st)
	}
	return out
}

// statRow is one sstat line: a step and its nodes' usage.
type statRow struct {
	id, nodes          string
	ntasks             int
	known              bool // some node has recorded its usage
	maxRSS, rssTotal   int64
	maxRSSNode         string
	maxPages, pagesTot int64
	maxPagesNode       string
	minCPU, cpuTotal   time.Duration
	minCPUNode         string
	maxCPU             time.Duration
	maxCPUNode         string
}

// newStatRow sums step st's nodes' usage: the most memory and page faults of a node
// (and which), their averages per task, the least and the most CPU time per task of a
// node (and which) and the average per task.
func newStatRow(st statStep, usage map[string]job.NodeUsage) statRow {
	r := statRow{id: st.id, nodes: hostlist.Compress(st.nodes), minCPU: -1}
	for _, n := range st.nodes {
		r.ntasks += st.tasks[n]
	}
	for _, n := range st.nodes {
		u, ok := usage[n]
		if !ok {
			continue
		}
		r.known = true
		if u.MaxBytes > r.maxRSS || r.maxRSSNode == "" {
			r.maxRSS, r.maxRSSNode = u.MaxBytes, n
		}
		if u.MajorFaults > r.maxPages || r.maxPagesNode == "" {
			r.maxPages, r.maxPagesNode = u.MajorFaults, n
		}
		r.rssTotal += u.CurrentBytes
		r.pagesTot += u.MajorFaults
		r.cpuTotal += u.CPU
		per := u.CPU / time.Duration(max(st.tasks[n], 1))
		if r.minCPU < 0 || per < r.minCPU {
			r.minCPU, r.minCPUNode = per, n
		}
		if per > r.maxCPU || r.maxCPUNode == "" {
			r.maxCPU, r.maxCPUNode = per, n
		}
	}
	return r
}

// value is the text of sstat field key (lower case) for r: "" for what gangrun does
// not know, as sstat prints a value it has none of.
func (r statRow) value(key string) string {
	switch key {
	case "jobid":
		return r.id
	case "nodelist":
		return r.nodes
	case "ntasks":
		return strconv.Itoa(r.ntasks)
	}
	if !r.known {
		return ""
	}
	per := int64(max(r.ntasks, 1))
	switch key {
	case "maxrss":
		return slurmSize(float64(r.maxRSS))
	case "maxrssnode":
		return r.maxRSSNode
	case "averss":
		return slurmSize(float64(r.rssTotal) / float64(per))
	case "maxpages":
		return strconv.FormatInt(r.maxPages, 10)
	case "maxpagesnode":
		return r.maxPagesNode
	case "avepages":
		return strconv.FormatInt(r.pagesTot/per, 10)
	case "mincpu":
		return cpuTime(r.minCPU)
	case "mincpunode":
		return r.minCPUNode
	case "avecpu":
		return cpuTime(r.cpuTotal / time.Duration(per))
	case "tresusageinmax":
		return fmt.Sprintf("cpu=%s,mem=%s,pages=%d", cpuTime(r.maxCPU), slurmSize(float64(r.maxRSS)), r.maxPages)
	case "tresusageinmaxnode":
		return fmt.Sprintf("cpu=%s,mem=%s,pages=%s", r.maxCPUNode, r.maxRSSNode, r.maxPagesNode)
	case "tresusageinave":
		return fmt.Sprintf("cpu=%s,mem=%s,pages=%d", cpuTime(r.cpuTotal/time.Duration(per)),
			slurmSize(float64(r.rssTotal)/float64(per)), r.pagesTot/per)
	case "tresusageintot":
		return fmt.Sprintf("cpu=%s,mem=%s,pages=%d", cpuTime(r.cpuTotal), slurmSize(float64(r.rssTotal)), r.pagesTot)
	}
	return ""
}

// slurmSize writes a size in bytes as sstat 22.05 does (convert_num_unit with its
// exact flag): in kilobytes, rounded, then in the next unit up only while that
// divides it exactly: 115824K, 100M, 0.
func slurmSize(bytes float64) string {
	units := []string{"K", "M", "G", "T", "P", "E"}
	n := int64(math.Round(bytes / 1024))
	i := 0
	for n >= 1024 && n%1024 == 0 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if n == 0 {
		return "0"
	}
	return strconv.FormatInt(n, 10) + units[i]
}

// cpuTime writes a CPU time as sstat 22.05 does: HH:MM:SS, D-HH:MM:SS from a day.
func cpuTime(d time.Duration) string {
	s := max(int64(d/time.Second), 0)
	days, h, m, sec := s/86400, s/3600%24, s/60%60, s%60
	if days > 0 {
		return fmt.Sprintf("%d-%02d:%02d:%02d", days, h, m, sec)
	}
	return fmt.Sprintf("%02d:%02d:%02d", h, m, sec)
}
