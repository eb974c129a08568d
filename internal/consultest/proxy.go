package consultest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a Consul agent that a test can cut, as a network
// partition that drops packets does: while cut, nothing crosses it in either direction,
// yet every connection stays open (no reset, no error: the client's requests simply get
// no answer), and a new connection is accepted but not forwarded. Healing delivers what
// was held back, as TCP's retransmissions would. Between a client and Consul it stands
// for the link of one node, so the other nodes keep their own.
type Proxy struct {
	// Addr is where clients connect, "127.0.0.1:PORT".
	Addr string

	target string
	ln     net.Listener

	mu     sync.Mutex
	cut    bool
	healed *sync.Cond
	conns  []net.Conn
	closed bool
}

// NewProxy starts a proxy to target ("HOST:PORT") on a free loopback port; the test's
// cleanup closes it and every connection through it.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	p.healed = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Cut stops all traffic through the proxy until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// Heal lets traffic through again, held-back bytes first.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.healed.Broadcast()
	p.mu.Unlock()
}

// pass blocks while the proxy is cut; it reports false once the proxy is closed.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut && !p.closed {
		p.healed.Wait()
	}
	return !p.closed
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *Proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			return
		}
		go func() {
			if !p.pass() { // a SYN into the partition: no answer until it heals
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				in.Close()
				return
			}
			if !p.track(out) {
				in.Close()
				return
			}
			go p.copy(out, in)
			go p.copy(in, out)
		}()
	}
}

// copy forwards src to dst chunk by chunk, holding each chunk while the proxy is cut.
func (p *Proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			dst.Close()
			return
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.healed.Broadcast()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}
