package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/job"
)

// scontrolOptions are scontrol 22.05's options, those gangrun builds and, refused,
// the rest.
var scontrolOptions = []option{
	{long: "details", short: 'd', arg: noArg},
	{long: "help", short: 'h', arg: noArg},
	{long: "oneliner", short: 'o', arg: noArg},
	{long: "quiet", short: 'Q', arg: noArg},
	{long: "usage", arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "all", short: 'a', arg: noArg},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "json", arg: noArg, unsupported: notBuilt},
	{long: "yaml", arg: noArg, unsupported: notBuilt},
}

// Scontrol is scontrol's show job, step, node, partition, hostnames, hostlist and
// hostlistsorted (-o: one line per record), in Slurm's KEY=VALUE layout, its hold,
// uhold, release, requeue and requeuehold of jobs (holdJobs) and update of a job
// (updateJobs). Its other verbs are refused.
func Scontrol(ctx context.Context, e *Env, args []string) int {
	c, code, done := scontrolParse(e, args)
	if done {
		return code
	}
	switch {
	case c.what == "hostnames":
		return showHostnames(e, c.arg)
	case c.what == "hostlist" || c.what == "hostlistsorted":
		return showHostlist(e, c.what == "hostlistsorted", c.arg)
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "scontrol", 1, "Unable to contact slurm controller (connect failure): %v", err)
	}
	defer s.Close()
	if c.hold != "" {
		return holdJobs(ctx, e, s, c.hold, c.jobs)
	}
	if c.update != nil {
		return updateJobs(ctx, e, s, c.update)
	}
	records, code := c.records(ctx, e, s)
	if len(records) == 0 {
		return code
	}
	for _, r := range records {
		if c.oneLine {
			fmt.Fprintln(e.Stdout, strings.Join(strings.Fields(r), " "))
			continue
		}
		fmt.Fprintln(e.Stdout, r)
	}
	return 0
}

// scontrolCmd is the show command scontrol was given: what to show (lowercased; a
// prefix of the entity's name), entity as given, its argument ("" for all), and
// whether to write each record on one line (-o).
type scontrolCmd struct {
	what, entity, arg string
	oneLine           bool
	// hold is a hold, uhold or release of jobs (their ids as given: each one or a
	// comma-separated list); "" for show.
	hold job.HoldOp
	jobs []string
	// update is scontrol update's arguments (nil for another verb).
	update []string
}

// scontrolParse reads scontrol's command line: its options, then "show ENTITY [ARG]".
// done is true, with the exit code, where the command ends here: help, version, a
// refused option or verb, or arguments scontrol refuses (in its words).
func scontrolParse(e *Env, args []string) (c scontrolCmd, code int, done bool) {
	ps, rest, err := getopt("scontrol", scontrolOptions, args, true, 1)
	if err != nil {
		return c, usage(e, "scontrol", err.(*UsageError)), true
	}
	for _, p := range ps {
		if p.unsupported != "" {
			return c, errorf(e, "scontrol", 1, "--%s is %s", p.name, p.unsupported), true
		}
		switch p.name {
		case "help", "usage":
			fmt.Fprintln(e.Stdout, "Usage: scontrol [<OPTION>] [<COMMAND>]")
			return c, 0, true
		case "version":
			fmt.Fprintln(e.Stdout, Version)
			return c, 0, true
		case "oneliner":
			c.oneLine = true
		}
	}
	if consumed := args[:len(args)-len(rest)]; !slices.Contains(consumed, "--") {
		// scontrol's getopt_long permutes: the first "--" anywhere ends the options
		// and goes ("scontrol hold -- 5" holds job 5).
		if i := slices.Index(rest, "--"); i >= 0 {
			rest = slices.Delete(slices.Clone(rest), i, i+1)
		}
	}
	if len(rest) == 0 {
		return c, errorf(e, "scontrol", 1, "gangrun's scontrol runs one command given on its command line (its interactive mode is %s)", notBuilt), true
	}
	switch strings.ToLower(rest[0]) {
	case "show":
	case "hold", "uhold", "release", "requeue", "requeuehold":
		c.hold, c.jobs = job.HoldOp(strings.ToLower(rest[0])), rest[1:]
		return c, 0, false
	case "update":
		c.update = rest[1:]
		return c, 0, false
	case "suspend", "resume", "reconfigure", "shutdown",
		"create", "delete", "notify", "top", "reboot", "takeover", "setdebug", "listpids", "wait_job":
		return c, errorf(e, "scontrol", 1, "scontrol %s is %s", rest[0], notBuilt), true
	default:
		fmt.Fprintf(e.Stderr, "invalid keyword: %s\n", rest[0])
		return c, 1, true
	}
	if len(rest) < 2 {
		fmt.Fprintln(e.Stderr, "too few arguments for keyword:show")
		return c, 1, true
	}
	c.what, c.entity = strings.ToLower(rest[1]), rest[1]
	if len(rest) > 2 {
		c.arg = rest[2]
	}
	if len(rest) > 3 {
		fmt.Fprintf(e.Stderr, "too many arguments for keyword:show\n")
		return c, 1, true
	}
	return c, 0, false
}

// showHostnames writes the hosts of hostlist arg (else of $SLURM_NODELIST), one a
// line, and returns the exit code.
func showHostnames(e *Env, arg string) int {
	if arg == "" {
		arg = e.Getenv("SLURM_NODELIST") // 22.05 reads this one alone
	}
	if arg == "" {
		return errorf(e, "scontrol", 1, "host list is empty")
	}
	hosts, err := hostlist.Expand(arg)
	if err != nil {
		// scontrol says so on stderr and exits 0 (22.05, checked in
		// TestSlurmCommandsAgainstSlurm).
		fmt.Fprintf(e.Stderr, "Invalid hostlist: %s\n", arg)
		return 0
	}
	for _, h := range hosts {
		fmt.Fprintln(e.Stdout, h)
	}
	return 0
}

// showHostlist writes the hosts arg names as one hostlist expression (sorted: show
// hostlistsorted), and returns the exit code.
func showHostlist(e *Env, sorted bool, arg string) int {
	if arg == "" {
		return errorf(e, "scontrol", 1, "host list is empty")
	}
	out, err := hostlist.CompressExpr(arg)
	if sorted {
		var hosts []string
		if hosts, err = hostlist.Expand(arg); err == nil {
			out = hostlist.CompressSorted(hosts)
		}
	}
	if err != nil {
		// scontrol says so on stderr and exits 0 (22.05, checked in
		// TestSlurmCommandsAgainstSlurm).
		fmt.Fprintf(e.Stderr, "Invalid hostlist: %s\n", arg)
		return 0
	}
	fmt.Fprintln(e.Stdout, out)
	return 0
}

// scontrolShows are the entities scontrol show reads from the cluster, in the order
// an abbreviation is matched: the entity's name (any nonempty prefix of it names it)
// and what collects the records of arg ("" for all). Where it collects none it has
// written why, and returns the exit code.
var scontrolShows = []struct {
	name    string
	records func(ctx context.Context, e *Env, s Store, arg string) ([]string, int)
}{
	{"jobs", showJobs}, {"steps", showSteps}, {"nodes", showNodes}, {"partitions", showPartitions},
}

// records collects the records c shows; where there are none it has written why, and
// returns the exit code.
func (c scontrolCmd) records(ctx context.Context, e *Env, s Store) ([]string, int) {
	for _, t := range scontrolShows {
		if c.what != "" && strings.HasPrefix(t.name, c.what) {
			return t.records(ctx, e, s, c.arg)
		}
	}
	fmt.Fprintf(e.Stderr, "invalid entity:%s for keyword:show \n", c.entity)
	return nil, 1
}

// showJobs collects `scontrol show job`'s records: every job, or job or array arg.
func showJobs(ctx context.Context, e *Env, s Store, arg string) ([]string, int) {
	jobs, err := job.List(ctx, s)
	if err != nil {
		return nil, errorf(e, "scontrol", 1, "slurm_load_jobs error: %v", err)
	}
	sched, _ := allocator.ReadStatus(ctx, s)
	var records []string
	for _, j := range jobs {
		if arg == "" || j.Spec.ID == arg || j.Spec.Array != nil && j.Spec.Array.JobID == arg {
			records = append(records, showJob(j, sched.Pending[j.Spec.ID]))
		}
	}
	if len(records) == 0 {
		if arg == "" {
			fmt.Fprintln(e.Stdout, "No jobs in the system")
			return nil, 0
		}
		fmt.Fprintln(e.Stderr, "slurm_load_jobs error: Invalid job id specified")
		return nil, 1
	}
	return records, 0
}

// showSteps collects `scontrol show step`'s records: the running srun steps of the
// running batch jobs, or of job arg (JOB or JOB.STEP).
func showSteps(ctx context.Context, e *Env, s Store, arg string) ([]string, int) {
	id, n, isStep := strings.Cut(arg, ".")
	jobs, err := job.List(ctx, s)
	if err != nil {
		return nil, errorf(e, "scontrol", 1, "slurm_get_job_steps error: %v", err)
	}
	var records []string
	for _, j := range jobs {
		if arg != "" && j.Spec.ID != id || j.State.Status != job.Running || j.Spec.Batch == nil {
			continue
		}
		ss, _ := job.SrunSteps(ctx, s, j.Spec.ID)
		for i := range ss {
			if ss[i].End == nil && (!isStep || strconv.Itoa(ss[i].Request.Step) == n) {
				records = append(records, showStep(j, ss[i]))
			}
		}
	}
	if len(records) == 0 {
		if arg == "" {
			fmt.Fprintln(e.Stdout, "No job steps in the system")
			return nil, 0
		}
		fmt.Fprintf(e.Stdout, "Job step %s not found\n", arg)
		return nil, 1
	}
	return records, 0
}

// showNodes collects `scontrol show node`'s records: every node, or node arg.
func showNodes(ctx context.Context, e *Env, s Store, arg string) ([]string, int) {
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		return nil, errorf(e, "scontrol", 1, "slurm_load_node error: %v", err)
	}
	var records []string
	for _, n := range c.NodeList() {
		if arg == "" || n.Name == arg {
			records = append(records, showNode(n))
		}
	}
	if len(records) == 0 {
		fmt.Fprintf(e.Stdout, "Node %s not found\n", arg)
		return nil, 1
	}
	return records, 0
}

// showPartitions collects `scontrol show partition`'s records: every partition, or
// partition arg.
func showPartitions(ctx context.Context, e *Env, s Store, arg string) ([]string, int) {
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		return nil, errorf(e, "scontrol", 1, "slurm_load_partitions error: %v", err)
	}
	nodes := c.NodeList()
	var records []string
	for _, p := range partitions(nodes, defaultPartition(ctx, s, nodes)) {
		if arg == "" || p.name == arg {
			records = append(records, showPartition(p))
		}
	}
	if len(records) == 0 {
		fmt.Fprintf(e.Stdout, "Partition %s not found\n", arg)
		return nil, 1
	}
	return records, 0
}

// userID writes a user as scontrol does: name(uid).
func userID(name string) (string, string) {
	u, err := user.Lookup(name)
	if err != nil {
		return name + "(" + name + ")", name + "(" + name + ")"
	}
	group := u.Gid
	if g, err := user.LookupGroupId(u.Gid); err == nil {
		group = g.Name
	}
	return fmt.Sprintf("%s(%s)", name, u.Uid), fmt.Sprintf("%s(%s)", group, u.Gid)
}

// orNone is v, or "NONE" for "".
func orNone(v string) string {
	if v == "" {
		return "NONE"
	}
	return v
}

// orNull is v, or "(null)" for "".
func orNull(v string) string {
	if v == "" {
		return "(null)"
	}
	return v
}

// showJob writes job j as `scontrol show job` does; pending is the scheduler's reason
// for it, if it waits.
func showJob(j job.Job, pending string) string {
	spec, st := j.Spec, j.State
	uid, gid := userID(spec.User)
	nodes := job.SlurmNodes(st.Nodes)
	row := jobRow{j: j, now: time.Now(), reason: pending}
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("JobId=%s JobName=%s\n", spec.ID, spec.Name)
	if spec.Array != nil {
		w("   ArrayJobId=%s ArrayTaskId=%d\n", spec.Array.JobID, spec.Array.TaskID)
	}
	w("   UserId=%s GroupId=%s MCS_label=N/A\n", uid, gid)
	w("   Priority=%d Nice=%d Account=%s QOS=%s\n", spec.Priority, spec.Nice, orNull(spec.Account), orNull(spec.QOS))
	w("   JobState=%s Reason=%s Dependency=%s\n", st.Status, jobReason(row), orNull(job.FormatDependencies(spec.Dependency)))
	requeue, batchFlag := 1, 0
	if spec.Batch != nil {
		if spec.Batch.NoRequeue {
			requeue = 0
		}
		if !spec.Batch.Allocation {
			batchFlag = 1
		}
	}
	w("   Requeue=%d Restarts=%d BatchFlag=%d Reboot=0 ExitCode=%s\n", requeue, st.SlurmRestarts(), batchFlag, exitCode(st.ExitCode, st.Reason))
	showJobTimes(w, spec, st)
	host := "n/a"
	if spec.Batch != nil && spec.Batch.SubmitHost != "" {
		host = spec.Batch.SubmitHost
	}
	w("   Partition=%s AllocNode:Sid=%s:0\n", job.PartitionName(spec.Partition), host)
	w("   ReqNodeList=%s ExcNodeList=%s\n", orNull(hostlist.Compress(spec.NodeList)), orNull(hostlist.Compress(spec.ExcNodes)))
	w("   NodeList=%s\n", hostlist.Compress(nodes))
	if len(nodes) > 0 && batchFlag == 1 {
		w("   BatchHost=%s\n", nodes[0])
	}
	showJobSize(w, spec, len(nodes))
	w("   Features=%s DelayBoot=00:00:00\n", orNull(spec.Constraint))
	w("   OverSubscribe=%s Contiguous=0 Licenses=(null) Network=(null)\n", spec.OverSubscribe())
	showJobFiles(w, spec, nodes)
	w("   Power=\n")
	if b := spec.Batch; b != nil && (b.MailType != "" || b.MailUser != "") {
		user := b.MailUser
		if user == "" {
			user = spec.User // slurmctld's default: the job's user
		}
		w("   MailUser=%s MailType=%s\n", user, orNone(b.MailType))
	}
	if spec.MemPerGPU > 0 {
		w("   MemPerTres=gres:gpu:%d\n", spec.MemPerGPU>>20)
	}
	if spec.GPUsPerNode > 0 { // a CPU-only job has none, as Slurm shows it
		w("   TresPerNode=%s\n", tresPerNode(spec))
	}
	w("   \n")
	return b.String()
}

// jobReason is show job's Reason: the scheduler's for a pending job, what ended a
// failed, timed out or node-failed one, else None.
func jobReason(row jobRow) string {
	st := row.j.State
	switch st.Status {
	case job.Pending:
		return reasonOf(row)
	case job.Failed:
		if strings.Contains(st.Reason, "signal") {
			return "RaisedSignal:" + strings.TrimPrefix(exitCode(st.ExitCode, st.Reason), "0:")
		}
		return "NonZeroExitCode"
	case job.Timeout:
		return "TimeLimit"
	case job.OutOfMemory:
		return "OutOfMemory"
	case job.NodeFail:
		return "NodeDown"
	}
	return "None"
}

// showJobTimes writes show job's time lines with w: its run time and limit, when it
// was submitted, started and ends (its time limit's end while it runs).
func showJobTimes(w func(format string, a ...any), spec job.Spec, st job.State) {
	runTime := time.Duration(0)
	if !st.Started.IsZero() {
		end := time.Now()
		if !st.Ended.IsZero() {
			end = st.Ended
		}
		runTime = end.Sub(st.PlacedSince())
	}
	limit := "UNLIMITED"
	if spec.TimeLimit > 0 {
		limit = job.FormatSlurmTime(spec.TimeLimit)
	}
	w("   RunTime=%s TimeLimit=%s TimeMin=N/A\n", job.FormatSlurmTime(runTime), limit)
	eligible := spec.Submitted
	if spec.Begin.After(eligible) {
		eligible = spec.Begin // --begin
	}
	w("   SubmitTime=%s EligibleTime=%s\n", slurmTime(spec.Submitted), slurmTime(eligible))
	w("   AccrueTime=%s\n", slurmTime(spec.Submitted))
	start, end := "Unknown", "Unknown"
	if !st.Started.IsZero() {
		start = slurmTime(st.PlacedSince())
		switch {
		case !st.Ended.IsZero():
			end = slurmTime(st.Ended)
		case spec.TimeLimit > 0:
			end = slurmTime(st.PlacedSince().Add(spec.TimeLimit))
		}
	}
	w("   StartTime=%s EndTime=%s Deadline=N/A\n", start, end)
	w("   SuspendTime=None SecsPreSuspend=0 LastSchedEval=%s Scheduler=Main\n", slurmTime(spec.Submitted))
}

// showJobSize writes show job's size lines with w: nodes (nn placed; the requested
// range while none is), CPUs, tasks, TRES (memory in MiB) and per-node minimums.
func showJobSize(w func(format string, a ...any), spec job.Spec, nn int) {
	numNodes := strconv.Itoa(nn)
	if nn == 0 {
		numNodes = fmt.Sprintf("%d-%d", spec.MinNodes, spec.MaxNodes)
		nn = spec.MinNodes
	}
	tasks, cpt, perNode := nn, 1, 0
	if b := spec.Batch; b != nil {
		tasks = 0
		for _, t := range b.TasksPerNode(nn) {
			tasks += t
		}
		cpt = max(b.CPUsPerTask, 1)
		perNode = b.NTasksPerNode
	}
	w("   NumNodes=%s NumCPUs=%d NumTasks=%d CPUs/Task=%d ReqB:S:C:T=0:0:*:*\n", numNodes, tasks*cpt, tasks, cpt)
	tres := fmt.Sprintf("cpu=%d,node=%d,billing=%d", tasks*cpt, nn, tasks*cpt)
	if mem := spec.NodeMem(); mem > 0 {
		tres = fmt.Sprintf("cpu=%d,mem=%s,node=%d,billing=%d", tasks*cpt, slurmMem(mem>>20*int64(nn)), nn, tasks*cpt)
	}
	if g := spec.GPUsPerNode * nn; g > 0 {
		tres += fmt.Sprintf(",gres/gpu=%d", g) // Slurm's TRES order: gres last
	}
	w("   TRES=%s\n", tres)
	w("   Socks/Node=* NtasksPerN:B:S:C=%d:0:*:* CoreSpec=*\n", perNode)
	if spec.MemPerCPU > 0 {
		w("   MinCPUsNode=%d MinMemoryCPU=%s MinTmpDiskNode=0\n", max(perNode, 1)*cpt, minMemory(spec))
	} else {
		w("   MinCPUsNode=%d MinMemoryNode=%s MinTmpDiskNode=0\n", max(perNode, 1)*cpt, minMemory(spec))
	}
}

// showJobFiles writes show job's Command and WorkDir lines with w, and a batch job's
// output files as its first node (of nodes; none yet: "") names them.
func showJobFiles(w func(format string, a ...any), spec job.Spec, nodes []string) {
	if spec.Batch != nil {
		w("   Command=%s\n", orNull(spec.Batch.ScriptPath))
	} else {
		w("   Command=%s\n", orNull(strings.Join(spec.Command, " ")))
	}
	w("   WorkDir=%s\n", spec.WorkDir)
	if spec.Batch != nil {
		host := ""
		if len(nodes) > 0 {
			host = nodes[0]
		}
		out, errPath := spec.BatchFiles(host)
		if errPath == "" {
			errPath = out
		}
		w("   StdErr=%s\n   StdIn=/dev/null\n   StdOut=%s\n", errPath, out)
	}
}

// showStep writes an srun step as `scontrol show step` does.
func showStep(j job.Job, s job.SrunStep) string {
	r := s.Request
	host := r.Host
	tasks := r.NTasks()
	return fmt.Sprintf(`StepId=%s UserId=%d StartTime=%s TimeLimit=UNLIMITED
   State=RUNNING Partition=%s NodeList=%s
   Nodes=%d CPUs=%d Tasks=%d Name=%s Network=(null)
   TRES=cpu=%d,mem=0,node=%d
   ResvPorts=(null)
   CPUFreqReq=Default Dist=Block
   SrunHost:Pid=%s:0
   TresPerNode=%s
`, s.ID(), r.UID, slurmTime(r.Created), job.PartitionName(j.Spec.Partition), hostlist.Compress(r.Nodes), len(r.Nodes), tasks, tasks,
		r.Name, tasks, len(r.Nodes), host, tresPerNode(j.Spec))
}

// nodeState is a node's state as sinfo and scontrol write it (long form): IDLE,
// MIXED, ALLOCATED, DRAINED, DRAINING, DOWN; by its GPUs, and where jobs hold none of
// them, by the CPUs CPU-only jobs hold.
func nodeState(n allocator.NodeStatus) string {
	switch n.State {
	case allocator.NodeDown:
		return "DOWN"
	case allocator.NodeDrained:
		if n.GPUsUsed > 0 || n.CPUsUsed > 0 {
			return "DRAINING"
		}
		return "DRAINED"
	}
	switch {
	case n.GPUsUsed == 0 && n.CPUsUsed == 0:
		return "IDLE"
	case n.GPUsUsed == 0 && n.CPUsTotal > 0 && n.CPUsUsed >= n.CPUsTotal:
		return "ALLOCATED" // CPU-only jobs hold all its CPUs
	case n.GPUsUsed == 0:
		return "MIXED" // CPU-only jobs hold some of its CPUs
	case n.GPUsUsed < n.GPUsTotal:
		return "MIXED"
	}
	return "ALLOCATED"
}

// showNode writes node n as `scontrol show node` does: its CPUs (CPUTot, CPUAlloc:
// those its jobs hold) and memory in MiB (RealMemory, AllocMem; FreeMem: what no job
// holds, where Slurm's is the OS's free memory).
func showNode(n allocator.NodeStatus) string {
	st := nodeState(n)
	reason := ""
	if n.Reason != "" {
		reason = "   Reason=" + n.Reason + "\n"
	}
	h, _ := os.Hostname()
	feat := orNull(allocator.Features(n.Labels))
	return fmt.Sprintf(`NodeName=%s Arch=x86_64 CoresPerSocket=1 
   CPUAlloc=%d CPUEfctv=%d CPUTot=%d
   AvailableFeatures=%s
   ActiveFeatures=%s
   Gres=gpu:%d
   NodeAddr=%s NodeHostName=%s Version=22.05.8
   RealMemory=%d AllocMem=%d FreeMem=%s
   State=%s Partitions=%s 
   AllocTRES=gres/gpu=%d
   CfgTRES=gres/gpu=%d
%s`, n.Name, n.CPUsUsed, n.CPUsTotal, n.CPUsTotal, feat, feat, n.GPUsTotal, orNull(n.Addr), orHost(n.Name, h),
		n.MemoryMiB, n.MemoryUsedMiB, freeMem([]allocator.NodeStatus{n}), st, partitionOf(n), n.GPUsUsed, n.GPUsTotal, reason)
}

// orHost is name, or h for "".
func orHost(name, h string) string {
	if name != "" {
		return name
	}
	return h
}

// partitionOf is the partition a node is in: its partition label, else "gangrun" (the
// one partition of a cluster whose nodes carry none).
func partitionOf(n allocator.NodeStatus) string {
	if p := n.Labels["partition"]; p != "" {
		return p
	}
	return job.NoPartition
}

// partition is one partition as sinfo and scontrol see it: its nodes.
type partition struct {
	name  string
	nodes []allocator.NodeStatus
	def   bool // the default partition: sinfo's "*", scontrol's Default=YES
}

// partitions groups nodes by partition, in name order; def names the default one
// (as DefaultPartition gives it, "" for job.NoPartition).
func partitions(nodes []allocator.NodeStatus, def string) []partition {
	by := map[string][]allocator.NodeStatus{}
	for _, n := range nodes {
		by[partitionOf(n)] = append(by[partitionOf(n)], n)
	}
	var out []partition
	for name, ns := range by {
		out = append(out, partition{name: name, nodes: ns, def: name == job.PartitionName(def)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// showPartition writes partition p as `scontrol show partition` does.
func showPartition(p partition) string {
	var names []string
	gpus := 0
	for _, n := range p.nodes {
		names = append(names, n.Name)
		gpus += n.GPUsTotal
	}
	return fmt.Sprintf(`PartitionName=%s
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=%s QoS=N/A
   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO
   MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=%s
   State=UP TotalNodes=%d
   TRES=node=%d,gres/gpu=%d
`, p.name, map[bool]string{true: "YES", false: "NO"}[p.def], hostlist.Compress(job.SlurmNodes(names)), len(p.nodes), len(p.nodes), gpus)
}

// holdJobs is scontrol hold, uhold, release, requeue or requeuehold (op) of the jobs ids (each an id or a
// comma-separated list; array ids name every task): each through the cluster as this
// process's user (Cluster.Hold). An error is said per job in Slurm's words, and makes
// the exit code 1.
func holdJobs(ctx context.Context, e *Env, s Store, op job.HoldOp, ids []string) int {
	var list []string
	for _, a := range ids {
		for _, id := range strings.FieldsFunc(a, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			if k, v, ok := strings.Cut(id, "="); ok && strings.EqualFold(k, "jobid") {
				id = v // scontrol takes JobId=ID too
			}
			list = append(list, expandTasks(id)...)
		}
	}
	if len(list) == 0 {
		fmt.Fprintf(e.Stderr, "too few arguments for keyword:%s\n", op)
		return 1
	}
	failed := false
	last := "" // Slurm's words for the last job's outcome, said again at the end
	for _, id := range list {
		_, err := e.Cluster.Hold(ctx, s, id, op)
		switch {
		case err == nil:
			last = "No error"
			continue
		case errors.Is(err, job.ErrNotFound):
			last = "Invalid job id specified"
		case errors.Is(err, job.ErrFinished):
			last = job.ErrFinished.Error()
		case errors.Is(err, job.ErrNotPending), errors.Is(err, job.ErrPending), errors.Is(err, job.ErrNotRunning), errors.Is(err, job.ErrRequeueDisabled):
			last = errors.Unwrap(err).Error()
		case errors.Is(err, job.ErrHeldByOperator), errors.Is(err, job.ErrNotYours):
			last = "Access/permission denied"
		default:
			last = err.Error()
		}
		failed = true
		fmt.Fprintf(e.Stderr, "%s for job %s\n", last, id)
	}
	if !failed {
		return 0
	}
	if op == job.OpRequeue || op == job.OpRequeueHold {
		return 1 // scontrol 22.05 says no more for these
	}
	// scontrol 22.05 then says the last job's outcome ("No error" when it was done),
	// under the name of the call it makes for every job verb (as checked in
	// TestSlurmCommandsAgainstSlurm).
	fmt.Fprintf(e.Stderr, "slurm_suspend error: %s\n", last)
	return 1
}

// expandTasks is job id as scontrol's job verbs take it: "7_[0-3,5]" is tasks 7_0 to
// 7_3 and 7_5 of array 7; any other id is itself (checked by the cluster).
func expandTasks(id string) []string {
	base, rng, ok := strings.Cut(id, "_[")
	if !ok || !strings.HasSuffix(rng, "]") {
		return []string{id}
	}
	var out []string
	for _, part := range strings.Split(strings.TrimSuffix(rng, "]"), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if !isRange {
			b, err2 = a, err1
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b-a > maxArrayExpand {
			return []string{id} // not an array's tasks: the cluster says the id is invalid
		}
		for x := a; x <= b; x++ {
			out = append(out, base+"_"+strconv.Itoa(x))
		}
	}
	return out
}

// maxArrayExpand bounds the tasks one range of expandTasks names.
const maxArrayExpand = 100000
