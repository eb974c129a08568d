package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/reason"
)

// TestDependencyChain: a chain of afterok jobs on a cluster of two nodes, each of which
// could run them all at once, runs in order, each job held PENDING (Dependency) without
// a request until the one before completed; afternotok on a completed job shows
// DependencyNeverSatisfied and stays pending until cancelled; a dependency on a job
// that does not exist is refused at submit with exit 2.
func TestDependencyChain(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	order := filepath.Join(dir, "order")
	step := func(n string) []string {
		return []string{"--gpus-per-node", "1", "--", "/bin/sh", "-c", "sleep 1; echo " + n + " >> " + order}
	}
	first := c.submit(step("1")...)
	second := c.submit(append([]string{"--dependency", "afterok:" + first}, step("2")...)...)
	third := c.submit(append([]string{"--dependency", "afterok:" + second + ",afterany:" + first}, step("3")...)...)
	if m := c.show(third); m["state"] != string(job.Pending) || m["reason"] != string(reason.Dependency) {
		t.Errorf("job %s at once: %v (%v), want PENDING (Dependency)", third, m["state"], m["reason"])
	}
	last := c.waitState(third, job.Completed, 2*time.Minute)
	got, _ := os.ReadFile(order)
	if string(got) != "1\n2\n3\n" {
		t.Errorf("the jobs ran in the order %q, want 1, 2, 3", got)
	}
	prev := c.show(second)
	if prev["ended"].(string) > last["started"].(string) {
		t.Errorf("job %s started %v, before job %s ended %v", third, last["started"], second, prev["ended"])
	}

	never := c.submit("--dependency", "afternotok:"+first, "--gpus-per-node", "1", "--", "/bin/true")
	waitUntilFor(t, 30*time.Second, func() bool { return c.show(never)["reason"] == string(reason.DependencyNeverSatisfied) }, "DependencyNeverSatisfied")
	time.Sleep(3 * time.Second) // a few of the controller's passes
	if m := c.show(never); m["state"] != string(job.Pending) {
		t.Errorf("job %s is %v, want it still PENDING", never, m["state"])
	}
	code, q, _ := c.gangrun("queue")
	if code != 0 || !strings.Contains(q, "(DependencyNeverSatisfied)") {
		t.Errorf("queue:\n%s", q)
	}
	code, out, _ := c.gangrun("show", never)
	if code != 0 || !strings.Contains(out, "Dependency=afternotok:"+first) {
		t.Errorf("show %s:\n%s", never, out)
	}
	if code, _, errOut := c.gangrun("cancel", never); code != 0 {
		t.Fatalf("cancel %s: %d %s", never, code, errOut)
	}
	c.waitState(never, job.Cancelled, 10*time.Second)

	for _, tc := range []struct{ dep, want string }{
		{"afterok:999", "no job 999"},
		{"afterok:" + first + ":77_1", "no job 77_1"},
		{"afterok:x", `"x" is no job id`},
		{"before:1", `unknown type "before"`},
	} {
		code, _, errOut := c.gangrun("submit", "--dependency", tc.dep, "--", "/bin/true")
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("submit --dependency %s: exit %d %q, want 2 and one line with %q", tc.dep, code, errOut, tc.want)
		}
	}
}

// TestJobArray: an array 0-3%2 on two nodes that could run all four tasks at once runs
// every task, never more than two at a time (by the tasks' own clocks and by the queue),
// each seeing its index, the array's id and size in its environment and writing its own
// output file (%A_%a); show of a task and of the array; cancel of one pending task, then
// of the whole array; bad --array values are refused with exit 2.
func TestJobArray(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	spans := filepath.Join(dir, "spans")
	code, out, errOut := c.gangrun("submit", "--json", "--array", "0-3%2", "--gpus-per-node", "1", "--output", "arr-%A_%a.out", "--",
		"/bin/sh", "-c", `echo "start $(date +%s%N)" >> `+spans+`; echo "task $GANGRUN_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT in $GANGRUN_ARRAY_JOB_ID ($SLURM_ARRAY_TASK_MIN-$SLURM_ARRAY_TASK_MAX) id $GANGRUN_JOB_ID"; sleep 2; echo "end $(date +%s%N)" >> `+spans)
	if code != 0 {
		t.Fatalf("submit --array: %d %s", code, errOut)
	}
	var sub struct {
		ID    string   `json:"id"`
		Tasks []string `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(out), &sub); err != nil || len(sub.Tasks) != 4 {
		t.Fatalf("submit --json: %v %s", err, out)
	}
	a := sub.ID
	if code, _, errOut := c.gangrun("logs", a); code != 2 || !strings.Contains(errOut, "job array of 4 tasks") || !strings.Contains(errOut, a+"_0") {
		t.Errorf("logs of the array's id: exit %d, %q; want 2 and a task to give", code, errOut)
	}
	maxLet := 0
	done := func() bool {
		_, q, _ := c.gangrun("queue", "--all", "--json")
		var entries []job.Entry
		_ = json.Unmarshal([]byte(q), &entries)
		let, ended := 0, 0
		for _, e := range entries {
			if !strings.HasPrefix(e.ID, a+"_") {
				continue
			}
			if e.State.Final() {
				ended++
			} else if e.State != job.Pending {
				let++
			}
		}
		maxLet = max(maxLet, let)
		return ended == 4
	}
	waitUntilFor(t, 3*time.Minute, done, "every task ended")
	if maxLet > 2 {
		t.Errorf("the queue showed %d tasks running at once, want at most 2", maxLet)
	}
	for i, id := range sub.Tasks {
		if id != a+"_"+strconv.Itoa(i) {
			t.Errorf("task %d's id %s, want %s_%d", i, id, a, i)
		}
		if m := c.show(id); m["state"] != string(job.Completed) {
			t.Errorf("task %s: %v (%v)", id, m["state"], m["reason"])
		}
		got, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("arr-%s_%d.out", a, i)))
		if want := fmt.Sprintf("task %d of 4 in %s (0-3) id %s_%d", i, a, a, i); !strings.Contains(string(got), want) {
			t.Errorf("task %d's output lacks %q:\n%s", i, want, got)
		}
	}
	// The tasks' own clocks: never more than two between start and end at once.
	data, _ := os.ReadFile(spans)
	type mark struct {
		at    int64
		delta int
	}
	var marks []mark
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		d := 1
		if f[0] == "end" {
			d = -1
		}
		marks = append(marks, mark{ns, d})
	}
	sort.Slice(marks, func(i, j int) bool {
		return marks[i].at < marks[j].at || marks[i].at == marks[j].at && marks[i].delta < marks[j].delta
	})
	running, most := 0, 0
	for _, m := range marks {
		running += m.delta
		most = max(most, running)
	}
	if len(marks) != 8 || most != 2 {
		t.Errorf("%d marks, at most %d tasks running at once: want 8 and 2 (the cap, reached)\n%s", len(marks), most, data)
	}
	if code, out, _ := c.gangrun("show", a); code != 0 || strings.Count(out, "JobId="+a+"_") != 4 || !strings.Contains(out, "ArrayTaskThrottle=2") {
		t.Errorf("show %s: %d\n%s", a, code, out)
	}

	// Cancel one task, then the rest of the array.
	code, out, errOut = c.gangrun("submit", "--array", "0-5%1", "--gpus-per-node", "1", "--term-timeout", "2s", "--", "/bin/sh", "-c", "sleep 300")
	if code != 0 {
		t.Fatalf("submit: %d %s", code, errOut)
	}
	b := strings.TrimSpace(out)
	c.waitState(b+"_0", job.Running, time.Minute)
	waitUntilFor(t, 30*time.Second, func() bool { return c.show(b + "_1")["reason"] == string(reason.JobArrayTaskLimit) }, "JobArrayTaskLimit")
	if code, out, errOut := c.gangrun("cancel", b+"_1"); code != 0 || !strings.Contains(out, "cancelled job "+b+"_1") {
		t.Fatalf("cancel %s_1: %d %s %s", b, code, out, errOut)
	}
	c.waitState(b+"_1", job.Cancelled, 10*time.Second)
	if m := c.show(b + "_0"); m["state"] != string(job.Running) {
		t.Errorf("task %s_0 is %v after the cancel of %s_1, want RUNNING", b, m["state"], b)
	}
	if code, out, errOut := c.gangrun("cancel", b); code != 0 || !strings.Contains(out, "cancelled 5 task(s) of job array "+b) {
		t.Fatalf("cancel %s: %d %s %s", b, code, out, errOut)
	}
	for i := 0; i < 6; i++ {
		c.waitState(fmt.Sprintf("%s_%d", b, i), job.Cancelled, time.Minute)
	}
	waitUntilFor(t, 30*time.Second, func() bool { return countWorkers(c.mark) == 0 }, "no worker left")

	for _, tc := range []struct{ array, want string }{
		{"0-3%0", `--array "0-3%0"`},
		{"0-10000", "over the largest, 9999"},
		{"x", `--array "x"`},
		{"3-1", "ends before it starts"},
	} {
		code, _, errOut := c.gangrun("submit", "--array", tc.array, "--", "/bin/true")
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("submit --array %s: exit %d %q, want 2 and one line with %q", tc.array, code, errOut, tc.want)
		}
	}
}
