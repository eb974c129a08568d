package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// testConfig is an agent on an in-memory store with no GPUs and its servers on free
// ports of the loopback (two addresses: the same one would be one server).
func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{Store: store.NewMemory(), Node: "node01", Addr: "127.0.0.1", Inventory: &topology.Inventory{Node: "node01"},
		Recorded: true, Auth: AuthNone, MetricsAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.2:0",
		JobMapDir: filepath.Join(t.TempDir(), "jobmap"), WasteThreshold: 1, WasteAfter: time.Minute,
		AcctRetention: time.Hour, AcctFold: time.Hour, AuditRetention: time.Hour, StateDir: filepath.Join(t.TempDir(), "state")}
}

// TestRunJoinsOnStop: Run registers the node, serves, and once its context ends
// returns only after every goroutine it started has ended: the servers no longer
// accept connections, and the steps' directory (no step ran) is gone.
func TestRunJoinsOnStop(t *testing.T) {
	cfg := testConfig(t)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for a.alloc.Session() == "" {
		if time.Now().After(deadline) {
			t.Fatal("the agent did not register within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	addrs := []string{a.metricsLn.Addr().String(), a.httpLn.Addr().String()}
	for _, addr := range addrs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("%s before the stop: %v", addr, err)
		}
		c.Close()
	}
	if _, err := os.Stat(cfg.StateDir); err != nil {
		t.Errorf("state directory: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of its context's end")
	}
	for _, addr := range addrs {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Run returned", addr)
		}
	}
}

// TestNewRefusesBadSettings: settings the allocator refuses are a *ConfigError; a
// listen address in use is another error, naming its flag.
func TestNewRefusesBadSettings(t *testing.T) {
	cfg := testConfig(t)
	cfg.Node = "bad/name"
	_, err := New(cfg)
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("bad node name: got %v, want a *ConfigError", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg = testConfig(t)
	cfg.MetricsAddr = ln.Addr().String()
	_, err = New(cfg)
	if err == nil || errors.As(err, &ce) || !strings.Contains(err.Error(), "--metrics-addr: ") {
		t.Errorf("metrics address in use: got %v, want an error naming --metrics-addr", err)
	}
}
