package rendezvous

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/internal/testport"
)

func TestParseC10dURL(t *testing.T) {
	yes := true
	for _, c := range []struct {
		in      string
		want    C10dEndpoint
		wantErr string
	}{
		{in: "c10d://node1.example.com", want: C10dEndpoint{Host: "node1.example.com", Port: 29400}},
		{in: "c10d://10.0.0.1:1234?is_host=yes&join_timeout=5&last_call_timeout=0.5&close_timeout=2&read_timeout=9&use_libuv=0",
			want: C10dEndpoint{Host: "10.0.0.1", Port: 1234, IsHost: &yes, JoinTimeout: 5 * time.Second, LastCall: 500 * time.Millisecond,
				CloseTimeout: 2 * time.Second, ReadTimeout: 9 * time.Second}},
		{in: "c10d://localhost:0?timeout=7", want: C10dEndpoint{Host: "localhost", Port: 0, JoinTimeout: 7 * time.Second}},
		{in: "c10d://[::1]:29401", want: C10dEndpoint{Host: "::1", Port: 29401}},
		{in: "c10d://", wantErr: "want c10d://HOST[:PORT]"},
		{in: "c10d://h:70000", wantErr: `port "70000": want 0..65535`},
		{in: "c10d://h:1?keep_alive_interval=5", wantErr: "keep_alive_interval: cannot be honoured"},
		{in: "c10d://h:1?store_type=file", wantErr: "rdzv-conf store_type: not a key of the c10d rendezvous"},
		{in: "c10d://h:1?join_timeout=-1", wantErr: "rdzv-conf join_timeout=-1: want a number of seconds above 0"},
		{in: "c10d://h:1?is_host=maybe", wantErr: "rdzv-conf is_host=maybe: want a boolean"},
	} {
		got, err := ParseC10dURL(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err %v, want %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		w := c.want
		for p, d := range map[*time.Duration]time.Duration{&w.JoinTimeout: C10dJoinTimeout, &w.LastCall: C10dLastCall,
			&w.CloseTimeout: C10dCloseTimeout, &w.ReadTimeout: C10dReadTimeout} {
			if *p == 0 {
				*p = d
			}
		}
		if got.Host != w.Host || got.Port != w.Port || (got.IsHost == nil) != (w.IsHost == nil) ||
			got.JoinTimeout != w.JoinTimeout || got.LastCall != w.LastCall || got.CloseTimeout != w.CloseTimeout || got.ReadTimeout != w.ReadTimeout {
			t.Errorf("%s: %+v, want %+v", c.in, got, w)
		}
	}
}

// freeLoopbackPort returns a port free on every interface, claimed for this test
// process (testport).
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	return testport.Get(t)
}

// TestC10dTwoNodesAndTheHostsLoss: two nodes of one machine open the same c10d
// endpoint: the first serves it, the second, finding the port taken, is its client
// (torch's fallback); they meet in one round. When the serving node goes away, the
// other's next join fails once read_timeout has passed, naming the endpoint: the job
// ends with the host, as torchrun's does.
func TestC10dTwoNodesAndTheHostsLoss(t *testing.T) {
	ctx := context.Background()
	port := freeLoopbackPort(t)
	url := "c10d://127.0.0.1:" + strconv.Itoa(port) + "?last_call_timeout=0.2&read_timeout=2&close_timeout=1"
	open := func(name string) *Opened {
		o, err := Open(ctx, url, Config{JobID: "job7", NodeName: name, MinNodes: 2, MaxNodes: 2, MaxRestarts: 1, AdvertiseAddr: "127.0.0.1"})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return o
	}
	host := open("a")
	client := open("b")
	defer client.Close()
	if _, ok := host.Store.(*store.Memory); !ok {
		t.Fatalf("the first node's store is %T, want the memory store it serves", host.Store)
	}
	if _, ok := client.Store.(*store.Remote); !ok {
		t.Fatalf("the second node's store is %T, want the endpoint's Remote", client.Store)
	}
	if !host.Shared || host.Backend != "c10d" || host.JobID != "job7" {
		t.Fatalf("opened %+v", host)
	}
	var wg sync.WaitGroup
	rounds := make([]Round, 2)
	for i, o := range []*Opened{host, client} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := o.Rendezvous.Join(ctx, JoinRequest{Node: o.NodeName, Addr: "127.0.0.1", LocalWorldSize: 2})
			if err != nil {
				t.Errorf("%s: join: %v", o.NodeName, err)
				return
			}
			rounds[i] = r
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	a, b := rounds[0].Assignment(), rounds[1].Assignment()
	if a.WorldSize != 4 || b.WorldSize != 4 || a.NodeRank == b.NodeRank || a.MasterEndpoint() != b.MasterEndpoint() {
		t.Fatalf("assignments %+v and %+v: want one world of 4 with one master", a, b)
	}
	// The host is lost: its endpoint stops answering.
	host.Close()
	start := time.Now()
	_, err := client.Rendezvous.Join(ctx, JoinRequest{Node: "b", Addr: "127.0.0.1", LocalWorldSize: 2})
	if err == nil || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) {
		t.Fatalf("join after the host's loss: %v, want ErrUnavailable naming the endpoint", err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("gave up after %s, before read_timeout (2s)", d)
	}
}

// TestC10dRefusals: what a c10d endpoint cannot be is refused before anything is held.
func TestC10dRefusals(t *testing.T) {
	ctx := context.Background()
	busy, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	for _, c := range []struct {
		url     string
		cfg     Config
		wantErr string
	}{
		{"c10d://127.0.0.1:0", Config{MinNodes: 2, MaxNodes: 2}, "port 0 picks a free port the other nodes cannot know"},
		{"c10d://192.0.2.1:1234?is_host=1", Config{}, "is_host=1, but 192.0.2.1 is not an address or name of this machine"},
		{"c10d://127.0.0.1:" + busyPort + "?is_host=true", Config{}, "cannot serve it here"},
	} {
		_, err := Open(ctx, c.url, c.cfg)
		if err == nil || !IsUsage(err) || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: %v, want a usage error with %q", c.url, err, c.wantErr)
		}
	}
	// A port something else holds, which answers but not as gangrun: refused at once.
	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer web.Close()
	go func() {
		for {
			c, err := web.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"))
			c.Close()
		}
	}()
	_, err = Open(ctx, "c10d://127.0.0.1:"+strconv.Itoa(web.Addr().(*net.TCPAddr).Port)+"?is_host=0", Config{MinNodes: 2, MaxNodes: 2})
	if err == nil || !strings.Contains(err.Error(), "not a gangrun endpoint") {
		t.Errorf("an endpoint that is not gangrun's: %v", err)
	}
}

func FuzzParseC10dURL(f *testing.F) {
	for _, s := range []string{"c10d://h:1", "c10d://[::1]:0?is_host=1", "c10d://h?join_timeout=1e308", "c10d://:1", "c10d://h:1?a=b&a=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseC10dURL(s)
		if err == nil && (e.Host == "" || e.Port < 0 || e.Port > 65535 || e.JoinTimeout <= 0 || e.ReadTimeout <= 0) {
			t.Fatalf("%q: accepted %+v", s, e)
		}
	})
}
