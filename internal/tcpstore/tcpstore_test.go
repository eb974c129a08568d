package tcpstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/torchtest"
)

// opsScript drives every store operation the client of the torch running it has,
// against the server at argv[1], and prints what each returned as JSON. A second
// client sets the key the first one waits for.
const opsScript = `
import datetime, json, sys, threading, time
import torch.distributed as d
port = int(sys.argv[1])
def client():
    return d.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=20))
c = client()
out = {}
c.set("k1", "v1")
out["get"] = c.get("k1").decode()
out["add"] = [c.add("n", 5), c.add("n", -2)]
out["cas"] = [c.compare_set("k1", "v1", "v2").decode(), c.compare_set("k1", "zz", "v3").decode(),
              c.compare_set("new", "", "fresh").decode(), c.compare_set("absent", "x", "y").decode()]
out["num_keys"] = c.num_keys()
out["delete"] = [c.delete_key("k1"), c.delete_key("k1")]
if hasattr(c, "check"):
    out["check"] = [c.check(["new"]), c.check(["new", "missing"])]
def later():
    time.sleep(0.3)
    other = client()
    other.set("late", "x")
threading.Thread(target=later).start()
t0 = time.time()
c.wait(["late", "new"])
out["waited"] = time.time() - t0 >= 0.25
out["late"] = c.get("late").decode()
try:
    c.wait(["never"], datetime.timedelta(milliseconds=500))
    out["wait_timeout"] = "no timeout"
except Exception as e:
    out["wait_timeout"] = type(e).__name__
c.set("after", "ok")
out["after_timeout"] = c.get("after").decode()
if hasattr(c, "append"):
    c.append("ap", "x"); c.append("ap", "y")
    out["append"] = c.get("ap").decode()
    c.multi_set(["a", "b"], ["1", "2"])
    out["multi_get"] = [v.decode() for v in c.multi_get(["a", "b"])]
if hasattr(c, "queue_push"):
    c.queue_push("q", "e1"); c.queue_push("q", "e2")
    out["queue_len"] = c.queue_len("q")
    out["queue_pop"] = [c.queue_pop("q").decode(), c.queue_pop("q").decode()]
    out["queue_len_after"] = c.queue_len("q")
print(json.dumps(out))
`

// TestRealClients: torch's own TCPStore client, from torch 1.13 and torch 2.x, gets
// torch's answers from this server for every operation it has.
func TestRealClients(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, py torchtest.Python) {
		s, err := Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var out map[string]any
		runPy(t, py.Path, opsScript, &out, strconv.Itoa(s.Port()))
		want := map[string]any{
			"get": "v1", "add": []any{5.0, 3.0}, "cas": []any{"v2", "v2", "fresh", "x"},
			// k1, n, new and the client's init/ key (torch's waitForWorkers adds to it).
			"num_keys": 4.0, "delete": []any{true, false},
			"waited": true, "late": "x", "wait_timeout": "DistStoreError", "after_timeout": "ok",
		}
		if py.Major() == 1 {
			want["wait_timeout"] = "RuntimeError" // torch 1.13's client: a socket timeout
		} else {
			want["check"] = []any{true, false}
			want["append"] = "xy"
			want["multi_get"] = []any{"1", "2"}
			want["queue_len"], want["queue_pop"], want["queue_len_after"] = 2.0, []any{"e1", "e2"}, 0.0
		}
		for k, v := range want {
			if fmt.Sprint(out[k]) != fmt.Sprint(v) {
				t.Errorf("%s = %v, want %v (torch %s)", k, out[k], v, py.Version)
			}
		}
		for k := range out {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected result %s = %v", k, out[k])
			}
		}
	})
}

// gangScript is what a worker under torchrun 2.x does with TORCHELASTIC_USE_AGENT_STORE
// True: init_process_group's env:// rendezvous connects to the agent's store as a
// client (rank 0 included), then gloo exchanges its addresses through it.
const gangScript = `
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
dist.barrier()
print(json.dumps({"rank": dist.get_rank(), "sum": float(t[0])}))
dist.destroy_process_group()
`

// TestAgentStoreGang: two gloo workers of each torch version meet in this server as
// torchrun's agent store, and all-reduce.
func TestAgentStoreGang(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, py torchtest.Python) {
		s, err := Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var wg sync.WaitGroup
		results := make([]map[string]any, 2)
		for rank := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				env := []string{"TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=0",
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(s.Port()),
					"RANK=" + strconv.Itoa(rank), "WORLD_SIZE=2", "LOCAL_RANK=" + strconv.Itoa(rank)}
				runPyEnv(t, py.Path, gangScript, &results[rank], env)
			}()
		}
		wg.Wait()
		for rank, r := range results {
			if r["rank"] != float64(rank) || r["sum"] != 3.0 {
				t.Errorf("rank %d: %v, want sum 3", rank, r)
			}
		}
	})
}

// TestBadRequests: a request the server does not take closes that connection only;
// the store serves the next client.
func TestBadRequests(t *testing.T) {
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u64 := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	for name, req := range map[string][]byte{
		"torch 1.13 WATCH_KEY":     {7},
		"unknown command":          append([]byte{0}, append(binary.LittleEndian.AppendUint32(nil, validationMagic), 200)...),
		"wrong magic":              {0, 1, 2, 3, 4},
		"key over 8 KiB":           append([]byte{0}, u64(MaxKeyBytes+1)...),
		"value over 64 MiB":        append(append(append([]byte{0}, u64(1)...), 'k'), u64(MaxValueBytes+1)...),
		"ADD to a non-number":      nil, // below
		"WAIT for too many keys":   append([]byte{5}, u64(MaxKeys+1)...),
		"MULTI_GET, too many keys": append(append([]byte{0}, binary.LittleEndian.AppendUint32(nil, validationMagic)...), append([]byte{10}, u64(MaxKeys+1)...)...),
	} {
		if req == nil {
			// torch 1.13 dialect: SET k "x", then ADD k 1.
			req = append(append(append([]byte{0}, u64(1)...), 'k'), append(u64(1), 'x')...)
			req = append(append(append(req, 3), u64(1)...), 'k')
			req = append(req, u64(1)...)
		}
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).CloseWrite() // a request cut short ends at EOF
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		rest, err := io.ReadAll(c)
		c.Close()
		if err != nil || len(rest) != 0 {
			t.Errorf("%s: read %q, %v; want the connection closed with no reply", name, rest, err)
		}
	}
	// The store still serves (torch 2.x dialect: VALIDATE, PING).
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := append([]byte{0}, binary.LittleEndian.AppendUint32(nil, validationMagic)...)
	req = append(append(req, byte(opPing)), binary.LittleEndian.AppendUint32(nil, 0xABCD)...)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var nonce [4]byte
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, nonce[:]); err != nil || binary.LittleEndian.Uint32(nonce[:]) != 0xABCD {
		t.Fatalf("PING after the bad requests: %x, %v", nonce, err)
	}
}

// TestCloseEndsClients: Close returns with clients connected and waiting, and their
// connections end.
func TestCloseEndsClients(t *testing.T) {
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// torch 1.13 dialect: WAIT for one key that never comes.
	req := append([]byte{5}, binary.LittleEndian.AppendUint64(nil, 1)...)
	req = append(append(req, binary.LittleEndian.AppendUint64(nil, 1)...), 'w')
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the waiting client read %d bytes, %v; want its connection closed", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// FuzzServe: any bytes a client sends leave the server serving: no panic, no hang, and
// a fresh client's PING is answered.
func FuzzServe(f *testing.F) {
	magic := binary.LittleEndian.AppendUint32([]byte{0}, validationMagic)
	f.Add([]byte{})
	f.Add(magic)
	f.Add(append(append([]byte{}, magic...), 13, 1, 2, 3, 4))
	f.Add([]byte{3, 5, 0, 0, 0, 0, 0, 0, 0, 'i', 'n', 'i', 't', '/', 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{5, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'w'})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(data)
		c.Close()
		p, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		req := append(append(append([]byte{}, magic...), byte(opPing)), 9, 9, 9, 9)
		if _, err := p.Write(req); err != nil {
			t.Fatal(err)
		}
		_ = p.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [4]byte
		if _, err := io.ReadFull(p, b[:]); err != nil || !bytes.Equal(b[:], []byte{9, 9, 9, 9}) {
			t.Fatalf("PING: %x, %v", b, err)
		}
	})
}

// runPy runs script with args under py and decodes its last stdout line into v.
func runPy(t *testing.T, py, script string, v any, args ...string) {
	t.Helper()
	runPyEnv(t, py, script, v, nil, args...)
}

func runPyEnv(t *testing.T, py, script string, v any, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{"-c", script}, args...)...)
	cmd.Env = append(cmd.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("%s: %v\n%s", py, err, stderr.String())
		return
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Errorf("%s output %q: %v\n%s", py, out, err, stderr.String())
	}
}

// TestGetAndSet: a key Set by the server's owner is what Get reads over the wire; a
// missing key reads empty; a closed store is an error naming its address.
func TestGetAndSet(t *testing.T) {
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if v, err := Get(ctx, s.Addr().String(), "gangrun/k"); err != nil || len(v) != 0 {
		t.Fatalf("missing key: %q, %v", v, err)
	}
	s.Set("gangrun/k", []byte("3"))
	if v, err := Get(ctx, s.Addr().String(), "gangrun/k"); err != nil || string(v) != "3" {
		t.Fatalf("Get: %q, %v; want 3", v, err)
	}
	addr := s.Addr().String()
	s.Close()
	if _, err := Get(ctx, addr, "gangrun/k"); err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("closed store: %v, want an error naming %s", err, addr)
	}
}
