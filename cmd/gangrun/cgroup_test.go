package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/job"
)

// cgroupReport is what a worker prints about its step's cgroup (see cgroupWorker):
// its cgroup path in each controller, its CPUs, and the limits read from inside.
const cgroupWorker = `for c in cpuset memory pids devices; do echo "cg $c $(grep -E "^[0-9]+:$c:" /proc/self/cgroup | cut -d: -f3)"; done
grep Cpus_allowed_list /proc/self/status
p=$(grep -E '^[0-9]+:pids:' /proc/self/cgroup | cut -d: -f3); echo "pids.max $(cat /sys/fs/cgroup/pids$p/pids.max)"
m=$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3); echo "memory.limit $(cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes)"
`

var cgroupLineRE = regexp.MustCompile(`\[rank(\d)\]: (cg (\S+) (\S+)|Cpus_allowed_list:\s*(\S+)|pids.max (\S+)|memory.limit (\S+))`)

// workerCgroups parses the workers' reports: rank → controller → path, and rank →
// "cpus", "pids.max", "memory.limit" → value.
func workerCgroups(out string) (paths map[string]map[string]string, vals map[string]map[string]string) {
	paths, vals = map[string]map[string]string{}, map[string]map[string]string{}
	for _, m := range cgroupLineRE.FindAllStringSubmatch(out, -1) {
		r := m[1]
		if paths[r] == nil {
			paths[r], vals[r] = map[string]string{}, map[string]string{}
		}
		switch {
		case m[3] != "":
			paths[r][m[3]] = m[4]
		case m[5] != "":
			vals[r]["cpus"] = m[5]
		case m[6] != "":
			vals[r]["pids.max"] = m[6]
		case m[7] != "":
			vals[r]["memory.limit"] = m[7]
		}
	}
	return paths, vals
}

// assertCgroupGone fails the test unless every directory of the step cgroup whose
// paths the workers reported is gone (waiting up to 30 s, for the guardian).
func assertCgroupGone(t *testing.T, paths map[string]string) {
	t.Helper()
	if len(paths) == 0 {
		t.Fatal("no cgroup paths reported")
	}
	var left []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		left = nil
		for c, p := range paths {
			d := filepath.Join("/sys/fs/cgroup", c, p)
			if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
				left = append(left, d)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
}

// TestRunConfinesWorkersToACgroup runs two workers on an inventory shaped like this
// machine (one CPU each) and reads from inside each worker its cgroup in every
// controller (/proc/self/cgroup), its CPUs (Cpus_allowed_list) and the step's
// limits: both workers are in the one step cgroup the log names, bound to their own
// CPU within its cpuset, under --pids-limit and --mem; the cgroup is gone after the
// run.
func TestRunConfinesWorkersToACgroup(t *testing.T) {
	var allowed unixCPUs
	if !allowed.twoOrMore() {
		t.Fatal("needs CPUs 0 and 1 (the development VM has them)")
	}
	mark := testMark(t)
	res := runGangrun(t, []string{mark}, "run", "--topology-file", twoCPUInventory(t), "--nproc-per-node", "2",
		"--cgroup", "required", "--mem", "256M", "--pids-limit", "100", "--", "sh", "-c", cgroupWorker)
	if res.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	name := regexp.MustCompile(`step confined to its cgroup\s+\{"cgroup": "(gangrun-[^"]+)", "controllers": \["cpuset", "memory", "pids", "devices"\], "cpus": "0-1", "mem": "256M", "pids_limit": 100`).FindStringSubmatch(res.stderr)
	if name == nil {
		t.Fatalf("no log line naming the step's cgroup, its controllers and limits:\n%s", res.stderr)
	}
	paths, vals := workerCgroups(res.stdout)
	for _, r := range []string{"0", "1"} {
		for _, c := range []string{"cpuset", "memory", "pids", "devices"} {
			if filepath.Base(paths[r][c]) != name[1] {
				t.Errorf("rank %s: %s cgroup %q, want .../%s", r, c, paths[r][c], name[1])
			}
		}
		if vals[r]["pids.max"] != "100" || vals[r]["memory.limit"] != "268435456" {
			t.Errorf("rank %s: pids.max %q, memory.limit_in_bytes %q; want 100 and 268435456", r, vals[r]["pids.max"], vals[r]["memory.limit"])
		}
		if vals[r]["cpus"] != r {
			t.Errorf("rank %s: Cpus_allowed_list %q, want %s (its share of the step's cpuset 0-1)", r, vals[r]["cpus"], r)
		}
	}
	assertCgroupGone(t, paths["0"])
}

// TestRunOutOfMemoryInItsCgroup: a worker allocating past --mem is killed by the
// kernel in the step's cgroup, and the failure names the cause, in the log line and
// in the root-cause report; no restart is left, so gangrun exits 137, and the cgroup
// is gone.
func TestRunOutOfMemoryInItsCgroup(t *testing.T) {
	mark := testMark(t)
	py := python(t)
	worker := `for c in cpuset memory pids devices; do echo "cg $c $(grep -E "^[0-9]+:$c:" /proc/self/cgroup | cut -d: -f3)"; done
if [ "$RANK" = 1 ]; then exec ` + py + ` -c "b = [b'x' * (16 << 20) for _ in range(32)]"; fi; sleep 30`
	res := runGangrun(t, []string{mark}, "run", "--nproc-per-node", "2", "--mem", "64M", "--max-restarts", "0", "--", "sh", "-c", worker)
	if res.code != 137 {
		t.Fatalf("exit %d, want 137 (the OOM killer's SIGKILL)\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	want := "out of memory in its cgroup (--mem 64M): the kernel's OOM killer sent signal SIGKILL (9)"
	if !strings.Contains(res.stderr, `"reason": "`+want+`"`) || !strings.Contains(res.stderr, "  status:  "+want+"\n") {
		t.Errorf("the failure does not name the cause %q in the log and the report:\n%s", want, res.stderr)
	}
	if !strings.Contains(res.stderr, `"rank": 1`) {
		t.Errorf("the root cause is not rank 1:\n%s", res.stderr)
	}
	paths, _ := workerCgroups(res.stdout)
	assertCgroupGone(t, paths["0"])
}

// TestRunPidsLimitNamedInTheRootCause: a worker that forks past --pids-limit fails, and
// the root cause says that the limit refused its forks (its exit status alone does not).
func TestRunPidsLimitNamedInTheRootCause(t *testing.T) {
	mark := testMark(t)
	worker := `i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); done; wait`
	res := runGangrun(t, []string{mark}, "run", "--nproc-per-node", "1", "--pids-limit", "16", "--max-restarts", "0", "--", "sh", "-c", worker)
	if res.code == 0 {
		t.Fatalf("exit 0: the worker's 40 forks under --pids-limit 16 all succeeded?\n%s", res.stderr)
	}
	if !regexp.MustCompile(`status:  .* \(the step's --pids-limit 16 refused [0-9]+ forks or threads in this attempt\)\n`).MatchString(res.stderr) {
		t.Errorf("the root cause does not name the pids limit:\n%s", res.stderr)
	}
}

// runThenSIGKILL runs `gangrun run` with two ranks of worker (a shell script that
// reports its cgroups) each leaving a setsid sleep and a sleep behind, SIGKILLs gangrun
// once both ranks are ready, and returns what the workers printed. The test's mark
// (testMark) is in the environment, with env: its cleanup fails the test if anything
// is left running.
func runThenSIGKILL(t *testing.T, worker string, env ...string) string {
	t.Helper()
	mark := testMark(t)
	dir := t.TempDir()
	var out syncBuffer
	cmd := exec.Command(gangrunBin, "run", "--nproc-per-node", "2", "--", "/bin/sh", "-c",
		worker+`setsid sleep 300 & sleep 300 & echo "started-$RANK"; touch `+dir+`/ready-$RANK; wait`)
	cmd.Env = append(append(os.Environ(), mark), env...)
	cmd.Stdout, cmd.Stderr = &out, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForFiles(t, dir, "ready-0", "ready-1")
	// gangrun copies each rank's lines in order: once it has copied the last, it has
	// copied what the worker printed before (a SIGKILL sooner loses lines still in the
	// pipe: seen once in a clean-clone run).
	waitUntilFor(t, 30*time.Second, func() bool {
		o := out.String()
		return strings.Contains(o, "started-0") && strings.Contains(o, "started-1")
	}, "both ranks' last line copied")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return out.String()
}

// TestRunSIGKILLRemovesItsCgroup: when gangrun is SIGKILLed, its guardian kills
// everything left in the step's cgroup — a process that left its worker's process
// group (setsid) too — and removes the cgroup.
func TestRunSIGKILLRemovesItsCgroup(t *testing.T) {
	out := runThenSIGKILL(t, cgroupWorker)
	paths, _ := workerCgroups(out)
	if len(paths["1"]) != 4 {
		t.Fatalf("the workers did not report their cgroups:\n%s", out)
	}
	assertCgroupGone(t, paths["0"])
	// testMark's cleanup asserts that nothing carrying the mark is left: the setsid
	// sleeps were in the cgroup, and the guardian killed them.
}

// TestRunCgroupAutoWithoutPermission: run as an unprivileged user, who may not create
// cgroups here, --cgroup auto (the default) says why once and runs the step
// unconfined; --cgroup required refuses to run it, in one line, exit 1.
func TestRunCgroupAutoWithoutPermission(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("runs as root (to run gangrun as nobody)")
	}
	dir, err := os.MkdirTemp("", "gangrun-nobody-") // nobody must reach it: not below t.TempDir's 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gangrun")
	data, err := os.ReadFile(gangrunBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	mark := testMark(t)
	run := func(mode string) (string, int) {
		cmd := exec.Command(bin, "run", "--cgroup", mode, "--", "sh", "-c", `grep -E '^[0-9]+:pids:' /proc/self/cgroup`)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), mark, "TMPDIR="+dir, "HOME="+dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return b.String(), cmd.ProcessState.ExitCode()
	}
	out, code := run("auto")
	why := "running the step unconfined (--cgroup auto): cgroups cannot be used: gangrun runs as uid 65534, and only root may create cgroups here"
	if code != 0 || strings.Count(out, why) != 1 || !strings.Contains(out, "[rank0]: ") || strings.Contains(out, "gangrun-gr-") {
		t.Errorf("--cgroup auto as nobody: exit %d, want 0, the reason once and the worker in gangrun's own cgroup:\n%s", code, out)
	}
	out, code = run("required")
	if code != 1 || !strings.Contains(out, "--cgroup required: cgroups cannot be used: gangrun runs as uid 65534") || strings.Contains(out, "[rank0]") {
		t.Errorf("--cgroup required as nobody: exit %d, want 1 naming why, no worker:\n%s", code, out)
	}
}

// TestCgroupFlagErrors: bad --cgroup, --mem and --pids-limit values are one-line usage
// errors naming the value (exit 2), nothing started.
func TestCgroupFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--cgroup", "on", "--", "true"}, `gangrun run: --cgroup "on": want off, auto or required`},
		{[]string{"run", "--mem", "4Gx", "--", "true"}, `gangrun run: --mem "4Gx": want a size such as 4G, 500M or 1024 (megabytes), or 0 for no limit`},
		{[]string{"run", "--mem", "-1", "--", "true"}, `gangrun run: --mem "-1": want a size such as 4G, 500M or 1024 (megabytes), or 0 for no limit`},
		{[]string{"run", "--mem", "2000T", "--", "true"}, `gangrun run: --mem "2000T": want at most 1P per node`},
		{[]string{"run", "--mem", "1K", "--", "true"}, `gangrun run: --mem "1K": want at least 16M (or 0 for no limit): a step needs more to start`},
		{[]string{"run", "--mem", "1G", "--cgroup", "off", "--", "true"}, `gangrun run: --mem 1G needs the step's cgroup, and --cgroup is off`},
		{[]string{"run", "--pids-limit", "100", "--cgroup", "off", "--", "true"}, `gangrun run: --pids-limit 100 needs the step's cgroup, and --cgroup is off`},
		{[]string{"run", "--pids-limit", "5", "--", "true"}, `gangrun run: --pids-limit 5: a Python worker alone starts more threads than that; want 0 (no limit) or at least 16`},
		{[]string{"run", "--pids-limit=-1", "--", "true"}, `gangrun run: --pids-limit -1: want 0 (no limit) or more`},
		{[]string{"submit", "--consul", "127.0.0.1:1", "--mem", "lots", "--", "true"}, `gangrun submit: --mem "lots": want a size such as 4G, 500M or 1024 (megabytes), or 0 for no limit`},
	} {
		_, stderr, code := runCLI(t, c.args...)
		if code != exitUsage || strings.TrimSpace(stderr) != c.want {
			t.Errorf("%v: exit %d, stderr %q; want 2, %q", c.args, code, stderr, c.want)
		}
	}
}

// TestJobOutOfMemoryIsItsRootCause: a cluster job submitted with --mem whose worker
// allocates past it fails with the cause in its record ("out of memory in its
// cgroup"), and its step's cgroup is gone.
func TestJobOutOfMemoryIsItsRootCause(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	py := python(t)
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit("--nodes", "1", "--gpus-per-node", "2", "--mem", "64M", "--max-restarts", "0", "--", "sh", "-c",
		`for c in cpuset memory pids devices; do echo "cg $c $(grep -E "^[0-9]+:$c:" /proc/self/cgroup | cut -d: -f3)"; done
if [ "$RANK" = 1 ]; then exec `+py+` -c "b = [b'x' * (16 << 20) for _ in range(32)]"; fi; sleep 30`)
	m := c.waitState(id, job.Failed, 2*time.Minute)
	want := "rank 1 on gpu-a: out of memory in its cgroup (--mem 64M): the kernel's OOM killer sent signal SIGKILL (9)"
	if m["reason"] != want || m["exit_code"] != float64(137) {
		t.Errorf("reason %q, exit code %v; want %q, 137", m["reason"], m["exit_code"], want)
	}
	out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"mem": "64M"`)) {
		t.Errorf("the step's output does not show its cgroup's memory limit:\n%s", out)
	}
	paths, _ := workerCgroups(string(out))
	assertCgroupGone(t, paths["0"])
}

// cgroupV2Env points gangrun's step cgroups at this machine's cgroup v2 mount: the
// development VM is hybrid, and its v2 hierarchy offers only hugetlb, so these runs
// exercise v2's placement (CLONE_INTO_CGROUP), removal and kill for real, not its
// cpuset, memory or pids limits.
const cgroupV2Env = "GANGRUN_CGROUP2_ROOT=/sys/fs/cgroup/unified"

// v2Worker prints the worker's cgroup v2 path ("v2 PATH") and its CPUs.
const v2Worker = `echo "v2 $(grep '^0::' /proc/self/cgroup | cut -d: -f3)"; grep Cpus_allowed_list /proc/self/status
`

var v2LineRE = regexp.MustCompile(`\[rank(\d)\]: v2 (\S+)`)

// assertV2Gone fails the test unless the cgroup v2 directory of path is gone (waiting
// up to 30 s, for the guardian).
func assertV2Gone(t *testing.T, path string) {
	t.Helper()
	d := filepath.Join("/sys/fs/cgroup/unified", path)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := os.Lstat(d)
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cgroup %s left behind (%v)", d, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunConfinesWorkersToACgroupV2: on cgroup v2 both workers are in the one step
// cgroup the log names (their own /proc/self/cgroup's 0:: line), bound to their own
// CPU; the log says once which limits v2 cannot apply here (no cpuset or pids
// controller offered); the cgroup is gone after the run.
func TestRunConfinesWorkersToACgroupV2(t *testing.T) {
	var allowed unixCPUs
	if !allowed.twoOrMore() {
		t.Fatal("needs CPUs 0 and 1 (the development VM has them)")
	}
	mark := testMark(t)
	res := runGangrun(t, []string{mark, cgroupV2Env}, "run", "--topology-file", twoCPUInventory(t), "--nproc-per-node", "2",
		"--cgroup", "required", "--", "sh", "-c", v2Worker)
	if res.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	name := regexp.MustCompile(`step confined to its cgroup\s+\{"cgroup": "(gangrun-[^"]+)", "controllers": \[\], "cpus": "0-1", "pids_limit": 32768, "hierarchy": "v2"\}`).FindStringSubmatch(res.stderr)
	if name == nil {
		t.Fatalf("no log line naming the step's cgroup v2:\n%s", res.stderr)
	}
	why := `the step's cgroup lacks part of its confinement: cgroup v2 offers no cpuset or pids controller in /sys/fs/cgroup/unified (its cgroup.controllers: "hugetlb"), so the step's cpuset and pids limit cannot be applied`
	if strings.Count(res.stderr, why) != 1 {
		t.Errorf("the log does not say once what v2 cannot apply here (%s):\n%s", why, res.stderr)
	}
	got := map[string]string{}
	for _, m := range v2LineRE.FindAllStringSubmatch(res.stdout, -1) {
		got[m[1]] = m[2]
	}
	for _, r := range []string{"0", "1"} {
		if got[r] != "/"+name[1] {
			t.Errorf("rank %s: cgroup v2 %q, want /%s", r, got[r], name[1])
		}
		if !strings.Contains(res.stdout, "[rank"+r+"]: Cpus_allowed_list:\t"+r+"\n") {
			t.Errorf("rank %s is not bound to CPU %s:\n%s", r, r, res.stdout)
		}
	}
	assertV2Gone(t, "/"+name[1])
}

// TestRunCgroupV2MemWithoutMemoryController: --mem where cgroup v2 offers no memory
// controller: --cgroup required refuses the run in one line naming why (exit 1, no
// worker); --cgroup auto says why once and runs the step unconfined.
func TestRunCgroupV2MemWithoutMemoryController(t *testing.T) {
	mark := testMark(t)
	why := `cgroups cannot be used: --mem needs the memory controller, which cgroup v2 does not offer in /sys/fs/cgroup/unified (its cgroup.controllers: "hugetlb")`
	res := runGangrun(t, []string{mark, cgroupV2Env}, "run", "--cgroup", "required", "--mem", "256M", "--", "sh", "-c", v2Worker)
	// The error is a JSON field of the log line: its quotes escaped.
	if res.code != 1 || !strings.Contains(res.stderr, `"error": "--cgroup required: `+strings.ReplaceAll(why, `"`, `\"`)+`"`) || strings.Contains(res.stdout, "[rank0]") {
		t.Errorf("--cgroup required: exit %d, want 1 naming why, no worker:\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	res = runGangrun(t, []string{mark, cgroupV2Env}, "run", "--mem", "256M", "--", "sh", "-c", v2Worker)
	if res.code != 0 || strings.Count(res.stderr, "running the step unconfined (--cgroup auto): "+why) != 1 || !strings.Contains(res.stdout, "[rank0]: v2 /\n") {
		t.Errorf("--cgroup auto: exit %d, want 0, why once, the worker in gangrun's own cgroup v2:\n%s\n%s", res.code, res.stdout, res.stderr)
	}
}

// TestRunSIGKILLRemovesItsCgroupV2: when gangrun is SIGKILLed, its guardian kills
// everything in the step's cgroup v2 (cgroup.kill) — a setsid process too — and
// removes the directory.
func TestRunSIGKILLRemovesItsCgroupV2(t *testing.T) {
	out := runThenSIGKILL(t, v2Worker, cgroupV2Env)
	m := v2LineRE.FindStringSubmatch(out)
	if m == nil || !strings.HasPrefix(m[2], "/gangrun-") {
		t.Fatalf("the workers did not report a step cgroup v2:\n%s", out)
	}
	assertV2Gone(t, m[2])
	// testMark's cleanup asserts that nothing carrying the mark is left: the setsid
	// sleeps were in the cgroup, and the guardian killed them.
}

// TestRunCgroupV2WarmAndColdRanks: on cgroup v2 a cold rank (attempt 0) and a rank
// started from a warm standby (attempt 1) are both in the step's cgroup, each cloned
// into it, and keep their CPU binding and memory policy (numactl's preferred on node
// 0) as on v1.
func TestRunCgroupV2WarmAndColdRanks(t *testing.T) {
	var allowed unixCPUs
	if !allowed.twoOrMore() {
		t.Fatal("needs CPUs 0 and 1 (the development VM has them)")
	}
	script := filepath.Join(t.TempDir(), "w.py")
	if err := os.WriteFile(script, []byte(`import os, sys
cg = [l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
cpus = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Cpus_allowed_list:")][0]
policy = open("/proc/self/numa_maps").readline().split()[1]
print("attempt", os.environ["GANGRUN_ATTEMPT"], "v2", cg, "cpus", cpus, "policy", policy, flush=True)
sys.exit(3 if os.environ["GANGRUN_ATTEMPT"] == "0" else 0)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := testMark(t)
	res := runGangrun(t, []string{mark, cgroupV2Env}, "run", "--topology-file", twoCPUInventory(t), "--nproc-per-node", "2",
		"--max-restarts", "1", "--restart-backoff", "0s", "--warm-delay", "0s", "--", python(t), script)
	if res.code != 0 || !strings.Contains(res.stderr, `"attempt": 1, "warm": 2, "cold": 0`) {
		t.Fatalf("exit %d, or attempt 1 not warm\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	name := regexp.MustCompile(`step confined to its cgroup\s+\{"cgroup": "(gangrun-[^"]+)"`).FindStringSubmatch(res.stderr)
	if name == nil {
		t.Fatalf("no log line naming the step's cgroup:\n%s", res.stderr)
	}
	re := regexp.MustCompile(`\[rank(\d)\]: attempt (\d) v2 (\S+) cpus (\S+) policy (\S+)`)
	seen := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(res.stdout, -1) {
		seen[m[2]]++
		if m[3] != "/"+name[1] || m[4] != m[1] || m[5] != "prefer:0" {
			t.Errorf("rank %s, attempt %s: cgroup %s, CPUs %s, policy %s; want /%s, CPU %s, prefer:0", m[1], m[2], m[3], m[4], m[5], name[1], m[1])
		}
	}
	// Attempt 0's lines may be cut short by the other rank's failure.
	if seen["1"] != 2 || seen["0"] < 1 {
		t.Errorf("lines by attempt %v, want 2 from attempt 1 and one or more from attempt 0\n%s", seen, res.stdout)
	}
	assertV2Gone(t, "/"+name[1])
}

// TestRunCgroupV2BesideItsOwn: on cgroup v2 the step's cgroup goes beside gangrun's
// own, in its parent, as with a systemd unit's Delegate=yes and DelegateSubgroup=:
// gangrun started in T/leaf puts its step in T/gangrun-..., and T is empty again
// after the run.
func TestRunCgroupV2BesideItsOwn(t *testing.T) {
	mark := testMark(t)
	top := filepath.Join("/sys/fs/cgroup/unified", "gangrun-test-delegated-"+strconv.Itoa(os.Getpid()))
	leaf := filepath.Join(top, "supervisor")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range []string{leaf, top} {
			if err := os.Remove(d); err != nil {
				t.Errorf("remove %s: %v (the step's cgroup left in it?)", d, err)
			}
		}
	})
	fd, err := unix.Open(leaf, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(gangrunBin, "run", "--nproc-per-node", "2", "--cgroup", "required", "--", "sh", "-c", v2Worker)
	cmd.Env = append(os.Environ(), mark, cgroupV2Env)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	name := regexp.MustCompile(`step confined to its cgroup\s+\{"cgroup": "(gangrun-[^"]+)"`).FindStringSubmatch(stderr.String())
	if name == nil {
		t.Fatalf("no log line naming the step's cgroup:\n%s", stderr.String())
	}
	want := "/" + filepath.Base(top) + "/" + name[1]
	for _, m := range v2LineRE.FindAllStringSubmatch(stdout.String(), -1) {
		if m[2] != want {
			t.Errorf("rank %s in %s, want %s (beside gangrun's own /%s/supervisor)", m[1], m[2], want, filepath.Base(top))
		}
	}
	if n := len(v2LineRE.FindAllStringSubmatch(stdout.String(), -1)); n != 2 {
		t.Errorf("%d ranks reported their cgroup, want 2:\n%s", n, stdout.String())
	}
	assertV2Gone(t, want)
}

// TestJobStepInCgroupV2: a cluster job's step on an agent that uses cgroup v2 runs in
// a step cgroup of its own there (both ranks' 0:: line), with the eBPF device program
// denying the node's GPUs the job was not given, and the cgroup is gone after.
func TestJobStepInCgroupV2(t *testing.T) {
	t.Setenv("GANGRUN_CGROUP2_ROOT", "/sys/fs/cgroup/unified") // the agents inherit it
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit("--nodes", "1", "--gpus-per-node", "2", "--", "sh", "-c", v2Worker)
	c.waitState(id, job.Completed, 2*time.Minute)
	out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`step confined to its cgroup\s+\{"step": "gpu-a", "cgroup": "(gangrun-[^"]+)", "controllers": \["devices"\].*"devices_denied": \["/dev/nvidia\d", "/dev/nvidia\d", "/dev/nvidia\d", "/dev/nvidia\d", "/dev/nvidia\d", "/dev/nvidia\d"\], "hierarchy": "v2"\}`).FindSubmatch(out)
	if name == nil {
		t.Fatalf("the step's output does not show its cgroup v2 with 6 GPUs denied:\n%s", out)
	}
	ranks := v2LineRE.FindAllSubmatch(out, -1)
	for _, m := range ranks {
		if string(m[2]) != "/"+string(name[1]) {
			t.Errorf("rank %s in %s, want /%s", m[1], m[2], name[1])
		}
	}
	if len(ranks) != 2 {
		t.Errorf("%d ranks reported their cgroup v2, want 2:\n%s", len(ranks), out)
	}
	assertV2Gone(t, "/"+string(name[1]))
}

// TestSbatchOutOfMemory: a batch job allocating past its --mem is killed by the OOM
// killer of its cgroup and ends as Slurm's does: OUT_OF_MEMORY, reason OutOfMemory,
// exit code 0:125 (scontrol, sacct, squeue's OOM), with slurmstepd's line in its output.
// (The reference Slurm of the tests enforces no memory: Slurm 22.05's documented
// behaviour and task/cgroup's message.)
func TestSbatchOutOfMemory(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	dir := sharedDir(t)
	t.Chdir(dir)
	links := slurmLinks(t)
	py := python(t)
	out, errOut, code := c.slurmCmd(links, "sbatch", "--parsable", "-N1", "--gres=gpu:1", "--mem", "100M", "-o", filepath.Join(dir, "oom.out"),
		"--wrap", py+` -c "b = [b'x' * (16 << 20) for _ in range(25)]"`)
	if code != 0 {
		t.Fatalf("sbatch: exit %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	c.waitState(id, job.OutOfMemory, 2*time.Minute)
	show, _, _ := c.slurmCmd(links, "scontrol", "show", "job", id)
	for _, want := range []string{"JobState=OUT_OF_MEMORY Reason=OutOfMemory", "ExitCode=0:125"} {
		if !strings.Contains(show, want) {
			t.Errorf("scontrol show job %s: no %q in\n%s", id, want, show)
		}
	}
	if got, _, _ := c.slurmCmd(links, "sacct", "-n", "-X", "-P", "-j", id, "-o", "State,ExitCode"); got != "OUT_OF_MEMORY|0:125\n" {
		t.Errorf("sacct -j %s: %q, want OUT_OF_MEMORY|0:125", id, got)
	}
	if got, _, _ := c.slurmCmd(links, "squeue", "-h", "-t", "all", "-j", id, "-o", "%t %T"); got != "OOM OUT_OF_MEMORY\n" {
		t.Errorf("squeue -t all -j %s: %q, want OOM OUT_OF_MEMORY", id, got)
	}
	b, err := os.ReadFile(filepath.Join(dir, "oom.out"))
	want := "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=" + id + ".batch. Some of your processes may have been killed by the cgroup out-of-memory handler.\n"
	if err != nil || !strings.HasSuffix(string(b), want) {
		t.Errorf("the job's output %q (%v) does not end with %q", b, err, want)
	}

	// An srun step killed so: slurmstepd's line for the step, srun's "Out Of Memory",
	// and the step OUT_OF_MEMORY; the job with it.
	out, errOut, code = c.slurmCmd(links, "sbatch", "--parsable", "-N1", "--gres=gpu:1", "--mem", "100M", "-o", filepath.Join(dir, "step.out"),
		"--wrap", filepath.Join(links, "srun")+" "+py+` -c "b = [b'x' * (16 << 20) for _ in range(25)]"`)
	if code != 0 {
		t.Fatalf("sbatch: exit %d %s", code, errOut)
	}
	id = strings.TrimSpace(out)
	waitUntilFor(t, 2*time.Minute, func() bool { s, _ := c.show(id)["state"].(string); return job.Status(s).Final() }, "the job's end")
	b, _ = os.ReadFile(filepath.Join(dir, "step.out"))
	if st := c.show(id)["state"]; st != string(job.OutOfMemory) {
		t.Errorf("job %s ended %v, want OUT_OF_MEMORY; its output:\n%s", id, st, b)
	}
	for _, want := range []string{
		"slurmstepd: error: Detected 1 oom-kill event(s) in StepId=" + id + ".0. Some of your processes may have been killed by the cgroup out-of-memory handler.\n",
		"srun: error: gpu-a: task 0: Out Of Memory\n",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the job's output does not show %q:\n%s", want, b)
		}
	}
	if got, _, _ := c.slurmCmd(links, "sacct", "-n", "-P", "-j", id, "-o", "JobID,State"); !strings.Contains(got, id+".0|OUT_OF_MEMORY\n") {
		t.Errorf("sacct -j %s: %q, want step %s.0 OUT_OF_MEMORY", id, got, id)
	}
}
