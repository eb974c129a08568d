package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/userfile"
)

// Consul is the Store on a Consul cluster, through github.com/hashicorp/consul/api.
type Consul struct {
	Locals    // what other packages keep on this client (LocalOf)
	c         *api.Client
	transport *http.Transport
	origin    origin
	// direct is what a request outside consul/api needs (Clock): the HTTP client
	// (TLS, a unix socket) and the scheme and host consul/api dials.
	direct direct
	// seen is the highest index of any answer about the KV store so far (List, Keys,
	// WatchList, Get): a KV index below it later means Consul's data went back in time
	// (RenewSession).
	seen atomic.Uint64
	// marker is the value of MarkerKey this client took as its cluster's data, read
	// (created where missing) after each session it created; nil until then. Another
	// value later, or none, means Consul's data is not the data it had (wentBack).
	marker atomic.Pointer[string]
	// lost is set while the last check of Consul's data (wentBack) found it not the
	// data this client had: watches then ask again often (Unsettled).
	lost atomic.Bool
}

// MarkerKey holds a random value that marks one cluster's Consul data: written once,
// check-and-set on a missing key, after the first gangrun session created there, and
// never changed. A snapshot restore brings it back with the rest of the data; a Consul
// that lost its data (an empty server answering until the operator restores: see
// docs/operations.md, "Recovery") has none, or, once a gangrun process created a
// session there, another. Its KV index cannot tell that second case: the empty Consul's
// index climbs with every write the agents make there and may pass what a client saw.
const MarkerKey = "gangrun/cluster/marker"

// saw records idx, an answer's index about the KV store.
func (s *Consul) saw(idx uint64) {
	for {
		cur := s.seen.Load()
		if idx <= cur || s.seen.CompareAndSwap(cur, idx) {
			return
		}
	}
}

// direct is the client consul/api made, for requests it has no call for.
type direct struct {
	client       *http.Client
	scheme, host string
}

// origin is the Consul address a client dials and where it came from, for the error
// of a request that could not connect.
type origin struct {
	// addr is the address as dialled ("127.0.0.1:8500", "https://h:8501",
	// "unix:///run/consul.sock").
	addr string
	// from says where it came from: "--consul", "CONSUL_HTTP_ADDR", "the default".
	from string
}

// ParseConsulURL turns a --coordinator value "consul://HOST:PORT" (or "consul://" to
// take the address from CONSUL_HTTP_ADDR) into an HTTP address for the Consul API;
// "" when the environment decides.
func ParseConsulURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "consul" || u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
		return "", fmt.Errorf("coordinator %q: want consul://HOST:PORT", s)
	}
	if u.Host == "" {
		return "", nil // consul:// : CONSUL_HTTP_ADDR decides
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return "", fmt.Errorf("coordinator %q: want consul://HOST:PORT", s)
	}
	if err := checkHost(host); err != nil {
		return "", fmt.Errorf("coordinator %q: %w", s, err)
	}
	if err := checkPort(port); err != nil {
		return "", fmt.Errorf("coordinator %q: %w", s, err)
	}
	return u.Host, nil
}

// NewConsul returns a Store talking to the Consul agent at addr (HOST:PORT, or "" for
// CONSUL_HTTP_ADDR, else 127.0.0.1:8500). The token and TLS settings come from the
// standard CONSUL_* variables (api.DefaultConfig reads them). A malformed address is
// refused here, naming where it came from ("consul address", or CONSUL_HTTP_ADDR),
// rather than failing as a DNS error at the first request.
func NewConsul(addr string) (*Consul, error) {
	return NewConsulFrom(addr, "consul address")
}

// NewConsulFrom is NewConsul naming where a non-empty addr came from ("--consul",
// "--coordinator"): the errors of a malformed address, and of a Consul that cannot be
// reached there, say so.
func NewConsulFrom(addr, from string) (*Consul, error) {
	return newConsul(addr, from, "")
}

// NewConsulToken is NewConsul with the ACL token secret given ("" takes it from
// CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE, as NewConsul does). The secret is sent
// in the X-Consul-Token header of every request, never in a URL, so it appears in no
// error.
func NewConsulToken(addr, token string) (*Consul, error) {
	return newConsul(addr, "consul address", token)
}

func newConsul(addr, from, token string) (*Consul, error) {
	if err := checkConsulEnv(); err != nil {
		return nil, err
	}
	cfg := api.DefaultConfig()
	if token != "" {
		cfg.Token, cfg.TokenFile = token, ""
	}
	what, shown := from, addr
	from = "from " + from
	if addr != "" {
		cfg.Address = addr
	} else if env := os.Getenv(api.HTTPAddrEnvName); env != "" {
		what, from, shown = api.HTTPAddrEnvName, "from "+api.HTTPAddrEnvName, env
		// DefaultConfig strips a scheme it understands into cfg.Scheme: judge the
		// variable as the user wrote it.
		if err := CheckConsulAddr(what, env); err != nil {
			return nil, err
		}
	} else {
		what, from, shown = "consul address", "the default: no --consul given and CONSUL_HTTP_ADDR unset", cfg.Address
	}
	if err := CheckConsulAddr(what, cfg.Address); err != nil {
		return nil, err
	}
	// A host without a port is Consul's port, not the scheme's (80 or 443).
	if a, added := withConsulPort(cfg.Address, cfg.Scheme); added {
		cfg.Address = a
		shown = withScheme(cfg.Address, cfg.Scheme)
		from += ", with Consul's default port added"
	}
	if err := checkToken(cfg); err != nil {
		return nil, err
	}
	if t := cfg.Transport; t != nil {
		// A gangrun process sends many requests at once through one client (an agent's
		// watches, its launcher, a step's): idle connections are kept for them instead
		// of being closed and dialled again (consul/api keeps GOMAXPROCS+1).
		t.MaxIdleConnsPerHost = maxIdleConns
		// Gzip costs both ends CPU for every answer and saves nothing on the loopback
		// to the node's own Consul agent, the way Consul is deployed.
		t.DisableCompression = loopback(cfg.Address)
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client for %s: %w", cfg.Address, err)
	}
	// NewClient filled in cfg: its HTTP client, the address without a scheme.
	host := cfg.Address
	if strings.HasPrefix(host, "/") {
		host = "localhost" // a unix socket: the client dials it whatever the host
	}
	return &Consul{c: c, transport: cfg.Transport, origin: origin{addr: shown, from: from},
		direct: direct{client: cfg.HttpClient, scheme: cfg.Scheme, host: host}}, nil
}

// Consul's default HTTP API port, and the port its documentation suggests for HTTPS
// (ports.http and ports.https in Consul's agent configuration reference).
const (
	DefaultHTTPPort  = "8500"
	DefaultHTTPSPort = "8501"
)

// withConsulPort adds Consul's default port to an address that has none (HOST,
// http://HOST, [::1]): 8500, or 8501 under https. consul/api would use the scheme's, 80
// or 443, where no Consul listens. An address with a path (a reverse proxy:
// https://proxy.example.com/consul) or a unix socket is left as it is.
func withConsulPort(addr, scheme string) (string, bool) {
	if strings.HasPrefix(addr, "unix://") {
		return addr, false
	}
	prefix, hostport := "", addr
	if p, rest, ok := strings.Cut(addr, "://"); ok {
		prefix, hostport, scheme = p+"://", rest, p
	}
	if hostport == "" || strings.ContainsAny(hostport, "/?#") {
		return addr, false
	}
	if _, _, err := net.SplitHostPort(hostport); err == nil {
		return addr, false
	}
	port := DefaultHTTPPort
	if scheme == "https" {
		port = DefaultHTTPSPort
	}
	return prefix + net.JoinHostPort(strings.Trim(hostport, "[]"), port), true
}

// withScheme returns addr as a user would write it: with https:// when the scheme is
// https and addr has none.
func withScheme(addr, scheme string) string {
	if scheme == "https" && !strings.Contains(addr, "://") {
		return "https://" + addr
	}
	return addr
}

// maxIdleConns is how many idle connections to its Consul agent a client keeps (Consul
// accepts 200 from one address by default: http_max_conns_per_client).
const maxIdleConns = 32

// loopback reports whether the Consul address addr (as Config.Address takes it) is on
// this machine: a unix socket, localhost, or a loopback IP.
func loopback(addr string) bool {
	if strings.HasPrefix(addr, "unix://") {
		return true
	}
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// CheckConsulAddr accepts what consul/api's Config.Address takes: HOST[:PORT], or
// http:// or https:// before it (with a path, for a reverse proxy), or unix://PATH,
// where HOST is an IP address or a host name (letters, digits, '-' and '_' in dot
// separated labels, not all digits at the end: 127.0.0.1.8500 is no host). Anything
// else would only fail, and be retried, at the first request, as a DNS error. The error
// begins with what, naming where addr came from ("--consul", "CONSUL_HTTP_ADDR"), and
// quotes addr.
func CheckConsulAddr(what, addr string) error {
	bad := fmt.Errorf("%s %q: want HOST:PORT, http://HOST:PORT, https://HOST:PORT or unix://PATH", what, addr)
	if rest, ok := strings.CutPrefix(addr, "unix://"); ok {
		if rest == "" {
			return fmt.Errorf("%s %q: no socket path after unix://", what, addr)
		}
		return nil
	}
	hostport := addr
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad
		}
		hostport = u.Host
	} else if strings.ContainsAny(addr, "/?#@ ") {
		return bad
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port: the scheme's default. A bracket left open, or colons that are not
		// a bracketed IPv6 address's, are no host.
		host = hostport
		if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
			host = host[1 : len(host)-1]
			if net.ParseIP(host) == nil {
				return bad
			}
		} else if host == "" || strings.ContainsAny(host, "[]:") {
			return bad
		}
	} else if host == "" {
		return bad
	} else if err := checkPort(port); err != nil {
		return fmt.Errorf("%s %q: %w", what, addr, err)
	}
	if err := checkHost(host); err != nil {
		return fmt.Errorf("%s %q: %w", what, addr, err)
	}
	return nil
}

// checkHost accepts an IP address or a host name: dot-separated labels of 1 to 63
// letters, digits, '-' and '_', not beginning or ending with '-', at most 253 bytes,
// the last label not all digits (a mistyped IPv4 address such as 10.0.0.1.8500).
func checkHost(host string) error {
	if net.ParseIP(host) != nil {
		return nil
	}
	bad := fmt.Errorf("host %q: want an IP address or a host name (letters, digits, '-', '.')", host)
	if len(strings.TrimSuffix(host, ".")) > 253 {
		return bad
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return bad
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("host %q: not an IP address (four numbers 0-255) nor a host name (its last label is all digits)", host)
	}
	return nil
}

// checkPort accepts a TCP port number, 1..65535.
func checkPort(port string) error {
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1..65535", port)
	}
	return nil
}

// Close releases the client's idle connections (Consul limits connections per client
// address, 200 by default).
func (s *Consul) Close() {
	if s.transport != nil {
		s.transport.CloseIdleConnections()
	}
}

// TokenSelf returns the ACL token this client sends, as Consul knows it (GET
// /v1/acl/token/self, which any token may ask of itself), riding out a leader election
// as every request does. With Consul's ACLs off the error says "ACL support disabled";
// an unknown token is a *PermissionError saying "ACL not found".
func (s *Consul) TokenSelf(ctx context.Context) (*api.ACLToken, error) {
	return attempt(ctx, s.origin, "consul acl token self", func(ctx context.Context) (*api.ACLToken, error) {
		t, _, err := s.c.ACL().TokenReadSelf((&api.QueryOptions{}).WithContext(ctx))
		return t, err
	})
}

// Client returns the underlying Consul API client.
func (s *Consul) Client() *api.Client { return s.c }

// CallTimeout bounds every Consul request that is not a blocking query, and is the
// slack added to a blocking query's wait: consul/api's HTTP client has no timeout of its
// own, so a request into a partition that drops packets would otherwise never return. A
// Consul server answers in milliseconds, and holds a request through a leader election
// for at most its rpc_hold_timeout (7 s by default).
const CallTimeout = 10 * time.Second

// call bounds ctx by CallTimeout (an earlier deadline of ctx's own still applies).
func call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, CallTimeout)
}

// blockingTimeout bounds a blocking query of the given wait: Consul adds up to wait/16
// of random jitter to it (Consul docs, "Blocking Queries"), plus CallTimeout of slack.
func blockingTimeout(wait time.Duration) time.Duration { return wait + wait/16 + CallTimeout }

// failed describes an error of request op. A cause that is no answer from Consul (a
// transport error, a timeout of CallTimeout, an HTTP 5xx such as "No cluster leader")
// is an *UnavailableError; an answer (an HTTP 4xx: an ACL refusal, a bad request) is
// wrapped as it is. When parent itself ended, its error is returned.
func failed(parent context.Context, o origin, op string, err error) error {
	if parent.Err() != nil {
		return parent.Err()
	}
	if dialFailed(err) {
		return &UnavailableError{Op: op, Err: err, Addr: o.addr, From: o.from}
	}
	if code := statusCode(err); code == 403 || code == 401 && strings.Contains(err.Error(), "ACL not found") {
		return &PermissionError{Op: op, Err: err}
	}
	if code := statusCode(err); code > 0 && code < 500 {
		return fmt.Errorf("%s: %w", op, err)
	}
	return &UnavailableError{Op: op, Err: err}
}

// statusCode returns the HTTP status of a consul/api error; 0 when it carries none.
// Most calls return an api.StatusError; some (Session.Renew) only format the code into
// the text, "Unexpected response code: 403", which is read here and nowhere else.
func statusCode(err error) int {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	const prefix = "Unexpected response code: "
	msg := err.Error()
	if i := strings.Index(msg, prefix); i >= 0 {
		rest := msg[i+len(prefix):]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if n, err := strconv.Atoi(rest[:j]); err == nil {
			return n
		}
	}
	return 0
}

// A request that reached no server is sent again after a pause of retryMin doubling up
// to notReachedRetryMax, within the call's CallTimeout; when the local agent itself
// refuses the connection (an agent that is down, more often than one restarting), for
// dialRetryFor at most, so a command against a Consul that is not there fails soon.
const (
	notReachedRetryMax = time.Second
	dialRetryFor       = 3 * time.Second
)

// notReached reports whether err shows that the request reached no Consul server able
// to apply it: the local agent refused the connection, or answered that it could not
// get a connection to a server, knows none, or that the servers have no leader (an
// election, which takes a few seconds). Such a request was not applied, so sending it
// again is safe for a write too. ("leadership lost while committing" is not such an
// answer: the write may have been applied.)
func notReached(err error) bool {
	if dialFailed(err) {
		// A name no DNS server knows stays unknown: nothing to wait for.
		var dns *net.DNSError
		return !errors.As(err, &dns) || !dns.IsNotFound
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code >= 500 {
		for _, m := range []string{"No cluster leader", "rpc error getting client", "No known Consul servers", "No path to datacenter"} {
			if strings.Contains(se.Body, m) {
				return true
			}
		}
	}
	return false
}

// dialFailed reports whether err is a failure to connect to the local agent.
func dialFailed(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// attempt runs f, bounded by CallTimeout, and runs it again while its error shows the
// request reached no server (notReached), until the bound: a one-shot command such as
// `gangrun alloc` then rides out a Consul leader election instead of failing at once.
// op names the request in the error; parent is the caller's context.
func attempt[T any](parent context.Context, o origin, op string, f func(ctx context.Context) (T, error)) (T, error) {
	ctx, cancel := call(parent)
	defer cancel()
	start := time.Now()
	backoff := retryMin
	for {
		v, err := f(ctx)
		if err == nil {
			return v, nil
		}
		if !notReached(err) || dialFailed(err) && time.Since(start) >= dialRetryFor || !Sleep(ctx, backoff) {
			return v, failed(parent, o, op, err)
		}
		backoff = min(backoff*2, notReachedRetryMax)
	}
}

func qopts(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx)
}

func wopts(ctx context.Context) *api.WriteOptions {
	return (&api.WriteOptions{}).WithContext(ctx)
}

func fromPair(p *api.KVPair) Entry {
	return Entry{Key: p.Key, Value: p.Value, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex, LockIndex: p.LockIndex, Session: p.Session}
}

// Get implements Store.
func (s *Consul) Get(ctx context.Context, key string) (*Entry, error) {
	p, err := attempt(ctx, s.origin, "consul get "+key, func(ctx context.Context) (*api.KVPair, error) {
		p, _, err := s.c.KV().Get(key, qopts(ctx))
		return p, err
	})
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, nil
	}
	e := fromPair(p)
	return &e, nil
}

// List implements Store.
func (s *Consul) List(ctx context.Context, prefix string) ([]Entry, uint64, error) {
	type listed struct {
		pairs api.KVPairs
		index uint64
	}
	l, err := attempt(ctx, s.origin, "consul list "+prefix, func(ctx context.Context) (listed, error) {
		pairs, meta, err := s.c.KV().List(prefix, qopts(ctx))
		if err != nil {
			return listed{}, err
		}
		s.saw(meta.LastIndex)
		return listed{pairs, meta.LastIndex}, nil
	})
	if err != nil {
		return nil, 0, err
	}
	return entries(l.pairs), l.index, nil
}

// Keys implements Store.
func (s *Consul) Keys(ctx context.Context, prefix string) ([]string, uint64, error) {
	type listed struct {
		keys  []string
		index uint64
	}
	l, err := attempt(ctx, s.origin, "consul keys "+prefix, func(ctx context.Context) (listed, error) {
		keys, meta, err := s.c.KV().Keys(prefix, "", qopts(ctx))
		if err != nil {
			return listed{}, err
		}
		s.saw(meta.LastIndex)
		return listed{keys, meta.LastIndex}, nil
	})
	if err != nil {
		return nil, 0, err
	}
	sort.Strings(l.keys)
	return l.keys, l.index, nil
}

// WatchList implements Store with a blocking query.
func (s *Consul) WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]Entry, uint64, error) {
	if wait > MaxWaitTime {
		wait = MaxWaitTime
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, blockingTimeout(wait))
	defer cancel()
	q := (&api.QueryOptions{WaitIndex: index, WaitTime: wait, RequireConsistent: true}).WithContext(ctx)
	pairs, meta, err := s.c.KV().List(prefix, q)
	if err != nil {
		return nil, 0, failed(parent, s.origin, "consul watch "+prefix, err)
	}
	s.saw(meta.LastIndex)
	return entries(pairs), meta.LastIndex, nil
}

func entries(pairs api.KVPairs) []Entry {
	out := make([]Entry, len(pairs))
	for i, p := range pairs {
		out[i] = fromPair(p)
	}
	return out
}

// Txn implements Store.
func (s *Consul) Txn(ctx context.Context, ops []Op) (TxnResult, error) {
	if err := CheckTxn(ops); err != nil {
		return TxnResult{}, err
	}
	tops := make(api.TxnOps, len(ops))
	for i, op := range ops {
		tops[i] = &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVOp(op.Verb), Key: op.Key, Value: op.Value, Index: op.Index, Session: op.Session}}
	}
	type answer struct {
		ok   bool
		resp *api.TxnResponse
	}
	ans, err := attempt(ctx, s.origin, "consul txn", func(ctx context.Context) (answer, error) {
		ok, resp, _, err := s.c.Txn().Txn(tops, qopts(ctx))
		return answer{ok, resp}, err
	})
	if err != nil {
		return TxnResult{}, err
	}
	ok, resp := ans.ok, ans.resp
	if !ok {
		te := &TxnError{}
		for _, e := range resp.Errors {
			oe := OpError{Op: e.OpIndex, What: e.What, Reason: consulReason(e.What)}
			if e.OpIndex >= 0 && e.OpIndex < len(ops) {
				oe.Key = ops[e.OpIndex].Key
			}
			te.Errors = append(te.Errors, oe)
		}
		if errors.Is(te, ErrSessionGone) {
			// A session Consul does not know, in a Consul that lost its data (an empty
			// server until the operator restores it): an outage, not the session's end
			// (wentBack), or an agent would register again into the empty server.
			if err := s.wentBack(ctx, "consul txn"); err != nil {
				return TxnResult{}, err
			}
		}
		return TxnResult{}, te
	}
	// Consul returns results for some verbs only (not for check-not-exists, say), so
	// results are matched to Get operations by key.
	// The written entries carry the index the transaction was applied at.
	var res TxnResult
	byKey := map[string]*api.KVPair{}
	for _, r := range resp.Results {
		if r.KV != nil {
			byKey[r.KV.Key] = r.KV
		}
	}
	for _, op := range ops {
		p, ok := byKey[op.Key]
		if !ok {
			continue
		}
		switch op.Verb {
		case Get:
			res.Entries = append(res.Entries, fromPair(p))
		case Set, CAS, Lock, Unlock:
			res.Index = max(res.Index, p.ModifyIndex)
		}
	}
	return res, nil
}

// consulReason maps Consul's description of a failed transaction operation to its
// reason sentinel; nil when it is none of them. This is the one place Consul's wording
// is read (agent/consul/state/txn.go, kvs.go and agent/consul/txn_endpoint.go, v1.14).
func consulReason(what string) error {
	switch {
	case strings.Contains(what, "due to lock delay"):
		return ErrLockDelay
	case strings.Contains(what, "lock is already held"):
		return ErrLockHeld
	case strings.Contains(what, "invalid session"), strings.Contains(what, "missing session"):
		return ErrSessionGone
	case strings.Contains(what, "index is stale"), strings.Contains(what, "current modify index"):
		return ErrStaleIndex
	case strings.Contains(what, "Permission denied"), strings.Contains(what, "permission denied"):
		return ErrPermissionDenied
	case strings.Contains(what, "doesn't exist"):
		return ErrKeyNotFound
	case strings.Contains(what, "exists"):
		return ErrKeyExists
	case strings.Contains(what, "failed session check"), strings.Contains(what, "lock isn't held"):
		return ErrNotLockHolder
	}
	return nil
}

// CreateSession implements Store.
func (s *Consul) CreateSession(ctx context.Context, o SessionOptions) (string, error) {
	if err := o.Validate(); err != nil {
		return "", err
	}
	b := o.Behavior
	if b == "" {
		b = Release
	}
	delay := o.LockDelay
	if delay == 0 {
		// The API leaves a zero lock-delay out of the request, and Consul then applies its
		// 15s default; 1ms is the smallest delay the API sends.
		delay = time.Millisecond
	}
	se := &api.SessionEntry{Name: o.Name, TTL: o.TTL.String(), Behavior: string(b), LockDelay: delay}
	id, err := attempt(ctx, s.origin, fmt.Sprintf("consul create session %q", o.Name), func(ctx context.Context) (string, error) {
		if o.NodeHealth {
			id, _, err := s.c.Session().Create(se, wopts(ctx))
			return id, err
		}
		id, _, err := s.c.Session().CreateNoChecks(se, wopts(ctx))
		return id, err
	})
	if err == nil {
		s.takeMarker(ctx)
	}
	return id, err
}

// takeMarker reads MarkerKey, creating it with a random value where it is missing, and
// takes its value as this client's cluster data. A read or write refused (an ACL token
// without them) or unanswered leaves what was taken before: the check only asks more.
func (s *Consul) takeMarker(ctx context.Context) {
	for range 2 {
		p, err := attempt(ctx, s.origin, "consul get "+MarkerKey, func(ctx context.Context) (*api.KVPair, error) {
			p, _, err := s.c.KV().Get(MarkerKey, qopts(ctx))
			return p, err
		})
		if err != nil {
			return
		}
		if p != nil {
			v := string(p.Value)
			s.marker.Store(&v)
			return
		}
		v := rand.Text()
		if _, err := attempt(ctx, s.origin, "consul create "+MarkerKey, func(ctx context.Context) (bool, error) {
			ok, _, err := s.c.KV().CAS(&api.KVPair{Key: MarkerKey, Value: []byte(v)}, wopts(ctx))
			return ok, err
		}); err != nil {
			return
		}
		// Created, or another client created it first: read what is there.
	}
}

// RenewSession implements Store.
func (s *Consul) RenewSession(ctx context.Context, id string) error {
	se, err := attempt(ctx, s.origin, "renew session "+id, func(ctx context.Context) (*api.SessionEntry, error) {
		se, _, err := s.c.Session().Renew(id, wopts(ctx))
		return se, err
	})
	if err != nil {
		return err
	}
	if se == nil {
		if err := s.wentBack(ctx, "renew session "+id); err != nil {
			return err
		}
		return fmt.Errorf("renew session %s: %w", id, ErrSessionGone)
	}
	return nil
}

// indexProbeKey is a key gangrun never writes: reading it answers with the KV store's
// index as a whole (Consul returns the table's index for a key it does not have).
const indexProbeKey = "gangrun/.index-probe"

// wentBack tells a session that Consul no longer knows apart from one it lost. Consul
// that lost its data (its only server replaced by an empty one, which an operator then
// restores from a snapshot: docs/operations.md, "Recovery") answers "no such session"
// until the restore brings the session back; ending the session's lease on that answer
// would stop a step whose job the restore shows running. wentBack reads the KV store's
// index and MarkerKey: a marker other than the one this client took (none, or
// another), or, before it took one, an index below the highest it has seen, means the
// data is not the data it had, and it returns an UnavailableError (ErrUnavailable: ask
// again; a lease still ends once nothing was renewed for LeaseStop). nil when neither,
// or the reads were refused: the session is gone. The reads' own unavailability is
// returned. The answer is kept for Unsettled.
func (s *Consul) wentBack(ctx context.Context, op string) error {
	seen, marker := s.seen.Load(), s.marker.Load()
	if seen == 0 && marker == nil {
		return nil
	}
	type probe struct {
		index  uint64
		marker *api.KVPair
	}
	p, err := attempt(ctx, s.origin, "consul get "+MarkerKey, func(ctx context.Context) (probe, error) {
		// The index of a key Consul does not have is the KV table's (indexProbeKey).
		_, meta, err := s.c.KV().Get(indexProbeKey, qopts(ctx))
		if err != nil {
			return probe{}, err
		}
		m, _, err := s.c.KV().Get(MarkerKey, qopts(ctx))
		return probe{meta.LastIndex, m}, err
	})
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return err // no answer: an outage all the same
		}
		return nil // refused (a token that may not read gangrun/): the answer stands
	}
	switch {
	case marker != nil && p.marker != nil && string(p.marker.Value) == *marker:
		// The data this client had, restored or never lost: its index counts from here
		// (the highest seen may be an empty server's, raised by writes there).
		s.seen.Store(p.index)
		s.lost.Store(false)
		return nil
	case marker != nil:
		s.lost.Store(true)
		now := "none"
		if p.marker != nil {
			now = strconv.Quote(string(p.marker.Value))
		}
		return &UnavailableError{Op: op, Err: fmt.Errorf("Consul's data went back in time or was lost (its %s is %s, %q was seen): restarted without its data, or being restored from a snapshot; the session may come back", MarkerKey, now, *marker)}
	case p.index < seen:
		// No marker taken (no session created yet): the index alone tells.
		s.lost.Store(true)
		return &UnavailableError{Op: op, Err: fmt.Errorf("Consul's data went back in time (its index is %d, %d was seen): restarted without its data, or being restored from a snapshot; the session may come back", p.index, seen)}
	}
	s.lost.Store(false)
	return nil
}

// DataLost reports whether s is a Consul (or a Store wrapping one: see Wrapper) whose
// data is not the data it had when this client last created a session there (its index
// went back, or MarkerKey is gone or another), or that does not answer: a caller that
// finds its keys gone waits for the restore, or for its lease to end, rather than taking
// them for deleted. False for a Memory store, which keeps its data while it lives, and
// for a Consul whose reads are refused.
func DataLost(ctx context.Context, s Store) bool {
	c := consulOf(s)
	return c != nil && c.wentBack(ctx, "check Consul's data") != nil
}

// TokenOwner is what carries a Consul ACL token, which TokenSelf describes (Consul's
// /v1/acl/token/self): a Consul, found in a Wrapper of one by FindTokenOwner.
type TokenOwner interface {
	TokenSelf(ctx context.Context) (*api.ACLToken, error)
}

// FindTokenOwner returns the TokenOwner s is or wraps; false for a store with no ACL
// token (Memory).
func FindTokenOwner(s Store) (TokenOwner, bool) {
	if c := consulOf(s); c != nil {
		return c, true
	}
	return nil, false
}

// Unsettled reports whether s is a Consul (or wraps one) whose data the last check
// (a renewal or transaction meeting an unknown session, DataLost) found not the data
// this client had: until a check finds it again, a restore may put back keys at
// indexes below what this client saw, and watches ask again every few seconds.
func Unsettled(s Store) bool {
	c := consulOf(s)
	return c != nil && c.lost.Load()
}

// consulOf returns the Consul s is or wraps (through Wrapper), nil for another store.
func consulOf(s Store) *Consul {
	for {
		switch t := s.(type) {
		case *Consul:
			return t
		case Wrapper:
			s = t.Unwrap()
		default:
			return nil
		}
	}
}

// Wrapper is a Store that adds to another (sealing values, say): Unwrap returns that
// Store, for the questions only it answers (DataLost).
type Wrapper interface {
	Store
	Unwrap() Store
}

// DestroySession implements Store.
func (s *Consul) DestroySession(ctx context.Context, id string) error {
	_, err := attempt(ctx, s.origin, "destroy session "+id, func(ctx context.Context) (struct{}, error) {
		_, err := s.c.Session().Destroy(id, wopts(ctx))
		return struct{}{}, err
	})
	return err
}

// SessionExists implements Store.
func (s *Consul) SessionExists(ctx context.Context, id string) (bool, error) {
	se, err := attempt(ctx, s.origin, "session info "+id, func(ctx context.Context) (*api.SessionEntry, error) {
		se, _, err := s.c.Session().Info(id, qopts(ctx))
		return se, err
	})
	if err != nil {
		return false, err
	}
	return se != nil, nil
}

// checkConsulEnv refuses a CONSUL_HTTP_SSL or CONSUL_HTTP_SSL_VERIFY that is not a
// boolean as strconv.ParseBool reads it (1, t, true, 0, f, false...): consul/api only
// logs a warning and goes on without TLS, or verifying, against what the user meant.
func checkConsulEnv() error {
	for _, name := range []string{api.HTTPSSLEnvName, api.HTTPSSLVerifyEnvName} {
		if v, ok := os.LookupEnv(name); ok && v != "" {
			if _, err := strconv.ParseBool(v); err != nil {
				return fmt.Errorf("%s %s: want true or false (1 or 0)", name, quote.Q(v))
			}
		}
	}
	return nil
}

// maxTokenFileBytes bounds how much of CONSUL_HTTP_TOKEN_FILE is read, in bytes: a
// token is a 36-character UUID.
const maxTokenFileBytes = 4 << 10

// checkToken refuses a token that could not be sent as the X-Consul-Token header (a
// file of two lines, a control character): consul/api would fail every request with
// net/http's "invalid header field value", and an agent would retry for ever. The error
// names where the token came from, never the token.
func checkToken(cfg *api.Config) error {
	token, from := cfg.Token, api.HTTPTokenEnvName
	if token == "" && cfg.TokenFile != "" {
		// A token file that is a FIFO or a device is refused, not read for ever.
		b, err := userfile.ReadFile(cfg.TokenFile, maxTokenFileBytes)
		if err != nil {
			return fmt.Errorf("%s %w", api.HTTPTokenFileEnvName, err)
		}
		token, from = strings.TrimSpace(string(b)), api.HTTPTokenFileEnvName+" "+cfg.TokenFile
		if token == "" {
			return fmt.Errorf("%s %s: empty: want the token's SecretID (unset the variable to send no token)", api.HTTPTokenFileEnvName, cfg.TokenFile)
		}
	}
	if strings.IndexFunc(token, func(r rune) bool { return r < 0x21 || r == 0x7f }) >= 0 {
		return fmt.Errorf("%s: the token holds a line break, a space or a control character (want one line: the token's SecretID)", from)
	}
	return nil
}
