package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/gangrun/gangrun/job"
)

var scancelOptions = []option{
	{long: "account", short: 'A', arg: reqArg},
	{long: "help", arg: noArg},
	{long: "jobname", short: 'n', arg: reqArg},
	{long: "name", arg: reqArg},
	{long: "me", arg: noArg},
	{long: "partition", short: 'p', arg: reqArg},
	{long: "quiet", short: 'Q', arg: noArg},
	{long: "signal", short: 's', arg: reqArg},
	{long: "state", short: 't', arg: reqArg},
	{long: "usage", arg: noArg},
	{long: "user", short: 'u', arg: reqArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "full", short: 'f', arg: noArg},
	{long: "batch", short: 'b', arg: noArg},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "ctld", arg: noArg, unsupported: notBuilt},
	{long: "hurry", short: 'H', arg: noArg, unsupported: notBuilt},
	{long: "interactive", short: 'i', arg: noArg, unsupported: notBuilt},
	{long: "nodelist", short: 'w', arg: reqArg, unsupported: notBuilt},
	{long: "qos", short: 'q', arg: reqArg, unsupported: notBuilt},
	{long: "reservation", short: 'R', arg: reqArg, unsupported: notBuilt},
	{long: "sibling", arg: reqArg, unsupported: notBuilt},
	{long: "wckey", arg: reqArg, unsupported: notBuilt},
}

// scancelID is a job id scancel takes: JOB, JOB_TASK (an array's task) or
// JOB.STEP (JOB.batch for the batch step).
var scancelID = regexp.MustCompile(`^(\d+)(_\d+)?(\.(\d+|batch))?$`)

// Scancel is scancel: it cancels the jobs, array tasks and srun steps named (and those
// -u, -n, -p, -t, -A, --me select) as their user: SIGCONT and SIGTERM, then SIGKILL
// after the grace, as scancel's default (and --signal=KILL). Another --signal is sent
// to the running jobs without cancelling them (scancelSignal).
func Scancel(ctx context.Context, e *Env, args []string) int {
	v, ids, done, code := parseOpts(e, "scancel", scancelOptions, args, 1, "Usage: scancel [OPTIONS] [job_id[_array_id][.step_id]]\n")
	if done {
		return code
	}
	var sig syscall.Signal
	if v.has("signal") {
		var err error
		if sig, err = job.SignalNumber(v["signal"]); err != nil {
			fmt.Fprintln(e.Stderr, err) // scancel 22.05's words, with no prefix
			return 1
		}
	}
	if sig != 0 && sig != syscall.SIGKILL {
		return scancelSignal(ctx, e, v, ids, sig)
	}
	if v.has("batch") || v.has("full") {
		if !v.has("signal") {
			return errorf(e, "scancel", 1, "--%s without --signal: cancelling the batch shell alone is %s", map[bool]string{true: "batch", false: "full"}[v.has("batch")], notBuilt)
		}
	}
	s, ids, filtered, code := scancelSelect(ctx, e, v, ids, false)
	if s == nil {
		return code
	}
	defer s.Close()
	failed := false
	cancel := func(id string) {
		n, err := e.Cluster.Cancel(ctx, s, id)
		switch {
		case errors.Is(err, job.ErrNotFound):
			// scancel 22.05 says nothing of an id it does not know.
		case errors.Is(err, job.ErrNotYours):
			errorf(e, "scancel", 0, "Kill job error on job id %s: Access/permission denied", id)
			failed = true
		case err != nil:
			errorf(e, "scancel", 0, "Kill job error on job id %s: %v", id, err)
			failed = true
		case n == 0 && v.has("verbose"):
			fmt.Fprintf(e.Stderr, "scancel: Job %s is already complete\n", id)
		}
	}
	if filtered {
		for _, id := range ids {
			cancel(id)
		}
	} else {
		for _, id := range ids {
			m := scancelID.FindStringSubmatch(id)
			jid, step := m[1]+m[2], m[4]
			switch {
			case step == "batch":
				errorf(e, "scancel", 0, "Kill job error on job step id %s: cancelling the batch step alone is %s", id, notBuilt)
				failed = true
			case step != "":
				if msg := cancelStep(ctx, s, jid, step); msg != "" {
					errorf(e, "scancel", 0, "Kill job error on job step id %s: %s", id, msg)
					failed = true
				}
			default:
				cancel(jid)
			}
		}
	}
	if failed {
		return 1
	}
	return 0
}

// scancelSelect checks the ids named and the filters (-u, -n/--jobname, -p, -t/--state,
// -A, --me) and opens the store: with filters, ids become the jobs they select among
// those named (all when none is), for signal the running ones alone, and a step id is
// refused with signal. A nil store means scancel ends with code, its error written.
func scancelSelect(ctx context.Context, e *Env, v values, ids []string, signal bool) (s Store, _ []string, filtered bool, code int) {
	if v.has("jobname") {
		v["name"] = v["jobname"]
	}
	if v.has("state") {
		v["states"] = v["state"]
	}
	for _, id := range ids {
		m := scancelID.FindStringSubmatch(id)
		if m == nil {
			return nil, nil, false, errorf(e, "scancel", 1, "Invalid job id %s", id)
		}
		if signal && m[3] != "" {
			return nil, nil, false, errorf(e, "scancel", 1, "--signal=%s %s: signalling one step of a job is %s (signal the job)", v["signal"], id, notBuilt)
		}
	}
	filtered = v.has("user") || v.has("name") || v.has("partition") || v.has("states") || v.has("account") || v.has("me")
	if len(ids) == 0 && !filtered {
		return nil, nil, false, errorf(e, "scancel", 1, "No job identification provided")
	}
	f, err := newJobFilter(v)
	if err != nil {
		return nil, nil, false, usage(e, "scancel", err.(*UsageError))
	}
	s, err = e.Cluster.Open(ctx)
	if err != nil {
		return nil, nil, false, errorf(e, "scancel", 1, "Unable to contact slurm controller (connect failure): %v", err)
	}
	if !filtered {
		return s, ids, false, 0
	}
	jobs, err := job.List(ctx, s)
	if err != nil {
		s.Close()
		return nil, nil, false, errorf(e, "scancel", 1, "%v", err)
	}
	var selected []string
	for _, j := range jobs {
		if (!signal || j.State.Status == job.Running) && (len(ids) == 0 || containsID(ids, j)) && f.match(j, false) {
			selected = append(selected, j.Spec.ID)
		}
	}
	return s, selected, true, 0
}

// containsID reports whether ids names j (or its array).
func containsID(ids []string, j job.Job) bool {
	for _, id := range ids {
		if id == j.Spec.ID || j.Spec.Array != nil && id == j.Spec.Array.JobID {
			return true
		}
	}
	return false
}

// cancelStep cancels srun step n of job id, and says why not ("": done). Its tasks are
// killed with SIGKILL, with no grace, as Slurm 22.05 kills a cancelled step's tasks
// (its srun then exits 137; checked in TestSlurmCommandsAgainstSlurm).
func cancelStep(ctx context.Context, s Store, id, n string) string {
	j, err := job.Read(ctx, s, id)
	if err != nil || j.State.Status != job.Running {
		return "Invalid job id specified"
	}
	ss, err := job.SrunSteps(ctx, s, id)
	if err != nil {
		return err.Error()
	}
	for _, st := range ss {
		if strconv.Itoa(st.Request.Step) != n {
			continue
		}
		if uid := uint32(os.Getuid()); uid != 0 && uid != st.Request.UID {
			return "Access/permission denied"
		}
		if st.End != nil {
			return "Job/step already completing or completed"
		}
		if err := job.EndSrunStep(ctx, s, id, st.Request.Step, job.SrunState{State: job.Cancelled, ExitCode: 0, Signal: 9,
			Ended: time.Now().UTC(), Reason: "cancelled by scancel"}); err != nil {
			return err.Error()
		}
		return ""
	}
	return "Invalid job id specified"
}

// scancelSignal is `scancel --signal=SIG [--batch|--full]`: sig goes to the running
// jobs named (and those the filters select) without cancelling them, as scancel 22.05
// sends it: to the srun steps' tasks, with --batch to the batch shell alone, with
// --full to the batch shell, its children and the tasks. A pending job is an error
// ("Job is pending execution"); one that ended is passed over (with -v: "Job ID is
// already complete"), as a cancel's.
func scancelSignal(ctx context.Context, e *Env, v values, ids []string, sig syscall.Signal) int {
	target := job.SignalSteps
	switch {
	case v.has("full"):
		target = job.SignalFull
	case v.has("batch"):
		target = job.SignalBatch
	}
	s, ids, _, code := scancelSelect(ctx, e, v, ids, true)
	if s == nil {
		return code
	}
	defer s.Close()
	failed := false
	for _, id := range ids {
		if !signalOne(ctx, e, s, id, sig, target, v.has("verbose")) {
			failed = true
		}
	}
	if failed {
		return 1
	}
	return 0
}

// signalOne sends sig to job id where target says and reports an error in scancel's
// words; false when it failed.
func signalOne(ctx context.Context, e *Env, s Store, id string, sig syscall.Signal, target string, verbose bool) bool {
	_, err := e.Cluster.Signal(ctx, s, id, sig, target)
	switch {
	case errors.Is(err, job.ErrNotFound):
		// scancel 22.05 says nothing of an id it does not know.
	case errors.Is(err, job.ErrFinished), errors.Is(err, job.ErrNotRunning):
		if verbose {
			fmt.Fprintf(e.Stderr, "scancel: Job %s is already complete\n", id)
		}
	case errors.Is(err, job.ErrNotYours):
		errorf(e, "scancel", 0, "Kill job error on job id %s: Access/permission denied", id)
		return false
	case errors.Is(err, job.ErrPending):
		errorf(e, "scancel", 0, "Kill job error on job id %s: %v", id, job.ErrPending)
		return false
	case err != nil:
		errorf(e, "scancel", 0, "Kill job error on job id %s: %v", id, err)
		return false
	}
	return true
}
