package consultest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cluster settings. Consul's defaults assume a WAN; on loopback a test wants elections
// in about a second, which raft_multiplier = 1 gives (Consul's production setting; the
// default 5 makes the raft timeouts five times longer).
const (
	// clusterStartTimeout bounds how long a new cluster may take to elect its first
	// leader and register every agent.
	clusterStartTimeout = 60 * time.Second
	// retryJoinInterval is how often an agent retries joining the servers (Consul's
	// default, 30s, would leave an agent that started before the servers listened
	// alone for half a minute).
	retryJoinInterval = 500 * time.Millisecond
)

// Cluster is a real Consul cluster on loopback: servers (`consul agent -server
// -bootstrap-expect N`, each with its own ports and data directory) that elect a leader
// among themselves, and client agents that join them, as every node of a real
// deployment runs one. Every agent has its own HTTP, serf LAN, serf WAN and server
// ports (DNS and gRPC off), its own data directory and node name, and a host-independent
// node ID (-disable-host-node-id: they all share one host). The cluster gets its own
// datacenter name, so its gossip never merges with another test's cluster should a
// port be reused.
type Cluster struct {
	// Servers are the server agents, in start order.
	Servers []*Agent
	// Clients are the client agents; their HTTP addresses are what gangrun talks to.
	Clients []*Agent

	t testing.TB
}

// StartCluster starts servers server agents and clients client agents, and waits until
// a leader is elected, every server is a healthy voter and every agent is registered
// (see WaitHealthy). Everything is stopped when the test ends, also when it fails.
func StartCluster(t testing.TB, servers, clients int) *Cluster {
	t.Helper()
	if servers < 1 || clients < 0 {
		t.Fatalf("consultest: a cluster of %d servers and %d clients", servers, clients)
	}
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	dc := "gangrun-" + hex.EncodeToString(id[:])
	c := &Cluster{t: t}
	n := servers + clients
	ports, err := freePorts(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	agents := make([]*Agent, n)
	for i := range agents {
		p := ports[4*i : 4*i+4]
		name := fmt.Sprintf("%s-client-%d", dc, i-servers)
		if i < servers {
			name = fmt.Sprintf("%s-server-%d", dc, i)
		}
		agents[i] = &Agent{t: t, bin: bin, dataDir: t.TempDir(), Name: name,
			Addr: "127.0.0.1:" + strconv.Itoa(p[0]), ServerAddr: "127.0.0.1:" + strconv.Itoa(p[1]),
			SerfLANAddr: "127.0.0.1:" + strconv.Itoa(p[2])}
		agents[i].args = []string{"agent", "-datacenter", dc, "-node", name, "-disable-host-node-id",
			"-data-dir", agents[i].dataDir, "-bind", "127.0.0.1", "-client", "127.0.0.1",
			"-http-port", strconv.Itoa(p[0]), "-server-port", strconv.Itoa(p[1]),
			"-serf-lan-port", strconv.Itoa(p[2]), "-serf-wan-port", strconv.Itoa(p[3]),
			"-dns-port", "-1", "-grpc-port", "-1", "-hcl", "ports { grpc_tls = -1 }",
			"-hcl", "limits { http_max_conns_per_client = 4096 }",
			"-hcl", "performance { raft_multiplier = 1 }",
			"-hcl", "disable_update_check = true", // no internet here, and no need
			"-retry-interval", retryJoinInterval.String(), "-log-level", "warn"}
		if i < servers {
			agents[i].args = append(agents[i].args, "-server", "-bootstrap-expect", strconv.Itoa(servers))
		}
	}
	for i := 0; i < servers; i++ {
		for _, s := range agents[:servers] {
			agents[i].args = append(agents[i].args, "-retry-join", s.SerfLANAddr)
		}
	}
	for _, a := range agents[servers:] {
		for _, s := range agents[:servers] {
			a.args = append(a.args, "-retry-join", s.SerfLANAddr)
		}
	}
	c.Servers, c.Clients = agents[:servers], agents[servers:]
	// Stop everything at the end, also after a failed start: registered before any
	// process exists, and after the data directories, so that cleanups (last in, first
	// out) stop the agents before their directories are removed.
	t.Cleanup(c.stop)
	for _, a := range agents {
		if err := a.spawn(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("consul cluster did not come up within %s: %v\n%s", clusterStartTimeout, err, c.Logs())
	}
	return c
}

// stop stops every agent, all at once (a client agent's graceful leave takes a moment).
func (c *Cluster) stop() {
	var wg sync.WaitGroup
	for _, a := range append(append([]*Agent(nil), c.Servers...), c.Clients...) {
		wg.Add(1)
		go func() { defer wg.Done(); a.Stop() }()
	}
	wg.Wait()
	if c.t.Failed() {
		c.t.Logf("consul cluster logs (last 4 KiB of each agent):\n%s", c.Logs())
	}
}

// Logs returns the end of every agent's log, for a failing test's report.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, a := range append(append([]*Agent(nil), c.Servers...), c.Clients...) {
		l := a.Log()
		if len(l) > 4<<10 {
			l = "..." + l[len(l)-4<<10:]
		}
		fmt.Fprintf(&b, "--- %s (%s)\n%s", a.Name, a.Addr, l)
	}
	return b.String()
}

// Leader returns the server that leads now. The answer is checked with the server
// itself: a follower may still name a leader that has just died, so the server named
// by /v1/status/leader must be running and say that it leads (agent/self's
// Stats.consul.leader). It returns an error while there is no leader.
func (c *Cluster) Leader(ctx context.Context) (*Agent, error) {
	var lastErr error
	for _, a := range append(append([]*Agent(nil), c.Clients...), c.Servers...) {
		if !a.Running() {
			continue
		}
		var addr string
		if err := a.get(ctx, "/v1/status/leader", &addr); err != nil {
			lastErr = err
			continue
		}
		if addr == "" {
			lastErr = fmt.Errorf("%s knows no leader", a.Name)
			continue
		}
		srv := c.server(addr)
		if srv == nil {
			return nil, fmt.Errorf("%s names leader %s, which is none of the cluster's servers", a.Name, addr)
		}
		if !srv.Running() {
			lastErr = fmt.Errorf("%s names leader %s (%s), which is not running", a.Name, srv.Name, addr)
			continue
		}
		leads, err := srv.leads(ctx)
		if err != nil {
			lastErr = err
			continue
		}
		if !leads {
			lastErr = fmt.Errorf("%s names leader %s, which does not lead", a.Name, srv.Name)
			continue
		}
		return srv, nil
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no agent is running")
	}
	return nil, fmt.Errorf("no leader: %w", lastErr)
}

// server returns the server whose RPC address is addr, or nil.
func (c *Cluster) server(addr string) *Agent {
	for _, s := range c.Servers {
		if s.ServerAddr == addr {
			return s
		}
	}
	return nil
}

// leads asks the server whether it is the raft leader (agent/self's Stats.consul.leader).
func (a *Agent) leads(ctx context.Context) (bool, error) {
	var self struct {
		Stats struct {
			Consul struct {
				Leader string `json:"leader"`
			} `json:"consul"`
		}
	}
	if err := a.get(ctx, "/v1/agent/self", &self); err != nil {
		return false, err
	}
	return self.Stats.Consul.Leader == "true", nil
}

// WaitHealthy waits until ctx ends for a cluster in working order: a leader; autopilot
// (through the leader) reporting every server healthy and a voter, so a server that was
// killed and launched again has caught up with the log; and every running agent
// answering a consistent read, with a leader known and its own node registered with a
// passing serfHealth check. Servers that are not running are left out. It returns the last reason the
// cluster was not healthy when ctx ends.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var last error
	for {
		if last = c.healthy(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// healthy is one check of WaitHealthy.
func (c *Cluster) healthy(ctx context.Context) error {
	leader, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	var health struct {
		Healthy bool
		Servers []struct {
			Name    string
			Healthy bool
			Voter   bool
		}
	}
	if err := leader.get(ctx, "/v1/operator/autopilot/health", &health); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, s := range health.Servers {
		seen[s.Name] = true
		if !s.Healthy || !s.Voter {
			return fmt.Errorf("server %s: healthy %v, voter %v", s.Name, s.Healthy, s.Voter)
		}
	}
	for _, s := range c.Servers {
		if s.Running() && !seen[s.Name] {
			return fmt.Errorf("server %s is not among the raft servers yet", s.Name)
		}
	}
	for _, a := range append(append([]*Agent(nil), c.Servers...), c.Clients...) {
		if !a.Running() {
			continue
		}
		if err := a.ready(ctx); err != nil {
			return fmt.Errorf("agent %s: %w", a.Name, err)
		}
		if err := a.consistentRead(ctx); err != nil {
			return fmt.Errorf("agent %s: %w", a.Name, err)
		}
	}
	return nil
}

// Launch starts agent a (one of the cluster's, stopped or killed) again on its ports
// and data directory, and waits until the whole cluster is healthy again
// (WaitHealthy), failing the test after timeout.
func (c *Cluster) Launch(a *Agent, timeout time.Duration) {
	c.t.Helper()
	if err := a.spawn(); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		c.t.Fatalf("consul cluster not healthy within %s of launching %s again: %v\n%s", timeout, a.Name, err, c.Logs())
	}
}

// consistentRead makes a consistent read through the agent (one the leader must
// confirm): it succeeds, found or not, only while the cluster has a working leader.
func (a *Agent) consistentRead(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+a.Addr+"/v1/kv/gangrun-consultest-probe?consistent", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("consistent read: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("consistent read: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}
