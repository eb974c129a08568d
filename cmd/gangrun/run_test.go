package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/torchtest"
)

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// python returns Debian's interpreter with torch 1.13 (torchtest.Debian): the tests
// whose outcome cannot differ between torch versions run on it alone; the others run
// on every installation through torchtest.Each.
func python(t *testing.T) string {
	t.Helper()
	return torchtest.Debian(t).Path
}

// torchrunOf returns the torchrun of installation py: torch 2.x's own console script,
// or, for Debian's torch 1.13, the shim that lets its torchrun start on Python 3.11
// (testdata/bin/torchrun).
func torchrunOf(t *testing.T, py torchtest.Python) string {
	t.Helper()
	if py.Major() == 1 {
		return filepath.Join(repoRoot(t), "cmd", "gangrun", "testdata", "bin", "torchrun")
	}
	return filepath.Join(py.Bin, "torchrun")
}

// gangrunResult is one finished gangrun process.
type gangrunResult struct {
	stdout, stderr string
	code           int
}

// runGangrun runs the built binary to completion (at most 3 minutes).
func runGangrun(t *testing.T, extraEnv []string, args ...string) gangrunResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gangrunBin, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gangrun %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("gangrun %v did not finish in time; stderr:\n%s", args, stderr.String())
	}
	return gangrunResult{stdout.String(), stderr.String(), code}
}

// testMark returns a unique KEY=VALUE to put in worker environments, and registers a
// cleanup that fails the test if any process carrying it is still around.
func testMark(t *testing.T) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	mark := "GANGRUN_TEST_MARK=" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		var alive []string
		deadline := time.Now().Add(5 * time.Second)
		for {
			alive = marked(mark)
			if len(alive) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(alive) > 0 {
			t.Errorf("processes left behind: %v", alive)
			for _, p := range alive {
				if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	return mark
}

// marked lists the processes (alive or zombie) whose environment holds mark.
func marked(mark string) []string {
	var out []string
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range envs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(mark+"\x00")) {
			continue
		}
		dir := filepath.Dir(p)
		stat, _ := os.ReadFile(filepath.Join(dir, "stat"))
		out = append(out, filepath.Base(dir)+" "+strings.TrimSpace(string(stat)))
	}
	return out
}

func TestRunUsageErrors(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	touch := []string{"/bin/sh", "-c", "touch " + marker}
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	used := filepath.Join(dir, "used-logs")
	if err := os.MkdirAll(filepath.Join(used, "attempt_0", "rank_0"), 0o755); err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(repoRoot(t), "cmd", "gangrun", "testdata", "bin", "torchrun")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", []string{"run"}, 2, "no command to run"},
		{"no command after --", []string{"run", "--"}, 2, "no command to run"},
		{"nproc zero", append([]string{"run", "--nproc-per-node", "0", "--"}, touch...), 2, `--nproc-per-node "0"`},
		{"nproc negative", append([]string{"run", "--nproc-per-node=-3", "--"}, touch...), 2, `--nproc-per-node "-3"`},
		{"nproc not a number", append([]string{"run", "--nproc-per-node", "many", "--"}, touch...), 2, `--nproc-per-node "many"`},
		{"unknown flag", append([]string{"run", "--frobnicate", "--"}, touch...), 2, "unknown flag: --frobnicate"},
		{"bad backoff", append([]string{"run", "--restart-backoff", "soon", "--"}, touch...), 2, `--restart-backoff "soon"`},
		{"bad duration", append([]string{"run", "--term-timeout", "10", "--"}, touch...), 2, "--term-timeout"},
		{"bad nnodes", append([]string{"run", "--nnodes", "2:1", "--"}, touch...), 2, `--nnodes "2:1"`},
		{"bad env", append([]string{"run", "--env", "RANK=4", "--"}, touch...), 2, "RANK is set by gangrun"},
		{"env against chosen devices", append([]string{"run", "--topology-file", filepath.Join(inventories, "dgx-a100-mig.json"), "--env", "CUDA_VISIBLE_DEVICES=0", "--"}, touch...), 2,
			"--env CUDA_VISIBLE_DEVICES=0: gangrun sets CUDA_VISIBLE_DEVICES=MIG-"},
		{"bad log format", append([]string{"run", "--log-format", "xml", "--"}, touch...), 2, `--log-format "xml"`},
		{"torchrun conflict", []string{"run", "--nproc-per-node", "2", "--", shim, "--nproc_per_node=4", "t.py"}, 2,
			"torchrun --nproc_per_node=4 conflicts with gangrun's --nproc-per-node 2"},
		{"torchrun restarts", []string{"run", "--", shim, "--max-restarts", "2", "t.py"}, 2,
			"torchrun --max-restarts 2 conflicts with gangrun's --max_restarts=0"},
		{"checkpoint dir is a file", append([]string{"run", "--checkpoint-dir", file, "--"}, touch...), 2, "--checkpoint-dir " + file + ": is a file, not a directory"},
		{"consul port out of range", append([]string{"run", "--coordinator", "consul://127.0.0.1:99999", "--job-id", "j", "--"}, touch...), 2, `port "99999": want 1..65535`},
		{"consul without a port", append([]string{"run", "--coordinator", "consul://127.0.0.1", "--job-id", "j", "--"}, touch...), 2, `coordinator "consul://127.0.0.1": want consul://HOST:PORT`},
		{"node name with a slash", append([]string{"run", "--coordinator", "consul://127.0.0.1:1", "--job-id", "j", "--node-name", "a/b", "--"}, touch...), 2, `--node-name "a/b": only letters`},
		{"advertise addr not an IP", append([]string{"run", "--advertise-addr", "notanip", "--"}, touch...), 2, `--advertise-addr "notanip": want an IP address`},
		{"resume arg without a checkpoint dir", append([]string{"run", "--resume-arg", "--resume", "--"}, touch...), 2, "--resume-arg --resume needs --checkpoint-dir"},
		{"log dir is a file", append([]string{"run", "--log-dir", file, "--"}, touch...), 2, "--log-dir " + file + ": is a file, not a directory"},
		{"log dir under a file", append([]string{"run", "--log-dir", filepath.Join(file, "logs"), "--"}, touch...), 2, "--log-dir " + filepath.Join(file, "logs") + ": cannot be created: " + file + " is a regular file, not a directory"},
		{"log dir in /proc", append([]string{"run", "--log-dir", "/proc/gangrun-logs", "--"}, touch...), 2, "--log-dir /proc/gangrun-logs: cannot be created: /proc is in the kernel's proc file system, where no files can be created"},
		{"log dir is /proc/1", append([]string{"run", "--log-dir", "/proc/1", "--"}, touch...), 2, "--log-dir /proc/1: cannot be written: /proc/1 is in the kernel's proc file system, where no files can be created"},
		{"log dir of an earlier run", append([]string{"run", "--log-dir", used, "--"}, touch...), 2, "--log-dir " + used + " already holds attempt_0 (an earlier run's logs): give each run its own directory"},
		{"command is a directory", []string{"run", "--", dir}, 126, dir + ": is a directory, not a command"},
		{"command not executable", []string{"run", "--", file}, 126, file + ": is not executable (no execute permission)"},
		{"empty command", []string{"run", "--", ""}, 127, "command not found: the command after -- is an empty string"},
		{"missing command", []string{"run", "--", "no-such-trainer-9f2"}, 127, "command not found: no-such-trainer-9f2"},
		{"missing command path", []string{"run", "--", "/nonexistent/train"}, 127, "command not found: /nonexistent/train"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			e := &env{stdout: &stdout, stderr: &stderr, getenv: os.Getenv}
			code := dispatch(context.Background(), e, tc.args)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.code, stderr.String())
			}
			msg := stderr.String()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("stderr %q does not contain %q", msg, tc.want)
			}
			if n := strings.Count(strings.TrimSpace(msg), "\n"); n != 0 {
				t.Errorf("want a one-line error, got %d lines:\n%s", n+1, msg)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("a worker started")
			}
		})
	}
}

func TestRunSIGKILLLeavesNoWorker(t *testing.T) {
	mark := testMark(t)
	dir := t.TempDir()
	tmp := t.TempDir() // gangrun's scratch directory (error files) goes here
	// Each worker leaves a grandchild in its process group; after gangrun is SIGKILLed
	// the parent-death signal takes the workers and the guardian the grandchildren and
	// the scratch directory.
	cmd := exec.Command(gangrunBin, "run", "--nproc-per-node", "3", "--",
		"/bin/sh", "-c", `sleep 300 & touch `+dir+`/ready-$RANK; wait`)
	cmd.Env = append(os.Environ(), mark, "TMPDIR="+tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForFiles(t, dir, "ready-0", "ready-1", "ready-2")
	if n := len(marked(mark)); n < 6 {
		t.Fatalf("expected at least 6 marked processes (3 workers, 3 grandchildren), found %d", n)
	}
	if scratch, _ := filepath.Glob(filepath.Join(tmp, "gangrun-*")); len(scratch) != 1 {
		t.Fatalf("scratch dirs before the kill: %v, want one", scratch)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitUntil(t, func() bool {
		scratch, _ := filepath.Glob(filepath.Join(tmp, "gangrun-*"))
		return len(scratch) == 0
	}, "the guardian removing the scratch directory")
	// testMark's cleanup asserts that nothing carrying the mark is left.
}

func TestRunSignalsReachEveryWorker(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			mark := testMark(t)
			dir := t.TempDir()
			// Workers log every signal they get; USR1 and USR2 leave them running, the
			// terminating signal ends them.
			script := `log=` + dir + `/got-$RANK
trap 'echo USR1 >> $log' USR1
trap 'echo USR2 >> $log' USR2
trap 'echo ` + sigName(sig) + ` >> $log; exit 0' ` + sigName(sig) + `
touch ` + dir + `/ready-$RANK
while true; do sleep 0.05; done`
			cmd, stderr := startTwoShellWorkers(t, mark, dir, "5s", script)
			for _, s := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
				if err := cmd.Process.Signal(s); err != nil {
					t.Fatal(err)
				}
				waitForLine(t, dir, sigName(s), 0, 1)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
				t.Errorf("gangrun ended with %v, want exit %d; stderr:\n%s", err, 128+int(sig), stderr.String())
			}
			waitForLine(t, dir, sigName(sig), 0, 1)
		})
	}
}

// startTwoShellWorkers starts the gangrun binary running `sh -c script` as 2 workers
// with mark in their environment and the given --term-timeout, and waits until both
// have touched dir/ready-$RANK. It returns the command and its stderr.
func startTwoShellWorkers(t *testing.T, mark, dir, termTimeout, script string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(gangrunBin, "run", "--nproc-per-node", "2", "--term-timeout", termTimeout, "--", "/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), mark)
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForFiles(t, dir, "ready-0", "ready-1")
	return cmd, stderr
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGQUIT:
		return "QUIT"
	case syscall.SIGUSR1:
		return "USR1"
	case syscall.SIGUSR2:
		return "USR2"
	}
	return s.String()
}

// waitForLine waits until every rank's log in dir holds line.
func waitForLine(t *testing.T, dir, line string, ranks ...int) {
	t.Helper()
	waitUntil(t, func() bool {
		for _, r := range ranks {
			b, _ := os.ReadFile(filepath.Join(dir, "got-"+strconv.Itoa(r)))
			if !strings.Contains(string(b), line+"\n") {
				return false
			}
		}
		return true
	}, "every rank logged "+line)
}

func waitForFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	waitUntil(t, func() bool {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				return false
			}
		}
		return true
	}, "files "+strings.Join(names, ", "))
}

func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var resumedRE = regexp.MustCompile(`(?m)^\[rank(\d+)\]: resumed from step (\d+)$`)

// resumedSteps maps each rank to the step it printed "resumed from step N" for.
func resumedSteps(out string) map[int]int {
	m := map[int]int{}
	for _, g := range resumedRE.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(g[1])
		s, _ := strconv.Atoi(g[2])
		m[r] = s
	}
	return m
}

func TestRunPyTorchRestartsFromCheckpoint(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		py := tp.Path
		mark := testMark(t)
		dir := t.TempDir()
		res := runGangrun(t, []string{mark}, "run", "--nproc-per-node", "2", "--restart-backoff", "0s", "--warm-delay", "0s",
			"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--log-dir", filepath.Join(dir, "logs"), "--",
			py, filepath.Join(repoRoot(t), "scripts", "examples", "train_ddp.py"),
			"--steps", "60", "--ckpt-every", "10", "--fail-at-step", "35")
		if res.code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", res.code, res.stderr)
		}
		// The failure at step 35 on the first attempt; the restart resumes every rank from
		// step 30, the last checkpoint at or before the failure, and runs to step 60.
		if got := resumedSteps(res.stdout); len(got) != 2 || got[0] != 30 || got[1] != 30 {
			t.Errorf("resumed steps by rank = %v, want both ranks at 30\nstdout:\n%s", got, res.stdout)
		}
		if !strings.Contains(res.stdout, "[rank0]: finished at step 60") {
			t.Errorf("no finish at step 60:\n%s", res.stdout)
		}
		for _, want := range []string{"rank 1 (local rank 1)", "injected failure at step 35", "restarting the gang"} {
			if !strings.Contains(res.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, res.stderr)
			}
		}
		// The restart ran the trainer from standby interpreters (warm restarts are the
		// default for a Python script).
		if !strings.Contains(res.stderr, `"attempt": 1, "warm": 2, "cold": 0`) {
			t.Errorf("attempt 1 did not start warm:\n%s", res.stderr)
		}
		// The second attempt's logs hold the resume line, without the console prefix.
		log, err := os.ReadFile(filepath.Join(dir, "logs", "attempt_1", "rank_1", "stdout.log"))
		if err != nil || !strings.Contains(string(log), "resumed from step 30\n") || strings.Contains(string(log), "[rank") {
			t.Errorf("attempt_1/rank_1/stdout.log = %q, %v", log, err)
		}
	})
}

// TestRunWarmRestartsFlag: a Python script's restart is warm when its standby was
// started (--warm-delay 0s: with the workers), cold with --warm-restarts=false, and cold,
// saying why, when the attempt failed within the default --warm-delay (5s), before its
// standbys were due.
func TestRunWarmRestartsFlag(t *testing.T) {
	py := python(t)
	mark := testMark(t)
	script := filepath.Join(t.TempDir(), "t.py")
	if err := os.WriteFile(script, []byte("import os, sys\nprint('attempt', os.environ['GANGRUN_ATTEMPT'])\nsys.exit(3 if os.environ['GANGRUN_ATTEMPT'] == '0' else 0)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag       string
		warm, told bool // told: the line saying the standbys were not due yet
	}{{"--warm-delay=0s", true, false}, {"--warm-restarts=false", false, false}, {"--warm-restarts", false, true}} {
		res := runGangrun(t, []string{mark}, "run", "--nproc-per-node", "1", "--max-restarts", "1", "--restart-backoff", "0s", c.flag, "--", py, script)
		if res.code != 0 || !strings.Contains(res.stdout, "[rank0]: attempt 1") {
			t.Fatalf("%s: exit %d; stdout:\n%s\nstderr:\n%s", c.flag, res.code, res.stdout, res.stderr)
		}
		if got := strings.Contains(res.stderr, `"attempt": 1, "warm": 1, "cold": 0`); got != c.warm {
			t.Errorf("%s: attempt 1 warm %v, want %v; stderr:\n%s", c.flag, got, c.warm, res.stderr)
		}
		if got := strings.Contains(res.stderr, "starting cold: the last attempt ended within --warm-delay"); got != c.told {
			t.Errorf("%s: told the standbys were not due %v, want %v; stderr:\n%s", c.flag, got, c.told, res.stderr)
		}
	}
}

// TestRunWarmStandbysFork: after the first warm attempt, each rank's standby is a fork
// of the one activated before it, so its modules are imported once for the whole run:
// three warm attempts, one import per rank. Every warm worker still runs the script
// as a fresh interpreter would, as gangrun's child (its parent pid is gangrun's, not an
// earlier worker's), each a process of its own; and nothing is left behind (testMark).
// A standby with a second thread does not fork (a fork copies one thread): the log says
// so and the next attempt's standby is started afresh, still warm.
func TestRunWarmStandbysFork(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	imports := filepath.Join(dir, "imports")
	mod := "import os, threading, time\n" +
		"with open(" + strconv.Quote(imports) + ", 'a') as f:\n    f.write('%d\\n' % os.getpid())\n" +
		"if os.environ.get('WARMMOD_THREAD'):\n    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
	if err := os.WriteFile(filepath.Join(dir, "warmmod.py"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "t.py")
	// Each rank prints, then waits for the other's line before attempts 0-2 fail.
	if err := os.WriteFile(script, []byte(`import os, sys, time
a = int(os.environ["GANGRUN_ATTEMPT"])
print("attempt", a, "pid", os.getpid(), "ppid", os.getppid(), "imported", "warmmod" in sys.modules,
      "name", __name__, "argv", sys.argv[1:], flush=True)
done = os.path.join(os.environ["SYNC_DIR"], "%d-%s" % (a, os.environ["RANK"]))
open(done, "w").close()
for _ in range(600):
    if all(os.path.exists(os.path.join(os.environ["SYNC_DIR"], "%d-%d" % (a, r))) for r in (0, 1)):
        break
    time.sleep(0.05)
sys.exit(3 if a < 3 else 0)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^\[rank(\d)\]: attempt (\d) pid (\d+) ppid (\d+) imported (\w+) name __main__ argv \['x'\]$`)
	for _, threaded := range []bool{false, true} {
		os.Remove(imports)
		env := []string{testMark(t), "PYTHONPATH=" + dir, "SYNC_DIR=" + t.TempDir()}
		if threaded {
			env = append(env, "WARMMOD_THREAD=1")
		}
		res := runGangrun(t, env, "run", "--nproc-per-node", "2", "--max-restarts", "3", "--restart-backoff", "0s",
			"--warm-delay", "0s", "--warm-imports", "warmmod", "--", py, script, "x")
		if res.code != 0 {
			t.Fatalf("threaded %v: exit %d; stdout:\n%s\nstderr:\n%s", threaded, res.code, res.stdout, res.stderr)
		}
		for a := 1; a <= 3; a++ {
			if !strings.Contains(res.stderr, fmt.Sprintf(`"attempt": %d, "warm": 2, "cold": 0`, a)) {
				t.Errorf("threaded %v: attempt %d not warm on both ranks; stderr:\n%s", threaded, a, res.stderr)
			}
		}
		pids, ppids := map[string]bool{}, map[string]bool{}
		ms := line.FindAllStringSubmatch(res.stdout, -1)
		for _, m := range ms {
			pids[m[3]] = true
			ppids[m[4]] = true
			if want := m[2] != "0"; (m[5] == "True") != want {
				t.Errorf("threaded %v: rank %s attempt %s: module imported %s, want %v", threaded, m[1], m[2], m[5], want)
			}
		}
		if len(ms) != 8 || len(pids) != 8 || len(ppids) != 1 {
			t.Errorf("threaded %v: want 8 worker lines, 8 pids, 1 parent (gangrun); got %d lines, %d pids, %d parents:\n%s",
				threaded, len(ms), len(pids), len(ppids), res.stdout)
		}
		data, err := os.ReadFile(imports)
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(string(data), "\n")
		told := strings.Contains(res.stderr, "standbys start afresh: a standby had more than one thread")
		if !threaded && (n != 2 || told) {
			t.Errorf("imports %d (want 2: one per rank, then forks), told %v; stderr:\n%s", n, told, res.stderr)
		}
		if threaded && (n < 6 || !told) {
			t.Errorf("threaded: imports %d (want 6 or more: a fresh standby per rank for each warm attempt), told %v; stderr:\n%s", n, told, res.stderr)
		}
	}
}

// TestRunWarmForksSeedTorchAnew: a fresh interpreter seeds torch's default CPU
// generator anew, so each warm attempt's worker, forked from the same standby, must
// too (before the fix, attempts 1-3 all drew the same torch.rand).
func TestRunWarmForksSeedTorchAnew(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		py := tp.Path
		script := filepath.Join(t.TempDir(), "t.py")
		if err := os.WriteFile(script, []byte(`import os, sys, torch
a = int(os.environ["GANGRUN_ATTEMPT"])
print("attempt", a, "seed", torch.initial_seed(), flush=True)
sys.exit(3 if a < 3 else 0)
`), 0o644); err != nil {
			t.Fatal(err)
		}
		res := runGangrun(t, []string{testMark(t)}, "run", "--nproc-per-node", "1", "--max-restarts", "3",
			"--restart-backoff", "0s", "--warm-delay", "0s", "--", py, script)
		if res.code != 0 {
			t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		for a := 2; a <= 3; a++ {
			if !strings.Contains(res.stderr, fmt.Sprintf(`"attempt": %d, "warm": 1, "cold": 0`, a)) {
				t.Fatalf("attempt %d not warm; stderr:\n%s", a, res.stderr)
			}
		}
		ms := regexp.MustCompile(`(?m)^\[rank0\]: attempt \d seed (\d+)$`).FindAllStringSubmatch(res.stdout, -1)
		seeds := map[string]bool{}
		for _, m := range ms {
			seeds[m[1]] = true
		}
		if len(ms) != 4 || len(seeds) != 4 {
			t.Errorf("want 4 attempts with 4 different torch seeds:\n%s", res.stdout)
		}
	})
}

// TestRunWarmRanksAwaitTheMaster: by default gangrun serves the workers' store on
// MASTER_ADDR:MASTER_PORT before any rank starts (TORCHELASTIC_USE_AGENT_STORE=True),
// so every attempt's rank 1 finds it listening and nothing waits in vain. With torch's
// opt-out (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) rank 0 hosts the store: a warm rank
// other than 0 starts once rank 0 listens there (torch's store client retries a
// refused connection only a second later), here after rank 0's 200 ms pause; where
// rank 0 never listens there, the ranks wait once in vain, the log says so, and later
// attempts do not wait.
func TestRunWarmRanksAwaitTheMaster(t *testing.T) {
	py := python(t)
	script := filepath.Join(t.TempDir(), "t.py")
	if err := os.WriteFile(script, []byte(`import os, socket, sys, time
a, rank = int(os.environ["GANGRUN_ATTEMPT"]), int(os.environ["RANK"])
addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if os.environ.get("LISTEN") and rank == 0:
    time.sleep(0.2)
    s = socket.create_server(addr)
    time.sleep(1)
elif rank == 1:
    try:
        socket.create_connection(addr, timeout=1).close()
        print("attempt", a, "master up", os.environ["TORCHELASTIC_USE_AGENT_STORE"], flush=True)
    except OSError:
        print("attempt", a, "master down", os.environ["TORCHELASTIC_USE_AGENT_STORE"], flush=True)
    time.sleep(0.3)
sys.exit(3 if a < 2 else 0)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		env        []string
		up         []string // attempts whose rank 1 found the store up
		down       []string // ... down
		told       int
		agentStore string
	}{
		{"agent store", nil, []string{"1", "2"}, nil, 0, "True"},
		{"rank 0 listens", []string{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "LISTEN=1"}, []string{"1", "2"}, nil, 0, "False"},
		{"nothing listens", []string{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"}, nil, []string{"2"}, 1, "False"},
	} {
		res := runGangrun(t, append([]string{testMark(t)}, c.env...), "run", "--nproc-per-node", "2", "--max-restarts", "2", "--restart-backoff", "0s",
			"--warm-delay", "0s", "--", py, script)
		if res.code != 0 {
			t.Fatalf("%s: exit %d; stdout:\n%s\nstderr:\n%s", c.name, res.code, res.stdout, res.stderr)
		}
		checked := 0
		for _, a := range c.up {
			if c.agentStore == "False" && !strings.Contains(res.stderr, `"attempt": `+a+`, "warm": 2, "cold": 0`) {
				// Only a warm rank 1 waits for rank 0's store: a standby not ready in
				// time (best effort, as warm restarts are) starts the attempt cold.
				t.Logf("%s: attempt %s did not start both ranks warm; its rank 1 is not checked", c.name, a)
				continue
			}
			checked++
			if !strings.Contains(res.stdout, "[rank1]: attempt "+a+" master up "+c.agentStore) {
				t.Errorf("%s: attempt %s's rank 1 did not find the store up (TORCHELASTIC_USE_AGENT_STORE=%s):\n%s\nstderr:\n%s", c.name, a, c.agentStore, res.stdout, res.stderr)
			}
		}
		if len(c.up) > 0 && checked == 0 {
			t.Errorf("%s: no attempt of %v started warm: nothing was checked; stderr:\n%s", c.name, c.up, res.stderr)
		}
		for _, a := range c.down {
			if !strings.Contains(res.stdout, "[rank1]: attempt "+a+" master down "+c.agentStore) {
				t.Errorf("%s: attempt %s's rank 1 found a store up (TORCHELASTIC_USE_AGENT_STORE=%s):\n%s", c.name, a, c.agentStore, res.stdout)
			}
		}
		if told := strings.Count(res.stderr, "warm ranks no longer wait for rank 0's store"); told != c.told {
			t.Errorf("%s: told %d times (want %d) that the ranks no longer wait; stderr:\n%s", c.name, told, c.told, res.stderr)
		}
	}
}

func TestRunPyTorchNoRestartsReturnsWorkerCode(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		py := tp.Path
		mark := testMark(t)
		res := runGangrun(t, []string{mark}, "run", "--nproc-per-node", "2", "--max-restarts", "0", "--",
			py, filepath.Join(repoRoot(t), "scripts", "examples", "train_ddp.py"),
			"--steps", "20", "--fail-at-step", "5", "--fail-exit-code", "13")
		if res.code != 13 {
			t.Fatalf("exit %d, want the worker's 13; stderr:\n%s", res.code, res.stderr)
		}
		if !strings.Contains(res.stderr, "no restarts left") {
			t.Errorf("stderr lacks 'no restarts left':\n%s", res.stderr)
		}
	})
}

func TestRunWrapsTorchrun(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		mark := testMark(t)
		dir := t.TempDir()
		// Real torchrun (torch 1.13's through the Python 3.11 shim) runs 2 workers; gangrun
		// owns the restart: the first attempt fails at step 25, the second resumes from 20.
		res := runGangrun(t, []string{mark, "PATH=" + tp.Bin + ":" + os.Getenv("PATH")}, "run", "--restart-backoff", "0s", "--checkpoint-dir", filepath.Join(dir, "ckpt"), "--",
			torchrunOf(t, tp), "--nproc_per_node", "2", filepath.Join(repoRoot(t), "scripts", "examples", "train_ddp.py"),
			"--steps", "40", "--ckpt-every", "10", "--fail-at-step", "25")
		if res.code != 0 {
			t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		resumed := regexp.MustCompile(`(?m)^\[node0\]: resumed from step (\d+)$`).FindAllStringSubmatch(res.stdout, -1)
		if len(resumed) != 2 || resumed[0][1] != "20" || resumed[1][1] != "20" {
			t.Errorf("want both torchrun workers resumed from step 20, got %v\nstdout:\n%s", resumed, res.stdout)
		}
		if !strings.Contains(res.stdout, "finished at step 40") {
			t.Errorf("no finish at step 40:\n%s", res.stdout)
		}
		// torchrun's @record main copied its root-cause worker's error into the error file
		// gangrun gave it.
		if !strings.Contains(res.stderr, "injected failure at step 25") {
			t.Errorf("the root cause's message did not reach gangrun's report:\n%s", res.stderr)
		}
	})
}

func TestRunJSONLogFormat(t *testing.T) {
	res := runGangrun(t, nil, "run", "--log-format", "json", "--nproc-per-node", "2", "--", "/bin/true")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
	if len(lines) < 2 {
		t.Fatalf("want gangrun's log lines on stderr, got %q", res.stderr)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["msg"] == nil || m["level"] == nil {
			t.Errorf("not a JSON log line: %q (%v)", l, err)
		}
	}
}

// TestRunKillsWhatLeftTheProcessGroup: a worker's child that starts its own session
// (setsid) escapes signals to the worker's process group; gangrun, a child subreaper,
// kills it when the attempt ends, on success and on SIGTERM alike.
func TestRunKillsWhatLeftTheProcessGroup(t *testing.T) {
	for _, how := range []string{"success", "sigterm"} {
		t.Run(how, func(t *testing.T) {
			mark := testMark(t) // fails the test if the escaped sleep is still around
			dir := t.TempDir()
			// The escaped process itself says it is ready, after setsid(2): a ready file
			// touched by the worker could come first, and the group-wide SIGTERM would
			// then kill the child before it escaped (1 run in 10 under load).
			ready := dir + `/ready-$RANK`
			script := `setsid sh -c 'touch ` + ready + `; exec sleep 300' >/dev/null 2>&1 & `
			if how == "success" {
				script += `while [ ! -e ` + ready + ` ]; do sleep 0.05; done; exit 0`
			} else {
				script += `sleep 300`
			}
			cmd, stderr := startTwoShellWorkers(t, mark, dir, "1s", script)
			if how == "sigterm" {
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			_ = cmd.Wait()
			want := map[string]int{"success": 0, "sigterm": 143}[how]
			if code := cmd.ProcessState.ExitCode(); code != want {
				t.Fatalf("exit %d, want %d\n%s", code, want, stderr.String())
			}
			if left := marked(mark); len(left) > 0 {
				t.Errorf("still running when gangrun exited: %v", left)
			}
			if !strings.Contains(stderr.String(), "killed processes the workers left outside their process groups") {
				t.Errorf("gangrun does not say it killed the escaped processes:\n%s", stderr.String())
			}
		})
	}
}

// TestRunReapsOrphansDuringTheAttempt: a worker's double-forked helper that exits while
// the attempt runs is re-parented to gangrun (a subreaper) and must not stay a zombie
// until the attempt ends.
func TestRunReapsOrphansDuringTheAttempt(t *testing.T) {
	mark := testMark(t)
	dir := t.TempDir()
	cmd, _ := startTwoShellWorkers(t, mark, dir, "1s", `(sleep 0.1 &); touch `+dir+`/ready-$RANK; sleep 30`)
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	zombies := func() int {
		n := 0
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			s := string(b)
			fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
			if len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(cmd.Process.Pid) {
				n++
			}
		}
		return n
	}
	waitUntilFor(t, 4*time.Second, func() bool { return zombies() > 0 }, "the helpers to exit and become gangrun's zombies")
	waitUntilFor(t, 15*time.Second, func() bool { return zombies() == 0 }, "gangrun to reap its zombies while the workers run")
	if cmd.ProcessState != nil {
		t.Fatal("gangrun exited: the zombies went with it, which proves nothing")
	}
}

// TestRunLeavesInheritedChildrenAlone: a shell that sends its output through a process
// substitution and then execs gangrun (`exec > >(tee run.log); exec gangrun run ...`)
// hands gangrun its tee as a child. The sweep after each attempt kills only what came
// from the workers: the tee lives on, and every attempt's output reaches the log.
func TestRunLeavesInheritedChildrenAlone(t *testing.T) {
	mark := testMark(t)
	dir := t.TempDir()
	logFile := filepath.Join(dir, "run.log")
	script := `exec > >(tee ` + logFile + ` >/dev/null) 2>&1
exec ` + gangrunBin + ` run --nproc-per-node 1 --max-restarts 2 --restart-backoff 0s -- /bin/sh -c 'echo "attempt $GANGRUN_ATTEMPT"; exit 3'`
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), mark)
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 3 {
		t.Fatalf("exit %d, want the worker's 3 after its restarts\n%s", code, out)
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[rank0]: attempt 0", "[rank0]: attempt 1", "[rank0]: attempt 2", "no restarts left"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the tee'd log lacks %q (the tee was killed?):\n%s", want, data)
		}
	}
}
