package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// BenchmarkRendezvous measures one rendezvous round on a real Consul dev agent: N-1
// simulated nodes (one session each) have joined, then the last node joins; the time is
// from that last join to every node holding its assignment. It reports the median over
// b.N rounds (each a fresh job) as ms/round.
//
//	go test ./rendezvous -run '^$' -bench BenchmarkRendezvous -benchtime 5x
func BenchmarkRendezvous(b *testing.B) {
	agent := consultest.Start(b)
	s, err := store.NewConsul(agent.Addr)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{8, 16, 256, 1024} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			var times []time.Duration
			for i := 0; i < b.N; i++ {
				times = append(times, oneRound(b, s, fmt.Sprintf("bench-%d-%d-%d", n, b.N, i), n))
			}
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/round")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkRendezvousC10d is BenchmarkRendezvous on the c10d endpoint gangrun serves
// without Consul (c10d://HOST:PORT): the job's store served over loopback HTTP
// (store.ServeRemote of a Memory), every simulated node a client of it through its
// own store.Remote, as the nodes of a job other than the serving one are.
//
//	go test ./rendezvous -run '^$' -bench BenchmarkRendezvousC10d -benchtime 5x
func BenchmarkRendezvousC10d(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := store.ServeRemote(ln, store.NewMemory())
	defer srv.Close()
	for _, n := range []int{8, 16, 256} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			var times []time.Duration
			for i := 0; i < b.N; i++ {
				times = append(times, oneRoundOn(b, func() store.Store { return store.NewRemote(ln.Addr().String()) },
					store.NewRemote(ln.Addr().String()), fmt.Sprintf("bench-%d-%d-%d", n, b.N, i), n))
			}
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/round")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func oneRound(b *testing.B, s store.Store, job string, n int) time.Duration {
	return oneRoundOn(b, func() store.Store { return s }, s, job, n)
}

// oneRoundOn is oneRound with each node's store from storeOf (one per node) and the
// watcher's from s.
func oneRoundOn(b *testing.B, storeOf func() store.Store, s store.Store, job string, n int) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nodes := make([]*Dynamic, n)
	for i := range nodes {
		c, err := NewDynamic(storeOf(), DynamicConfig{JobID: job, MinNodes: n, MaxNodes: n, MaxRestarts: 0, Host: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
	}
	defer func() {
		for _, c := range nodes {
			_ = c.Close(context.Background())
		}
	}()
	var wg sync.WaitGroup
	var last time.Time
	var done []time.Time
	var mu sync.Mutex
	join := func(i int) {
		defer wg.Done()
		_, err := nodes[i].Join(ctx, JoinRequest{Node: fmt.Sprintf("n%04d", i), Addr: fmt.Sprintf("10.%d.%d.1", i/250, i%250), LocalWorldSize: 8})
		if err != nil {
			b.Error(err)
			return
		}
		mu.Lock()
		done = append(done, time.Now())
		mu.Unlock()
	}
	for i := 0; i < n-1; i++ {
		wg.Add(1)
		go join(i)
	}
	// Wait until the first n-1 have joined round 0.
	for {
		entries, _, err := s.List(ctx, "gangrun/jobs/"+job+"/members/")
		if err != nil {
			b.Fatal(err)
		}
		joined := 0
		for _, e := range entries {
			var m memberRecord
			if json.Unmarshal(e.Value, &m) == nil && m.Round == 0 {
				joined++
			}
		}
		if joined == n-1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StartTimer()
	last = time.Now()
	wg.Add(1)
	go join(n - 1)
	wg.Wait()
	b.StopTimer()
	if len(done) != n {
		b.Fatalf("%d of %d nodes got a round", len(done), n)
	}
	var end time.Time
	for _, t := range done {
		if t.After(end) {
			end = t
		}
	}
	return end.Sub(last)
}
