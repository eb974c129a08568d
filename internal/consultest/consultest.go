// Package consultest starts real Consul agents for tests: a `consul agent -dev` on free
// loopback ports, a single-server agent with a data directory that survives a restart,
// or a cluster of several servers and client agents (cluster.go). The binary is
// $GANGRUN_CONSUL, else the repository's .tools/bin/consul (built by
// scripts/install-consul.sh, which `make test` runs), else consul on PATH. A missing
// binary fails the test: tests never skip for it.
package consultest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/testport"
)

// startTimeout bounds how long an agent may take to elect itself leader.
const startTimeout = 30 * time.Second

// requestTimeout bounds one HTTP request of the readiness checks.
const requestTimeout = 5 * time.Second

// Agent is one Consul agent: running, or stopped (Stop, Kill) and able to run again on
// the same ports and data directory (Launch).
type Agent struct {
	// Addr is the HTTP API address, "127.0.0.1:PORT".
	Addr string
	// Name is the agent's node name (-node).
	Name string
	// ServerAddr is the server RPC address, "127.0.0.1:PORT": what /v1/status/leader
	// answers when this agent is a server and leads.
	ServerAddr string
	// SerfLANAddr is the LAN gossip address other agents join, "127.0.0.1:PORT".
	SerfLANAddr string
	// ManagementToken is the ACL system's initial management token (a UUID) of an agent
	// started by StartACL; "" when ACLs are off.
	ManagementToken string

	t       testing.TB
	bin     string
	args    []string
	dataDir string
	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has been reaped
	log     *logBuffer
}

// logKeep bounds how much of an agent's output is kept for a failing test's report.
const logKeep = 256 << 10

// logBuffer keeps the last logKeep bytes an agent wrote; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > logKeep {
		l.b = append([]byte(nil), l.b[len(l.b)-logKeep/2:]...)
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// Log returns the last of what the agent wrote (its log level is warn), for a failing
// test's report.
func (a *Agent) Log() string {
	a.mu.Lock()
	l := a.log
	a.mu.Unlock()
	if l == nil {
		return ""
	}
	return l.String()
}

// Binary returns the consul binary to use, or an error saying how to get one.
func Binary() (string, error) {
	if p := os.Getenv("GANGRUN_CONSUL"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		return "", fmt.Errorf("GANGRUN_CONSUL=%s: no such file (run scripts/install-consul.sh)", p)
	}
	if root, err := repoRoot(); err == nil {
		p := filepath.Join(root, ".tools", "bin", "consul")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("consul"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no consul binary: run scripts/install-consul.sh (make test does), or set GANGRUN_CONSUL")
}

// repoRoot walks up from the working directory to the directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// freePorts returns n distinct ports on 127.0.0.1 claimed for this test process
// (testport: below the ephemeral range, where no client socket takes them meanwhile).
func freePorts(n int) ([]int, error) { return testport.Take(n) }

// Start starts `consul agent -dev` on free loopback ports and stops it when the test
// ends. Its state lives in memory: a restart loses it.
func Start(t testing.TB) *Agent {
	t.Helper()
	return start(t, false)
}

// StartPersistent starts a single-server Consul agent (-server -bootstrap-expect 1)
// with a data directory, so KV data and sessions survive Restart.
func StartPersistent(t testing.TB) *Agent {
	t.Helper()
	return start(t, true)
}

// StartACL starts `consul agent -dev` as Start does, with Consul's ACL system on and
// default_policy "deny": a request without a token, or with one whose policies do not
// allow it, is refused (HTTP 403). The agent's ManagementToken is the initial
// management token (Consul's acl.tokens.initial_management), which the agent also uses
// for its own requests (acl.tokens.agent).
func StartACL(t testing.TB) *Agent {
	t.Helper()
	return startWith(t, false, true)
}

// aclConfig is the agent's ACL configuration (Consul v1.14's agent configuration
// reference, "ACL Parameters"), with the management token as %s twice.
const aclConfig = `acl {
  enabled = true
  default_policy = "deny"
  down_policy = "extend-cache"
  tokens {
    initial_management = %q
    agent = %q
  }
}
`

func start(t testing.TB, persistent bool) *Agent {
	t.Helper()
	return startWith(t, persistent, false)
}

func startWith(t testing.TB, persistent, acl bool) *Agent {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{t: t, bin: bin, Addr: "127.0.0.1:" + strconv.Itoa(ports[0]), Name: "gangrun-test",
		ServerAddr: "127.0.0.1:" + strconv.Itoa(ports[1]), SerfLANAddr: "127.0.0.1:" + strconv.Itoa(ports[2])}
	common := []string{
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-node", a.Name,
		"-http-port", strconv.Itoa(ports[0]), "-server-port", strconv.Itoa(ports[1]),
		"-serf-lan-port", strconv.Itoa(ports[2]), "-serf-wan-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-hcl", "ports { grpc_tls = -1 }", "-hcl", "limits { http_max_conns_per_client = 4096 }",
		"-log-level", "warn",
	}
	if acl {
		var b [16]byte
		_, _ = rand.Read(b[:])
		a.ManagementToken = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
		f := filepath.Join(t.TempDir(), "acl.hcl")
		if err := os.WriteFile(f, []byte(fmt.Sprintf(aclConfig, a.ManagementToken, a.ManagementToken)), 0o600); err != nil {
			t.Fatal(err)
		}
		common = append(common, "-config-file", f)
	}
	if persistent {
		a.dataDir = t.TempDir()
		a.args = append([]string{"agent", "-server", "-bootstrap-expect", "1", "-data-dir", a.dataDir,
			"-hcl", "performance { raft_multiplier = 1 }"}, common...)
	} else {
		a.args = append([]string{"agent", "-dev"}, common...)
	}
	a.Launch()
	t.Cleanup(a.Stop)
	return a
}

// Launch starts the agent (again, after Stop or Kill: same ports, data directory and
// node name) and waits until it is ready: a leader is known and the agent's node is in
// the catalog with a passing serfHealth check. It fails the test if the agent is not
// ready within 30 s.
func (a *Agent) Launch() {
	a.t.Helper()
	if err := a.spawn(); err != nil {
		a.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := a.waitReady(ctx); err != nil {
		a.Stop()
		a.t.Fatalf("consul agent %s at %s: %v; its log:\n%s", a.Name, a.Addr, err, a.Log())
	}
}

// spawn starts the agent's process without waiting for it to be ready.
func (a *Agent) spawn() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return fmt.Errorf("consul agent %s is already running (pid %d)", a.Name, a.cmd.Process.Pid)
	}
	cmd := exec.Command(a.bin, a.args...)
	log := &logBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start consul agent %s: %w", a.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	a.cmd, a.done, a.log = cmd, done, log
	return nil
}

// Running reports whether the agent's process runs (it was started and has not exited).
func (a *Agent) Running() bool {
	a.mu.Lock()
	done := a.done
	running := a.cmd != nil
	a.mu.Unlock()
	if !running {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// waitReady polls until a leader is known to the agent (with ACLs, until the management
// token works) and the agent's own node is in
// the catalog with a passing serfHealth check: a session bound to the node's health
// (Consul's default) is refused with "Missing check 'serfHealth' registration" until
// the leader has registered that check, which can come after the node itself, and an
// agent restarted after a crash has a critical one until the leader sees it again.
func (a *Agent) waitReady(ctx context.Context) error {
	var last error
	for {
		if !a.Running() {
			return fmt.Errorf("the process exited")
		}
		if last = a.ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ready is one readiness check (see waitReady).
func (a *Agent) ready(ctx context.Context) error {
	var leader string
	if err := a.get(ctx, "/v1/status/leader", &leader); err != nil {
		return err
	}
	if leader == "" {
		return fmt.Errorf("no leader known")
	}
	if a.ManagementToken != "" {
		// The leader creates the initial management token after it is elected.
		var tok struct{ AccessorID string }
		if err := a.get(ctx, "/v1/acl/token/self", &tok); err != nil {
			return fmt.Errorf("the management token: %w", err)
		}
	}
	var checks []struct {
		CheckID string
		Status  string
	}
	if err := a.get(ctx, "/v1/health/node/"+a.Name, &checks); err != nil {
		return err
	}
	for _, c := range checks {
		if c.CheckID == "serfHealth" {
			if c.Status != "passing" {
				return fmt.Errorf("node %s: serfHealth %s", a.Name, c.Status)
			}
			return nil
		}
	}
	return fmt.Errorf("node %s: no serfHealth check registered yet", a.Name)
}

// get GETs path from the agent's HTTP API and decodes the JSON answer into v.
func (a *Agent) get(ctx context.Context, path string, v any) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+a.Addr+path, nil)
	if err != nil {
		return err
	}
	if a.ManagementToken != "" {
		req.Header.Set("X-Consul-Token", a.ManagementToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// Stop stops the agent (SIGTERM, then SIGKILL of its process group after 5s). Safe to
// call twice, and on an agent that was killed.
func (a *Agent) Stop() {
	a.halt(syscall.SIGTERM)
}

// Kill SIGKILLs the agent's process group, as a crash would, and reaps it: the agent
// leaves nothing behind (no leave message, no snapshot), and Launch starts it again on
// the same ports and data directory.
func (a *Agent) Kill() {
	a.halt(syscall.SIGKILL)
}

// halt signals the agent and waits for it to exit; after 5s it SIGKILLs the group.
func (a *Agent) halt(sig syscall.Signal) {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.cmd = nil
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = cmd.Process.Signal(sig)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// Restart stops the agent and starts it again on the same ports and data directory.
func (a *Agent) Restart() {
	a.t.Helper()
	a.Stop()
	a.Launch()
}
