package job

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
)

func TestParseTime(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"90", 90 * time.Minute, false},
		{"5:30", 5*time.Minute + 30*time.Second, false},
		{"1:02:03", time.Hour + 2*time.Minute + 3*time.Second, false},
		{"2-3", 51 * time.Hour, false},
		{"2-3:04", 51*time.Hour + 4*time.Minute, false},
		{"2-3:04:05", 51*time.Hour + 4*time.Minute + 5*time.Second, false},
		{"90m", 90 * time.Minute, false},
		{"2h30m", 150 * time.Minute, false},
		{"UNLIMITED", 0, false},
		{"infinite", 0, false},
		{"", 0, true},
		{"abc", 0, true},
		{"1:2:3:4", 0, true},
		{"-5", 0, true},
		{"1-2:3:4:5", 0, true},
		{"-1h", 0, true},
		{"99999999999", 0, true},
	} {
		got, err := ParseTime(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseTime(%q) = %s, %v; want %s, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), `--time "`+tc.in+`"`) {
			t.Errorf("ParseTime(%q): error %q does not name the value", tc.in, err)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		sig  syscall.Signal
		lead time.Duration
		err  bool
	}{
		{"USR1@120", syscall.SIGUSR1, 120 * time.Second, false},
		{"SIGUSR2@2m", syscall.SIGUSR2, 2 * time.Minute, false},
		{"usr1", syscall.SIGUSR1, DefaultSignalBefore, false},
		{"10@30", syscall.Signal(10), 30 * time.Second, false},
		{"NOPE@10", 0, 0, true},
		{"USR1@-3", 0, 0, true},
		{"0", 0, 0, true},
		{"65", 0, 0, true},
		{"USR1@soon", 0, 0, true},
	} {
		sig, lead, err := ParseSignal(tc.in)
		if (err != nil) != tc.err || sig != tc.sig || lead != tc.lead {
			t.Errorf("ParseSignal(%q) = %v, %s, %v; want %v, %s, error %v", tc.in, sig, lead, err, tc.sig, tc.lead, tc.err)
		}
	}
}

func TestParseNodes(t *testing.T) {
	for _, tc := range []struct {
		in     string
		lo, hi int
		err    bool
	}{
		{"2", 2, 2, false}, {"2:4", 2, 4, false}, {"2-4", 2, 4, false},
		{"0", 0, 0, true}, {"4:2", 0, 0, true}, {"x", 0, 0, true}, {"2:", 0, 0, true},
	} {
		lo, hi, err := ParseNodes(tc.in)
		if (err != nil) != tc.err || lo != tc.lo || hi != tc.hi {
			t.Errorf("ParseNodes(%q) = %d, %d, %v; want %d, %d, error %v", tc.in, lo, hi, err, tc.lo, tc.hi, tc.err)
		}
	}
}

func TestExpand(t *testing.T) {
	for _, tc := range []struct{ pattern, want, err string }{
		{"gangrun-%j.out", "gangrun-42.out", ""},
		{"%x-%j-%n.log", "train-42-gpu-a.log", ""},
		{"logs/%u/%j_%%.out", "logs/alice/42_%.out", ""},
		{"out-%q", "", "unknown pattern %q"},
		{"out-%", "", "a lone %"},
		{"slurm-%A_%a.out", "slurm-40_2.out", ""},
	} {
		got, err := Expand(tc.pattern, Names{ID: "42", Name: "train", Node: "gpu-a", User: "alice", ArrayJobID: "40", ArrayTaskID: "2"})
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Expand(%q): error %v, want one saying %q", tc.pattern, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("Expand(%q) = %q, %v; want %q", tc.pattern, got, err, tc.want)
		}
	}
}

// TestExpandErrors pins Expand's and ExpandSlurm's whole error messages and the
// differences between the two syntaxes: %n is the node's name in gangrun's --output and
// the node's index in Slurm's, and only Slurm's takes a width.
func TestExpandErrors(t *testing.T) {
	names := Names{ID: "42", Name: "train", Node: "gpu-a", User: "alice", ArrayJobID: "40", ArrayTaskID: "2"}
	for _, tc := range []struct{ pattern, want, err string }{
		{"%n/%N", "gpu-a/gpu-a", ""},
		{"%%%j", "%42", ""},
		{"%4j", "", `--output "%4j": unknown pattern %4 (want %j, %x, %n, %u, %A, %a or %%)`},
		{"a-%", "", `--output "a-%": a lone % at the end (write %% for a percent sign)`},
		{"%t", "", `--output "%t": unknown pattern %t (want %j, %x, %n, %u, %A, %a or %%)`},
	} {
		got, err := Expand(tc.pattern, names)
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("Expand(%q): error %v, want %q", tc.pattern, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("Expand(%q) = %q, %v; want %q", tc.pattern, got, err, tc.want)
		}
	}
	sn := SlurmNames{JobID: "42", Name: "train", User: "alice", ArrayJobID: "40", ArrayTaskID: "2", Node: "gpu-a", StepID: "batch", NodeID: 3, TaskID: 7}
	for _, tc := range []struct{ pattern, want, err string }{
		{"%N-%n-%t-%s-%J", "gpu-a-3-7-batch-42.batch", ""},
		{"%4j_%3a_%2n_%3t_%5J", "0042_002_03_007_00042.batch", ""},
		{"%3N%3u%3x%3%", "gpu-aalicetrain%", ""},
		{"%A_%a.%u.%x%%", "40_2.alice.train%", ""},
		{"a-%", "", `--error "a-%": a lone % at the end (write %% for a percent sign)`},
		{"a-%12", "", `--error "a-%12": a pattern's width is at most 10 digits`},
		{"a-%4", "", `--error "a-%4": a lone % at the end (write %% for a percent sign)`},
		{"%q", "", `--error "%q": unknown pattern %q (want %A, %a, %J, %j, %N, %n, %s, %t, %u, %x or %%)`},
	} {
		got, err := ExpandSlurm("--error", tc.pattern, sn)
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("ExpandSlurm(%q): error %v, want %q", tc.pattern, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ExpandSlurm(%q) = %q, %v; want %q", tc.pattern, got, err, tc.want)
		}
	}
}

func TestScriptOptions(t *testing.T) {
	script := `#!/bin/bash
# a comment
#GANGRUN --nodes 2:4
#GANGRUN --name "my job" --env 'A=b c'
#GANGRUNX --ignored
#SBATCH --nodes 9

python train.py
#GANGRUN --after-the-command-is-ignored
`
	got, err := ScriptOptions(script)
	want := []string{"--nodes", "2:4", "--name", "my job", "--env", "A=b c"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ScriptOptions = %q, %v; want %q", got, err, want)
	}
	// A Slurm script alone is refused, naming its first #SBATCH line: its options would
	// be lost; with #GANGRUN lines beside them, the #SBATCH lines are Slurm's.
	if _, err := ScriptOptions("#!/bin/sh\n# x\n#SBATCH --gpus-per-node=2\n#SBATCH --time=10\nhostname\n"); err == nil ||
		!strings.Contains(err.Error(), "script line 3") || !strings.Contains(err.Error(), "#SBATCH") {
		t.Errorf("a script of #SBATCH lines only: error %v, want one naming line 3", err)
	}
	if got, err := ScriptOptions("#!/bin/sh\n#SBATCH --nodes=2\nhostname\n#GANGRUN --nodes 9\n"); err == nil {
		t.Errorf("#SBATCH lines and a #GANGRUN line after the first command: %q, want refused (the #GANGRUN line does not count)", got)
	}
	if _, err := ScriptOptions("#GANGRUN --name \"unclosed\n"); err == nil || !strings.Contains(err.Error(), "script line 1") {
		t.Errorf("an unclosed quote: error %v, want one naming line 1", err)
	}
	if HasCommand("#!/bin/sh\n#GANGRUN --nodes 2\n\n# nothing\n") || !HasCommand("#!/bin/sh\ntrue\n") {
		t.Error("HasCommand: a script of comments has none; one with a line has one")
	}
	if got := Interpreter("#!/usr/bin/env python3\nprint(1)\n"); !slices.Equal(got, []string{"/usr/bin/env", "python3"}) {
		t.Errorf("Interpreter = %q", got)
	}
	if got := Interpreter("echo hi\n"); !slices.Equal(got, []string{"/bin/sh"}) {
		t.Errorf("Interpreter without #! = %q, want /bin/sh", got)
	}
}

// TestLostWhy: a running job's node is lost when it is down with no step running there,
// drained, its step gone after taking the GPUs over, or no step StepStartTimeout after
// it joined the job; a node whose step runs (its agent restarting or not), or has not
// had the time to start, is not.
func TestLostWhy(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cl := &allocator.Cluster{Nodes: map[string]*allocator.NodeState{
		"up":      {Up: true, AliveSession: "agent-up"},
		"down":    {Up: false},
		"drained": {Up: true, AliveSession: "agent-drained", Drain: &allocator.Drain{Reason: "GPU 0 failed: Xid 79"}},
	}}
	g := allocator.Grant{ID: "7", Nodes: []allocator.GrantNode{{Name: "up", Session: "agent-up"}, {Name: "down"}, {Name: "drained", Session: "agent-drained"}}}
	stepped := allocator.Grant{ID: "7", Nodes: []allocator.GrantNode{{Name: "up", Session: "step-session"}}}
	recent := Job{State: State{NodesSince: now.Add(-5 * time.Second)}}
	old := Job{State: State{NodesSince: now.Add(-StepStartTimeout - time.Second)}}
	running := map[string]StepRecord{"up": {Node: "up"}}
	for _, tc := range []struct {
		name  string
		g     allocator.Grant
		j     Job
		node  string
		steps map[string]StepRecord
		want  string
	}{
		{"step running", g, old, "up", running, ""},
		{"step starting", g, recent, "up", nil, ""},
		{"step never started", g, old, "up", nil, "did not start on node up within 30s"},
		{"step gone after it took the GPUs", stepped, recent, "up", nil, "step on node up ended"},
		{"node down", g, recent, "down", nil, "node down is down"},
		// Its agent restarting (an upgrade): the step runs on, the node is not lost.
		{"agent down, step running", g, old, "down", map[string]StepRecord{"down": {Node: "down"}}, ""},
		{"unregistered, step running", g, old, "gone", map[string]StepRecord{"gone": {Node: "gone"}}, ""},
		{"node drained", g, recent, "drained", nil, "was drained: GPU 0 failed: Xid 79"},
		{"node outside the grant", allocator.Grant{ID: "7"}, recent, "up", nil, "left the job's grant"},
		{"step ended and said so", g, Job{State: State{NodesSince: old.State.NodesSince, StepsEnded: []string{"up"}}}, "up", nil, ""},
	} {
		got := lostWhy(cl, tc.g, tc.j, tc.node, tc.steps, now)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: lostWhy = %q, want %q", tc.name, got, tc.want)
		}
	}
	if !healthy(cl, "up") || healthy(cl, "down") || healthy(cl, "drained") || healthy(cl, "unknown") {
		t.Error("healthy: only an up, undrained node is")
	}
}

// TestRequestAfterLosingNodes: the first placement waits for the spares; a placement
// again takes them when free, and keeps away from the excluded nodes only.
func TestRequestAfterLosingNodes(t *testing.T) {
	spec := Spec{ID: "9", MinNodes: 2, MaxNodes: 2, SpareNodes: 1, GPUsPerNode: 4}
	first := request(spec, false, nil)
	again := request(spec, true, []string{"gpu-b"})
	if first.Nodes != 3 || first.MaxNodes != 3 || len(first.Exclude) != 0 {
		t.Errorf("first placement: %d..%d nodes excluding %v, want 3..3 excluding none", first.Nodes, first.MaxNodes, first.Exclude)
	}
	if again.Nodes != 2 || again.MaxNodes != 3 || !slices.Equal(again.Exclude, []string{"gpu-b"}) {
		t.Errorf("placement again: %d..%d nodes excluding %v, want 2..3 excluding gpu-b", again.Nodes, again.MaxNodes, again.Exclude)
	}
}
