// Package consultest starts real Consul agents for tests: a `consul agent -dev` on free
// loopback ports, or a single-server agent with a data directory that survives a
// restart. The binary is $GANGRUN_CONSUL, else the repository's .tools/bin/consul (built
// by scripts/install-consul.sh, which `make test` runs), else consul on PATH. A missing
// binary fails the test: tests never skip for it.
package consultest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long an agent may take to elect itself leader.
const startTimeout = 30 * time.Second

// Agent is one running Consul agent.
type Agent struct {
	// Addr is the HTTP API address, "127.0.0.1:PORT".
	Addr string

	t       testing.TB
	bin     string
	args    []string
	dataDir string
	mu      sync.Mutex
	cmd     *exec.Cmd
	log     *bytes.Buffer
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

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

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

func start(t testing.TB, persistent bool) *Agent {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{t: t, bin: bin, Addr: "127.0.0.1:" + strconv.Itoa(ports[0])}
	common := []string{
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-node", "gangrun-test",
		"-http-port", strconv.Itoa(ports[0]), "-server-port", strconv.Itoa(ports[1]),
		"-serf-lan-port", strconv.Itoa(ports[2]), "-serf-wan-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-hcl", "ports { grpc_tls = -1 }", "-hcl", "limits { http_max_conns_per_client = 4096 }",
		"-log-level", "warn",
	}
	if persistent {
		a.dataDir = t.TempDir()
		a.args = append([]string{"agent", "-server", "-bootstrap-expect", "1", "-data-dir", a.dataDir,
			"-hcl", "performance { raft_multiplier = 1 }"}, common...)
	} else {
		a.args = append([]string{"agent", "-dev"}, common...)
	}
	a.launch()
	t.Cleanup(a.Stop)
	return a
}

func (a *Agent) launch() {
	a.t.Helper()
	a.mu.Lock()
	cmd := exec.Command(a.bin, a.args...)
	a.log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = a.log, a.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		a.mu.Unlock()
		a.t.Fatalf("start consul: %v", err)
	}
	a.cmd = cmd
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	// Ready means a leader is elected and the agent's own node is in the catalog with
	// its serfHealth check: a session bound to the node's health (Consul's default) is
	// refused with "Missing check 'serfHealth' registration" until the leader has
	// registered that check, which can come after the node itself.
	ready := func(path string, want ...string) bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.Addr+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		body := bytes.TrimSpace(buf.Bytes())
		for _, w := range want {
			if !bytes.Contains(body, []byte(w)) {
				return false
			}
		}
		return resp.StatusCode == 200 && len(body) > 0 && string(body) != "null" && string(body) != `""`
	}
	for {
		if ready("/v1/status/leader") && ready("/v1/catalog/node/gangrun-test") &&
			ready("/v1/health/node/gangrun-test", `"serfHealth"`) {
			return
		}
		select {
		case <-ctx.Done():
			a.Stop()
			a.t.Fatalf("consul at %s did not elect a leader within %s; its log:\n%s", a.Addr, startTimeout, a.log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops the agent (SIGTERM, then SIGKILL after 5s). Safe to call twice.
func (a *Agent) Stop() {
	a.mu.Lock()
	cmd := a.cmd
	a.cmd = nil
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
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
	a.launch()
}
