package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
)

// cpuTime is this process' user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScrape8GPUNode scrapes, over HTTP, the /metrics of an 8-GPU node as an agent
// serves it — go-nvml's DGX H100 mock for the GPUs, its node registered on a real
// Consul dev agent, a job's grant holding 4 GPUs — with the cache off (every scrape
// reads NVML and Consul afresh, as at a 15 s interval). It reports the median and p99
// of a scrape's latency and the CPU one scrape costs, and what that is at a 15 s
// scrape interval (cpu_pct_at_15s, % of one core). benchmarks/README.md, "Metrics".
func BenchmarkScrape8GPUNode(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := consultest.ConsulStore(b, consultest.Start(b))
	m := newMockNode(b, dgxh100.New(), "gpu-bench")
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: "gpu-bench", Addr: "127.0.0.1", Inventory: m.inv, NoScheduler: true})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for a.Session() == "" {
		time.Sleep(10 * time.Millisecond)
	}
	const ttl = time.Nanosecond // no cache: each scrape reads afresh
	view := NewView(s, ttl)
	gpus := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-bench", Inventory: a.Inventory, CacheTTL: ttl,
		Holders: func(ctx context.Context) (map[int]JobLabels, error) { return view.Holders(ctx, "gpu-bench") }})
	srv := httptest.NewServer(Handler(gpus, NewNodeCollector(view, "gpu-bench"), NewSchedulerCollector(s, view)))
	defer srv.Close()
	scrape := func() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	scrape() // warm the connection
	lat := make([]time.Duration, 0, b.N)
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		scrape()
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	cpu := (cpuTime() - cpu0) / time.Duration(b.N) // client and server together: an upper bound
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu_ms/scrape")
	b.ReportMetric(100*cpu.Seconds()/15, "cpu_pct_at_15s")
}
