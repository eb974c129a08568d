package store_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestRemoteWhenTheServerIsGone: a Remote whose server is not there, or goes away while
// a WatchList blocks, fails ErrUnavailable naming the endpoint; one pointed at a port
// that is not a gangrun store (a web server, a torchrun agent's TCPStore) says so.
func TestRemoteWhenTheServerIsGone(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := store.NewRemote(addr)
	defer r.Close()
	if _, err := r.Get(ctx, "k"); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Errorf("nothing listening: %v, want ErrUnavailable naming %s", err, addr)
	}

	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := store.ServeRemote(ln, store.NewMemory())
	r2 := store.NewRemote(ln.Addr().String())
	defer r2.Close()
	if err := r2.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	_, idx, err := r2.List(ctx, "p/")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := r2.WatchList(ctx, "p/", idx, time.Minute)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("watch when the server closed: %v, want ErrUnavailable", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the watch did not end when its server closed")
	}

	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>hello</html>")) })}
	go func() { _ = hs.Serve(web) }()
	defer hs.Close()
	r3 := store.NewRemote(web.Addr().String())
	defer r3.Close()
	if err := r3.Ping(ctx); err == nil || errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "not a gangrun endpoint") {
		t.Errorf("a web server: %v, want 'not a gangrun endpoint'", err)
	}
}

// TestRemoteKeepsErrorTypes: a rejected transaction and a gone session come back as
// the same typed errors the served store returned.
func TestRemoteKeepsErrorTypes(t *testing.T) {
	ctx := context.Background()
	r := remoteStore(t, store.NewMemory())
	a := session(t, r, store.SessionOptions{Name: "a"})
	b := session(t, r, store.SessionOptions{Name: "b"})
	if _, err := r.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "x", Value: []byte("a"), Session: a}}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Txn(ctx, []store.Op{{Verb: store.Lock, Key: "x", Value: []byte("b"), Session: b}})
	var te *store.TxnError
	if !errors.As(err, &te) || !errors.Is(err, store.ErrLockHeld) || te.Errors[0].Key != "x" {
		t.Errorf("lock held elsewhere: %v, want a *TxnError with ErrLockHeld on x", err)
	}
	if err := r.DestroySession(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := r.RenewSession(ctx, b); !errors.Is(err, store.ErrSessionGone) {
		t.Errorf("renew a destroyed session: %v, want ErrSessionGone", err)
	}
	if ok, err := r.SessionExists(ctx, b); ok || err != nil {
		t.Errorf("SessionExists(destroyed) = %v, %v", ok, err)
	}
	if _, err := r.CreateSession(ctx, store.SessionOptions{TTL: time.Second}); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a 1s TTL: %v, want refused as Consul refuses it", err)
	}
}
