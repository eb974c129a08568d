package store

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Addr returns the Consul address s dials and where it came from, as its errors word
// them: "from --consul", "from CONSUL_HTTP_ADDR", "the default: no --consul given and
// CONSUL_HTTP_ADDR unset".
func (s *Consul) Addr() (addr, from string) { return s.origin.addr, s.origin.from }

// Clock is what an HTTP answer of a Consul agent says of its clock.
type Clock struct {
	// Date is the agent's time as its answer's Date header gives it, to the second
	// (net/http's server sets it, RFC 7231 7.1.1.2): the agent's clock was at or past it,
	// and less than a second past it, when it answered.
	Date time.Time
	// Sent and Received are this host's clock just before the request and just after the
	// answer: the agent answered between them.
	Sent, Received time.Time
}

// Skew is how far the agent's clock is ahead of this host's (negative: behind), and
// how far off that figure may be: the Date header's second and the round trip.
func (c Clock) Skew() (skew, uncertainty time.Duration) {
	rtt := c.Received.Sub(c.Sent)
	mid := c.Sent.Add(rtt / 2)
	remote := c.Date.Add(500 * time.Millisecond) // the middle of the second Date names
	return remote.Sub(mid), 500*time.Millisecond + rtt/2
}

// Clock asks a Consul agent for its time: the Date header of its answer to GET
// /v1/status/leader, which needs no token. host is the agent's HOST:PORT, "" for the
// agent s talks to; another host is asked with s's scheme and TLS settings (a Consul
// server's HTTP API, whose clock is the servers'). Errors: Consul unreachable
// (*UnavailableError naming the address for s's own agent), an answer with no Date.
func (s *Consul) Clock(ctx context.Context, host string) (Clock, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	own := host == ""
	if own {
		host = s.direct.host
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.direct.scheme+"://"+host+"/v1/status/leader", nil)
	if err != nil {
		return Clock{}, fmt.Errorf("consul clock at %s: %w", host, err)
	}
	c := Clock{Sent: time.Now()}
	resp, err := s.direct.client.Do(req)
	c.Received = time.Now()
	if err != nil {
		if own && dialFailed(err) {
			return Clock{}, &UnavailableError{Op: "consul clock", Err: err, Addr: s.origin.addr, From: s.origin.from}
		}
		return Clock{}, &UnavailableError{Op: "consul clock at " + host, Err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	d, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return Clock{}, fmt.Errorf("consul clock at %s: its answer (HTTP %d) has no Date header", host, resp.StatusCode)
	}
	c.Date = d
	return c, nil
}
