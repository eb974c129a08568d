package store

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestConsulAddresses(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want string // "" when accepted, else part of the error
	}{
		{"127.0.0.1:8500", ""},
		{"[::1]:8500", ""},
		{"http://127.0.0.1:8500", ""},
		{"https://consul.example.com", ""},
		{"unix:///run/consul.sock", ""},
		{"localhost", ""},
		{"consul.service.consul", ""},
		{"https://proxy.example.com/consul", ""},
		{"[::1", "want HOST:PORT"},
		{":8500", "want HOST:PORT"},
		{"a b:1", "want HOST:PORT"},
		{"http://[::1", "want HOST:PORT"},
		{"ftp://h:21", "want HOST:PORT"},
		{"h:0", `port "0": want 1..65535`},
		{"h:http", `port "http": want 1..65535`},
		{"unix://", "no socket path"},
		{"http://[::1]", ""},
		{"consul-1.dc_a.example", ""},
		{"127.0.0.1;8500", `host "127.0.0.1;8500": want an IP address or a host name`},
		{"127.0.0.1:8500:1", "want HOST:PORT"},
		{"127.0.0.1.8500", `host "127.0.0.1.8500": not an IP address`},
		{"1.2.3.4.5:8500", `host "1.2.3.4.5": not an IP address`},
		{"-x", `host "-x": want an IP address or a host name`},
		{"...:80", `host "...": want an IP address or a host name`},
		{"a\nb", `host "a\nb": want an IP address or a host name`},
		{"exa$mple:80", `host "exa$mple"`},
	} {
		err := CheckConsulAddr("consul address", tc.addr)
		if tc.want == "" && err != nil {
			t.Errorf("%q: %v, want it accepted", tc.addr, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), strconv.Quote(tc.addr))) {
			t.Errorf("%q: error %v, want one naming it and saying %q", tc.addr, err, tc.want)
		}
	}
	for _, tc := range []struct{ url, host, want string }{
		{"consul://127.0.0.1:8500", "127.0.0.1:8500", ""},
		{"consul://", "", ""},
		{"consul://h:99999", "", `port "99999"`},
		{"consul://h", "", "want consul://HOST:PORT"},
		{"consul://u@h:1", "", "want consul://HOST:PORT"},
		{"http://h:1", "", "want consul://HOST:PORT"},
		{"consul://1.2.3.4.5:8500", "", `host "1.2.3.4.5"`},
	} {
		host, err := ParseConsulURL(tc.url)
		if tc.want == "" && (err != nil || host != tc.host) {
			t.Errorf("ParseConsulURL(%q) = %q, %v; want %q", tc.url, host, err, tc.host)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("ParseConsulURL(%q) error %v, want %q", tc.url, err, tc.want)
		}
	}
}

// TestConsulAddrFromEnvironment: a malformed CONSUL_HTTP_ADDR is refused by NewConsul,
// naming the variable, instead of surfacing as a DNS error at the first request.
func TestConsulAddrFromEnvironment(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"127.0.0.1;8500", `CONSUL_HTTP_ADDR "127.0.0.1;8500": host "127.0.0.1;8500": want an IP address or a host name`},
		{"127.0.0.1.8500", `CONSUL_HTTP_ADDR "127.0.0.1.8500": host "127.0.0.1.8500": not an IP address`},
		{"ftp://h:1", `CONSUL_HTTP_ADDR "ftp://h:1": want HOST:PORT`},
		{"https://h:0", `CONSUL_HTTP_ADDR "https://h:0": port "0": want 1..65535`},
		{"127.0.0.1:8500", ""},
		{"https://consul.example.com:8501", ""},
	} {
		t.Setenv("CONSUL_HTTP_ADDR", tc.value)
		s, err := NewConsul("")
		if tc.want == "" {
			if err != nil {
				t.Errorf("CONSUL_HTTP_ADDR=%q: %v", tc.value, err)
			} else {
				s.Close()
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("CONSUL_HTTP_ADDR=%q: error %v, want %q", tc.value, err, tc.want)
		}
	}
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1;8500")
	if _, err := NewConsul("127.0.0.1:8500"); err != nil {
		t.Errorf("an explicit address wins over a bad CONSUL_HTTP_ADDR: %v", err)
	}
}

// TestTokenThatCannotBeSent: a token file of two lines (or a token with a control
// character) is refused when the store is made, naming where it came from and not the
// token; one line, spaces around it trimmed as consul/api does, is taken.
func TestTokenThatCannotBeSent(t *testing.T) {
	dir := t.TempDir()
	two := filepath.Join(dir, "two")
	one := filepath.Join(dir, "one")
	if err := os.WriteFile(two, []byte("secret-a\nsecret-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(one, []byte("  secret-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", two)
	_, err := NewConsul("127.0.0.1:8500")
	if err == nil || !strings.Contains(err.Error(), "CONSUL_HTTP_TOKEN_FILE "+two) || strings.Contains(err.Error(), "secret") {
		t.Errorf("a two-line token file: %v, want a refusal naming the file and not the token", err)
	}
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", one)
	if c, err := NewConsul("127.0.0.1:8500"); err != nil {
		t.Errorf("a one-line token file: %v", err)
	} else {
		c.Close()
	}
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	t.Setenv("CONSUL_HTTP_TOKEN", "secret\x1b[2J")
	if _, err := NewConsul("127.0.0.1:8500"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("a token with an escape: %v, want a refusal without the token", err)
	}
}

// TestConsulClientConnections: a client of a Consul on this machine asks for no gzip
// (it would only cost CPU on the loopback) and keeps its connections for the next
// requests when many were sent at once, instead of dialling again.
func TestConsulClientConnections(t *testing.T) {
	const at = 16 // at once: more than consul/api's own GOMAXPROCS+1 idle connections
	var mu sync.Mutex
	conns, gzipAsked, arrived := 0, 0, 0
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			gzipAsked++
		}
		// Each round's requests are answered once all of them arrived: they are
		// open at once, each on a connection of its own.
		ch := release
		if arrived++; arrived%at == 0 {
			close(release)
			release = make(chan struct{})
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(time.Minute):
		}
		w.Header().Set("X-Consul-Index", "5")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[{"Key":"k","Value":"eA==","ModifyIndex":5}]`))
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	s, err := NewConsul(strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	round := func() {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range at {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := s.Get(context.Background(), "k"); err != nil {
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
	}
	round()
	mu.Lock()
	first := conns
	mu.Unlock()
	for range 3 {
		round()
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != first {
		t.Errorf("%d connections for the first %d requests at once, %d after three rounds more: want them kept", first, at, conns)
	}
	if gzipAsked != 0 {
		t.Errorf("%d of %d requests to a loopback Consul asked for gzip", gzipAsked, 4*at)
	}
	for addr, want := range map[string]bool{"127.0.0.1:8500": true, "localhost:8500": true, "[::1]:8500": true,
		"http://127.0.0.1:8500": true, "unix:///run/consul.sock": true, "10.0.0.5:8500": false, "consul.example:8500": false,
		"https://consul.example": false} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
