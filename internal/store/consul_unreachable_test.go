package store

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestConsulUnreachableSaysWhereAndWhy: a Consul that cannot be reached is one error
// naming the address dialled, where it came from (--consul, CONSUL_HTTP_ADDR, the
// default) and the system's reason, without the request's URL; it is still
// ErrUnavailable.
func TestConsulUnreachableSaysWhereAndWhy(t *testing.T) {
	closed := freePort(t)
	for _, tc := range []struct {
		name, addr, from, env string
		want                  string
	}{
		{"given", closed, "--consul", "", "cannot reach Consul at " + closed + " (from --consul): connection refused; start a Consul agent there"},
		{"from the environment", "", "--consul", closed, "cannot reach Consul at " + closed + " (from CONSUL_HTTP_ADDR): connection refused"},
		{"no port: Consul's, not 80", "", "--consul", "127.0.0.77", "cannot reach Consul at 127.0.0.77:8500 (from CONSUL_HTTP_ADDR, with Consul's default port added)"},
		{"https without a port", "", "--coordinator", "https://127.0.0.77", "cannot reach Consul at https://127.0.0.77:8501 (from CONSUL_HTTP_ADDR, with Consul's default port added)"},
		{"no such host", "nosuchhost.invalid:8500", "--consul", "", `cannot reach Consul at nosuchhost.invalid:8500 (from --consul): no such host "nosuchhost.invalid"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CONSUL_HTTP_ADDR", tc.env)
			s, err := NewConsulFrom(tc.addr, tc.from)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, err = s.Get(context.Background(), "gangrun/x")
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("err %v is not ErrUnavailable", err)
			}
			var ue *UnavailableError
			if !errors.As(err, &ue) || !ue.Unreachable() {
				t.Fatalf("err %v: not an unreachable UnavailableError", err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tc.want) || strings.Contains(msg, "http://") || strings.Contains(msg, "Get ") {
				t.Errorf("error %q\nwant it to begin %q, without the URL", msg, tc.want)
			}
		})
	}
}

// TestConsulDefaultPort: a host without a port gets Consul's (8500, 8501 under
// https); a port, a path (a reverse proxy) or a socket is left alone.
func TestConsulDefaultPort(t *testing.T) {
	for _, tc := range []struct{ addr, scheme, want string }{
		{"h", "http", "h:8500"},
		{"h", "https", "h:8501"},
		{"http://h", "", "http://h:8500"},
		{"https://h", "", "https://h:8501"},
		{"[::1]", "http", "[::1]:8500"},
		{"h:80", "http", "h:80"},
		{"https://proxy.example.com/consul", "", "https://proxy.example.com/consul"},
		{"unix:///run/consul.sock", "", "unix:///run/consul.sock"},
	} {
		if got, _ := withConsulPort(tc.addr, tc.scheme); got != tc.want {
			t.Errorf("withConsulPort(%q, %q) = %q, want %q", tc.addr, tc.scheme, got, tc.want)
		}
	}
}

// TestConsulSSLVariablesAreChecked: CONSUL_HTTP_SSL=maybe is refused, not warned about
// and ignored.
func TestConsulSSLVariablesAreChecked(t *testing.T) {
	for _, name := range []string{"CONSUL_HTTP_SSL", "CONSUL_HTTP_SSL_VERIFY"} {
		t.Setenv(name, "maybe")
		if _, err := NewConsul("127.0.0.1:8500"); err == nil || err.Error() != name+` "maybe": want true or false (1 or 0)` {
			t.Errorf("%s=maybe: %v", name, err)
		}
		t.Setenv(name, "true")
		s, err := NewConsul("127.0.0.1:8500")
		if err != nil {
			t.Errorf("%s=true: %v", name, err)
		} else {
			s.Close()
		}
		t.Setenv(name, "")
	}
}

// TestNamesAreBounded: an id or name longer than MaxSegmentBytes, and a node name DNS
// would not take, are refused naming them shortened.
func TestNamesAreBounded(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	if err := CheckSegment("job id", long); err == nil || !strings.Contains(err.Error(), `"`+long[:60]+`"... (102400 bytes): longer than 128 bytes`) {
		t.Errorf("CheckSegment of 100 KB: %v", err)
	}
	if err := CheckSegment("job id", strings.Repeat("x", MaxSegmentBytes)); err != nil {
		t.Errorf("CheckSegment of %d bytes: %v", MaxSegmentBytes, err)
	}
	for _, tc := range []struct{ name, want string }{
		{"node-01", ""}, {"gpu01.rack2.example.com", ""}, {strings.Repeat("a", 63), ""},
		{strings.Repeat("a", 64), "a label of 64 bytes: DNS allows 63 between dots"},
		{"-n", "a label begins or ends with '-'"}, {"a..b", "an empty label"}, {"n/1", "only letters"},
	} {
		err := CheckNodeName("--node-name", tc.name)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckNodeName(%q) = %v; want %q", tc.name, err, tc.want)
		}
	}
}
