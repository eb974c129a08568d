package store_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// TestClock: a real Consul agent's answer carries its clock (the Date header), this
// host's; the skew read from it is within its own uncertainty of zero, and the
// uncertainty is the Date's half second and half the round trip. A Consul that is not
// there is an *UnavailableError naming the address.
func TestClock(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	c, err := s.Clock(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Date.IsZero() || c.Received.Before(c.Sent) {
		t.Fatalf("clock %+v", c)
	}
	skew, unc := c.Skew()
	if unc < 500*time.Millisecond || unc > 500*time.Millisecond+c.Received.Sub(c.Sent) {
		t.Errorf("uncertainty %v for a round trip of %v", unc, c.Received.Sub(c.Sent))
	}
	if skew < -unc || skew > unc {
		t.Errorf("skew %v ± %v against this host's own clock (Date %v, sent %v)", skew, unc, c.Date, c.Sent)
	}
	// The same agent asked by its address, as a server's HTTP API is.
	if _, err := s.Clock(context.Background(), agent.Addr); err != nil {
		t.Errorf("Clock(%s): %v", agent.Addr, err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	down, err := store.NewConsulFrom(closed, "--consul")
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.Clock(context.Background(), "")
	var ue *store.UnavailableError
	if !errors.As(err, &ue) || !ue.Unreachable() || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Clock of a closed port: %v, want an unreachable *UnavailableError", err)
	}
	if addr, from := down.Addr(); addr != closed || from != "from --consul" {
		t.Errorf("Addr() = %q, %q", addr, from)
	}
}
