package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/job"
)

// preemptPolicy: three partitions on the same nodes (label pool=x): low (tier 1), high
// (tier 10), and keep (tier 0, never pre-empted); pre-emption sends SIGUSR1, then stops
// the workers 4 s later.
const preemptPolicy = `{
  "preemption": {"type": "partition_prio", "exempt_time": "1s", "signal": "SIGUSR1", "grace_time": "4s"},
  "partitions": {
    "low":  {"nodes": {"pool": "x"}, "tier": 1},
    "high": {"nodes": {"pool": "x"}, "tier": 10},
    "keep": {"nodes": {"pool": "x"}, "preempt_mode": "off"}
  }
}`

// TestPreemptionRequeuesAndResumesFromTheSignalsCheckpoint: on one 4-GPU node, a job of
// partition keep (never pre-empted) and a real PyTorch DDP trainer of partition low hold
// all the GPUs; a job of partition high is submitted. The low job is pre-empted (not
// the keep one): its workers get SIGUSR1 and write a checkpoint, then SIGTERM after the
// grace and write another, and stop; the high job runs; the low job waits, runs again
// once the high one has ended, resumes from the newest checkpoint it wrote on the
// signals (periodic checkpoints are off), and completes with its restart budget
// untouched. show, acct and the queue's reason record it.
func TestPreemptionRequeuesAndResumesFromTheSignalsCheckpoint(t *testing.T) {
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	c := startJobClusterWith(t, func(string) []string { return []string{"--labels", "pool=x", "--metrics-addr", metricsAddr} })
	c.inventory = filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "pcie-2socket.json")
	c.startAgent("gpu-a")
	waitUntilFor(t, 60*time.Second, func() bool {
		n := nodesJSON(t, c.consul)
		return len(n) == 1 && n[0].State == "up"
	}, "the agent up")
	train := trainer(t, "--steps", "800", "--ckpt-every", "100000", "--step-time", "0.05") // before the Chdir: repoRoot is relative
	dir := t.TempDir()
	t.Chdir(dir)
	c.setPolicy(preemptPolicy)

	keep := c.submit("--partition", "keep", "--gpus-per-node", "2", "--", "sleep", "600")
	t.Cleanup(func() { c.gangrun("cancel", keep) })
	c.waitState(keep, job.Running, 60*time.Second)
	low := c.submit(append([]string{"--partition", "low", "--gpus-per-node", "2", "--checkpoint-dir", "ckpt", "--max-restarts", "0", "--"}, train...)...)
	c.waitState(low, job.Running, 60*time.Second)
	lowOut := filepath.Join(dir, "gangrun-"+low+".out")
	waitUntilFor(t, 120*time.Second, func() bool {
		b, _ := os.ReadFile(lowOut)
		if m := c.show(low); m["state"] != string(job.Running) {
			t.Fatalf("the low job is %v before its trainer started:\n%s", m["state"], b)
		}
		return bytes.Contains(b, []byte("training: world size 2"))
	}, "the low job's trainer at work")

	high := c.submit("--partition", "high", "--gpus-per-node", "2", "--", "/bin/sh", "-c", "echo high ran; sleep 5")
	m := c.waitState(high, job.Completed, 3*time.Minute)
	if m["exit_code"] != float64(0) {
		t.Errorf("the high job's exit code %v, want 0", m["exit_code"])
	}
	if m := c.show(keep); m["state"] != string(job.Running) {
		t.Errorf("the keep job (preempt_mode off) is %v, want RUNNING", m["state"])
	}
	lm := c.show(low)
	pre, _ := lm["preemptions"].([]any)
	if len(pre) != 1 || pre[0].(map[string]any)["by"] != high {
		t.Fatalf("the low job's preemptions: %v, want one, by job %s", lm["preemptions"], high)
	}

	lm = c.waitState(low, job.Completed, 5*time.Minute)
	out, err := os.ReadFile(lowOut)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	// What was written before the resume, and where it resumed.
	before, after, resumed := strings.Cut(text, "resumed from step ")
	if !resumed {
		t.Fatalf("the low job did not resume from a checkpoint:\n%s", text)
	}
	var saved []int
	for _, mm := range regexp.MustCompile(`checkpoint step (\d+) `).FindAllStringSubmatch(before, -1) {
		n, _ := strconv.Atoi(mm[1])
		saved = append(saved, n)
	}
	from, _ := strconv.Atoi(strings.Fields(after)[0])
	if len(saved) == 0 || from != saved[len(saved)-1] {
		t.Errorf("resumed from step %d; the checkpoints written before: %v (want the newest of them)", from, saved)
	}
	if !strings.Contains(before, "the job was pre-empted: signalling the workers") || !strings.Contains(before, "USR1") {
		t.Errorf("the low job's output does not show the pre-emption's signal:\n%s", before)
	}
	if !strings.Contains(after, "finished at step 800") {
		t.Errorf("the low job did not finish after its resume:\n%s", text)
	}
	attempts, _ := lm["attempts"].([]any)
	last, _ := attempts[len(attempts)-1].(map[string]any)
	if rf, _ := last["resume_from"].(string); !strings.HasSuffix(rf, "step-"+strconv.Itoa(from)) {
		t.Errorf("the last attempt resumed from %q, want .../step-%d", rf, from)
	}
	// --max-restarts 0, and yet it ran again: the pre-emption used none of the budget.
	if lm["restarts"] != float64(0) {
		t.Errorf("the low job's own restarts: %v, want 0 (a pre-emption is not the job's failure)", lm["restarts"])
	}
	if rc, _ := lm["restarts_by_cause"].(map[string]any); rc[job.CausePreempted] != float64(1) {
		t.Errorf("restarts by cause: %v, want preempted=1", lm["restarts_by_cause"])
	}
	_, show, _ := c.gangrun("show", low)
	if !strings.Contains(show, "Preempted by job "+high+" (partition high)") || !strings.Contains(show, "SIGUSR1, grace 4s") {
		t.Errorf("show does not record the pre-emption:\n%s", show)
	}
	recs := c.acctJSON("--since", "1h")
	if r := recs[low]; r.Preemptions != 1 || len(r.PreemptedBy) != 1 || r.PreemptedBy[0] != high {
		t.Errorf("acct's record of the low job: preemptions %d by %v, want 1 by %s", r.Preemptions, r.PreemptedBy, high)
	}
	if m := scrape(t, metricsAddr); !strings.Contains(m, `gangrun_preemptions_total{partition="low"} 1`) {
		t.Errorf("metrics lack the pre-emption:\n%s", grepLines(m, "preempt"))
	}
	if code, out, errOut := c.gangrun("audit", "--since", "1h"); code != 0 || strings.Count(out, " preempt ") != 1 ||
		!strings.Contains(out, "job "+low) || !strings.Contains(out, "for job "+high+" (partition high)") {
		t.Errorf("the audit log does not record the one pre-emption: exit %d\n%s%s", code, out, errOut)
	}
	c.gangrun("cancel", keep)
	c.waitState(keep, job.Cancelled, 60*time.Second)
}

// grepLines returns text's lines that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPolicySetRefusesBadPreemption: a bad pre-emption setting is refused with exit
// code 2 and one line naming the field and the value, and nothing is written.
func TestPolicySetRefusesBadPreemption(t *testing.T) {
	consul := consultest.Start(t).Addr
	dir := t.TempDir()
	for _, tc := range []struct{ doc, want string }{
		{`{"preemption": {"type": "partition_prio", "signal": "KILL"}}`, `preemption.signal "KILL": want SIGTERM, SIGUSR1, SIGUSR2 or SIGINT`},
		{`{"preemption": {"type": "qos"}}`, `preemption.type "qos": want "off" or "partition_prio"`},
		{`{"preemption": {"type": "partition_prio", "grace_time": "-1s"}}`, `preemption.grace_time -1s: want 0 to 24h0m0s`},
		{`{"partitions": {"p": {"preempt_mode": "cancel"}}}`, `partitions.p.preempt_mode "cancel": want "requeue" or "off"`},
	} {
		f := filepath.Join(dir, "policy.json")
		if err := os.WriteFile(f, []byte(tc.doc), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := inProcess("policy", "set", "--consul", consul, f)
		if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("policy set %s: exit %d, %q; want 2 and one line with %q", tc.doc, code, errOut, tc.want)
		}
	}
	if code, out, _ := inProcess("policy", "show", "--consul", consul); code != 0 || strings.Contains(out, "preemption") {
		t.Errorf("policy show after the refusals: exit %d:\n%s", code, out)
	}
}
