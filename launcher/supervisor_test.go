package launcher

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/rendezvous"
)

// syncBuffer is a bytes.Buffer safe for the supervisor's concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testRun is one supervised run of shell workers.
type testRun struct {
	cfg     Config
	mark    string // in every worker's environment, to find leftovers
	stdout  *syncBuffer
	stderr  *syncBuffer
	signals chan os.Signal
}

// newTestRun returns a run of `sh -c script` with n workers, no restarts backoff, and a
// short term timeout.
func newTestRun(t *testing.T, n int, script string) *testRun {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	r := &testRun{mark: "GANGRUN_TEST_MARK_" + hex.EncodeToString(b[:]), stdout: &syncBuffer{}, stderr: &syncBuffer{}, signals: make(chan os.Signal, 4)}
	r.cfg = Config{
		Command:      []string{"/bin/sh", "-c", script},
		NProcPerNode: n, MaxRestarts: 0, Backoff: Backoff{},
		TermTimeout: 2 * time.Second, JobID: "test-job", NodeName: "node-a",
		Env:    EnvConfig{Base: append(os.Environ(), "TEST_MARK="+r.mark)},
		Stdout: r.stdout, Stderr: r.stderr, Report: r.stderr, Signals: r.signals,
		Log: zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(r.stderr), zapcore.DebugLevel)),
	}
	t.Cleanup(func() { assertNoLeftovers(t, r.mark) })
	return r
}

func (r *testRun) run(t *testing.T) Result {
	t.Helper()
	sup, err := New(r.cfg, rendezvous.NewLocal(r.cfg.JobID, r.cfg.MaxRestarts))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return sup.Run(context.Background())
}

// assertNoLeftovers fails when any process still carries mark in its environment.
func assertNoLeftovers(t *testing.T, mark string) {
	t.Helper()
	var alive []string
	deadline := time.Now().Add(3 * time.Second)
	for {
		alive = alive[:0]
		procs, _ := filepath.Glob("/proc/[0-9]*/environ")
		for _, p := range procs {
			data, err := os.ReadFile(p)
			if err != nil || !bytes.Contains(data, []byte("TEST_MARK="+mark)) {
				continue
			}
			pid := filepath.Base(filepath.Dir(p))
			stat, _ := os.ReadFile(filepath.Join("/proc", pid, "stat"))
			alive = append(alive, pid+" "+string(stat))
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(alive) > 0 {
		t.Errorf("processes left behind (zombie or alive): %v", alive)
	}
}

func TestRunSucceedsWithPrefixedOutput(t *testing.T) {
	r := newTestRun(t, 3, `echo "hello from $RANK of $WORLD_SIZE"; echo "err $LOCAL_RANK" >&2`)
	res := r.run(t)
	if res.ExitCode != 0 || res.Attempts != 1 {
		t.Fatalf("exit %d after %d attempts, want 0 after 1; stderr:\n%s", res.ExitCode, res.Attempts, r.stderr)
	}
	for rank := 0; rank < 3; rank++ {
		want := "[rank" + strconv.Itoa(rank) + "]: hello from " + strconv.Itoa(rank) + " of 3\n"
		if !strings.Contains(r.stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
		wantErr := "[rank" + strconv.Itoa(rank) + "]: err " + strconv.Itoa(rank) + "\n"
		if !strings.Contains(r.stderr.String(), wantErr) {
			t.Errorf("stderr lacks %q:\n%s", wantErr, r.stderr)
		}
	}
}

func TestRunLinesAreNeverMixed(t *testing.T) {
	// Four workers each write 300 long lines as fast as they can, without a newline at
	// the very end; every console line must be one whole line of one worker.
	script := `python3 -c '
import os, sys
r = os.environ["RANK"]
for i in range(300):
    sys.stdout.write(("r%s-%d:" % (r, i)) + r * 5000 + "\n")
sys.stdout.write("tail-" + r)
'`
	r := newTestRun(t, 4, script)
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, r.stderr)
	}
	line := regexp.MustCompile(`^\[rank(\d)\]: (?:r(\d)-\d+:(\d+)|tail-(\d))$`)
	lines := strings.Split(strings.TrimSuffix(r.stdout.String(), "\n"), "\n")
	if len(lines) != 4*301 {
		t.Fatalf("got %d lines, want %d", len(lines), 4*301)
	}
	for _, l := range lines {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("mixed or cut line (first 120 bytes): %q", l[:min(len(l), 120)])
		}
		if m[4] != "" {
			if m[4] != m[1] {
				t.Fatalf("tail of rank %s under prefix of rank %s", m[4], m[1])
			}
			continue
		}
		if m[2] != m[1] || m[3] != strings.Repeat(m[1], 5000) {
			t.Fatalf("line of rank %s under prefix of rank %s", m[2], m[1])
		}
	}
}

func TestRunRestartsAfterFailure(t *testing.T) {
	// Rank 1 fails on the first attempt only; the gang restarts and succeeds.
	r := newTestRun(t, 2, `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 7; fi
[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && sleep 30
echo "attempt $GANGRUN_ATTEMPT restarts $TORCHELASTIC_RESTART_COUNT"`)
	r.cfg.MaxRestarts = 2
	start := time.Now()
	res := r.run(t)
	if res.ExitCode != 0 || res.Attempts != 2 {
		t.Fatalf("exit %d after %d attempts, want 0 after 2; stderr:\n%s", res.ExitCode, res.Attempts, r.stderr)
	}
	if res.Failure == nil || res.Failure.Rank != 1 || res.Failure.ExitCode != 7 || res.Failure.Kind != failure.Exit {
		t.Errorf("root cause = %+v, want rank 1 exit 7 (kind %s)", res.Failure, failure.Exit)
	}
	if !strings.Contains(r.stdout.String(), "[rank0]: attempt 1 restarts 1") {
		t.Errorf("second attempt not seen:\n%s", r.stdout)
	}
	// Rank 0 slept 30s on attempt 0; it must have been stopped, not waited for.
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("took %s: the surviving rank was not stopped", took)
	}
	if !strings.Contains(r.stderr.String(), "rank 1 (local rank 1) on node node-a") || !strings.Contains(r.stderr.String(), "exit code 7") {
		t.Errorf("failure report lacks the root cause:\n%s", r.stderr)
	}
}

func TestRunExitCodeWhenRestartsRunOut(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   int
		kind   failure.Kind
	}{
		{"exit code", `[ "$RANK" = 1 ] && exit 3; sleep 30`, 3, failure.Exit},
		{"signal", `[ "$RANK" = 0 ] && kill -KILL $$; sleep 30`, 128 + 9, failure.Signal},
		{"abort", `[ "$RANK" = 0 ] && kill -ABRT $$; sleep 30`, 128 + 6, failure.Signal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRun(t, 2, tc.script)
			r.cfg.MaxRestarts = 1
			res := r.run(t)
			if res.ExitCode != tc.want {
				t.Errorf("exit %d, want %d; stderr:\n%s", res.ExitCode, tc.want, r.stderr)
			}
			if res.Attempts != 2 {
				t.Errorf("%d attempts, want 2 (one restart)", res.Attempts)
			}
			if res.Failure == nil || res.Failure.Kind != tc.kind {
				t.Errorf("root cause %+v, want kind %s", res.Failure, tc.kind)
			}
		})
	}
}

func TestRunKillsWorkerIgnoringSIGTERMAfterTermTimeout(t *testing.T) {
	dir := t.TempDir()
	// Rank 0 ignores SIGTERM and records that it was asked; rank 1 fails.
	r := newTestRun(t, 2, `if [ "$RANK" = 0 ]; then
  trap 'echo term > `+dir+`/got-term' TERM
  echo $$ > `+dir+`/pid
  while true; do sleep 0.1; done
fi
sleep 0.5; exit 1`)
	r.cfg.TermTimeout = 1500 * time.Millisecond
	start := time.Now()
	res := r.run(t)
	took := time.Since(start)
	if res.ExitCode != 1 {
		t.Fatalf("exit %d, want 1", res.ExitCode)
	}
	if _, err := os.Stat(filepath.Join(dir, "got-term")); err != nil {
		t.Errorf("rank 0 never got SIGTERM: %v", err)
	}
	if took < 1500*time.Millisecond {
		t.Errorf("returned after %s, before the term timeout", took)
	}
	pid, _ := os.ReadFile(filepath.Join(dir, "pid"))
	if p, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
		if syscall.Kill(p, 0) == nil {
			t.Errorf("rank 0 (pid %d) still alive", p)
		}
	}
	if !strings.Contains(r.stderr.String(), "SIGKILL") {
		t.Errorf("no SIGKILL warning in log output")
	}
}

func TestRunForwardsSignals(t *testing.T) {
	dir := t.TempDir()
	// Each worker records the signals it gets; SIGUSR1 and SIGUSR2 must not stop the
	// run, SIGTERM must, with exit 128+15.
	r := newTestRun(t, 3, `for s in USR1 USR2 TERM; do trap "echo $s >> `+dir+`/got-\$RANK" $s; done
trap 'echo TERM >> `+dir+`/got-$RANK; exit 0' TERM
touch `+dir+`/ready-$RANK
while true; do sleep 0.05; done`)
	done := make(chan Result, 1)
	go func() { done <- r.run(t) }()
	waitFiles(t, dir, "ready-0", "ready-1", "ready-2")
	r.signals <- syscall.SIGUSR1
	r.signals <- syscall.SIGUSR2
	waitFor(t, func() bool {
		for rank := 0; rank < 3; rank++ {
			b, _ := os.ReadFile(filepath.Join(dir, "got-"+strconv.Itoa(rank)))
			if !strings.Contains(string(b), "USR1") || !strings.Contains(string(b), "USR2") {
				return false
			}
		}
		return true
	})
	select {
	case res := <-done:
		t.Fatalf("run ended on SIGUSR1/SIGUSR2 with exit %d", res.ExitCode)
	case <-time.After(200 * time.Millisecond):
	}
	r.signals <- syscall.SIGTERM
	res := <-done
	if res.ExitCode != 128+15 {
		t.Errorf("exit %d after SIGTERM, want 143", res.ExitCode)
	}
	for rank := 0; rank < 3; rank++ {
		b, _ := os.ReadFile(filepath.Join(dir, "got-"+strconv.Itoa(rank)))
		if !strings.Contains(string(b), "TERM") {
			t.Errorf("rank %d got %q, want TERM among them", rank, b)
		}
	}
}

func TestRunHangTimeout(t *testing.T) {
	r := newTestRun(t, 2, `echo started; sleep 30`)
	r.cfg.HangTimeout = 600 * time.Millisecond
	res := r.run(t)
	if res.ExitCode != 1 || res.Failure == nil || !strings.Contains(res.Failure.Reason, "hang-timeout") || res.Failure.Kind != failure.Hang {
		t.Fatalf("exit %d failure %+v, want a hang failure", res.ExitCode, res.Failure)
	}
}

func TestRunLogDir(t *testing.T) {
	logs, marks := t.TempDir(), t.TempDir()
	// Rank 1 fails attempt 0 only once rank 0 has written both its lines: the gang's
	// SIGTERM would otherwise cut rank 0 short on a loaded machine.
	r := newTestRun(t, 2, `echo "out $RANK attempt $GANGRUN_ATTEMPT"; echo "err $RANK" >&2
touch "`+marks+`/written-$RANK-$GANGRUN_ATTEMPT"
if [ "$GANGRUN_ATTEMPT" = 0 ] && [ "$RANK" = 1 ]; then
  while [ ! -e "`+marks+`/written-0-0" ]; do sleep 0.01; done; exit 1
fi; exit 0`)
	r.cfg.LogDir, r.cfg.Tee, r.cfg.MaxRestarts = logs, false, 1
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	for attempt := 0; attempt < 2; attempt++ {
		for rank := 0; rank < 2; rank++ {
			dir := filepath.Join(logs, "attempt_"+strconv.Itoa(attempt), "rank_"+strconv.Itoa(rank))
			out, err := os.ReadFile(filepath.Join(dir, "stdout.log"))
			if err != nil || string(out) != "out "+strconv.Itoa(rank)+" attempt "+strconv.Itoa(attempt)+"\n" {
				t.Errorf("%s/stdout.log = %q, %v", dir, out, err)
			}
			errb, err := os.ReadFile(filepath.Join(dir, "stderr.log"))
			if err != nil || string(errb) != "err "+strconv.Itoa(rank)+"\n" {
				t.Errorf("%s/stderr.log = %q, %v", dir, errb, err)
			}
		}
	}
	if strings.Contains(r.stdout.String(), "out 0") {
		t.Errorf("--tee=false: worker output reached the console:\n%s", r.stdout)
	}
}

func TestRunReportsErrorFile(t *testing.T) {
	// A worker that writes torch's error file format: the report carries its message
	// and traceback.
	r := newTestRun(t, 2, `if [ "$RANK" = 1 ]; then
cat > "$TORCHELASTIC_ERROR_FILE" <<'EOF'
{"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad batch\n", "timestamp": "1700000000"}}}
EOF
exit 1; fi; sleep 30`)
	res := r.run(t)
	if res.Failure == nil || res.Failure.Message != "ValueError: bad batch" {
		t.Fatalf("failure = %+v", res.Failure)
	}
	for _, want := range []string{"error:   ValueError: bad batch", `File "train.py", line 3`, "2023-11-14T22:13:20Z"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, r.stderr)
		}
	}
}

func TestRunResumesFromLatestAndFallsBack(t *testing.T) {
	ckpt := t.TempDir()
	for _, step := range []string{"step-9", "step-10", "step-20"} {
		if err := os.MkdirAll(filepath.Join(ckpt, step), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ckpt, step, ".complete"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The newest directory is incomplete: never chosen.
	if err := os.MkdirAll(filepath.Join(ckpt, "step-30"), 0o755); err != nil {
		t.Fatal(err)
	}
	seen := filepath.Join(t.TempDir(), "seen")
	// Every attempt fails at once without writing a checkpoint, logging what it resumed
	// from (env) and the --resume argument it was given.
	r := newTestRun(t, 1, `echo "$GANGRUN_ATTEMPT $GANGRUN_RESUME_FROM $1 $2" >> `+seen+`; exit 1`)
	r.cfg.Command = append(r.cfg.Command, "sh")
	r.cfg.CheckpointDir, r.cfg.ResumeArg, r.cfg.MaxRestarts = ckpt, "--resume", 4
	res := r.run(t)
	if res.ExitCode != 1 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	got, _ := os.ReadFile(seen)
	s20, s10, s9 := filepath.Join(ckpt, "step-20"), filepath.Join(ckpt, "step-10"), filepath.Join(ckpt, "step-9")
	want := strings.Join([]string{
		"0 " + s20 + " --resume " + s20,
		"1 " + s20 + " --resume " + s20, // second failure from step-20: skipped from now on
		"2 " + s10 + " --resume " + s10,
		"3 " + s10 + " --resume " + s10,
		"4 " + s9 + " --resume " + s9,
	}, "\n") + "\n"
	if string(got) != want {
		t.Errorf("resume sequence:\n%s\nwant:\n%s", got, want)
	}
}

// TestRunResumeArgWithEquals: --resume-arg --resume= is passed as one argument,
// --resume=PATH, the form argparse and click both read.
func TestRunResumeArgWithEquals(t *testing.T) {
	ckpt := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ckpt, "step-5"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ckpt, "step-5", ".complete"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := newTestRun(t, 1, `echo "args: $# [$1]"`)
	r.cfg.Command = append(r.cfg.Command, "sh")
	r.cfg.CheckpointDir, r.cfg.ResumeArg = ckpt, "--resume="
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if want := "[rank0]: args: 1 [--resume=" + filepath.Join(ckpt, "step-5") + "]"; !strings.Contains(r.stdout.String(), want) {
		t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
	}
}

func TestRunLocalRankArg(t *testing.T) {
	r := newTestRun(t, 2, `echo "args: $*"`)
	r.cfg.Command = append(r.cfg.Command, "sh", "--x")
	r.cfg.LocalRankArg = true
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	for _, want := range []string{"[rank0]: args: --x --local_rank=0", "[rank1]: args: --x --local_rank=1"} {
		if !strings.Contains(r.stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestRunKillsOrphansOfFinishedWorkers(t *testing.T) {
	// A worker that leaves a background child in its process group and exits 0: the
	// child must not outlive the run (assertNoLeftovers checks it).
	r := newTestRun(t, 2, `sleep 60 & echo spawned`)
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	base := Config{Command: []string{"/bin/true"}, NProcPerNode: 1, JobID: "j", NodeName: "n"}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(t.TempDir(), "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no command", func(c *Config) { c.Command = nil }, "no command"},
		{"zero workers", func(c *Config) { c.NProcPerNode = 0 }, "--nproc-per-node 0"},
		{"more workers than open files allow", func(c *Config) { c.NProcPerNode = int(nofile()/fdsPerWorker) + 1 }, "open files, and this process may open"},
		{"missing command", func(c *Config) { c.Command = []string{"no-such-trainer-xyz"} }, "command not found: no-such-trainer-xyz"},
		{"checkpoint dir is a file", func(c *Config) { c.CheckpointDir = file }, "--checkpoint-dir " + file + ": is a file, not a directory"},
		{"checkpoint dir loops", func(c *Config) { c.CheckpointDir = loop }, "--checkpoint-dir " + loop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			_, err := New(c, rendezvous.NewLocal("j", c.MaxRestarts))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func waitFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	waitFor(t, func() bool {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				return false
			}
		}
		return true
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nofile is this process's soft limit on open files.
func nofile() uint64 {
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) // cannot fail on Linux for this resource
	return lim.Cur
}

// TestRunReportsItsStates: the worker group moves through torch's states, and the run's
// events say so: a failed first attempt, a restart, a resumed second attempt that
// succeeds.
func TestRunReportsItsStates(t *testing.T) {
	r := newTestRun(t, 2, `if [ "$GANGRUN_ATTEMPT" = 0 ] && [ "$RANK" = 1 ]; then exit 7; fi
[ "$GANGRUN_ATTEMPT" = 0 ] && sleep 30
exit 0`)
	r.cfg.MaxRestarts = 1
	rec := &event.Recorder{}
	r.cfg.Events = rec
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d; stderr:\n%s", res.ExitCode, r.stderr)
	}
	var states []string
	for _, e := range rec.Of(event.StateChanged) {
		states = append(states, e.State)
	}
	want := []string{"INIT", "HEALTHY", "FAILED", "INIT", "HEALTHY", "SUCCEEDED"}
	if strings.Join(states, " ") != strings.Join(want, " ") {
		t.Errorf("states %v, want %v", states, want)
	}
	failed := rec.Of(event.WorkerFailed)
	if len(failed) != 1 || failed[0].Rank != 1 || failed[0].ExitCode != 7 || failed[0].Attempt != 0 {
		t.Errorf("worker failures %+v, want rank 1 exit 7 in attempt 0", failed)
	}
	if r := rec.Of(event.Restarting); len(r) != 1 || r[0].Cause != "exit code 7" {
		t.Errorf("restarts %+v, want one, caused by exit code 7", r)
	}
	if c := rec.Of(event.CheckpointChosen); len(c) != 2 || c[1].Attempt != 1 {
		t.Errorf("checkpoint choices %+v, want one per attempt", c)
	}
	ends := rec.Of(event.RoundEnded)
	if len(ends) != 2 || ends[0].Cause != "failed" || ends[0].Attempt != 0 || ends[1].Cause != "succeeded" || ends[1].Attempt != 1 {
		t.Errorf("round ends %+v, want attempt 0's failure, then attempt 1's success", ends)
	}
}

// TestBackoffStartsAgainAfterProgress: a failed attempt that wrote a newer complete
// checkpoint restarts at once and resets the backoff; failures in a row without
// progress wait Initial, then twice it.
func TestBackoffStartsAgainAfterProgress(t *testing.T) {
	ckpt := t.TempDir()
	// Attempt 0 writes step-10 and fails; attempts 1 and 2 fail at once; attempt 3
	// writes step-20 and fails; attempt 4 fails at once; attempt 5 succeeds.
	r := newTestRun(t, 1, `a=$GANGRUN_ATTEMPT; d=`+ckpt+`
case $a in
0) mkdir -p $d/step-10 && touch $d/step-10/.complete; exit 3 ;;
3) mkdir -p $d/step-20 && touch $d/step-20/.complete; exit 3 ;;
5) exit 0 ;;
*) exit 3 ;;
esac`)
	r.cfg.CheckpointDir, r.cfg.MaxRestarts = ckpt, 5
	r.cfg.Backoff = Backoff{Initial: 200 * time.Millisecond, Max: time.Second}
	rec := &event.Recorder{}
	r.cfg.Events = rec
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d; stderr:\n%s", res.ExitCode, r.stderr)
	}
	var got []string
	for _, e := range rec.Of(event.Restarting) {
		got = append(got, e.Detail)
	}
	want := []string{"backoff 0s", "backoff 200ms", "backoff 400ms", "backoff 0s", "backoff 200ms"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("restarts: %v, want %v", got, want)
	}
}

// TestNoRestartExitCode: a worker exiting with --no-restart-exit-code ends the run at
// once with that code, restarts left or not; with it off, the same exit is restarted.
func TestNoRestartExitCode(t *testing.T) {
	script := `[ "$GANGRUN_ATTEMPT" = 0 ] && exit 99; exit 0`
	r := newTestRun(t, 2, script)
	r.cfg.MaxRestarts, r.cfg.NoRestartExitCode = 3, DefaultNoRestartExitCode
	if res := r.run(t); res.ExitCode != 99 {
		t.Errorf("exit %d, want 99 without a restart; stderr:\n%s", res.ExitCode, r.stderr)
	}
	if !strings.Contains(r.stderr.String(), "no-restart code") || strings.Contains(r.stderr.String(), "restarting the gang") {
		t.Errorf("stderr does not say the run ends on the no-restart code:\n%s", r.stderr)
	}
	r = newTestRun(t, 2, script)
	r.cfg.MaxRestarts = 3 // NoRestartExitCode 0: none
	if res := r.run(t); res.ExitCode != 0 {
		t.Errorf("exit %d with the code off, want 0 after a restart; stderr:\n%s", res.ExitCode, r.stderr)
	}
}

// TestNoRestartHookEndsTheRun: when Config.NoRestart gives a reason (a cluster job's
// step while the job is pre-empted), a failed worker ends the run with its code, restarts
// left or not, and the log says why; without a reason the same failure is restarted.
func TestNoRestartHookEndsTheRun(t *testing.T) {
	script := `[ "$GANGRUN_ATTEMPT" = 0 ] && exit 7; exit 0`
	r := newTestRun(t, 2, script)
	r.cfg.MaxRestarts = 3
	r.cfg.NoRestart = func() string { return "the job is being pre-empted" }
	if res := r.run(t); res.ExitCode != 7 {
		t.Errorf("exit %d, want 7 without a restart; stderr:\n%s", res.ExitCode, r.stderr)
	}
	if !strings.Contains(r.stderr.String(), "no restart: the job is being pre-empted") || strings.Contains(r.stderr.String(), "restarting the gang") {
		t.Errorf("stderr does not say why there is no restart:\n%s", r.stderr)
	}
	r = newTestRun(t, 2, script)
	r.cfg.MaxRestarts = 3
	r.cfg.NoRestart = func() string { return "" }
	if res := r.run(t); res.ExitCode != 0 {
		t.Errorf("exit %d with no reason given, want 0 after a restart; stderr:\n%s", res.ExitCode, r.stderr)
	}
}

// TestUSR1ReachesTheWorkerNotItsChildren: SIGUSR1 forwarded to the workers reaches the
// worker process (its handler runs) and not a child of it without a handler, which
// would die of it (status 138: a DataLoader worker on a pre-emption warning).
func TestUSR1ReachesTheWorkerNotItsChildren(t *testing.T) {
	// The worker polls for its handler's mark (a signal that came before a "wait" would
	// leave it waiting on the child); its child cannot end on its own within the test.
	r := newTestRun(t, 1, `sleep 600 & c=$!
got=
trap 'echo got USR1; got=1' USR1
echo ready
for i in $(seq 400); do [ -n "$got" ] && break; sleep 0.05; done
sleep 0.3
if grep -q '^State:.*Z' /proc/$c/status 2>/dev/null || ! kill -0 $c 2>/dev/null; then echo child died; else echo child alive; kill $c; fi
exit 0`)
	done := make(chan Result, 1)
	go func() { done <- r.run(t) }()
	waitFor(t, func() bool { return strings.Contains(r.stdout.String(), "ready") }) // the worker started
	r.signals <- syscall.SIGUSR1
	res := <-done
	out := r.stdout.String()
	if res.ExitCode != 0 || !strings.Contains(out, "got USR1") || !strings.Contains(out, "child alive") {
		t.Errorf("exit %d, want the worker's handler to run and its child to live; stdout:\n%s\nstderr:\n%s", res.ExitCode, out, r.stderr)
	}
}

// TestHungRankIsNamedWithItsStack: under --hang-timeout, rank 1 stops touching its
// heartbeat file (stuck in a function) while rank 0 goes on touching its own; neither
// prints (the heartbeats are the gang's activity). The gang fails with rank 1 as the
// root cause, and every rank's Python stack (faulthandler) is in the output, rank 1's
// showing where it is stuck.
func TestHungRankIsNamedWithItsStack(t *testing.T) {
	r := newTestRun(t, 2, "")
	r.cfg.Command = []string{"/usr/bin/python3", "-c", `
import os, pathlib, time
hb = pathlib.Path(os.environ["GANGRUN_HEARTBEAT_FILE"])
def stuck_here():
    time.sleep(60)
def train():
    for step in range(100000):
        hb.touch()
        if os.environ["RANK"] == "1" and step == 5:
            stuck_here()
        time.sleep(0.05)
train()
`}
	r.cfg.HangTimeout = 2 * time.Second
	res := r.run(t)
	if res.ExitCode == 0 || res.Failure == nil || res.Failure.Rank != 1 || !strings.Contains(res.Failure.Reason, "no heartbeat") || res.Failure.Kind != failure.Hang {
		t.Fatalf("exit %d, failure %+v: want rank 1's missing heartbeat; stderr:\n%s", res.ExitCode, res.Failure, r.stderr)
	}
	out := r.stdout.String() + r.stderr.String()
	for _, want := range []string{"[rank1]: ", "in stuck_here", "[rank0]: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q (the ranks' stacks):\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`\[rank1\]: .*in stuck_here`).MatchString(out) {
		t.Errorf("rank 1's stack does not show it in stuck_here:\n%s", out)
	}
}

// TestTorchFileTimerNamesTheRank: with TORCHELASTIC_ENABLE_FILE_TIMER=1, gangrun serves
// torch's file-based watchdog; rank 1's timer expires inside its step, and the gang
// fails with rank 1 and the timer's scope as the root cause.
func TestTorchFileTimerNamesTheRank(t *testing.T) {
	r := newTestRun(t, 2, "")
	r.cfg.Command = []string{testPython(t), "-c", `
import os, time
import torch.distributed.elastic.timer as timer
timer.configure(timer.FileTimerClient(file_path=os.environ["TORCHELASTIC_TIMER_FILE"]))
rank = os.environ["RANK"]
for step in range(100000):
    with timer.expires(after=1, scope="train_step"):
        if rank == "1" and step == 5:
            time.sleep(60)
        time.sleep(0.05)
    print("step", step, flush=True)
`}
	r.cfg.Env.Base = append(r.cfg.Env.Base, FileTimerEnableEnv+"=1")
	res := r.run(t)
	if res.ExitCode == 0 || res.Failure == nil || res.Failure.Rank != 1 || !strings.Contains(res.Failure.Reason, `watchdog timer "train_step" expired`) || res.Failure.Kind != failure.Watchdog {
		t.Fatalf("exit %d, failure %+v: want rank 1's train_step timer; stderr:\n%s", res.ExitCode, res.Failure, r.stderr)
	}
}

// TestSignalWhileStoppingEndsTheRun: a terminating signal that arrives while a failed
// attempt's workers are being stopped (one ignores SIGTERM) kills them at once and ends
// the run with 128+N; no next attempt starts, restarts left or not.
func TestSignalWhileStoppingEndsTheRun(t *testing.T) {
	r := newTestRun(t, 2, `if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi
trap '' TERM
echo "attempt $GANGRUN_ATTEMPT"
while :; do sleep 0.1; done`)
	r.cfg.MaxRestarts, r.cfg.TermTimeout = 3, 20*time.Second
	done := make(chan Result, 1)
	go func() { done <- r.run(t) }()
	waitFor(t, func() bool { return strings.Contains(r.stderr.String(), "worker failed") }) // rank 1 failed
	time.Sleep(300 * time.Millisecond)                                                      // the gang is stopping: rank 0 ignores SIGTERM
	r.signals <- syscall.SIGTERM
	select {
	case res := <-done:
		if res.ExitCode != 128+int(syscall.SIGTERM) || strings.Contains(r.stdout.String(), "attempt 1") {
			t.Errorf("exit %d, stdout:\n%s\nwant 143 and no attempt 1", res.ExitCode, r.stdout)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the run did not end after SIGTERM during the stop; stderr:\n%s", r.stderr)
	}
}
