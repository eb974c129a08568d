package tcpstore

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"
)

// Set sets key to value in the store from this process, as a client's SET would (its
// waiters are woken).
func (s *Server) Set(key string, value []byte) {
	s.mu.Lock()
	s.keys[key] = append([]byte(nil), value...)
	s.wake(key)
	s.mu.Unlock()
}

// v1Get is torch 1.13's GET command byte (v1Ops), which this package's server takes as
// a connection's first request.
const v1Get = 2

// Get reads key from the store at addr ("HOST:PORT") over one connection of its own,
// in torch 1.13's dialect: the value, empty when the key is missing (this package's
// server answers so; torch's own waits for the key, so Get is meant for this server).
// It gives up when ctx ends; errors name addr.
func Get(ctx context.Context, addr, key string) ([]byte, error) {
	if len(key) > MaxKeyBytes {
		return nil, fmt.Errorf("TCPStore key of %d bytes: at most %d", len(key), MaxKeyBytes)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TCPStore at %s: %w", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(time.Minute))
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	req := appendBytes([]byte{v1Get}, []byte(key))
	if _, err := c.Write(req); err != nil {
		return nil, fmt.Errorf("TCPStore at %s: GET %q: %w", addr, key, err)
	}
	v, err := readValue(bufio.NewReader(c))
	if err != nil {
		return nil, fmt.Errorf("TCPStore at %s: GET %q: %w", addr, key, err)
	}
	return v, nil
}
