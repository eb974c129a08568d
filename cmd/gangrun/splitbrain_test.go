package main

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
)

// write is one line a split-brain test's worker appended to the shared file: when, from
// which node, in which attempt.
type write struct {
	at      float64 // seconds since the epoch
	node    string
	attempt int
}

// splitBrainWorker appends "TIME NODE ATTEMPT" to DIR/writes every 0.5 s until stopped:
// the stand-in for a trainer writing into a shared checkpoint directory.
func splitBrainWorker(dir string) []string {
	return []string{"/bin/sh", "-c", `while :; do echo "$(date +%s.%N) $GANGRUN_NODE_NAME $GANGRUN_ATTEMPT" >> ` +
		dir + `/writes; sleep 0.5; done`}
}

func readWrites(t *testing.T, dir string) []write {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "writes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []write
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		at, err1 := strconv.ParseFloat(f[0], 64)
		attempt, err2 := strconv.Atoi(f[2])
		if err1 == nil && err2 == nil {
			out = append(out, write{at: at, node: f[1], attempt: attempt})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// bothWriting returns the attempt in which both nodes have written, or -1.
func bothWriting(ws []write) int {
	seen := map[int]map[string]bool{}
	for _, w := range ws {
		if seen[w.attempt] == nil {
			seen[w.attempt] = map[string]bool{}
		}
		seen[w.attempt][w.node] = true
		if len(seen[w.attempt]) == 2 {
			return w.attempt
		}
	}
	return -1
}

// TestNoSplitBrain: node-b of a two-node elastic job (--nnodes 1:2) is cut off from the
// gang while its workers run: its gangrun frozen (SIGSTOP), or its link to Consul
// dropping every packet (a proxy that stops forwarding). Node-a re-forms alone once
// node-b's session expires. At no moment may node-b's old workers write into the
// shared directory while node-a's new gang does: node-b's lease ends (6 s without a
// renewal) before Consul can expire its session (10 s at the earliest, 20 s in
// practice), and its workers are dead by the lease's kill time (8 s) — stopped by
// gangrun itself when it is cut off, by its guardian when it is frozen. Then node-b
// rejoins and the gang is two nodes again.
func TestNoSplitBrain(t *testing.T) {
	for _, how := range []string{"freeze", "partition"} {
		t.Run(how, func(t *testing.T) {
			agent := consultest.Start(t)
			mark := testMark(t)
			dir := t.TempDir()
			addr := map[string]string{"node-a": agent.Addr, "node-b": agent.Addr}
			var proxy *consultest.Proxy
			if how == "partition" {
				proxy = consultest.NewProxy(t, agent.Addr)
				addr["node-b"] = proxy.Addr
			}
			nodes := map[string]*gangrunNode{}
			for _, name := range []string{"node-a", "node-b"} {
				args := append([]string{"run", "--coordinator", "consul://" + addr[name], "--job-id", "split-" + how,
					"--nnodes", "1:2", "--node-name", name, "--advertise-addr", "127.0.0.1", "--nproc-per-node", "1",
					"--restart-backoff", "0s", "--max-restarts", "10", "--term-timeout", "30s", "--checkpoint-dir", dir, "--"},
					splitBrainWorker(dir)...)
				nodes[name] = startNode(t, name, []string{mark}, args...)
			}
			var round int
			waitUntilFor(t, 60*time.Second, func() bool {
				round = bothWriting(readWrites(t, dir))
				return round >= 0
			}, "both nodes' workers to write in one attempt")

			b := nodes["node-b"]
			cutAt := time.Now()
			if how == "freeze" {
				if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			} else {
				proxy.Cut()
			}
			// Node-a re-forms alone when node-b's session expires (at most 2×TTL = 20 s
			// after its last renewal, plus the 3 s last call).
			var reformed float64
			waitUntilFor(t, 90*time.Second, func() bool {
				for _, w := range readWrites(t, dir) {
					if w.node == "node-a" && w.attempt > round {
						reformed = w.at
						return true
					}
				}
				return false
			}, "node-a to re-form without node-b")
			time.Sleep(2 * time.Second) // the new gang runs a while before node-b is back
			if how == "freeze" {
				if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			} else {
				proxy.Heal()
			}
			healed := time.Now()
			// Node-b rejoins: both write in a later attempt.
			waitUntilFor(t, 90*time.Second, func() bool {
				for _, w := range readWrites(t, dir) {
					if w.node == "node-b" && w.at > float64(healed.UnixNano())/1e9 && w.attempt > round {
						return true
					}
				}
				return false
			}, "node-b to rejoin the gang")
			for _, n := range nodes {
				_ = n.cmd.Process.Signal(syscall.SIGTERM)
			}
			for _, n := range nodes {
				n.wait(t, 60*time.Second)
			}

			var lastOld float64
			for _, w := range readWrites(t, dir) {
				if w.node == "node-b" && w.attempt == round {
					lastOld = max(lastOld, w.at)
				}
			}
			cut := float64(cutAt.UnixNano()) / 1e9
			overlap := lastOld - reformed
			t.Logf("%s: node-b's old workers wrote last %.1f s after the cut; node-a's new gang wrote first %.1f s after it; overlap %.1f s",
				how, lastOld-cut, reformed-cut, max(overlap, 0))
			if overlap > 0 {
				t.Errorf("split brain: node-b's workers of attempt %d wrote %.1f s after node-a's new gang started\n%s\n%s",
					round, overlap, nodes["node-a"].output(), b.output())
			}
			want := map[string]string{
				"freeze":    "the supervisor's lease with the coordinator ran out",
				"partition": "this node lost its lease with the coordinator",
			}[how]
			if !strings.Contains(b.stderr.String(), want) {
				t.Errorf("node-b does not say %q:\n%s", want, b.output())
			}
		})
	}
}
