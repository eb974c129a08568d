package store

import (
	"context"
	"sync"

	"github.com/hashicorp/consul/api"
)

// ConsulClient is a Store that is a client of a Consul cluster: what gangrun's commands
// and doctor hold, where the packages beneath them take a Store. *Consul is the one
// gangrun makes; a test may pass another.
type ConsulClient interface {
	Store
	// Addr returns the Consul address the client dials and where it came from (a
	// flag, CONSUL_HTTP_ADDR, the default), as its errors word them.
	Addr() (addr, from string)
	// Client returns the consul/api client, for Consul's own APIs (its ACL tokens, its
	// servers' status).
	Client() *api.Client
	// Clock reads the clock of the Consul agent at host (HOST:PORT; "": the one the
	// client dials) from its HTTP answer's Date header.
	Clock(ctx context.Context, host string) (Clock, error)
	// Close releases the client's idle connections.
	Close()
}

// Locals is what other packages keep on one store client between their calls (job's
// submit cache), dropped with the client. Consul and Memory embed one; a Store that
// does not (a Wrapper, a Remote) keeps nothing.
type Locals struct{ m sync.Map }

// Local returns the value kept under key on this client, made by mk on its first use
// (mk may run more than once when two callers race; one value is kept). key is
// compared as a map key: use an unexported type of the caller's package.
func (l *Locals) Local(key any, mk func() any) any {
	if v, ok := l.m.Load(key); ok {
		return v
	}
	v, _ := l.m.LoadOrStore(key, mk())
	return v
}

// LocalOf returns s's value under key as Locals.Local does, and false when s keeps no
// values (it embeds no Locals).
func LocalOf(s Store, key any, mk func() any) (any, bool) {
	l, ok := s.(interface {
		Local(key any, mk func() any) any
	})
	if !ok {
		return nil, false
	}
	return l.Local(key, mk), true
}
