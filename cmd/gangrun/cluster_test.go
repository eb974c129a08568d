package main

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
)

// inProcess runs gangrun in this process and returns its exit code, stdout and stderr.
func inProcess(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, getenv: os.Getenv, stdin: strings.NewReader("")}
	code := dispatch(context.Background(), e, args)
	return code, stdout.String(), stderr.String()
}

// startAgent starts `gangrun agent` as a process for node with the recorded inventory
// (topology/testdata/inventories/INVENTORY.json) and labels; it is stopped with SIGTERM
// at cleanup.
func startAgent(t *testing.T, consul, node, inventory string, labels string) *exec.Cmd {
	t.Helper()
	cmd, _ := startAgentProc(t, consul, node, inventory, nil, "--labels", labels)
	return cmd
}

// startAgentWith is startAgent on the DGX H100 inventory with extra environment and
// flags; it returns the agent's output.
func startAgentWith(t *testing.T, consul, node string, env []string, flags ...string) *syncBuffer {
	t.Helper()
	_, log := startAgentProc(t, consul, node, "dgx-h100", env, flags...)
	return log
}

// startAgentProc starts `gangrun agent` for node with the recorded inventory, extra
// environment and flags; it is stopped with SIGTERM at cleanup, its output logged if
// the test failed.
func startAgentProc(t *testing.T, consul, node, inventory string, env []string, flags ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	args := append([]string{"agent", "--consul", consul, "--node-name", node, "--advertise-addr", "127.0.0.1",
		"--topology-file", filepath.Join(repoRoot(t), "topology", "testdata", "inventories", inventory+".json")}, flags...)
	cmd := exec.Command(gangrunBin, args...)
	cmd.Env = agentEnv(env...)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// The steps' own messages, read before the agent stops and removes them.
			t.Logf("agent %s's steps' messages:\n%s", node, stepMessages(log.String()))
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agent %s log:\n%s", node, log.String())
		}
	})
	return cmd, log
}

// stepMessages returns the files in the directory an agent's log names as "the steps'
// own messages", each under its name.
func stepMessages(agentLog string) string {
	m := regexp.MustCompile(`the steps' own messages\t\{"dir": "([^"]+)"\}`).FindStringSubmatch(agentLog)
	if m == nil {
		return "(the agent's log names no directory)"
	}
	files, _ := filepath.Glob(filepath.Join(m[1], "*"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(f), data)
	}
	return b.String()
}

func nodesJSON(t *testing.T, consul string) []allocator.NodeStatus {
	t.Helper()
	code, out, errOut := inProcess("nodes", "--consul", consul, "--json")
	if code != 0 {
		t.Fatalf("gangrun nodes: exit %d: %s", code, errOut)
	}
	var nodes []allocator.NodeStatus
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("gangrun nodes --json: %v\n%s", err, out)
	}
	return nodes
}

// startHolder starts `gangrun alloc --json` for nodes × gpus and returns it, holding its
// grant, and the grant as it printed it (compacted, as alloc puts it in GANGRUN_GRANT).
// It is stopped with SIGTERM at cleanup, if still running.
func startHolder(t *testing.T, consul string, nodes, gpus int) (*exec.Cmd, []byte) {
	t.Helper()
	holder := exec.Command(gangrunBin, "alloc", "--consul", consul, "--nodes", strconv.Itoa(nodes),
		"--gpus-per-node", strconv.Itoa(gpus), "--json")
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var holderErr syncBuffer
	holder.Stderr = &holderErr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Signal(syscall.SIGTERM); _ = holder.Wait() })
	var raw json.RawMessage
	if err := json.NewDecoder(bufio.NewReader(stdout)).Decode(&raw); err != nil {
		t.Fatalf("alloc --json: %v; stderr: %s", err, holderErr.String())
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		t.Fatal(err)
	}
	return holder, compact.Bytes()
}

func freeGPUs(nodes []allocator.NodeStatus) (free, total int) {
	for _, n := range nodes {
		free += n.GPUsFree
		total += n.GPUsTotal
	}
	return free, total
}

func TestClusterWalkthrough(t *testing.T) {
	consul := consultest.Start(t).Addr
	a := startAgent(t, consul, "gpu-a", "dgx-h100", "partition=train,switch=leaf1")
	startAgent(t, consul, "gpu-b", "dgx-h100", "partition=train,switch=leaf1")
	waitUntil(t, func() bool {
		nodes := nodesJSON(t, consul)
		return len(nodes) == 2 && nodes[0].State == "up" && nodes[1].State == "up"
	}, "two agents up")

	// A holder takes 2 nodes × 4 GPUs and holds them.
	holder, raw := startHolder(t, consul, 2, 4)
	var grant struct {
		ID    string `json:"id"`
		Nodes []struct {
			Name string `json:"name"`
			GPUs []int  `json:"gpus"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &grant); err != nil {
		t.Fatalf("alloc --json: %v", err)
	}
	if len(grant.Nodes) != 2 || len(grant.Nodes[0].GPUs) != 4 || len(grant.Nodes[1].GPUs) != 4 {
		t.Fatalf("grant = %+v", grant)
	}
	if free, total := freeGPUs(nodesJSON(t, consul)); free != 8 || total != 16 {
		t.Fatalf("free %d of %d after the grant, want 8 of 16", free, total)
	}
	code, out, _ := inProcess("queue", "--consul", consul, "--json")
	if code != 0 || !strings.Contains(out, `"state": "RUNNING"`) || !strings.Contains(out, `"kind": "alloc"`) || !strings.Contains(out, grant.ID) {
		t.Errorf("queue --json = %d %s", code, out)
	}

	// The holder dies without releasing: its GPUs come back by themselves within the
	// documented bound (2×TTL, then they are lockable after the lock-delay).
	killed := time.Now()
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	waitUntilFor(t, allocator.ReleaseBound+5*time.Second, func() bool {
		free, _ := freeGPUs(nodesJSON(t, consul))
		return free == 16
	}, "the dead holder's GPUs back")
	t.Logf("GPUs back %s after the holder's SIGKILL (bound %s)", time.Since(killed).Round(time.Second), allocator.ReleaseBound)

	// They can be granted again (the lock-delay does not keep them stuck); the command
	// runs inside the grant and its exit code comes back.
	ctx, cancel := context.WithTimeout(context.Background(), allocator.ReleaseBound+30*time.Second)
	defer cancel()
	run := exec.CommandContext(ctx, gangrunBin, "alloc", "--consul", consul, "--nodes", "2", "--gpus-per-node", "8", "--",
		"/bin/sh", "-c", `echo "grant=$GANGRUN_GRANT_ID nodes=$GANGRUN_NODELIST n=$GANGRUN_NNODES"; exit 7`)
	outb, err := run.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("alloc -- command: %v, want exit 7; stdout %s", err, outb)
	}
	if !strings.Contains(string(outb), "nodes=gpu-a,gpu-b n=2") {
		t.Errorf("command output %q lacks the grant's environment", outb)
	}
	if free, _ := freeGPUs(nodesJSON(t, consul)); free != 16 {
		t.Errorf("free %d after the command, want 16 (released)", free)
	}

	// Drain and resume.
	if code, out, errOut := inProcess("drain", "--consul", consul, "gpu-b", "--reason", "fan failure"); code != 0 || !strings.Contains(out, "drained gpu-b") {
		t.Fatalf("drain: %d %s %s", code, out, errOut)
	}
	for _, n := range nodesJSON(t, consul) {
		if n.Name == "gpu-b" && (n.State != "drained" || n.Reason != "fan failure" || n.GPUsFree != 0) {
			t.Errorf("drained node = %+v", n)
		}
	}
	if code, _, errOut := inProcess("alloc", "--consul", consul, "--nodes", "2", "--gpus-per-node", "1", "--wait", "2s"); code != 1 || !strings.Contains(errOut, "1 drained") {
		t.Errorf("alloc on a drained node: exit %d: %s", code, errOut)
	}
	if code, _, errOut := inProcess("resume", "--consul", consul, "gpu-b"); code != 0 {
		t.Fatalf("resume: %d %s", code, errOut)
	}

	// SIGTERM ends an agent cleanly; its node shows down at once.
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(); err != nil {
		t.Errorf("agent after SIGTERM: %v, want exit 0", err)
	}
	for _, n := range nodesJSON(t, consul) {
		if n.Name == "gpu-a" && n.State != "down" {
			t.Errorf("stopped agent's node is %s, want down", n.State)
		}
	}
}

func waitUntilFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClusterUsageErrors(t *testing.T) {
	consul := consultest.Start(t).Addr
	startAgent(t, consul, "gpu-a", "pcie-2socket", "partition=dev")
	waitUntil(t, func() bool { return len(nodesJSON(t, consul)) == 1 }, "the agent up")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"alloc", "--nodes", "0"}, 2, "--nodes 0"},
		{[]string{"alloc", "--gpus-per-node", "99"}, 2, "--gpus-per-node 99: no node has more than 4"},
		{[]string{"alloc", "--partition", "prod"}, 2, "--partition prod: no node is in that partition"},
		{[]string{"alloc", "--labels", "rack"}, 2, `--labels "rack"`},
		{[]string{"alloc", "--wait", "soon"}, 2, "--wait"},
		{[]string{"alloc", "--", "no-such-cmd-x1"}, 127, "command not found: no-such-cmd-x1"},
		{[]string{"alloc", "--wait", "9999999999h"}, 2, `--wait "9999999999h": must be a duration like 30s, 5m or 2h (at most 10000h)`},
		{[]string{"alloc", "--wait", "-1s"}, 2, `--wait "-1s": must not be negative`},
		{[]string{"alloc", "--nodes", "99999999999999999999"}, 2, `--nodes "99999999999999999999": must be an integer`},
		{[]string{"alloc", "--labels", "rack=a\nb"}, 2, `--labels "rack=a\nb": holds the invisible character U+000A (newline)`},
		{[]string{"alloc", "--labels", "rack=a\tb"}, 2, `--labels "rack=a\tb": holds the invisible character U+0009 (tab)`},
		{[]string{"alloc", "--labels", "rack=\u202eb"}, 2, `--labels "rack=\u202eb": holds the invisible character U+202E (right-to-left override)`},
		{[]string{"alloc", "--partition", "dev\x1b[2J"}, 2, `--partition "dev\x1b[2J": holds the invisible character U+001B (escape)`},
		{[]string{"alloc", "--gpu-model", "H100\u200b"}, 2, `--gpu-model "H100\u200b": holds the invisible character U+200B (zero-width space)`},
		{[]string{"alloc", "--", "/tmp"}, 126, "/tmp: is a directory, not a command"},
		{[]string{"cancel", "abcdef123456"}, 2, `no job, request or grant "abcdef123456" (gangrun queue lists them)`},
		{[]string{"cancel", "../etc"}, 2, `id "../etc"`},
		{[]string{"cancel", ""}, 2, `id "": want a name`},
		{[]string{"show", "abcdef123456"}, 2, `no job, request or grant "abcdef123456" (gangrun queue lists them)`},
		{[]string{"show", "a\nb"}, 2, `id "a\nb": only letters`},
		{[]string{"drain", "gpu-a"}, 2, "--reason is required"},
		{[]string{"drain", "gpu-z", "--reason", "x"}, 2, `node "gpu-z": not found`},
		{[]string{"drain", "a/b", "--reason", "x"}, 2, `node "a/b": only letters`},
		{[]string{"resume", "gpu-z"}, 2, `node "gpu-z": not found`},
		{[]string{"drain", "gpu-a", "--reason", "multi\nline"}, 2, `--reason "multi\nline": holds the invisible character U+000A (newline)`},
		{[]string{"drain", "gpu-a", "--reason", strings.Repeat("x", 100_000)}, 2, `--reason of 100000 bytes ("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"...): want at most 512, one line for gangrun nodes`},
		{[]string{"drain", "gpu-a", "--reason", "fan\u202eliaf"}, 2, `--reason "fan\u202eliaf": holds the invisible character U+202E`},
		{[]string{"agent", "--labels", "=x", "--node-name", "n"}, 2, "--labels"},
		{[]string{"agent", "--labels", "switch=leaf\n1", "--node-name", "n"}, 2, `--labels "switch=leaf\n1": holds the invisible character U+000A (newline)`},
		{[]string{"agent", "--node-name", ""}, 2, "--node-name \"\": "},
		{[]string{"agent", "--advertise-addr", "not-an-ip", "--node-name", "n"}, 2, `--advertise-addr "not-an-ip": want an IP address`},
	} {
		code, _, errOut := inProcess(append(tc.args, "--consul", consul)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
		if n := strings.Count(strings.TrimSpace(errOut), "\n"); n > 0 {
			t.Errorf("%v: %d lines on stderr, want one: %q", tc.args, n+1, errOut)
		}
	}
	if free, total := freeGPUs(nodesJSON(t, consul)); free != total {
		t.Errorf("bad requests reserved GPUs: %d of %d free", free, total)
	}
}

// TestAllocSIGKILLLeavesNoCommand: `alloc -- CMD` SIGKILLed while CMD and a child of
// it run: the guardian kills CMD's process group, so nothing goes on using GPUs whose
// grant expires with the dead holder's session.
func TestAllocSIGKILLLeavesNoCommand(t *testing.T) {
	consul := consultest.Start(t).Addr
	startAgent(t, consul, "gpu-a", "pcie-2socket", "")
	waitUntil(t, func() bool { return len(nodesJSON(t, consul)) == 1 }, "the agent up")
	mark := testMark(t) // fails the test if CMD or its child outlive the holder
	dir := t.TempDir()
	holder := exec.Command(gangrunBin, "alloc", "--consul", consul, "--nodes", "1", "--gpus-per-node", "2", "--",
		"/bin/sh", "-c", `sleep 300 & touch `+dir+`/ready; wait`)
	holder.Env = append(os.Environ(), mark)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitForFiles(t, dir, "ready")
	if n := len(marked(mark)); n < 2 {
		t.Fatalf("%d marked processes before the kill, want the command and its child", n)
	}
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
}
