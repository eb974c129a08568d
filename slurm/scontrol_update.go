package slurm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/job"
)

// scontrol update of a job, as Slurm 22.05's scontrol reads it (src/scontrol/update_job.c,
// scontrol_update_job): TAG=VALUE arguments (or TAG VALUE), each tag any case and
// abbreviated down to Slurm's least length for it; the first bad one ends the command
// with exit 1 and nothing changed. gangrun changes TimeLimit (also +N and -N), JobName
// (Name), Partition, Dependency, NumNodes, Priority and Nice; the other tags Slurm knows are
// refused in one line, and a tag Slurm does not know gets Slurm's words for it.

// updateTag is a tag scontrol update takes: its name and the least prefix length Slurm
// accepts (MAX(taglen, N) in update_job.c).
type updateTag struct {
	name string
	min  int
}

// updateBuilt are the tags gangrun changes (and JobId).
var updateBuilt = []updateTag{{"JobId", 3}, {"TimeLimit", 5}, {"Priority", 2}, {"Nice", 2}, {"NumNodes", 8}, {"ReqNodes", 8},
	{"StartTime", 2}, {"EligibleTime", 2},
	{"Partition", 2}, {"Name", 2}, {"JobName", 4}, {"Dependency", 1}}

// updateRefused are the tags Slurm's scontrol update of a job takes that gangrun does
// not change: refused as not built.
var updateRefused = []updateTag{{"AdminComment", 3}, {"ArrayTaskThrottle", 10}, {"Comment", 3}, {"DelayBoot", 5},
	{"TimeMin", 5}, {"CPUsPerTask", 6}, {"NumCPUs", 6}, {"NumTasks", 8}, {"ReqProcs", 8}, {"Requeue", 4},
	{"ReqSockets", 4}, {"ReqCores", 4}, {"TasksPerNode", 2}, {"ReqThreads", 4}, {"MinCPUsNode", 4},
	{"MinMemoryNode", 10}, {"MinMemoryCPU", 10}, {"MinTmpDiskNode", 5}, {"QOS", 2}, {"ReservationName", 3},
	{"WCKey", 1}, {"StdOut", 6}, {"Switches", 5}, {"wait-for-switch", 5}, {"OverSubscribe", 2}, {"Shared", 2},
	{"Contiguous", 3}, {"CoreSpec", 4}, {"ThreadSpec", 4}, {"ExcNodeList", 3}, {"NodeList", 8}, {"ReqNodeList", 8},
	{"Features", 1}, {"Gres", 2}, {"Account", 1}, {"BurstBuffer", 1}, {"Geometry", 2}, {"Rotate", 2},
	{"Conn-Type", 2}, {"Licenses", 1}, {"EndTime", 2}, {"Reboot", 3},
	{"UserID", 3}, {"Deadline", 3}, {"MailType", 5}, {"MailUser", 5}}

// match returns the tag of tags that tag names (tag's own spelling, any case, at least
// its least length), "" for none.
func match(tags []updateTag, tag string) string {
	for _, t := range tags {
		if len(tag) >= t.min && len(tag) <= len(t.name) && strings.EqualFold(tag, t.name[:len(tag)]) {
			return t.name
		}
	}
	return ""
}

// jobUpdate is scontrol update's command line, read: the jobs and the change.
type jobUpdate struct {
	ids, name string
	u         job.Update
	// timeStep is +1 or -1 for a TimeLimit increment or decrement of *u.TimeLimit.
	timeStep int
}

// updateEntities are the tags that make scontrol update another entity's (scontrol.c's
// _update_it): refused, as gangrun updates jobs only.
var updateEntities = []updateTag{{"NodeName", 5}, {"PartitionName", 3}, {"ReservationName", 3}, {"Reservation", 3},
	{"SlurmctldDebug", 2}, {"FrontendName", 2}, {"StepId", 4}, {"SuspendExcNodes", 8}, {"SuspendExcParts", 8}}

// updateEntity says which entity scontrol update's args change ("" for a job's), and
// whether any does (scontrol's "No valid entity" otherwise). A JobId or JobName tag
// makes it a job's whatever else is there, as scontrol checks it first (a job's update
// may name a partition).
func updateEntity(args []string) (string, bool) {
	other := ""
	for _, a := range args {
		tag, _, _ := strings.Cut(a, "=")
		if match([]updateTag{{"JobId", 3}, {"JobName", 3}}, tag) != "" {
			return "", true
		}
		if m := match(updateEntities, tag); m != "" && other == "" {
			other = m
		}
	}
	return other, other != ""
}

// parseNice reads a nice value as Slurm does (strtoll: what does not parse is 0;
// "" is DefaultNice) and refuses one out of range, in sbatch's words (exit 255);
// scontrol says it its own way (niceRange).
func parseNice(v string) (int, error) {
	if v == "" {
		return job.DefaultNice, nil
	}
	end := 0
	for end < len(v) && (v[end] >= '0' && v[end] <= '9' || end == 0 && (v[0] == '-' || v[0] == '+')) {
		end++
	}
	n, err := strconv.ParseInt(v[:end], 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		n = 0
	}
	if err != nil && errors.Is(err, strconv.ErrRange) || n > job.MaxNice || n < -job.MaxNice {
		return 0, &UsageError{Msg: fmt.Sprintf("error: Invalid --nice value, out of range (+/- %d)", job.MaxNice), Code: 255}
	}
	return int(n), nil
}

// mailTypes are --mail-type's values (Slurm 22.05's parse_mail_type, any case).
var mailTypes = []string{"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
	"TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"}

// setMail sets spec's --mail-type and --mail-user from v: kept with the job, shown by
// scontrol show job and logged by the controller; no mail is sent. A type Slurm does
// not know is refused in its words, exit 255.
func setMail(spec *job.Spec, v values) error {
	if spec.Batch == nil || !v.has("mail-type") && !v.has("mail-user") {
		return nil
	}
	var types []string
	for _, t := range strings.Split(v["mail-type"], ",") {
		u := strings.ToUpper(t)
		if !slices.Contains(mailTypes, u) {
			return &UsageError{Msg: "error: Invalid --mail-type specification", Code: 255}
		}
		if u != "NONE" {
			types = append(types, u)
		}
	}
	spec.Batch.MailType, spec.Batch.MailUser = strings.Join(types, ","), v["mail-user"]
	return nil
}

// parseUpdate reads scontrol update's arguments; done, with the exit code, where it has
// said why it ends here.
func parseUpdate(e *Env, args []string) (ju jobUpdate, code int, done bool) {
	changes := 0
	abort := func(format string, a ...any) (jobUpdate, int, bool) {
		fmt.Fprintf(e.Stderr, format+"\n", a...)
		return ju, 1, true
	}
	switch entity, ok := updateEntity(args); {
	case entity != "":
		return abort("scontrol: error: scontrol update %s is %s", entity, notBuilt)
	case !ok:
		return abort("No valid entity in update command\n" +
			`Input line must include "NodeName", "PartitionName", "Reservation", "JobId", or "SlurmctldDebug"`)
	}
	for i := 0; i < len(args); i++ {
		tag, val, ok := strings.Cut(args[i], "=")
		switch {
		case ok:
		case match([]updateTag{{"Nice", 2}}, tag) != "":
			// "Nice" alone is the only tag without a value (DefaultNice).
		case i+1 < len(args):
			i++
			val = args[i]
		default:
			return abort("Invalid input: %s\nRequest aborted", args[i])
		}
		name := match(updateBuilt, tag)
		if name == "" {
			if r := match(updateRefused, tag); r != "" {
				return abort("scontrol: error: scontrol update %s is %s", r, notBuilt)
			}
			return abort("Update of this parameter is not supported: %s\nRequest aborted", args[i])
		}
		if name == "StartTime" || name == "EligibleTime" {
			if _, err := job.ParseBegin(val, time.Now()); err != nil {
				// parse_time's line; scontrol then goes on without the tag.
				fmt.Fprintf(e.Stderr, "Invalid time specification (pos=0): %s\n", val)
				continue
			}
		}
		if name != "JobId" {
			changes++
		}
		if msg := ju.set(name, val); msg != "" {
			return abort("scontrol: error: %s", msg)
		}
	}
	if changes == 0 {
		return abort("No changes specified")
	}
	if ju.ids == "" && ju.name == "" {
		return abort("scontrol: error: No job ID specified")
	}
	return ju, 0, false
}

// set sets tag name to val, and returns scontrol's words for a bad value ("" for none).
func (ju *jobUpdate) set(name, val string) string {
	switch name {
	case "JobId":
		ju.ids = val
	case "TimeLimit":
		step := 0
		if strings.HasPrefix(val, "+") || strings.HasPrefix(val, "-") { // "-1" too: a minute less, as scontrol reads it
			step = map[byte]int{'+': 1, '-': -1}[val[0]]
			val = val[1:]
		}
		d, err := job.ParseTime(val)
		if err != nil {
			return "Invalid TimeLimit value"
		}
		if step != 0 && ju.ids == "" {
			return "JobId must precede TimeLimit increment or decrement"
		}
		ju.u.TimeLimit, ju.timeStep = &d, step
	case "Priority":
		p, err := strconv.ParseUint(val, 10, 32)
		if err != nil {
			return "Invalid Priority value: " + val
		}
		n := int(p)
		ju.u.Priority = &n
	case "NumNodes", "ReqNodes":
		lo, hi, err := job.ParseNodes(val)
		if err != nil || lo < 1 {
			return fmt.Sprintf("Invalid node count specification: %s", val)
		}
		ju.u.MinNodes, ju.u.MaxNodes = &lo, &hi
	case "Nice":
		n, err := parseNice(val)
		if err != nil {
			return fmt.Sprintf("Nice value out of range (+/- %d). Value ignored", job.MaxNice) // update_job.c's words
		}
		ju.u.Nice = &n
	case "StartTime", "EligibleTime":
		t, err := job.ParseBegin(val, time.Now())
		if err != nil {
			return fmt.Sprintf("Invalid time specification (pos=0): %s", val)
		}
		ju.u.Begin = &t
	case "Partition":
		ju.u.Partition = &val
	case "Name", "JobName":
		ju.u.Name, ju.name = &val, val
	case "Dependency":
		ju.u.Dependency = &val
	}
	return ""
}

// updateJobs is scontrol update of jobs: each job JobId names (a comma-separated list;
// array ids name every task), else each job named JobName, changed through the
// cluster as this process's user (Cluster.Update). An error is said per job in Slurm's
// words, and makes the exit code 1.
func updateJobs(ctx context.Context, e *Env, s Store, args []string) int {
	ju, code, done := parseUpdate(e, args)
	if done {
		return code
	}
	var ids []string
	for _, id := range strings.Split(ju.ids, ",") {
		if id != "" {
			ids = append(ids, expandTasks(id)...)
		}
	}
	if len(ids) == 0 {
		// No JobId: the jobs named JobName, as scontrol translates the name.
		jobs, err := job.List(ctx, s)
		if err != nil {
			return errorf(e, "scontrol", 1, "Could not load state information: %v", err)
		}
		for _, j := range jobs {
			if j.Spec.Name == ju.name && !j.State.Status.Final() {
				ids = append(ids, j.Spec.ID)
			}
		}
		if len(ids) == 0 {
			return errorf(e, "scontrol", 1, "No jobs with name '%s'", quote.Plain(ju.name))
		}
		ju.u.Name = nil
		if ju.u == (job.Update{}) {
			fmt.Fprintln(e.Stderr, "No changes specified")
			return 1
		}
	}
	if ju.u.Partition != nil {
		// The same partition as sbatch -p gives (gangrun, on nodes that carry no label).
		p := resolvePartition(ctx, s, *ju.u.Partition)
		ju.u.Partition = &p
	}
	failed := false
	for _, id := range ids {
		u := ju.u
		if ju.timeStep != 0 {
			j, err := job.Read(ctx, s, id)
			if err != nil {
				return errorf(e, "scontrol", 1, "Job ID %s not found", quote.Plain(id))
			}
			d := j.Spec.TimeLimit + time.Duration(ju.timeStep)*(*u.TimeLimit)
			if d < 0 {
				return errorf(e, "scontrol", 1, "TimeLimit decrement larger than current time limit (%d > %d)",
					int(*u.TimeLimit/time.Minute), int(j.Spec.TimeLimit/time.Minute))
			}
			u.TimeLimit = &d
		}
		if _, err := e.Cluster.Update(ctx, s, id, u); err != nil {
			failed = true
			fmt.Fprintf(e.Stderr, "%s for job %s\n", updateWords(err, id), quote.Plain(id)) // no raw control byte
		}
	}
	if failed {
		return 1
	}
	return 0
}

// updateWords says an update's error of job id as scontrol does: slurmctld's words, or, for what
// gangrun does not build, gangrun's own.
func updateWords(err error, id string) string {
	switch {
	case errors.Is(err, job.ErrNotFound):
		return "Invalid job id specified"
	case errors.Is(err, job.ErrNotYours):
		return job.ErrAccessDenied.Error()
	case errors.Is(err, job.ErrUpdateNotBuilt):
		return strings.TrimPrefix(err.Error(), "job "+id+": ")
	}
	for _, w := range []error{job.ErrAccessDenied, job.ErrNotSupported, job.ErrInvalidPartition, job.ErrDependency, job.ErrCircular, job.ErrNodeConfig,
		job.ErrTimeLimit, job.ErrFinished, job.ErrNotPending} {
		if errors.Is(err, w) {
			return w.Error()
		}
	}
	return err.Error()
}
