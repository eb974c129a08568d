package store

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gangrun/gangrun/internal/consultest"
)

// TestKeepAliveReportsAnOutage stops a real Consul server (one that keeps its data)
// under a kept-alive session: KeepAlive says the coordinator is unreachable while it
// is down, keeps the session once it is back, and says so.
func TestKeepAliveReportsAnOutage(t *testing.T) {
	agent := consultest.StartPersistent(t)
	s, err := NewConsul(agent.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := session(t, s, SessionOptions{TTL: MinSessionTTL})
	core, logs := observer.New(zapcore.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- KeepAlive(ctx, s, id, MinSessionTTL, zap.New(core)) }()

	agent.Stop()
	waitLog(t, logs, "coordinator unreachable: cannot renew the session, retrying", 2*MinSessionTTL)
	agent.Restart()
	waitLog(t, logs, "coordinator reachable again: session renewed", 2*MinSessionTTL)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("KeepAlive: %v", err)
	}
	if n := logs.FilterMessage("coordinator unreachable: cannot renew the session, retrying").Len(); n != 1 {
		t.Errorf("the outage was reported %d times at its start, want once", n)
	}
}

func waitLog(t *testing.T, logs *observer.ObservedLogs, msg string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for logs.FilterMessage(msg).Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged within %s; logged: %v", msg, within, logs.All())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
