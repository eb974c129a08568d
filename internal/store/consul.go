package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// Consul is the Store on a Consul cluster, through github.com/hashicorp/consul/api.
type Consul struct {
	c         *api.Client
	transport *http.Transport
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
	cfg := api.DefaultConfig()
	what := "consul address"
	if addr != "" {
		cfg.Address = addr
	} else if env := os.Getenv(api.HTTPAddrEnvName); env != "" {
		what = api.HTTPAddrEnvName
		// DefaultConfig strips a scheme it understands into cfg.Scheme: judge the
		// variable as the user wrote it.
		if err := CheckConsulAddr(what, env); err != nil {
			return nil, err
		}
	}
	if err := CheckConsulAddr(what, cfg.Address); err != nil {
		return nil, err
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client for %s: %w", cfg.Address, err)
	}
	return &Consul{c: c, transport: cfg.Transport}, nil
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

// Client returns the underlying Consul API client.
func (s *Consul) Client() *api.Client { return s.c }

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
	p, _, err := s.c.KV().Get(key, qopts(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul get %s: %w", key, err)
	}
	if p == nil {
		return nil, nil
	}
	e := fromPair(p)
	return &e, nil
}

// List implements Store.
func (s *Consul) List(ctx context.Context, prefix string) ([]Entry, uint64, error) {
	pairs, meta, err := s.c.KV().List(prefix, qopts(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("consul list %s: %w", prefix, err)
	}
	return entries(pairs), meta.LastIndex, nil
}

// WatchList implements Store with a blocking query.
func (s *Consul) WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]Entry, uint64, error) {
	if wait > MaxWaitTime {
		wait = MaxWaitTime
	}
	q := (&api.QueryOptions{WaitIndex: index, WaitTime: wait, RequireConsistent: true}).WithContext(ctx)
	pairs, meta, err := s.c.KV().List(prefix, q)
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, fmt.Errorf("consul watch %s: %w", prefix, err)
	}
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
	ok, resp, _, err := s.c.Txn().Txn(tops, qopts(ctx))
	if err != nil {
		return TxnResult{}, fmt.Errorf("consul txn: %w", err)
	}
	if !ok {
		te := &TxnError{}
		for _, e := range resp.Errors {
			te.Errors = append(te.Errors, OpError{Op: e.OpIndex, What: e.What})
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
	var id string
	var err error
	if o.NodeHealth {
		id, _, err = s.c.Session().Create(se, wopts(ctx))
	} else {
		id, _, err = s.c.Session().CreateNoChecks(se, wopts(ctx))
	}
	if err != nil {
		return "", fmt.Errorf("consul create session %q: %w", o.Name, err)
	}
	return id, nil
}

// RenewSession implements Store.
func (s *Consul) RenewSession(ctx context.Context, id string) error {
	se, _, err := s.c.Session().Renew(id, wopts(ctx))
	if err != nil {
		var status api.StatusError
		if errors.As(err, &status) && status.Code == 404 || strings.Contains(err.Error(), "404") {
			return fmt.Errorf("renew session %s: %w", id, ErrSessionGone)
		}
		return fmt.Errorf("renew session %s: %w", id, err)
	}
	if se == nil {
		return fmt.Errorf("renew session %s: %w", id, ErrSessionGone)
	}
	return nil
}

// DestroySession implements Store.
func (s *Consul) DestroySession(ctx context.Context, id string) error {
	if _, err := s.c.Session().Destroy(id, wopts(ctx)); err != nil {
		return fmt.Errorf("destroy session %s: %w", id, err)
	}
	return nil
}

// SessionExists implements Store.
func (s *Consul) SessionExists(ctx context.Context, id string) (bool, error) {
	se, _, err := s.c.Session().Info(id, qopts(ctx))
	if err != nil {
		return false, fmt.Errorf("session info %s: %w", id, err)
	}
	return se != nil, nil
}
