package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/store"
)

// torchrun's c10d rendezvous defaults (torch/distributed/elastic/rendezvous: run.py's
// --rdzv-endpoint port, dynamic_rendezvous.py's RendezvousTimeout, c10d_rendezvous_backend.py's
// read_timeout).
const (
	// C10dDefaultPort is the endpoint's port when HOST alone is given.
	C10dDefaultPort = 29400
	// C10dJoinTimeout is join_timeout: a round that has not closed this long after the
	// node asked to join fails the node.
	C10dJoinTimeout = 600 * time.Second
	// C10dLastCall is last_call_timeout: how long a round waits for more nodes once
	// MIN have joined (gangrun's own default on Consul is DefaultLastCall, 3 s).
	C10dLastCall = 30 * time.Second
	// C10dCloseTimeout is close_timeout: how long the node serving the endpoint keeps it
	// up, once its own run is over, for the other nodes to leave.
	C10dCloseTimeout = 30 * time.Second
	// C10dReadTimeout is read_timeout: how long another node waits for an endpoint
	// that does not answer before its run fails (the job ends with the endpoint's host).
	C10dReadTimeout = 60 * time.Second
	// C10dJobID is the job id (TORCHELASTIC_RUN_ID) without --rdzv-id: torchrun's
	// "none".
	C10dJobID = "none"
)

// C10dEndpoint is a parsed c10d endpoint: "c10d://HOST[:PORT][?KEY=VALUE&...]", the
// --coordinator form of torchrun's --rdzv-backend c10d --rdzv-endpoint HOST:PORT
// --rdzv-conf KEY=VALUE,....
type C10dEndpoint struct {
	// Host and Port are where the endpoint is served; Port 0 (torchrun's
	// localhost:0) picks a free one and is for one node only.
	Host string
	Port int
	// IsHost is rdzv-conf is_host: true serves the endpoint here, false never does;
	// nil decides as torchrun does (this machine's name or address, and the port free).
	IsHost *bool
	// JoinTimeout, LastCall, CloseTimeout and ReadTimeout are the rdzv-conf values
	// join_timeout (or its older name timeout), last_call_timeout, close_timeout and
	// read_timeout, in seconds there; the C10d* defaults when not given.
	JoinTimeout, LastCall, CloseTimeout, ReadTimeout time.Duration
}

// C10dConfKeys lists the rdzv-conf keys a c10d endpoint takes, with what each means
// here. use_libuv picks the implementation of torch's own TCPStore server, which the
// endpoint is not: it is taken and has no effect.
var C10dConfKeys = []string{"is_host", "join_timeout", "timeout", "last_call_timeout", "close_timeout", "read_timeout", "use_libuv"}

// ParseC10dURL parses "c10d://HOST[:PORT][?KEY=VALUE&...]". Errors name the bad part:
// a missing host, a port outside 0..65535, a key of torchrun's that gangrun cannot
// honour (keep_alive_interval, keep_alive_max_attempt: a node's liveness is its
// session's, 20 s to 40 s), an unknown key, a value that is not a number of seconds
// or a boolean.
func ParseC10dURL(s string) (C10dEndpoint, error) {
	e := C10dEndpoint{Port: C10dDefaultPort, JoinTimeout: C10dJoinTimeout, LastCall: C10dLastCall,
		CloseTimeout: C10dCloseTimeout, ReadTimeout: C10dReadTimeout}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "c10d" || u.Host == "" || u.Path != "" && u.Path != "/" || u.User != nil {
		return e, fmt.Errorf("coordinator %q: want c10d://HOST[:PORT]", s)
	}
	e.Host = u.Hostname()
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 65535 {
			return e, fmt.Errorf("c10d endpoint %s: port %q: want 0..65535", u.Host, p)
		}
		e.Port = n
	}
	if e.Host == "" {
		return e, fmt.Errorf("c10d endpoint %q: want HOST[:PORT]", u.Host)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return e, fmt.Errorf("coordinator %q: %w", s, err)
	}
	for key, vals := range q {
		v := vals[len(vals)-1]
		seconds := func(p *time.Duration) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 1e6 {
				return fmt.Errorf("rdzv-conf %s=%s: want a number of seconds above 0", key, v)
			}
			*p = time.Duration(f * float64(time.Second))
			return nil
		}
		switch key {
		case "is_host":
			b, err := parseTorchBool(v)
			if err != nil {
				return e, fmt.Errorf("rdzv-conf is_host=%s: %w", v, err)
			}
			e.IsHost = &b
		case "join_timeout", "timeout":
			err = seconds(&e.JoinTimeout)
		case "last_call_timeout":
			err = seconds(&e.LastCall)
		case "close_timeout":
			err = seconds(&e.CloseTimeout)
		case "read_timeout":
			err = seconds(&e.ReadTimeout)
		case "use_libuv":
			if _, err = parseTorchBool(v); err != nil {
				err = fmt.Errorf("rdzv-conf use_libuv=%s: %w", v, err)
			}
		case "keep_alive_interval", "keep_alive_max_attempt":
			err = fmt.Errorf("rdzv-conf %s: cannot be honoured: a node is judged alive by its session with the endpoint (renewed every 10 s, gone 20 s to 40 s after its last renewal), not by torch's keep-alives", key)
		default:
			err = fmt.Errorf("rdzv-conf %s: not a key of the c10d rendezvous gangrun serves (it takes %s)", key, strings.Join(C10dConfKeys, ", "))
		}
		if err != nil {
			return e, err
		}
	}
	return e, nil
}

// parseTorchBool reads a boolean as torch's RendezvousParameters.get_as_bool does:
// 1, true, t, yes, y and 0, false, f, no, n, in any case.
func parseTorchBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "true", "t", "yes", "y":
		return true, nil
	case "0", "false", "f", "no", "n":
		return false, nil
	}
	return false, errors.New("want a boolean (1, true, yes or 0, false, no)")
}

// Endpoint is "HOST:PORT".
func (e C10dEndpoint) Endpoint() string { return net.JoinHostPort(e.Host, strconv.Itoa(e.Port)) }

// c10d is the c10d endpoint: torchrun's --rdzv-backend c10d without Consul. The node
// at HOST serves the job's store (a Memory) on PORT to the others (store.ServeRemote),
// as torchrun's agent there serves its TCPStore, and the nodes meet in the dynamic
// rendezvous over it. It is one process on one host, as torch's store is: when that
// host is lost the others' calls fail, their workers stop when their sessions' leases
// run out, and each gives up ReadTimeout after the endpoint stopped answering, so the
// job ends (torchrun's semantics). Whatever must outlive a host goes through Consul.
type c10d struct{}

func (c10d) name() string { return "c10d" }

func (c10d) claims(c string) bool { return strings.HasPrefix(c, "c10d://") }

func (c10d) open(ctx context.Context, coordinator string, cfg Config) (*Opened, error) {
	e, err := ParseC10dURL(coordinator)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	if e.Port == 0 && cfg.MaxNodes > 1 {
		return nil, usage("c10d endpoint %s with --nnodes %s: port 0 picks a free port the other nodes cannot know; give HOST:PORT", e.Endpoint(), nnodesString(cfg.MinNodes, cfg.MaxNodes))
	}
	node, err := c10dNodeName(cfg)
	if err != nil {
		return nil, err
	}
	job := cfg.JobID
	if job == "" {
		job = C10dJobID
	}
	conn, err := connectC10d(ctx, &e, cfg)
	if err != nil {
		return nil, err
	}
	self := cfg.AdvertiseAddr
	if self == "" {
		self = DefaultAddr(e.Endpoint())
	}
	host, _ := os.Hostname()
	giveUp := e.ReadTimeout
	if conn.srv != nil {
		giveUp = 0 // its own store does not go away
	}
	d, err := NewDynamic(conn.s, DynamicConfig{JobID: job, MinNodes: cfg.MinNodes, MaxNodes: cfg.MaxNodes,
		MaxRestarts: cfg.MaxRestarts, LastCall: e.LastCall, GiveUpAfter: giveUp, Host: host,
		Log: cfg.Log.Named("rendezvous"), Events: cfg.Events, FollowRun: cfg.FollowRun})
	if err != nil {
		conn.close(0)
		return nil, &UsageError{Err: err}
	}
	closed := false
	return &Opened{Rendezvous: &timedJoin{r: d, timeout: e.JoinTimeout, endpoint: e.Endpoint()}, JobID: job, NodeName: node,
		MinNodes: cfg.MinNodes, MaxNodes: cfg.MaxNodes, Addr: self, Shared: cfg.MaxNodes > 1, GPUsOnNode: -1, Store: conn.s,
		Close: func() {
			if closed {
				return
			}
			closed = true
			_ = d.Close(context.Background())
			// The others read the run's end from this store: keep it up until they have
			// left (their sessions are gone), at most CloseTimeout.
			conn.close(e.CloseTimeout)
		}}, nil
}

// c10dNodeName is this node's name in a c10d rendezvous: --node-name, else as
// torchrun's (_NodeDescGenerator: fqdn_pid_n) its host and process, so that several on
// one machine are several nodes.
func c10dNodeName(cfg Config) (string, error) {
	name := cfg.NodeName
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			return "", usage("--node-name not given and the hostname is unknown: %v", err)
		}
		name = host + "-" + strconv.Itoa(os.Getpid())
	}
	return nodeName(name)
}

// c10dConn is the store a c10d node meets the others in: the Memory it serves on the
// endpoint (mem, srv), or a Remote of the node that serves it.
type c10dConn struct {
	s      store.Store
	mem    *store.Memory
	srv    *store.RemoteServer
	remote *store.Remote
}

// connectC10d serves the endpoint's store when e's host is this machine's (and is_host
// does not say otherwise), setting e.Port to the port bound; it connects to the node
// that serves it otherwise, or when is_host was inferred and another process here holds
// the port (torch's fallback), waiting for it as awaitEndpoint does.
func connectC10d(ctx context.Context, e *C10dEndpoint, cfg Config) (*c10dConn, error) {
	local := IsLocalHost(e.Host)
	if e.IsHost != nil && *e.IsHost && !local {
		return nil, usage("c10d endpoint %s: rdzv-conf is_host=1, but %s is not an address or name of this machine", e.Endpoint(), e.Host)
	}
	if local && (e.IsHost == nil || *e.IsHost) {
		ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(e.Port)))
		switch {
		case err == nil:
			mem := store.NewMemory()
			srv := store.ServeRemote(ln, mem)
			e.Port = ln.Addr().(*net.TCPAddr).Port
			cfg.Log.Info("serving the c10d rendezvous endpoint", zap.String("endpoint", e.Endpoint()))
			return &c10dConn{s: mem, mem: mem, srv: srv}, nil
		case e.IsHost == nil && errors.Is(err, syscall.EADDRINUSE):
			// Another node on this machine serves it (torch's fallback: is_host
			// inferred, the bind failed, so be a client).
		default:
			return nil, usage("c10d endpoint %s: cannot serve it here: %v", e.Endpoint(), err)
		}
	}
	remote := store.NewRemote(e.Endpoint())
	if err := awaitEndpoint(ctx, remote, *e); err != nil {
		remote.Close()
		return nil, err
	}
	return &c10dConn{s: remote, remote: remote}, nil
}

// close stops serving the store, after waiting up to drain for the other nodes'
// sessions on it to go, or closes the connection to it.
func (cc *c10dConn) close(drain time.Duration) {
	if cc.srv != nil {
		deadline := time.Now().Add(drain)
		for cc.mem.Sessions() > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		_ = cc.srv.Close()
	}
	if cc.remote != nil {
		cc.remote.Close()
	}
}

// awaitEndpoint waits until the endpoint answers as a gangrun store, as torch's client
// retries connecting to its endpoint: for up to e.JoinTimeout, or until ctx ends. An
// endpoint that answers, but not as gangrun does, is an error at once.
func awaitEndpoint(ctx context.Context, r *store.Remote, e C10dEndpoint) error {
	deadline := time.Now().Add(e.JoinTimeout)
	for {
		err := r.Ping(ctx)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, store.ErrUnavailable):
			return &UsageError{Err: err}
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("c10d endpoint %s: nothing answered within join_timeout %s: %w", e.Endpoint(), e.JoinTimeout, err)
		}
		if !store.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// IsLocalHost reports whether host names this machine, as torch's
// _matches_machine_hostname decides whether its agent serves the endpoint: localhost,
// a loopback address, this machine's hostname, or an address of one of its interfaces
// (a name resolving to one).
func IsLocalHost(host string) bool {
	if host == "localhost" {
		return true
	}
	if name, err := os.Hostname(); err == nil && strings.EqualFold(host, name) {
		return true
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		addrs, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		ips = addrs
	}
	mine, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		if slices.ContainsFunc(mine, func(a net.Addr) bool {
			n, ok := a.(*net.IPNet)
			return ok && n.IP.Equal(ip)
		}) {
			return true
		}
	}
	return false
}

// timedJoin is a Rendezvous whose every Join fails after timeout (torchrun's
// join_timeout), naming the endpoint.
type timedJoin struct {
	r        Rendezvous
	timeout  time.Duration
	endpoint string
}

// Join implements Rendezvous.
func (t *timedJoin) Join(ctx context.Context, req JoinRequest) (Round, error) {
	jctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	r, err := t.r.Join(jctx, req)
	if err != nil && ctx.Err() == nil && errors.Is(jctx.Err(), context.DeadlineExceeded) {
		return nil, fmt.Errorf("c10d rendezvous at %s: no round closed within join_timeout %s (too few nodes joined)", t.endpoint, t.timeout)
	}
	return r, err
}
