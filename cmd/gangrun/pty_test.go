package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/slurm"
)

// ptySession is a command driven on a real pseudo-terminal (testdata/ptydrive.py, on
// Python's pty module): how it ended and what its terminal showed.
type ptySession struct {
	Exit   int    `json:"exit"`
	Output string `json:"output"`
	Failed string `json:"failed"`
}

// ptyStep is one step of a ptydrive.py session.
type ptyStep map[string]any

// ptyCluster is a gangrun cluster with Slurm's commands linked where every user may run
// them, and the pty driver where every user may read it.
type ptyCluster struct {
	*jobCluster
	links, driver, dir string
}

func startPtyCluster(t *testing.T, nodes ...string) *ptyCluster {
	t.Helper()
	c := &ptyCluster{jobCluster: startJobCluster(t, nodes...), dir: sharedDir(t)}
	links, err := os.MkdirTemp("", "gangrun-pty-links-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(links) })
	if err := os.Chmod(links, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range slurm.Names() {
		if err := os.Symlink(binForUsers(t), filepath.Join(links, n)); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(filepath.Join("testdata", "ptydrive.py"))
	if err != nil {
		t.Fatal(err)
	}
	c.links, c.driver = links, filepath.Join(c.dir, "ptydrive.py")
	if err := os.WriteFile(c.driver, script, 0o755); err != nil {
		t.Fatal(err)
	}
	return c
}

// env is a login's environment for user name (root: ""), with Slurm's commands on PATH
// and the cluster's Consul, marked as the test's.
func (c *ptyCluster) env(name string) []string {
	home := c.dir
	if name != "" {
		home = "/nonexistent"
	}
	return []string{"PATH=" + c.links + ":/usr/bin:/bin", "HOME=" + home, "TERM=xterm", "LANG=C",
		"CONSUL_HTTP_ADDR=" + c.consul, "MUNGE_SOCKET=" + os.Getenv("MUNGE_SOCKET"), c.mark}
}

// drive runs argv as user name (root: "") on a terminal of rows x cols, through steps.
func (c *ptyCluster) drive(name string, rows, cols int, steps []ptyStep, argv ...string) ptySession {
	c.t.Helper()
	if steps == nil {
		steps = []ptyStep{}
	}
	b, _ := json.Marshal(steps)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", append([]string{c.driver, strconv.Itoa(rows), strconv.Itoa(cols), string(b)}, argv...)...)
	cmd.Dir, cmd.Env = c.dir, c.env(name)
	if name != "" {
		u, err := user.Lookup(name)
		if err != nil {
			c.t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.Env = append(cmd.Env, "USER="+name, "LOGNAME="+name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	out, err := cmd.Output()
	var s ptySession
	if jerr := json.Unmarshal(out, &s); err != nil || jerr != nil {
		c.t.Fatalf("ptydrive %v: %v %v\n%s", argv, err, jerr, out)
	}
	if s.Failed != "" {
		c.t.Fatalf("ptydrive %v: gave up at %s; the terminal showed:\n%s", argv, s.Failed, s.Output)
	}
	return s
}

// steps returns job id's srun steps.
func (c *ptyCluster) steps(id string) []job.SrunStep {
	c.t.Helper()
	s, err := store.NewConsul(c.consul)
	if err != nil {
		c.t.Fatal(err)
	}
	defer s.Close()
	steps, err := job.SrunSteps(context.Background(), s, id)
	if err != nil {
		c.t.Fatal(err)
	}
	return steps
}

// noneLeft checks, within a few seconds, that no process of the test has the command
// line cmdline (its words joined by spaces).
func (c *ptyCluster) noneLeft(cmdline string) {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, pid := range markedProcs(c.t, c.mark, cmdline) {
			b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			if strings.TrimSuffix(strings.ReplaceAll(string(b), "\x00", " "), " ") == cmdline {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Errorf("processes running %q left: %v", cmdline, left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSrunPtyInSalloc: `salloc srun --pty bash` on a real terminal (33 x 101) gives a
// shell on the allocated node, in the job's cgroup: the keys typed reach it (echoed by its own terminal),
// its output comes back without waiting for a line's end, it has the job's variables,
// its terminal has srun's size and follows a resize (SIGWINCH), Ctrl-C interrupts its
// foreground job and not srun, and `exit 3` ends srun and salloc with 3. Nothing is
// left: the job it put in the background is killed with its session, and the step
// is recorded ended with the shell's code.
func TestSrunPtyInSalloc(t *testing.T) {
	c := startPtyCluster(t, "gpu-a")
	s := c.drive("", 33, 101, []ptyStep{
		{"expect": `Granted job allocation \d+`},
		{"send": "echo MARK-$((6*7)) job=$SLURM_JOB_ID step=$SLURM_STEP_ID node=$SLURMD_NODENAME tty=$(tty) cgroup=$(grep -c ':pids:/.*gangrun-' /proc/self/cgroup); stty size\r"},
		{"expect": `MARK-42 job=\d+ step=0 node=gpu-a tty=/dev/pts/\d+ cgroup=1\r\n33 101\r\n`},
		// Output without a newline shows at once: the foreground job has the terminal.
		{"send": "sh -c 'printf \"no new\"\"line:\"; exec sleep 600'\r"},
		{"expect": `no newline:`},
		{"send": "\x03"}, // Ctrl-C: a byte for the node's terminal, which interrupts sleep
		{"send": "echo rc=$?\r"},
		{"expect": `rc=130\r\n`},
		{"resize": []int{40, 120}},
		{"poll": "stty size\r", "expect": `40 120\r\n`},
		{"send": "sleep 1001 & echo BG-$((1+1))\r"},
		{"expect": `BG-2\r\n`},
		{"send": "exit 3\r"},
	}, "salloc", "-N1", "--gres=gpu:1", "srun", "--pty", "bash")
	t.Logf("the terminal showed:\n%s", s.Output)
	if s.Exit != 3 {
		t.Errorf("salloc srun --pty bash: exit %d, want 3 (the shell's exit 3); the terminal showed:\n%s", s.Exit, s.Output)
	}
	m := regexp.MustCompile(`Granted job allocation (\d+)`).FindStringSubmatch(s.Output)
	if m == nil || !strings.Contains(s.Output, "job="+m[1]+" ") {
		t.Errorf("the shell's SLURM_JOB_ID is not the allocation's:\n%s", s.Output)
	}
	// srun's line starts a line of its own and ends at the line's start: "\r\n" (1 run in
	// about 50 it is "\r\r\n", the same on the screen: a race left open, in the note).
	for _, want := range []string{`srun: error: gpu-a: task 0: Exited with exit code 3\r+\n`, `salloc: Relinquishing job allocation`} {
		if !regexp.MustCompile(want).MatchString(s.Output) {
			t.Errorf("the terminal does not show %q:\n%s", want, s.Output)
		}
	}
	c.noneLeft("sleep 1001")
	c.noneLeft("sleep 600")
	steps := c.steps(m[1])
	if len(steps) != 1 || steps[0].End == nil || steps[0].End.ExitCode != 3 || steps[0].End.State != job.Failed {
		t.Errorf("steps of job %s: %+v, want step 0 ended FAILED with exit code 3", m[1], steps)
	}
}

// TestSrunPtyJoinsARunningJob: `srun --jobid ID --overlap --pty bash` from outside a
// running batch job of alice's gives alice a shell on the job's node, beside the batch
// script; leaving it ends the step and not the job. SIGHUP to srun (its terminal
// closed) kills the shell (srun exits 137); srun killed outright, the node hangs the
// shell up and records the step cancelled. --pty -n2 is refused. mallory is refused as Slurm refuses her,
// and nothing runs; root may join.
func TestSrunPtyJoinsARunningJob(t *testing.T) {
	c := startPtyCluster(t, "gpu-a")
	unixUsers(t, "alice", "mallory")
	sb := c.drive("alice", 24, 80, []ptyStep{{"expect": `Submitted batch job \d+`}},
		"sbatch", "-N1", "--gres=gpu:1", "--wrap", "sleep 1003")
	id := regexp.MustCompile(`Submitted batch job (\d+)`).FindStringSubmatch(sb.Output)[1]
	t.Cleanup(func() { c.gangrun("cancel", id) })
	c.waitState(id, job.Running, 90*time.Second)
	waitUntilFor(t, 30*time.Second, func() bool { return len(markedProcs(t, c.mark, "sleep 1003")) > 0 }, "the batch script's sleep")

	s := c.drive("alice", 30, 90, []ptyStep{
		// cgroup=1: the shell is a step the node started (in a gangrun cgroup), not one
		// srun ran here.
		{"send": "echo JOINED-$((2+3)) job=$SLURM_JOB_ID user=$(id -un) batch=$(pgrep -u alice -xf 'sleep 1003' | wc -l) cgroup=$(grep -c ':pids:/.*gangrun-' /proc/self/cgroup); stty size\r"},
		{"expect": `JOINED-5 job=` + id + ` user=alice batch=1 cgroup=1\r\n30 90\r\n`},
		{"send": "exit\r"},
	}, "srun", "--jobid", id, "--overlap", "--pty", "bash")
	if s.Exit != 0 {
		t.Errorf("alice's srun --jobid %s --overlap --pty bash: exit %d, want 0:\n%s", id, s.Exit, s.Output)
	}
	if st := c.show(id)["state"]; st != string(job.Running) {
		t.Errorf("the job is %v after the joined shell exited, want RUNNING", st)
	}

	hup := c.drive("alice", 24, 80, []ptyStep{
		{"send": "echo READY-$((3+4))\r"},
		{"expect": `READY-7\r\n`},
		{"signal": int(syscall.SIGHUP)},
	}, "srun", "--jobid", id, "--overlap", "--pty", "bash")
	if hup.Exit != 137 || !strings.Contains(hup.Output, "task 0: Killed") {
		t.Errorf("srun --pty given SIGHUP: exit %d, want 137 with the task Killed:\n%s", hup.Exit, hup.Output)
	}

	// srun killed outright: the node, losing it, hangs the shell up and records the step
	// cancelled.
	lost := c.drive("alice", 24, 80, []ptyStep{
		{"send": "echo LOST-$((5+5))\r"},
		{"expect": `LOST-10\r\n`},
		{"signal": int(syscall.SIGKILL)},
	}, "srun", "--jobid", id, "--overlap", "--pty", "bash")
	if lost.Exit != 137 {
		t.Errorf("srun --pty killed: exit %d, want 137:\n%s", lost.Exit, lost.Output)
	}
	two := c.drive("alice", 24, 80, nil, "srun", "--jobid", id, "--overlap", "--pty", "-n2", "bash")
	if two.Exit != 1 || !strings.HasPrefix(two.Output, "srun: error: --pty runs one task on a terminal, and this step has 2: give -n1") {
		t.Errorf("srun --pty -n2: exit %d, %q; want 1 and the refusal", two.Exit, two.Output)
	}
	refused := c.drive("mallory", 24, 80, nil, "srun", "--jobid", id, "--overlap", "--pty", "bash")
	want := fmt.Sprintf("srun: error: Unable to create step for job %s: Access/permission denied\r\n", id)
	if refused.Exit != 1 || refused.Output != want {
		t.Errorf("mallory's srun --jobid %s --pty bash: exit %d, %q; want 1, %q", id, refused.Exit, refused.Output, want)
	}
	root := c.drive("", 24, 80, []ptyStep{
		{"send": "echo ROOT-$((4+4)) user=$(id -un) cgroup=$(grep -c ':pids:/.*gangrun-' /proc/self/cgroup)\r"},
		{"expect": `ROOT-8 user=alice cgroup=1\r\n`},
		{"send": "exit 5\r"},
	}, "srun", "--jobid", id, "--overlap", "--pty", "bash")
	if root.Exit != 5 {
		t.Errorf("root's srun --jobid %s --pty bash: exit %d, want 5:\n%s", id, root.Exit, root.Output)
	}
	var steps []job.SrunStep
	waitFor(t, 30*time.Second, "every step's end recorded", func() (bool, string) {
		steps = c.steps(id)
		for _, st := range steps {
			if st.End == nil {
				return false, fmt.Sprintf("step %d has none", st.Request.Step)
			}
		}
		return true, ""
	})
	if len(steps) != 4 {
		t.Fatalf("job %s has %d steps, want 4 (-n2's and mallory's refused before one was made): %+v", id, len(steps), steps)
	}
	if end := steps[2].End; end.State != job.Cancelled || end.Reason != "srun ended before its tasks" {
		t.Errorf("the step whose srun was killed ended %+v, want CANCELLED as srun ended first", end)
	}
	if st := c.show(id)["state"]; st != string(job.Running) {
		t.Errorf("the job is %v after the joins, want RUNNING", st)
	}
	c.noneLeft("bash")
	if code, _, errOut := c.gangrun("cancel", id); code != 0 {
		t.Errorf("cancel %s: exit %d: %s", id, code, errOut)
	}
}

// TestSrunPtyWithoutTerminalAgainstSlurm: srun --jobid ID --overlap --pty without a
// terminal on stdin says what Slurm 22.05's says, in the same two lines, and runs the
// step without one (exit 0, its output on stdout), on both.
func TestSrunPtyWithoutTerminalAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a")
	dir := sharedDir(t)
	type result struct {
		out, errOut string
		code        int
	}
	got := map[side]result{}
	for _, s := range []side{realSlurm, gangrunSide} {
		out, errOut, code := p.run(s, dir, "", nil, "sbatch", "--parsable", "-N1", "--gres=gpu:1", "--wrap", "sleep 300")
		if code != 0 {
			t.Fatalf("%s: sbatch: exit %d: %s", s, code, errOut)
		}
		id := strings.TrimSpace(out)
		t.Cleanup(func() { p.run(s, dir, "", nil, "scancel", id) })
		waitFor(t, 90*time.Second, string(s)+": the job running", func() (bool, string) {
			st, _, _ := p.run(s, dir, "", nil, "squeue", "-h", "-j", id, "-o", "%T")
			return strings.TrimSpace(st) == "RUNNING", st
		})
		out, errOut, code = p.run(s, dir, "", nil, "srun", "--jobid", id, "--overlap", "--pty", "echo", "hi")
		got[s] = result{out, errOut, code}
	}
	want := result{"hi\n", "srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device\nsrun: error: Not using a pseudo-terminal, disregarding --pty option\n", 0}
	for s, r := range got {
		if r != want {
			t.Errorf("%s: srun --pty without a terminal: %+v, want %+v", s, r, want)
		}
	}
}

// TestSallocCancelledHangsUp: `scancel` of salloc's job while `srun --pty bash` runs
// in salloc's shell (the reported case) revokes the allocation as Slurm's salloc does:
// it prints "Job allocation N has been revoked.", hangs up its shell and the step's
// srun (SIGHUP: the terminal's foreground group and the command), and exits without
// relinquishing; srun says "Force Terminated" once, and the step is recorded
// CANCELLED.
func TestSallocCancelledHangsUp(t *testing.T) {
	c := startPtyCluster(t, "gpu-a")
	s := c.drive("", 24, 80, []ptyStep{
		{"expect": `Granted job allocation \d+`},
		{"send": "srun --pty bash\r"},
		{"poll": "echo IN-STEP-$((2*3)) step=$SLURM_STEP_ID\r", "expect": `IN-STEP-6 step=0\r\n`},
		{"send": "scancel $SLURM_JOB_ID\r"},
		{"expect": `has been revoked\.`},
	}, "salloc", "-N1", "--gres=gpu:1", "bash", "--norc", "-i")
	t.Logf("the terminal showed:\n%s", s.Output)
	m := regexp.MustCompile(`Granted job allocation (\d+)`).FindStringSubmatch(s.Output)
	if m == nil {
		t.Fatalf("no allocation:\n%s", s.Output)
	}
	if want := "salloc: Job allocation " + m[1] + " has been revoked.\r\n"; !strings.Contains(s.Output, want) {
		t.Errorf("the terminal does not show %q:\n%s", want, s.Output)
	}
	if s.Exit != 0 {
		// Slurm's salloc exits 0 when SIGHUP ended its command (salloc.c).
		t.Errorf("salloc: exit %d, want 0 (its shell hung up)", s.Exit)
	}
	if strings.Contains(s.Output, "Relinquishing") {
		t.Errorf("salloc relinquished a revoked allocation:\n%s", s.Output)
	}
	if n := strings.Count(s.Output, "Force Terminated"); n > 1 {
		t.Errorf("srun printed Force Terminated %d times:\n%s", n, s.Output)
	}
	if st := c.show(m[1])["state"]; st != string(job.Cancelled) {
		t.Errorf("job %s is %v, want CANCELLED", m[1], st)
	}
	var steps []job.SrunStep
	waitUntilFor(t, 60*time.Second, func() bool {
		steps = c.steps(m[1])
		return len(steps) == 1 && steps[0].End != nil
	}, "the step's end")
	if steps[0].End.State != job.Cancelled {
		t.Errorf("step %s.0 ended %+v, want CANCELLED", m[1], *steps[0].End)
	}
}
