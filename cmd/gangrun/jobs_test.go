package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// jobCluster is a test cluster for jobs: a Consul dev agent and gangrun agents as
// nodes (recorded DGX H100 inventories), every process carrying mark.
type jobCluster struct {
	t         *testing.T
	consul    string
	mark      string
	inventory string
	agents    map[string]*exec.Cmd
	logs      map[string]*syncBuffer
	// health is each node's recorded stream of GPU health changes (agent
	// --health-events): a line appended there is a GPU event on that node.
	health map[string]string
	dir    string
	// flags, when set, gives each agent's extra flags (--metrics-addr, --http-addr).
	flags func(node string) []string
	// bins, when it names one, is the gangrun binary node's agent runs (gangrunBin
	// otherwise): each node's own installed one in the rolling-upgrade test.
	bins map[string]string
}

func startJobCluster(t *testing.T, nodes ...string) *jobCluster {
	t.Helper()
	return startJobClusterWith(t, nil, nodes...)
}

// startJobClusterWith is startJobCluster with flags giving each agent's extra flags.
func startJobClusterWith(t *testing.T, flags func(node string) []string, nodes ...string) *jobCluster {
	t.Helper()
	c := &jobCluster{t: t, consul: consultest.Start(t).Addr, mark: testMark(t), agents: map[string]*exec.Cmd{}, logs: map[string]*syncBuffer{},
		inventory: filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json"),
		health:    map[string]string{}, dir: t.TempDir(), flags: flags}
	for _, n := range nodes {
		c.startAgent(n)
	}
	waitUntilFor(t, 60*time.Second, func() bool {
		up := 0
		for _, n := range nodesJSON(t, c.consul) {
			if n.State == "up" {
				up++
			}
		}
		return up == len(nodes)
	}, "every agent up")
	return c
}

func (c *jobCluster) startAgent(node string) {
	c.t.Helper()
	if c.health[node] == "" {
		c.health[node] = filepath.Join(c.dir, node+".health")
		if err := os.WriteFile(c.health[node], nil, 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	args := []string{"agent", "--consul", c.consul, "--node-name", node, "--advertise-addr", "127.0.0.1",
		"--topology-file", c.inventory, "--health-events", c.health[node]}
	if c.flags != nil {
		args = append(args, c.flags(node)...)
	}
	bin := gangrunBin
	if c.bins[node] != "" {
		bin = c.bins[node]
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = agentEnv(c.mark)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.agents[node], c.logs[node] = cmd, log
	c.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if c.t.Failed() {
			c.t.Logf("agent %s log:\n%s", node, log.String())
		}
	})
}

// gangrun runs the CLI against the cluster and returns its exit code and output.
func (c *jobCluster) gangrun(args ...string) (int, string, string) {
	return inProcess(append([]string{args[0], "--consul", c.consul}, args[1:]...)...)
}

func (c *jobCluster) show(id string) map[string]any {
	c.t.Helper()
	code, out, errOut := inProcess("show", "--consul", c.consul, "--json", id)
	if code != 0 {
		c.t.Fatalf("show %s: exit %d: %s", id, code, errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		c.t.Fatalf("show --json: %v\n%s", err, out)
	}
	return m
}

// waitState waits until job id is in state.
func (c *jobCluster) waitState(id string, state job.Status, within time.Duration) map[string]any {
	c.t.Helper()
	var m map[string]any
	deadline := time.Now().Add(within)
	for {
		m = c.show(id)
		if m["state"] == string(state) {
			return m
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(m, "", "  ")
			_, logs, _ := c.gangrun("logs", id)
			steps, _ := filepath.Glob(filepath.Join(agentTmp, "gangrun-agent-*", "job-"+id+"-step.log"))
			var stepLogs []byte
			for _, p := range steps {
				b, _ := os.ReadFile(p)
				stepLogs = append(append(stepLogs, "--- "+p+"\n"...), b...)
			}
			c.t.Fatalf("job %s did not reach %s within %s:\n%s\n--- its output:\n%s%s", id, state, within, b, logs, stepLogs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *jobCluster) submit(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.gangrun(append([]string{"submit"}, args...)...)
	if code != 0 {
		c.t.Fatalf("submit: exit %d: %s", code, errOut)
	}
	return strings.TrimSpace(out)
}

// TestSubmitRunsAJobToCompletion: a submitted 2-node job is placed, its steps start on
// both nodes with the granted GPUs, its workers get torchrun's environment and the
// job's node list, its output lands in gangrun-<id>.out with rank prefixes, and it ends
// COMPLETED with its GPUs given back and nothing left running.
func TestSubmitRunsAJobToCompletion(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b", "gpu-c")
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit("--nodes", "2", "--gpus-per-node", "4", "--name", "hello", "--",
		"/bin/sh", "-c", `echo "rank $RANK of $WORLD_SIZE on $GANGRUN_NODE_NAME devices $CUDA_VISIBLE_DEVICES nodes $GANGRUN_NODELIST"`)
	m := c.waitState(id, job.Completed, 90*time.Second)
	if m["exit_code"] != float64(0) {
		t.Errorf("exit code %v, want 0", m["exit_code"])
	}
	out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[rank0]: rank 0 of 8", "[rank7]: rank 7 of 8", "devices 0,1,2,3", "nodes gpu-"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, logs, _ := c.gangrun("logs", id)
	if code != 0 || logs != string(out) {
		t.Errorf("logs: exit %d, %d bytes, want the output file's %d", code, len(logs), len(out))
	}
	code, q, _ := c.gangrun("queue", "--all", "--json")
	if code != 0 || !strings.Contains(q, `"state": "COMPLETED"`) || !strings.Contains(q, `"name": "hello"`) {
		t.Errorf("queue --all --json: %d %s", code, q)
	}
	waitUntilFor(t, 30*time.Second, func() bool {
		free, total := freeGPUs(nodesJSON(t, c.consul))
		return free == total
	}, "every GPU free again")
}

// TestJobResumesAfterAWorkerFails: a real PyTorch DDP job on two nodes whose last rank
// fails once restarts as a gang from its newest checkpoint and completes; show records
// both attempts, the second resumed from the checkpoint, and one restart of its own.
// The job is carol's, so its workers run as her Unix user, writing the checkpoints
// gangrun reads.
func TestJobResumesAfterAWorkerFails(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	unixUsers(t, "carol")
	// Her copy of the trainer: the repository may be in a directory only root may
	// reach (a CI's clean clone under mktemp -d).
	argv := trainer(t, "--steps", "40", "--ckpt-every", "10", "--fail-at-step", "25")
	dir := sharedDir(t)
	t.Chdir(dir)
	src, err := os.ReadFile(argv[1])
	if err != nil {
		t.Fatal(err)
	}
	argv[1] = filepath.Join(dir, "train_ddp.py")
	if err := os.WriteFile(argv[1], src, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--uid", "carol", "--nodes", "2", "--gpus-per-node", "2", "--checkpoint-dir", "ckpt", "--"}, argv...)
	id := c.submit(args...)
	m := c.waitState(id, job.Completed, 3*time.Minute)
	attempts, _ := m["attempts"].([]any)
	if len(attempts) < 2 {
		t.Fatalf("attempts %v, want the failed one and the resumed one", m["attempts"])
	}
	last := attempts[len(attempts)-1].(map[string]any)
	if !strings.HasSuffix(last["resume_from"].(string), "step-20") {
		t.Errorf("the last attempt resumed from %v, want .../step-20", last["resume_from"])
	}
	if m["restarts"] != float64(1) || m["node_failures"] != float64(0) {
		t.Errorf("restarts %v, node failures %v: want 1 and 0", m["restarts"], m["node_failures"])
	}
	out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	for _, want := range []string{"injected failure at step 25", "resumed from step 20", "finished at step 40"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestCancelStopsARunningJob: cancel of a running 2-node job stops every worker (none
// is left), gives the GPUs back, and the job ends CANCELLED; a pending job is simply
// dropped from the queue.
func TestCancelStopsARunningJob(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	t.Chdir(t.TempDir())
	id := c.submit("--nodes", "2", "--gpus-per-node", "8", "--term-timeout", "2s", "--",
		"/bin/sh", "-c", `echo started; sleep 300`)
	c.waitState(id, job.Running, 60*time.Second)
	waitUntilFor(t, 60*time.Second, func() bool { return countWorkers(c.mark) == 16 }, "16 workers")
	pending := c.submit("--nodes", "1", "--gpus-per-node", "8", "--", "/bin/true")
	if code, out, errOut := c.gangrun("cancel", id, pending); code != 0 || !strings.Contains(out, "cancelled job "+id) {
		t.Fatalf("cancel: %d %s %s", code, out, errOut)
	}
	c.waitState(id, job.Cancelled, 60*time.Second)
	// The pending job may have been granted the GPUs the first gave back before its own
	// cancel was served (the cancel serves its ids in turn): then it is stopping, and
	// ends CANCELLED too.
	c.waitState(pending, job.Cancelled, 60*time.Second)
	if n := countWorkers(c.mark); n != 0 {
		t.Errorf("%d workers left after the cancel", n)
	}
	waitUntilFor(t, 30*time.Second, func() bool {
		free, total := freeGPUs(nodesJSON(t, c.consul))
		return free == total
	}, "every GPU free again")
	code, q, _ := c.gangrun("queue")
	if code != 0 || strings.Contains(q, "RUNNING") || strings.Contains(q, "PENDING") {
		t.Errorf("queue after the cancels:\n%s", q)
	}
}

// heldGPUs counts node's GPU keys, read from Consul.
func heldGPUs(t *testing.T, consul, node string) int {
	t.Helper()
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := allocator.Snapshot(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := c.Nodes[node]; ok {
		return len(n.Held)
	}
	return 0
}

// countWorkers counts the live workers carrying mark: processes with a RANK that lead
// their process group (a worker's own children share its group).
func countWorkers(mark string) int {
	n := 0
	for _, p := range marked(mark) {
		f := strings.Fields(p) // pid, then /proc/PID/stat: pid (comm) state ppid pgrp ...
		if len(f) > 5 && f[3] != "Z" && f[0] == f[5] && workerEnv(f[0]) {
			n++
		}
	}
	return n
}

// workerEnv reports whether process pid's environment has a RANK (it is a worker).
func workerEnv(pid string) bool {
	data, err := os.ReadFile("/proc/" + pid + "/environ")
	return err == nil && bytes.Contains(data, []byte("\x00RANK="))
}

// TestJobTimeLimit: a job past --time gets --signal's signal first, then SIGTERM, and
// ends TIMEOUT.
func TestJobTimeLimit(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit("--gpus-per-node", "1", "--time", "4s", "--signal", "USR1@2", "--term-timeout", "2s", "--",
		"/bin/sh", "-c", `trap 'echo got USR1' USR1; trap 'echo got TERM; exit 143' TERM; while :; do sleep 0.1; done`)
	m := c.waitState(id, job.Timeout, 60*time.Second)
	if !strings.Contains(m["reason"].(string), "time limit") {
		t.Errorf("reason %v, want the time limit", m["reason"])
	}
	out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if i, j := bytes.Index(out, []byte("got USR1")), bytes.Index(out, []byte("got TERM")); i < 0 || j < i {
		t.Errorf("want USR1 before TERM in the output:\n%s", out)
	}
	if a := m["attempts"].([]any); len(a) == 0 || a[len(a)-1].(map[string]any)["cause"] != "timeout" || a[len(a)-1].(map[string]any)["ended"] == nil {
		t.Errorf("attempts %v: want the last one ended by the time limit", m["attempts"])
	}
}

// TestJobWhoseCommandIsMissingFails: a job whose command does not exist on its nodes
// ends FAILED with exit code 127 and the reason, once; its nodes are not taken for lost
// ones (each step said why it could not start), and nothing is placed again.
func TestJobWhoseCommandIsMissingFails(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b", "gpu-c")
	t.Chdir(t.TempDir())
	id := c.submit("--nodes", "2", "--gpus-per-node", "1", "--", "/nonexistent/cmd")
	m := c.waitState(id, job.Failed, 60*time.Second)
	if m["exit_code"] != float64(127) || !strings.Contains(m["reason"].(string), "command not found") {
		t.Errorf("exit code %v, reason %q: want 127, command not found", m["exit_code"], m["reason"])
	}
	if lost, _ := m["lost_nodes"].([]any); len(lost) != 0 || m["node_failures"] != float64(0) {
		t.Errorf("lost nodes %v, node failures %v: want none", m["lost_nodes"], m["node_failures"])
	}
}

// stepLogDir is the directory of node's agent (as it is now) for its steps' own
// messages, as its log names it at start.
func (c *jobCluster) stepLogDir(node string) string {
	c.t.Helper()
	re := regexp.MustCompile(`the steps' own messages\t\{"dir": "([^"]+)"`)
	var dir string
	waitUntilFor(c.t, 30*time.Second, func() bool {
		if m := re.FindStringSubmatch(c.logs[node].String()); m != nil {
			dir = m[1]
		}
		return dir != ""
	}, "agent "+node+" names its step-log directory")
	return dir
}

// TestJobSurvivesItsAgentsRestart: an agent restarted while its node runs a job's step
// leaves the step running (as slurmstepd outlives slurmd) and its GPUs held, and its
// step-log directory, which the step may still write, in place; the job completes. An
// agent stopped when the steps it started have ended removes its directory.
func TestJobSurvivesItsAgentsRestart(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	first := c.stepLogDir("gpu-a")
	t.Cleanup(func() { _ = os.RemoveAll(first) })
	gate := filepath.Join(dir, "go")
	id := c.submit("--gpus-per-node", "2", "--", "/bin/sh", "-c", `while [ ! -e `+gate+` ]; do sleep 0.1; done; echo done`)
	c.waitState(id, job.Running, 60*time.Second)
	waitUntilFor(t, 30*time.Second, func() bool { return countWorkers(c.mark) == 2 }, "2 workers")
	a := c.agents["gpu-a"]
	_ = a.Process.Signal(syscall.SIGTERM)
	_ = a.Wait()
	if n := countWorkers(c.mark); n != 2 {
		t.Fatalf("%d workers after the agent stopped, want the 2 still running", n)
	}
	if held := heldGPUs(t, c.consul, "gpu-a"); held != 2 {
		t.Errorf("%d GPUs held with the agent down, want the step's 2", held)
	}
	if _, err := os.Stat(filepath.Join(first, "job-"+id+"-step.log")); err != nil ||
		!strings.Contains(c.logs["gpu-a"].String(), "leaving the steps' own messages: steps this agent started still run") {
		t.Errorf("the stopped agent's step-log directory with its step running: %v; want it left, and said", err)
	}
	c.startAgent("gpu-a")
	second := c.stepLogDir("gpu-a")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.waitState(id, job.Completed, 60*time.Second)

	// A step the restarted agent starts, and which ends: the agent's directory goes
	// when it stops.
	short := c.submit("--gpus-per-node", "1", "--", "true")
	c.waitState(short, job.Completed, 60*time.Second)
	if _, err := os.Stat(filepath.Join(second, "job-"+short+"-step.log")); err != nil {
		t.Fatalf("the restarted agent's step log: %v", err)
	}
	waitUntilFor(t, 30*time.Second, func() bool { return stepPID(c.mark, short, "gpu-a") == 0 }, "the short job's step ended")
	a = c.agents["gpu-a"]
	_ = a.Process.Signal(syscall.SIGTERM)
	if err := a.Wait(); err != nil {
		t.Fatalf("the agent stopped with %v, want exit 0", err)
	}
	if _, err := os.Stat(second); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stopped agent's step-log directory %s: %v, want it removed", second, err)
	}
}

// TestJobSurvivesAnotherNodesAgentRestart: on a 2-node cluster, the agent of the node
// that is not the elected one is stopped (SIGTERM) and started again while a 2-node job
// runs there, as a rolling upgrade does: its node shows down meanwhile, but the job's
// step on it runs on, the elected agent does not take the node for lost, and the job
// completes with no node failure and no restart, its steps the same processes.
func TestJobSurvivesAnotherNodesAgentRestart(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	gate := filepath.Join(dir, "go")
	id := c.submit("--nodes", "2", "--gpus-per-node", "2", "--", "/bin/sh", "-c", `while [ ! -e `+gate+` ]; do sleep 0.1; done; echo done`)
	c.waitState(id, job.Running, 60*time.Second)
	waitUntilFor(t, 30*time.Second, func() bool { return countWorkers(c.mark) == 4 }, "4 workers")
	s, err := store.NewConsul(c.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := s.Get(context.Background(), "gangrun/scheduler/leader")
	if err != nil || e == nil {
		t.Fatalf("the elected agent: %v %v", e, err)
	}
	other := "gpu-a"
	if string(e.Value) == other {
		other = "gpu-b"
	}
	steps := map[string]int{"gpu-a": stepPID(c.mark, id, "gpu-a"), "gpu-b": stepPID(c.mark, id, "gpu-b")}
	a := c.agents[other]
	_ = a.Process.Signal(syscall.SIGTERM)
	if err := a.Wait(); err != nil {
		t.Fatalf("agent %s stopped with %v", other, err)
	}
	waitUntilFor(t, 30*time.Second, func() bool {
		for _, n := range nodesJSON(t, c.consul) {
			if n.Name == other {
				return n.State == "down"
			}
		}
		return false
	}, other+" down")
	time.Sleep(3 * time.Second) // passes of the elected agent's controller, with the node down
	c.startAgent(other)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m := c.waitState(id, job.Completed, 60*time.Second)
	if m["node_failures"] != float64(0) || m["restarts"] != float64(0) || len(m["attempts"].([]any)) != 1 {
		t.Errorf("job %s: %v node failures, %v restarts, %d attempts; want none lost, one attempt", id, m["node_failures"], m["restarts"], len(m["attempts"].([]any)))
	}
	for n, pid := range steps {
		if pid == 0 {
			t.Errorf("no step on %s", n)
		}
	}
	out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if got := strings.Count(string(out), "done"); got != 4 {
		t.Errorf("%d workers said done, want the 4 that ran throughout:\n%s", got, out)
	}
}

// TestSubmitRefusesBadSpecs: what no node could run, or cannot be read, is refused in one
// line with exit 2, and nothing is queued.
func TestSubmitRefusesBadSpecs(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	noCmd := filepath.Join(dir, "empty.sh")
	_ = os.WriteFile(noCmd, []byte("#!/bin/sh\n#GANGRUN --nodes 1\n"), 0o644)
	badLine := filepath.Join(dir, "bad.sh")
	_ = os.WriteFile(badLine, []byte("#!/bin/sh\n#GANGRUN --nodes 'one\necho hi\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--partition", "nope", "--", "/bin/true"}, "--partition nope: no node is in that partition"},
		{[]string{"--gpus-per-node", "9", "--", "/bin/true"}, "GPUs"},
		{[]string{"--time", "abc", "--", "/bin/true"}, `--time "abc"`},
		{[]string{"--signal", "USR1@60", "--", "/bin/true"}, "--signal USR1@1m0s needs --time"},
		{[]string{"--nodes", "3:2", "--", "/bin/true"}, `--nodes "3:2"`},
		{[]string{"--output", "x-%q", "--", "/bin/true"}, "unknown pattern %q"},
		{[]string{"--begin", "bogus", "--", "/bin/true"}, `--begin "bogus": Invalid time specification`},
		{[]string{"--qos", "high", "--", "/bin/true"}, "Invalid qos specification"},
		{[]string{"--dependency", "afterok:1?afterany:2,singleton", "--", "/bin/true"}, "not both"},
		{[]string{noCmd}, "nothing to run"},
		{[]string{badLine}, "unterminated single quote"},
		{[]string{filepath.Join(dir, "missing.sh")}, "missing.sh"},
		{nil, "no command"},
	} {
		code, _, errOut := c.gangrun(append([]string{"submit"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("submit %v: exit %d %q, want 2 and one line with %q", tc.args, code, errOut, tc.want)
		}
	}
	if code, q, _ := c.gangrun("queue", "--all", "--json"); code != 0 || strings.TrimSpace(q) != "[]" {
		t.Errorf("queue after the refusals: %s", q)
	}
}

// stepPID finds the pid of job id's step on node among the processes carrying mark.
func stepPID(mark, id, node string) int {
	for _, p := range marked(mark) {
		pid := strings.Fields(p)[0]
		cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) >= 3 && args[1] == stepCommand && args[len(args)-2] == id && args[len(args)-1] == node {
			n, _ := strconv.Atoi(pid)
			return n
		}
	}
	return 0
}

// watchInvariants reads Consul's grant keys every 50 ms until the test ends and fails
// it if a GPU is ever held by two grants (or a grant is not whole).
func watchInvariants(t *testing.T, consul string) {
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	reads := 0
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			entries, idx, err := s.List(ctx, allocator.ClusterPrefix)
			if err == nil {
				reads++
				if _, bad := allocator.CheckInvariants(entries, idx); len(bad) > 0 {
					t.Errorf("invariants broken: %v", bad)
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done; s.Close(); t.Logf("%d reads of the grants, no GPU held twice", reads) })
}

// TestJobMovesToTheSpareWhenANodeDies: a node of a running 2-node job dies (its agent
// and the job's step there SIGKILLed): once Consul expires its session the node shows
// down, the job's spare takes its place, and the gang resumes from its newest complete
// checkpoint and completes. The lost node counts as a node failure, not against
// --max-restarts; no GPU is held twice at any moment; nothing is left running.
func TestJobMovesToTheSpareWhenANodeDies(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b", "gpu-c")
	watchInvariants(t, c.consul)
	args := append([]string{"--nodes", "2", "--spare-nodes", "1", "--gpus-per-node", "2", "--checkpoint-dir", "ckpt", "--max-restarts", "0", "--"},
		trainer(t, "--steps", "400", "--ckpt-every", "10", "--step-time", "0.05")...)
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit(args...)
	m := c.waitState(id, job.Running, 60*time.Second)
	waitUntilFor(t, 2*time.Minute, func() bool {
		_, err := os.Stat(filepath.Join(dir, "ckpt", "step-20", ".complete"))
		return err == nil
	}, "checkpoint step-20")
	m = c.show(id)
	spares, _ := m["spares"].([]any)
	if len(spares) != 1 {
		t.Fatalf("spares %v, want one", m["spares"])
	}
	spare := spares[0].(string)
	victim := m["nodes"].([]any)[1].(map[string]any)["name"].(string)
	killed := time.Now()
	step := stepPID(c.mark, id, victim)
	if step == 0 {
		t.Fatalf("no step of job %s on %s", id, victim)
	}
	_ = c.agents[victim].Process.Signal(syscall.SIGKILL)
	_ = syscall.Kill(step, syscall.SIGKILL)
	waitUntilFor(t, 2*time.Minute, func() bool {
		for _, n := range nodesJSON(t, c.consul) {
			if n.Name == victim {
				return n.State == "down"
			}
		}
		return false
	}, victim+" down")
	m = c.waitState(id, job.Completed, 4*time.Minute)
	t.Logf("job %s completed %s after %s died", id, time.Since(killed).Round(time.Second), victim)
	nodes := []string{}
	for _, n := range m["nodes"].([]any) {
		nodes = append(nodes, n.(map[string]any)["name"].(string))
	}
	if !slicesContains(nodes, spare) || slicesContains(nodes, victim) {
		t.Errorf("the job ended on %v, want the spare %s in place of %s", nodes, spare, victim)
	}
	lost, _ := m["lost_nodes"].([]any)
	if len(lost) != 1 || lost[0].(map[string]any)["node"] != victim {
		t.Errorf("lost nodes %v, want %s", m["lost_nodes"], victim)
	}
	if m["node_failures"] != float64(1) || m["restarts"] != float64(0) {
		t.Errorf("node failures %v, restarts %v: want 1 and 0 (the node's failure does not count)", m["node_failures"], m["restarts"])
	}
	out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if !bytes.Contains(out, []byte("finished at step 400")) || !bytes.Contains(out, []byte("resumed from step")) {
		t.Errorf("the job did not resume and finish:\n%s", out)
	}
}

// TestJobExcludedNodeWaitsForItsAgentsRestart: on a 2-node cluster, a 2-node job whose
// step on gpu-b is SIGKILLed (its agent and node up) waits PENDING away from gpu-b,
// its pending reason naming gpu-b and that restarting the gangrun agent there clears
// it; once that agent has restarted, the job runs on both nodes again and completes.
func TestJobExcludedNodeWaitsForItsAgentsRestart(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	gate := filepath.Join(dir, "go")
	id := c.submit("--nodes", "2", "--gpus-per-node", "2", "--max-restarts", "0", "--",
		"/bin/sh", "-c", `while [ ! -e `+gate+` ]; do sleep 0.1; done; echo done`)
	c.waitState(id, job.Running, 60*time.Second)
	waitUntilFor(t, 30*time.Second, func() bool { return stepPID(c.mark, id, "gpu-b") != 0 }, "the step on gpu-b")
	if err := syscall.Kill(stepPID(c.mark, id, "gpu-b"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	const want = "1 excluded (gpu-b lost this job's step; restarting the gangrun agent there clears it)"
	var reason string
	waitUntilFor(t, 2*time.Minute, func() bool {
		reason = c.reason(id)
		return strings.Contains(reason, want)
	}, "the pending reason naming gpu-b's exclusion")
	t.Logf("pending reason: %s", reason)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a := c.agents["gpu-b"]
	_ = a.Process.Signal(syscall.SIGTERM)
	_ = a.Wait()
	c.startAgent("gpu-b")
	m := c.waitState(id, job.Completed, 2*time.Minute)
	if n, _ := m["nodes"].([]any); len(n) != 2 {
		t.Errorf("the job ended on %v, want both nodes", m["nodes"])
	}
}

// TestJobMovesOffANodeWhoseGPUFails: an Xid 79 on a GPU of a node a 2-node job runs on
// (replayed by its agent) drains the node with the reason; the job, which cannot do
// without it, stops on both nodes, waits PENDING, is placed again on the two healthy
// nodes — one of which it just ran on, so its new step starts there as soon as the old
// one is gone — resumes from its checkpoint and completes.
func TestJobMovesOffANodeWhoseGPUFails(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b", "gpu-c")
	watchInvariants(t, c.consul)
	args := append([]string{"--nodes", "2", "--gpus-per-node", "2", "--checkpoint-dir", "ckpt", "--max-restarts", "0", "--"},
		trainer(t, "--steps", "300", "--ckpt-every", "10", "--step-time", "0.05")...)
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit(args...)
	c.waitState(id, job.Running, 60*time.Second)
	waitUntilFor(t, 2*time.Minute, func() bool {
		_, err := os.Stat(filepath.Join(dir, "ckpt", "step-20", ".complete"))
		return err == nil
	}, "checkpoint step-20")
	placed := c.show(id)["nodes"].([]any)
	first, second := placed[0].(map[string]any)["name"].(string), placed[1].(map[string]any)["name"].(string)
	xid := `{"Index": 0, "Xid": 79, "GPUInstanceID": -1, "ComputeInstanceID": -1, "Health": {"state": "failed", "reasons": ["Xid 79: GPU has fallen off the bus"]}}` + "\n"
	f, err := os.OpenFile(c.health[first], os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(xid)
	f.Close()
	m := c.waitState(id, job.Completed, 4*time.Minute)
	var nodes []string
	for _, n := range m["nodes"].([]any) {
		nodes = append(nodes, n.(map[string]any)["name"].(string))
	}
	if len(nodes) != 2 || slicesContains(nodes, first) || !slicesContains(nodes, second) {
		t.Errorf("the job ended on %v, want the two nodes other than %s (%s among them)", nodes, first, second)
	}
	if a := m["attempts"].([]any); len(a) < 2 || !strings.Contains(a[0].(map[string]any)["cause"].(string), "requeued") {
		t.Errorf("attempts %v: want the first ended by the requeue", m["attempts"])
	} else if k := a[0].(map[string]any)["failure"]; k != string(failure.GPUHealth) {
		t.Errorf("the first attempt's failure %v, want %s (the drain's kind)", k, failure.GPUHealth)
	}
	if by, _ := m["restarts_by_cause"].(map[string]any); by["gpu_health"] != float64(1) {
		t.Errorf("restarts by cause %v, want the requeue counted as gpu_health", m["restarts_by_cause"])
	}
	lost, _ := m["lost_nodes"].([]any)
	if len(lost) != 1 || !strings.Contains(lost[0].(map[string]any)["why"].(string), "Xid 79") || lost[0].(map[string]any)["kind"] != string(failure.GPUHealth) {
		t.Errorf("lost nodes %v, want %s drained for its Xid 79 (kind %s)", m["lost_nodes"], first, failure.GPUHealth)
	}
	for _, n := range nodesJSON(t, c.consul) {
		if n.Name == first && n.State != "drained" {
			t.Errorf("%s is %s, want drained", first, n.State)
		}
	}
	out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if !bytes.Contains(out, []byte("finished at step 300")) || !bytes.Contains(out, []byte("resumed from step")) {
		t.Errorf("the job did not resume and finish:\n%s", out)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestSubmitMIGProfile: on a node whose recorded inventory runs MIG on GPU 0 (two
// 3g.20gb devices), --gpus-per-node 3g.20gb:2 is granted those two MIG devices, each
// rank sees exactly one of them, and show gives the request back as written; a profile
// the cluster lacks is refused before it is queued, naming the value.
func TestSubmitMIGProfile(t *testing.T) {
	c := startJobClusterWith(t, nil)
	c.inventory = filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-a100-mig.json")
	c.startAgent("mig-a")
	waitUntilFor(t, 60*time.Second, func() bool {
		n := nodesJSON(t, c.consul)
		return len(n) == 1 && n[0].State == "up"
	}, "the agent up")
	dir := t.TempDir()
	t.Chdir(dir)

	code, _, errOut := c.gangrun("submit", "--gpus-per-node", "1g.10gb:1", "--", "true")
	if code != 2 || !strings.Contains(errOut, "--gpus-per-node 1g.10gb:1: no node has 1g.10gb MIG devices") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("a profile no node has: exit %d, %q; want exit 2 and one line naming it", code, errOut)
	}

	id := c.submit("--gpus-per-node", "3g.20gb:2", "--", "/bin/sh", "-c", `echo "rank $LOCAL_RANK sees $CUDA_VISIBLE_DEVICES"`)
	c.waitState(id, job.Completed, 90*time.Second)
	out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`rank (\d) sees (\S*)`).FindAllStringSubmatch(string(out), -1) {
		if !strings.HasPrefix(m[2], "MIG-") || strings.Contains(m[2], ",") {
			t.Errorf("rank %s sees %q, want one MIG device", m[1], m[2])
		}
		seen[m[2]] = true
	}
	if len(seen) != 2 {
		t.Errorf("the ranks saw %d distinct MIG devices, want 2:\n%s", len(seen), out)
	}
	if code, show, _ := c.gangrun("show", id); code != 0 || !strings.Contains(show, "GPUsPerNode=3g.20gb:2") {
		t.Errorf("show: exit %d:\n%s", code, show)
	}
}

// TestJobFailsWhenOneNodesStepCannotStart: a 2-node job whose output one node cannot
// open (its directory is missing there) fails on that node before the job's
// rendezvous; the other node's step, waiting in the rendezvous for it, is stopped too,
// so the job ends FAILED with the cause and every GPU free, rather than COMPLETING for
// ever.
func TestJobFailsWhenOneNodesStepCannotStart(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir(filepath.Join(dir, "out-gpu-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	id := c.submit("--nodes", "2", "--gpus-per-node", "2", "--output", filepath.Join(dir, "out-%n", "o-%j.out"), "--", "sleep", "300")
	m := c.waitState(id, job.Failed, 120*time.Second)
	if r, _ := m["reason"].(string); !strings.Contains(r, "output "+filepath.Join(dir, "out-gpu-b", "o-"+id+".out")+": ") {
		t.Errorf("reason %q, want gpu-b's output refused", r)
	}
	waitUntilFor(t, 60*time.Second, func() bool {
		free, total := freeGPUs(nodesJSON(t, c.consul))
		return free == total
	}, "every GPU free again")
}

// TestSubmitBegin: a job submitted with --begin waits PENDING with reason BeginTime,
// without a request, then runs to COMPLETED once its time has come.
func TestSubmitBegin(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	t.Chdir(t.TempDir())
	before := time.Now()
	id := c.submit("--begin", "now+3", "--nice", "5", "--", "/bin/true")
	if m := c.show(id); m["state"] != string(job.Pending) || m["reason"] != "BeginTime" {
		t.Errorf("a job with --begin now+3: %v %v, want PENDING BeginTime", m["state"], m["reason"])
	}
	m := c.waitState(id, job.Completed, time.Minute)
	// Not before its begin time (now+3 s, to the second).
	at, _ := m["started"].(string)
	if started, err := time.Parse(time.RFC3339Nano, at); err != nil || started.Before(before.Truncate(time.Second).Add(3*time.Second)) {
		t.Errorf("the job with --begin now+3 submitted at %s started %v, want 3 s later", before.Format(time.RFC3339Nano), m["started"])
	}
}
