package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/torchtest"
)

// gangrunNode is one `gangrun run` process standing in for a node.
type gangrunNode struct {
	name   string
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
	code   int
}

func startNode(t *testing.T, name string, env []string, args ...string) *gangrunNode {
	t.Helper()
	n := &gangrunNode{name: name, done: make(chan struct{})}
	n.cmd = exec.Command(gangrunBin, args...)
	n.cmd.Env = append(os.Environ(), env...)
	n.cmd.Stdout, n.cmd.Stderr = &n.stdout, &n.stderr
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(n.done)
		err := n.cmd.Wait()
		n.code = n.cmd.ProcessState.ExitCode()
		_ = err
	}()
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.done
	})
	return n
}

// wait waits for the node's gangrun to exit and returns its exit code.
func (n *gangrunNode) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-n.done:
		return n.code
	case <-time.After(d):
		t.Fatalf("node %s did not finish within %s; stderr:\n%s", n.name, d, n.output())
	}
	return -1
}

func (n *gangrunNode) output() string {
	return "--- stdout\n" + n.stdout.String() + "--- stderr\n" + n.stderr.String()
}

// syncBuffer is a buffer the child process writes to while the test reads it.
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

// workerPID finds the pid of the worker with the given node name and local rank among
// the processes carrying mark.
func workerPID(mark, node string, localRank int) int {
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range envs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(mark+"\x00")) {
			continue
		}
		if bytes.Contains(data, []byte("GANGRUN_NODE_NAME="+node+"\x00")) && bytes.Contains(data, []byte("\x00LOCAL_RANK="+strconv.Itoa(localRank)+"\x00")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	return 0
}

// trainer is the example trainer's command line on Debian's torch.
func trainer(t *testing.T, args ...string) []string {
	return trainerOn(t, python(t), args...)
}

// trainerOn is the example trainer's command line on interpreter py.
func trainerOn(t *testing.T, py string, args ...string) []string {
	return append([]string{py, filepath.Join(repoRoot(t), "scripts", "examples", "train_ddp.py")}, args...)
}

func TestTwoNodesRestartFromTheSameCheckpoint(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		consul := consultest.Start(t).Addr
		mark := testMark(t)
		ckpt := filepath.Join(t.TempDir(), "ckpt")
		nodes := map[string]*gangrunNode{}
		for _, name := range []string{"node-a", "node-b"} {
			args := append([]string{"run", "--coordinator", "consul://" + consul, "--job-id", "two-nodes", "--nnodes", "2",
				"--node-name", name, "--advertise-addr", "127.0.0.1", "--nproc-per-node", "2", "--restart-backoff", "0s",
				"--checkpoint-dir", ckpt, "--"}, trainerOn(t, tp.Path, "--steps", "80", "--ckpt-every", "10", "--step-time", "0.05")...)
			nodes[name] = startNode(t, name, []string{mark}, args...)
		}
		// Once step-20 is complete, SIGKILL a worker of node B.
		waitUntilFor(t, 90*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(ckpt, "step-20", ".complete"))
			return err == nil
		}, "checkpoint step-20")
		pid := workerPID(mark, "node-b", 1)
		if pid == 0 {
			t.Fatal("no worker of node-b found")
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for name, n := range nodes {
			if code := n.wait(t, 2*time.Minute); code != 0 {
				t.Fatalf("%s exited %d\n%s", name, code, n.output())
			}
		}
		// Every rank of the second attempt resumed from one and the same checkpoint.
		resumed := map[int]int{}
		for _, n := range nodes {
			for r, s := range resumedSteps(n.stdout.String()) {
				resumed[r] = s
			}
		}
		if len(resumed) != 4 {
			t.Fatalf("resumed steps by rank = %v, want all 4 ranks", resumed)
		}
		for r, s := range resumed {
			if s != resumed[0] || s < 20 {
				t.Errorf("rank %d resumed from step %d, rank 0 from %d (want one step >= 20)", r, s, resumed[0])
			}
		}
		if !strings.Contains(nodes["node-a"].stderr.String()+nodes["node-b"].stderr.String(), "signal SIGKILL (9)") {
			t.Errorf("no node reported the SIGKILLed worker as the root cause")
		}
		all := nodes["node-a"].stdout.String() + nodes["node-b"].stdout.String()
		if !strings.Contains(all, "finished at step 80") {
			t.Errorf("the gang did not finish at step 80")
		}
	})
}

func TestElasticSurvivorCarriesOnAlone(t *testing.T) {
	consul := consultest.Start(t).Addr
	mark := testMark(t)
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	nodes := map[string]*gangrunNode{}
	for _, name := range []string{"node-a", "node-b"} {
		args := append([]string{"run", "--coordinator", "consul://" + consul, "--job-id", "elastic", "--nnodes", "1:2",
			"--node-name", name, "--advertise-addr", "127.0.0.1", "--nproc-per-node", "2", "--restart-backoff", "0s",
			"--checkpoint-dir", ckpt, "--"}, trainer(t, "--steps", "80", "--ckpt-every", "10", "--step-time", "0.05")...)
		nodes[name] = startNode(t, name, []string{mark}, args...)
	}
	waitUntilFor(t, 90*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(ckpt, "step-20", ".complete"))
		return err == nil
	}, "checkpoint step-20")
	if !strings.Contains(nodes["node-a"].stdout.String()+nodes["node-b"].stdout.String(), "world size 4") {
		t.Fatalf("the first attempt did not run both nodes (world size 4)")
	}
	// Node B's gangrun dies outright; its workers die with it. Node A re-forms alone.
	if err := nodes["node-b"].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := nodes["node-a"].wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("node-a exited %d\n%s", code, nodes["node-a"].output())
	}
	out := nodes["node-a"].stdout.String()
	attempts := regexp.MustCompile(`world size (\d+), backend gloo, steps (\d+)\.\.`).FindAllStringSubmatch(out, -1)
	if len(attempts) == 0 || attempts[len(attempts)-1][1] != "2" {
		t.Fatalf("node-a's last attempt: %v, want world size 2\n%s", attempts, nodes["node-a"].output())
	}
	if from, _ := strconv.Atoi(attempts[len(attempts)-1][2]); from < 20 {
		t.Errorf("the survivor resumed from step %d, want >= 20", from)
	}
	if !strings.Contains(out, "finished at step 80") {
		t.Errorf("node-a did not finish at step 80")
	}
}

func TestSlurmWithoutConsul(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		mark := testMark(t)
		jobID := strconv.Itoa(100000 + rand.IntN(800000))
		nodes := make([]*gangrunNode, 2)
		for i := range nodes {
			env := []string{mark, "SLURM_JOB_ID=" + jobID, "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=127.0.0.[1-2]",
				"SLURM_NNODES=2", "SLURM_NODEID=" + strconv.Itoa(i), "SLURM_TASKS_PER_NODE=1(x2)"}
			args := append([]string{"run", "--nproc-per-node", "2", "--"}, trainerOn(t, tp.Path, "--steps", "30")...)
			nodes[i] = startNode(t, fmt.Sprint("slurm", i), env, args...)
		}
		for _, n := range nodes {
			if code := n.wait(t, 2*time.Minute); code != 0 {
				t.Fatalf("%s exited %d\n%s", n.name, code, n.output())
			}
		}
		if !strings.Contains(nodes[0].stdout.String(), "training: world size 4") || !strings.Contains(nodes[0].stdout.String(), "finished at step 30") {
			t.Errorf("slurm node 0 output:\n%s", nodes[0].output())
		}
		for _, want := range []string{`"node_rank": 1`, `"world_size": 4`, `"master": "127.0.0.1:` + strconv.Itoa(20000+mustAtoi(jobID)%10000) + `"`} {
			if !strings.Contains(nodes[1].stderr.String(), want) {
				t.Errorf("slurm node 1 lacks %s:\n%s", want, nodes[1].output())
			}
		}
		// The job's id is SLURM_JOB_ID on every node (docs/run.md), not an id of its own.
		for _, n := range nodes {
			if want := `"job_id": "` + jobID + `"`; !strings.Contains(n.stderr.String(), want) {
				t.Errorf("%s lacks %s:\n%s", n.name, want, n.output())
			}
		}
	})
	// Bad Slurm input is a usage error naming the variable.
	code, _, errOut := inProcessEnv(map[string]string{"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2",
		"SLURM_NODEID": "0"}, "run", "--", "/bin/true")
	if code != 2 || !strings.Contains(errOut, `SLURM_JOB_NODELIST="n[1-2"`) {
		t.Errorf("bad nodelist: exit %d, %q", code, errOut)
	}
	code, _, errOut = inProcessEnv(map[string]string{"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]",
		"SLURM_NODEID": "5"}, "run", "--", "/bin/true")
	if code != 2 || !strings.Contains(errOut, `SLURM_NODEID="5"`) {
		t.Errorf("bad node id: exit %d, %q", code, errOut)
	}
}

// inProcessEnv runs gangrun in-process with getenv answering from vars.
func inProcessEnv(vars map[string]string, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return vars[k] }, stdin: strings.NewReader("")}
	code := dispatch(context.Background(), e, args)
	return code, stdout.String(), stderr.String()
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// TestFinishedNodeIsNotRerunWhenConsulLosesTheJob: node A's workers finish while node B's
// still run; then the Consul dev agent restarts, losing every key and session. Node A
// must not start its finished workers again (a finished job run twice): it exits 0 and
// says the other nodes' outcome is unknown.
func TestFinishedNodeIsNotRerunWhenConsulLosesTheJob(t *testing.T) {
	agent := consultest.Start(t)
	mark := testMark(t)
	dir := t.TempDir()
	script := `echo "$GANGRUN_NODE_NAME $RANK" >> ` + dir + `/starts
if [ "$GANGRUN_NODE_NAME" = node-b ]; then while [ ! -e ` + dir + `/go ]; do sleep 0.05; done; fi
echo "finished $RANK"`
	nodes := map[string]*gangrunNode{}
	for _, name := range []string{"node-a", "node-b"} {
		nodes[name] = startNode(t, name, []string{mark}, "run", "--coordinator", "consul://"+agent.Addr, "--job-id", "lost",
			"--nnodes", "2", "--node-name", name, "--advertise-addr", "127.0.0.1", "--nproc-per-node", "1",
			"--restart-backoff", "0s", "--term-timeout", "1s", "--", "/bin/sh", "-c", script)
	}
	waitUntilFor(t, 60*time.Second, func() bool {
		return strings.Contains(nodes["node-a"].stdout.String(), "finished")
	}, "node-a's worker to finish")
	// node-a has reported its success and waits for node-b's.
	time.Sleep(300 * time.Millisecond)
	agent.Restart()
	if code := nodes["node-a"].wait(t, 60*time.Second); code != 0 {
		t.Fatalf("node-a exited %d, want 0\n%s", code, nodes["node-a"].output())
	}
	if out := nodes["node-a"].stderr.String(); !strings.Contains(out, "the other nodes' outcome is unknown") {
		t.Errorf("node-a does not say the gang's outcome is unknown:\n%s", out)
	}
	starts, err := os.ReadFile(filepath.Join(dir, "starts"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(starts), "node-a "); n != 1 {
		t.Errorf("node-a's worker started %d times, want once:\n%s", n, starts)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
