package store

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestConsulRetriesWhatReachedNoServer: an answer saying the request reached no server
// (the servers have no leader, the agent could not get a connection to one) is asked
// again within the call's bound; an answer that may hide an applied write is not.
func TestConsulRetriesWhatReachedNoServer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		wantCalls int64
		wantErr   bool
	}{
		{"no leader", "No cluster leader", 3, false},
		{"no connection to a server", "rpc error making call: rpc error getting client: failed to get conn: dial tcp 127.0.0.1:0->127.0.0.1:8300: connect: connection refused", 3, false},
		{"leadership lost while committing", "leadership lost while committing log", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) <= 2 {
					http.Error(w, tc.body, http.StatusInternalServerError)
					return
				}
				w.Header().Set("X-Consul-Index", "7")
				_, _ = w.Write([]byte(`[{"Key":"k","Value":"dg==","ModifyIndex":7}]`))
			}))
			defer srv.Close()
			s, err := NewConsul(strings.TrimPrefix(srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			e, err := s.Get(context.Background(), "k")
			if got := calls.Load(); got != tc.wantCalls {
				t.Errorf("%d requests, want %d", got, tc.wantCalls)
			}
			if tc.wantErr {
				if err == nil || !errors.Is(err, ErrUnavailable) {
					t.Errorf("err = %v, want ErrUnavailable", err)
				}
				return
			}
			if err != nil || e == nil || string(e.Value) != "v" {
				t.Errorf("Get = %+v, %v; want k=v", e, err)
			}
		})
	}
	t.Run("agent refuses connections", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		s, err := NewConsul(addr)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = s.Get(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrUnavailable) {
			t.Errorf("err = %v, want the caller's deadline or ErrUnavailable", err)
		}
		if took := time.Since(start); took < 500*time.Millisecond {
			t.Errorf("gave up after %s: a refused connection is asked again until the caller's deadline", took)
		}
	})
}
