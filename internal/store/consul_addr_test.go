package store

import (
	"strings"
	"testing"
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
	} {
		err := checkConsulAddr(tc.addr)
		if tc.want == "" && err != nil {
			t.Errorf("%q: %v, want it accepted", tc.addr, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.addr)) {
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
