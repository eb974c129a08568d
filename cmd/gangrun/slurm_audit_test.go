package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/job"
)

// TestScancelAuditsAnotherUsersJob: scancel of another user's job is recorded in the
// audit log as `gangrun cancel` records it (docs/acl.md, "Audit"): the same action,
// target and owner, whether the agents check MUNGE credentials (the elected agent
// cancels and records) or not (--auth none: the command does).
func TestScancelAuditsAnotherUsersJob(t *testing.T) {
	for _, auth := range []string{"munge", "none"} {
		t.Run(auth, func(t *testing.T) { testScancelAudit(t, auth) })
	}
}

func testScancelAudit(t *testing.T, auth string) {
	links := slurmLinks(t)
	c := startJobClusterWith(t, func(string) []string { return []string{"--auth", auth} }, "gpu-a")
	p := &slurmPair{t: t, gr: c, links: links}
	dir := sharedDir(t)
	t.Chdir(dir)
	var ids []string
	for range 2 {
		ids = append(ids, p.gr.submit("--uid", "nobody", "--gpus-per-node", "1", "--", "sleep", "300"))
	}
	if code, out, errOut := p.gr.gangrun("cancel", ids[0]); code != 0 {
		t.Fatalf("gangrun cancel %s: exit %d %s %s", ids[0], code, out, errOut)
	}
	if _, errOut, code := p.run(gangrunSide, dir, "", nil, "scancel", ids[1]); code != 0 {
		t.Fatalf("scancel %s: exit %d %s", ids[1], code, errOut)
	}
	for _, id := range ids {
		p.gr.waitState(id, job.Cancelled, time.Minute)
	}
	code, out, errOut := p.gr.gangrun("audit", "--json")
	if code != 0 {
		t.Fatalf("audit: exit %d %s", code, errOut)
	}
	var entries []audit.Entry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, out)
	}
	for _, id := range ids {
		found := false
		for _, e := range entries {
			found = found || (e.Action == audit.ActionCancel && e.Target == "job "+id && e.Owner == "nobody")
		}
		if !found {
			t.Errorf("no audit entry of the cancel of job %s (nobody's); the log:\n%s", id, strings.TrimSpace(out))
		}
	}
}
