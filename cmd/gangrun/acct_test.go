package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// acctRecordKeys returns, per job id, how many accounting records it has in Consul.
func acctRecordKeys(t *testing.T, consul string) map[string]int {
	t.Helper()
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	entries, _, err := s.List(context.Background(), "gangrun/acct/jobs/")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range entries {
		out[e.Key[strings.LastIndexByte(e.Key, '/')+1:]]++
	}
	return out
}

// acctJSON runs acct --json with args and returns the records by job id.
func (c *jobCluster) acctJSON(args ...string) map[string]job.Record {
	c.t.Helper()
	code, out, errOut := c.gangrun(append([]string{"acct", "--json"}, args...)...)
	if code != 0 {
		c.t.Fatalf("acct --json %v: exit %d: %s", args, code, errOut)
	}
	var recs []job.Record
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		c.t.Fatalf("acct --json: %v\n%s", err, out)
	}
	m := map[string]job.Record{}
	for _, r := range recs {
		m[r.ID] = r
	}
	return m
}

// TestAcctRecordsFinishedJobs: on a real Consul with two agents, a completed, a failed
// and a cancelled job each leave exactly one accounting record with their user,
// account, partition, nodes, GPUs, times, state, exit code, restarts and GPU-seconds;
// the elected agent is killed while a job runs, the other takes over and the job's
// end is recorded once, the earlier records untouched; a record injected past the
// retention is folded into its day's rollup by the new leader and deleted, and the
// report keeps its GPU-hours; acct --json, the sacct-like table and --report check out.
func TestAcctRecordsFinishedJobs(t *testing.T) {
	c := startJobClusterWith(t, func(node string) []string {
		return []string{"--labels", "partition=p-" + node, "--acct-fold-interval", "3s"}
	}, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	me := currentUser()

	done := c.submit("--nodes", "2", "--gpus-per-node", "2", "--account", "vision", "--", "/bin/sh", "-c", "sleep 1")
	failed := c.submit("--partition", "p-gpu-a", "--account", "vision", "--max-restarts", "1", "--", "/bin/sh", "-c", "exit 3")
	c.waitState(done, job.Completed, 90*time.Second)
	c.waitState(failed, job.Failed, 90*time.Second)
	cancelled := c.submit("--gpus-per-node", "8", "--term-timeout", "2s", "--", "/bin/sh", "-c", "sleep 300")
	c.waitState(cancelled, job.Running, 60*time.Second)
	waitUntilFor(t, 60*time.Second, func() bool { return countWorkers(c.mark) == 8 }, "8 workers")
	if code, _, errOut := c.gangrun("cancel", cancelled); code != 0 {
		t.Fatalf("cancel: %s", errOut)
	}
	c.waitState(cancelled, job.Cancelled, 60*time.Second)

	recs := c.acctJSON("--since", "1h")
	if len(recs) != 3 {
		t.Fatalf("acct --json: %d records, want 3: %+v", len(recs), recs)
	}
	r := recs[done]
	if r.State != job.Completed || r.ExitCode != 0 || r.User != me || r.Account != "vision" || r.Partition != "" || r.NumNodes != 2 || r.GPUs != 4 ||
		len(r.Nodes) != 2 || r.Started.IsZero() || r.Ended.Before(r.Started) || r.Submitted.After(r.Started) || r.Restarts != 0 {
		t.Errorf("the completed job's record: %+v", r)
	}
	// 2 nodes × 2 GPUs for at least the second the command sleeps, and no longer than
	// the job ran (the attempt lies within Started..Ended).
	if ran := r.Ended.Sub(r.Started).Seconds(); r.GPUSeconds < 4*0.9 || r.GPUSeconds > 4*(ran+1) {
		t.Errorf("the completed job's GPU-seconds %v, want 4 GPUs × about 1 s (it ran %.1f s)", r.GPUSeconds, ran)
	}
	r = recs[failed]
	if r.State != job.Failed || r.ExitCode != 3 || r.Account != "vision" || r.Partition != "p-gpu-a" || r.GPUs != 1 ||
		r.Restarts != 1 || r.RestartsByCause[job.CauseWorkerExit] != 1 || len(r.Nodes) != 1 || r.Nodes[0] != "gpu-a" {
		t.Errorf("the failed job's record: %+v", r)
	}
	r = recs[cancelled]
	if r.State != job.Cancelled || r.Account != me || r.GPUs != 8 || r.GPUSeconds <= 0 || r.User != me {
		t.Errorf("the cancelled job's record: %+v", r)
	}
	for id, n := range acctRecordKeys(t, c.consul) {
		if n != 1 {
			t.Errorf("job %s has %d records, want 1", id, n)
		}
	}

	// The sacct-like table and the filters.
	code, out, _ := c.gangrun("acct", "--since", "1h", "--account", "vision", "--state", "failed")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "JOBID") || !strings.Contains(lines[0], "GPUHOURS") ||
		strings.Fields(lines[1])[0] != failed || !strings.Contains(lines[1], "FAILED") || strings.Fields(lines[1])[5] != "3" {
		t.Errorf("acct --account vision --state failed: exit %d\n%s", code, out)
	}

	// The elected agent dies while a job runs on the other node; the job's end is
	// recorded once by the new leader.
	s, err := store.NewConsul(c.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	e, err := s.Get(ctx, schedulerLeaderKey)
	if err != nil || e == nil || e.Session == "" {
		t.Fatalf("no elected agent: %v %v", e, err)
	}
	leader := string(e.Value)
	other := map[string]string{"gpu-a": "gpu-b", "gpu-b": "gpu-a"}[leader]
	gate := filepath.Join(dir, "go")
	gated := c.submit("--partition", "p-"+other, "--account", "nlp", "--", "/bin/sh", "-c", `while [ ! -e `+gate+` ]; do sleep 0.1; done`)
	c.waitState(gated, job.Running, 60*time.Second)
	_ = c.agents[leader].Process.Signal(syscall.SIGKILL)
	waitUntilFor(t, 2*time.Minute, func() bool {
		e, err := s.Get(ctx, schedulerLeaderKey)
		return err == nil && e != nil && e.Session != "" && string(e.Value) == other
	}, other+" elected")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.waitState(gated, job.Completed, 90*time.Second)
	time.Sleep(3 * time.Second) // a pass or two more of the new leader's controller
	keys := acctRecordKeys(t, c.consul)
	if len(keys) != 4 {
		t.Errorf("records of jobs %v, want the 4 jobs", keys)
	}
	for id, n := range keys {
		if n != 1 {
			t.Errorf("job %s has %d records, want 1", id, n)
		}
	}
	if r := c.acctJSON("--since", "1h", "--user", me)[gated]; r.State != job.Completed || r.Account != "nlp" || len(r.Nodes) != 1 || r.Nodes[0] != other {
		t.Errorf("the job that ended under the new leader: %+v", r)
	}

	// A record past the retention (30 days by default) is folded by the new leader into
	// its day's rollup and deleted; the report keeps its GPU-hours.
	oldEnd := time.Now().UTC().Add(-40 * 24 * time.Hour)
	old := job.Record{ID: "9001", User: "olduser", Account: "vision", State: job.Completed, Submitted: oldEnd.Add(-2 * time.Hour),
		Started: oldEnd.Add(-time.Hour), Ended: oldEnd, GPUSeconds: 36000, GPUs: 10, NumNodes: 2}
	if err := job.WriteRecord(ctx, s, old); err != nil {
		t.Fatal(err)
	}
	waitUntilFor(t, 60*time.Second, func() bool { return acctRecordKeys(t, c.consul)["9001"] == 0 }, "the old record folded")
	rollup, err := s.Get(ctx, "gangrun/acct/daily/"+oldEnd.Format("2006-01-02"))
	if err != nil || rollup == nil || !strings.Contains(string(rollup.Value), `"olduser"`) {
		t.Fatalf("the rollup of %s: %v %v", oldEnd.Format("2006-01-02"), rollup, err)
	}
	if got := c.acctJSON("--since", "60d"); len(got) != 4 {
		t.Errorf("acct --since 60d lists %d records, want the 4 kept (the folded one is in the rollup only)", len(got))
	}

	code, out, errOut := c.gangrun("acct", "--report", "--since", "60d", "--json")
	if code != 0 {
		t.Fatalf("acct --report --json: exit %d: %s", code, errOut)
	}
	var rep struct {
		Accounts []struct {
			Account    string  `json:"account"`
			Jobs       int     `json:"jobs"`
			GPUSeconds float64 `json:"gpu_seconds"`
			GPUHours   float64 `json:"gpu_hours"`
			Users      []struct {
				User       string  `json:"user"`
				Jobs       int     `json:"jobs"`
				GPUSeconds float64 `json:"gpu_seconds"`
			} `json:"users"`
		} `json:"accounts"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("acct --report --json: %v\n%s", err, out)
	}
	all := c.acctJSON("--since", "60d")
	wantVision := 36000 + all[done].GPUSeconds + all[failed].GPUSeconds
	got := map[string]int{}
	for _, a := range rep.Accounts {
		got[a.Account] = a.Jobs
		if a.Account == "vision" {
			if math.Abs(a.GPUSeconds-wantVision) > 1e-6 || math.Abs(a.GPUHours-wantVision/3600) > 1e-6 || len(a.Users) != 2 {
				t.Errorf("vision: %v GPU-seconds (%v h), users %+v; want %v with olduser's 36000 from the rollup", a.GPUSeconds, a.GPUHours, a.Users, wantVision)
			}
			for _, u := range a.Users {
				if u.User == "olduser" && (u.Jobs != 1 || u.GPUSeconds != 36000) {
					t.Errorf("vision/olduser: %+v, want 1 job, 36000 GPU-seconds", u)
				}
			}
		}
	}
	if got["vision"] != 3 || got["nlp"] != 1 || got[me] != 1 || len(got) != 3 {
		t.Errorf("report jobs per account %v, want vision 3, nlp 1, %s 1", got, me)
	}
	_, table, _ := c.gangrun("acct", "--since", "1h")
	t.Logf("gangrun acct --since 1h:\n%s", table)
	code, out, _ = c.gangrun("acct", "--report", "--since", "60d")
	t.Logf("gangrun acct --report --since 60d:\n%s", out)
	if code != 0 || !strings.Contains(out, "ACCOUNT") || !strings.Contains(out, "olduser") || !strings.Contains(out, "10.00") {
		t.Errorf("acct --report: exit %d\n%s", code, out)
	}
}

// TestAcctRefusesBadFlags: a bad value is refused before Consul is asked, in one line
// naming it, with exit 2.
func TestAcctRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--since", "yesterday"}, `--since "yesterday"`},
		{[]string{"--until", "2025-13-01"}, `--until "2025-13-01"`},
		{[]string{"--since", "-5d"}, `--since "-5d"`},
		{[]string{"--state", "RUNNING"}, `--state "RUNNING"`},
		{[]string{"--report", "--state", "FAILED"}, `--state "FAILED"`},
		{[]string{"--since", "2025-02-01", "--until", "2025-01-01"}, "is not before --until"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		code, out, errOut := inProcess(append([]string{"acct", "--consul", "127.0.0.1:1"}, tc.args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("acct %v: exit %d %q, want 2 and one line with %s", tc.args, code, errOut, tc.want)
		}
	}
}

// TestAcctWhenAndReportFilter: --since/--until forms against a fixed now, and
// --report's --account/--user filters.
func TestAcctWhenAndReportFilter(t *testing.T) {
	now := time.Date(2025, 6, 30, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Time{
		"2025-06-01":                time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC),
		"2025-06-01T08:30":          time.Date(2025, 6, 1, 8, 30, 0, 0, time.UTC),
		"2025-06-01T08:30:15":       time.Date(2025, 6, 1, 8, 30, 15, 0, time.UTC),
		"2025-06-01T08:30:00+02:00": time.Date(2025, 6, 1, 6, 30, 0, 0, time.UTC),
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        time.Date(2025, 6, 23, 12, 0, 0, 0, time.UTC),
	} {
		if got, err := parseWhen(v, now); err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	rep := []job.AccountUsage{
		{Account: "nlp", Usage: job.Usage{Jobs: 3, GPUSeconds: 30}, Users: []job.UserUsage{{User: "ann", Usage: job.Usage{Jobs: 1, GPUSeconds: 10}}, {User: "bob", Usage: job.Usage{Jobs: 2, GPUSeconds: 20}}}},
		{Account: "vision", Usage: job.Usage{Jobs: 1, GPUSeconds: 5}, Users: []job.UserUsage{{User: "bob", Usage: job.Usage{Jobs: 1, GPUSeconds: 5}}}},
	}
	if got := filterReport(rep, "", "ann"); len(got) != 1 || got[0].Account != "nlp" || got[0].Jobs != 1 || got[0].GPUSeconds != 10 || len(got[0].Users) != 1 {
		t.Errorf("--user ann: %+v", got)
	}
	if got := filterReport(rep, "vision", ""); len(got) != 1 || got[0].Account != "vision" || got[0].Jobs != 1 {
		t.Errorf("--account vision: %+v", got)
	}
	if got := filterReport(rep, "nlp", "carl"); len(got) != 0 {
		t.Errorf("--account nlp --user carl: %+v, want nothing", got)
	}
}

// TestEndedJobsRecordsGoAfterMinJobAge: with --min-job-age 3s, a completed job's records
// (show) are removed by the elected agent a few seconds after its end, while its
// accounting record stays; a job that a waiting job's dependency names is kept.
func TestEndedJobsRecordsGoAfterMinJobAge(t *testing.T) {
	c := startJobClusterWith(t, func(string) []string { return []string{"--min-job-age", "3s"} }, "gpu-a")
	t.Chdir(t.TempDir())
	done := c.submit("--nodes", "1", "--gpus-per-node", "1", "--", "/bin/true")
	c.waitState(done, job.Completed, time.Minute)
	// A job that stays held (it depends on a job that never ends while the test runs)
	// keeps the job it names: here the running blocker.
	blocker := c.submit("--nodes", "1", "--gpus-per-node", "1", "--", "/bin/sleep", "60")
	c.waitState(blocker, job.Running, time.Minute)
	waiting := c.submit("--nodes", "1", "--gpus-per-node", "1", "--dependency", "afterok:"+done+":"+blocker, "--", "/bin/true")
	c.waitState(waiting, job.Pending, time.Minute)
	time.Sleep(8 * time.Second) // past --min-job-age, several controller ticks
	if code, _, errOut := c.gangrun("show", done); code != 0 {
		t.Fatalf("show %s (named by job %s's dependency) exited %d after --min-job-age: %s", done, waiting, code, errOut)
	}
	if code, _, _ := c.gangrun("cancel", waiting); code != 0 {
		t.Fatalf("cancel %s exited %d", waiting, code)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, _, errOut := c.gangrun("show", done)
		if code != 0 {
			if !strings.Contains(errOut, done) {
				t.Errorf("show of a removed job: exit %d, %q; want it named", code, errOut)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still shown a minute after --min-job-age and its dependent's end", done)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if r, ok := c.acctJSON("--since", "1h")[done]; !ok || r.State != job.Completed {
		t.Errorf("acct after the job's records went: %+v (present %v), want its COMPLETED record", r, ok)
	}
	c.gangrun("cancel", blocker)
}
