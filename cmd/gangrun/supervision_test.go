package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/topology"
)

// TestSupervisionFlagsSameOnRunAndSubmit: every supervision flag is on `run` and on
// `submit` with the same type, default and help, and reads the same in both --help
// texts.
func TestSupervisionFlagsSameOnRunAndSubmit(t *testing.T) {
	var sf supervisionFlags
	shared := pflag.NewFlagSet("supervision", pflag.ContinueOnError)
	sf.register(shared)
	_, runHelp, _ := inProcess("run", "--help")
	_, submitHelp, _ := inProcess("submit", "--help")
	n := 0
	shared.VisitAll(func(f *pflag.Flag) {
		n++
		runLine, submitLine := helpLine(runHelp, f.Name), helpLine(submitHelp, f.Name)
		if runLine == "" || runLine != submitLine {
			t.Errorf("--%s:\nrun --help:    %q\nsubmit --help: %q", f.Name, runLine, submitLine)
		}
	})
	for _, name := range []string{"max-restarts", "restart-backoff", "no-restart-exit-code", "hang-timeout", "warm-restarts", "warm-imports", "warm-delay"} {
		if shared.Lookup(name) == nil {
			t.Errorf("--%s is not a supervision flag", name)
		}
	}
	if n == 0 {
		t.Fatal("no supervision flags")
	}
}

// TestSupervisionFlagsReachTheSupervisor: the supervision flags, as `run` and `submit`
// take them, are recorded in their encoding (the defaults as max_restarts alone, an
// older release's record) and reach the supervisor's Config as given:
// --no-restart-exit-code 0 is no code, --warm-delay 0s standbys at once.
func TestSupervisionFlagsReachTheSupervisor(t *testing.T) {
	inv, err := topology.LoadFile(filepath.Join(inventories, "cpu-only.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args       []string
		record     string
		exitCode   int
		warm       bool
		warmDelay  time.Duration
		maxRestart int
	}{
		{nil, `{"max_restarts":3}`, launcher.DefaultNoRestartExitCode, true, launcher.DefaultWarmDelay, 3},
		{[]string{"--no-restart-exit-code", "99", "--warm-delay", "5s", "--restart-backoff", "exp", "--warm-restarts"},
			`{"max_restarts":3}`, launcher.DefaultNoRestartExitCode, true, launcher.DefaultWarmDelay, 3},
		{[]string{"--no-restart-exit-code", "0"}, `{"max_restarts":3,"no_restart_exit_code":-1}`, 0, true, launcher.DefaultWarmDelay, 3},
		{[]string{"--no-restart-exit-code", "7"}, `{"max_restarts":3,"no_restart_exit_code":7}`, 7, true, launcher.DefaultWarmDelay, 3},
		{[]string{"--warm-delay", "0s"}, `{"max_restarts":3,"warm_delay":-1}`, launcher.DefaultNoRestartExitCode, true, 0, 3},
		{[]string{"--warm-delay", "2s"}, `{"max_restarts":3,"warm_delay":2000000000}`, launcher.DefaultNoRestartExitCode, true, 2 * time.Second, 3},
		{[]string{"--warm-restarts=false", "--max-restarts", "0"}, `{"max_restarts":0,"cold_restarts":true}`, launcher.DefaultNoRestartExitCode, false, launcher.DefaultWarmDelay, 0},
	} {
		var f supervisionFlags
		fs := pflag.NewFlagSet("supervision", pflag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		sup, err := f.supervision()
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if b, _ := json.Marshal(sup); string(b) != tc.record {
			t.Errorf("%v: recorded as %s, want %s", tc.args, b, tc.record)
		}
		p, err := launcher.Prepare(context.Background(), launcher.Spec{Command: []string{"/bin/true"}, Inventory: inv, NodeName: "a", Supervision: sup})
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		c := p.Config
		p.Close()
		if c.NoRestartExitCode != tc.exitCode || c.WarmRestarts != tc.warm || c.WarmDelay != tc.warmDelay || c.MaxRestarts != tc.maxRestart {
			t.Errorf("%v: Config's no-restart code %d, warm %v, warm delay %s, max restarts %d; want %d, %v, %s, %d", tc.args,
				c.NoRestartExitCode, c.WarmRestarts, c.WarmDelay, c.MaxRestarts, tc.exitCode, tc.warm, tc.warmDelay, tc.maxRestart)
		}
	}
}

// helpLine is flag name's line in a --help text ("" when it has none).
func helpLine(help, name string) string {
	for _, l := range strings.Split(help, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		flag, _, _ := strings.Cut(f[0], "[") // --warm-restarts[=true|false]
		if flag == "--"+name {
			return strings.Join(f, " ") // pflag pads the columns to each command's longest flag
		}
	}
	return ""
}

// TestSubmitHangTimeout: a submitted job with --hang-timeout whose first attempt hangs
// (no output) is stopped for it and restarted, as `gangrun run` does; the job
// completes on its second attempt, the first recorded as a hang.
func TestSubmitHangTimeout(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit("--gpus-per-node", "1", "--hang-timeout", "2s", "--max-restarts", "1", "--restart-backoff", "0s", "--",
		"/bin/sh", "-c", `echo "attempt $GANGRUN_ATTEMPT"; if [ "$GANGRUN_ATTEMPT" = 0 ]; then exec sleep 300; fi`)
	m := c.waitState(id, job.Completed, 90*time.Second)
	attempts, _ := m["attempts"].([]any)
	if len(attempts) != 2 {
		t.Fatalf("attempts %v, want the hung one and the one after it", m["attempts"])
	}
	if cause, _ := attempts[0].(map[string]any)["cause"].(string); !strings.Contains(cause, "hang-timeout") {
		t.Errorf("the first attempt's cause %q, want the hang timeout", cause)
	}
	if m["restarts"] != float64(1) {
		t.Errorf("restarts %v, want 1", m["restarts"])
	}
	out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if !strings.Contains(string(out), "attempt 1") {
		t.Errorf("output lacks the second attempt:\n%s", out)
	}
}

// TestSubmitWarmRestarts: a submitted Python job's restart is warm when its standby
// was started (--warm-delay 0s: with the workers), and cold with --warm-restarts=false,
// as `gangrun run`'s (TestRunWarmRestartsFlag); the step's log lines in the job's
// output say which.
func TestSubmitWarmRestarts(t *testing.T) {
	py := python(t)
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	script := filepath.Join(dir, "t.py")
	if err := os.WriteFile(script, []byte("import os, sys\nprint('attempt', os.environ['GANGRUN_ATTEMPT'])\nsys.exit(3 if os.environ['GANGRUN_ATTEMPT'] == '0' else 0)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flag string
		warm bool
	}{{"--warm-delay=0s", true}, {"--warm-restarts=false", false}} {
		id := c.submit("--gpus-per-node", "1", "--max-restarts", "1", "--restart-backoff", "0s", tc.flag, "--", py, script)
		c.waitState(id, job.Completed, 90*time.Second)
		log, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(log), "[rank0]: attempt 1") {
			t.Fatalf("%s: no second attempt; output:\n%s", tc.flag, log)
		}
		if warm := strings.Contains(string(log), `"attempt": 1, "warm": 1, "cold": 0`); warm != tc.warm {
			t.Errorf("%s: attempt 1 warm %v, want %v; output:\n%s", tc.flag, warm, tc.warm, log)
		}
	}
}
