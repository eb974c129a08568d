package allocator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// registerNodes publishes n nodes with the recorded inventory directly (one session holds
// every alive key), as n agents would, without running n agents.
func registerNodes(b testing.TB, s store.Store, n int, invName string) string {
	b.Helper()
	ctx := context.Background()
	sess, err := s.CreateSession(ctx, store.SessionOptions{Name: "bench nodes", TTL: 5 * time.Minute, Behavior: store.DeleteKeys})
	if err != nil {
		b.Fatal(err)
	}
	var ops []store.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := s.Txn(ctx, ops); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("node%04d", i)
		inv := inventory(b, invName, name)
		data, err := inv.JSON()
		if err != nil {
			b.Fatal(err)
		}
		sum := sha256.Sum256(data)
		rec := NodeRecord{Name: name, GPUs: len(inv.GPUs), InventoryHash: hex.EncodeToString(sum[:8]),
			Labels:  map[string]string{LabelSwitch: fmt.Sprintf("leaf%02d", i/32), LabelSpine: fmt.Sprintf("spine%d", i/256)},
			Devices: inv.Allocatable()}
		ops = append(ops,
			store.Op{Verb: store.Set, Key: inventoryPrefix + name, Value: data},
			store.Op{Verb: store.Set, Key: nodesPrefix + name, Value: mustJSON(rec)},
			store.Op{Verb: store.Lock, Key: alivePrefix + name, Session: sess},
		)
		if len(ops) >= 15 {
			flush()
		}
	}
	flush()
	return sess
}

// BenchmarkGrant measures grant latency (submit → granted, through the elected
// scheduler) on a real Consul dev agent with 1,024 registered 8-GPU nodes, for gangs of
// 1, 64 and 512 nodes × 8 GPUs, one at a time (each released before the next). It
// reports p50 and p99 latency and grants per second.
//
//	go test ./allocator -run '^$' -bench BenchmarkGrant -benchtime 20x
func BenchmarkGrant(b *testing.B) {
	agent := consultest.Start(b)
	s, err := store.NewConsul(agent.Addr)
	if err != nil {
		b.Fatal(err)
	}
	registerNodes(b, s, 1024, "dgx-h100")
	tc := &testCluster{t: b, s: s, agents: map[string]*Agent{}, stops: map[string]context.CancelFunc{}, done: map[string]chan struct{}{}}
	tc.add("sched", "cpu-only", nil, false) // the scheduling agent (no GPUs of its own)
	tc.waitUp(1025)
	b.Cleanup(tc.stopAll)
	for _, nodes := range []int{1, 64, 512} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			ctx := context.Background()
			// One warm-up grant: the scheduler caches the inventories it places on.
			_, g := submitAndWaitB(b, s, Request{Nodes: nodes, GPUsPerNode: 8, Holder: "bench"})
			_ = g
			var lat []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				tk, err := Submit(ctx, s, Request{Nodes: nodes, GPUsPerNode: 8, Holder: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tk.Wait(ctx, nil); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				if err := tk.Release(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
			var total time.Duration
			for _, l := range lat {
				total += l
			}
			b.ReportMetric(float64(pct(0.5).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(len(lat))/total.Seconds(), "grants/s")
		})
	}
}

func submitAndWaitB(b testing.TB, s store.Store, r Request) (*Ticket, Grant) {
	tk, g := submitAndWait(b, s, r)
	if err := tk.Release(context.Background()); err != nil {
		b.Fatal(err)
	}
	return tk, g
}
