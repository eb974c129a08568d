// Package metrics is what a gangrun agent exports to Prometheus: its node's GPUs under
// dcgm-exporter's metric names and labels (read through NVML when a scrape comes, with
// a short cache), plus the job holding each GPU; its node's state and GPU counts; and,
// on the agent elected scheduler, the queue's and the scheduler's metrics in Kueue's
// style (gangrun_pending_jobs, gangrun_job_wait_time_seconds, ...); and, for each
// running job whose node rank 0 is on its node, the job's supervision (restarts by
// cause, checkpoint age, effective training time ratio). Each group is a
// prometheus.Collector; Handler serves them all on /metrics. docs/metrics.md lists
// every metric.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultPort is the port docs/metrics.md suggests for --metrics-addr (and the status
// page's --http-addr): 9410, next to dcgm-exporter's 9400 and node_exporter's 9100,
// and free in Prometheus' default port allocations list.
const DefaultPort = 9410

// DefaultCacheTTL is how long a scrape's readings (NVML, Consul) serve the next
// scrapes: a storm of scrapes costs the driver and Consul one read per second.
const DefaultCacheTTL = time.Second

// scrapeTimeout bounds the Consul reads of one scrape: a scrape answers with what it
// has rather than hang while Consul is unreachable.
const scrapeTimeout = 5 * time.Second

// JobLabels names the job holding a GPU: its id, user and name. An allocation of
// `gangrun alloc` has its grant id only, and IsJob false.
type JobLabels struct {
	ID, User, Name string
	IsJob          bool
}

// The labels on the GPU metrics: dcgm-exporter's (gpu, UUID, pci_bus_id, device,
// modelName, Hostname, and DCGM_FI_DRIVER_VERSION, the label its default counters make
// of the driver's version) and the job's. hpc_job is dcgm-exporter's own label for the
// HPC job holding a GPU (its job-mapping transform); hpc_user and hpc_job_name follow
// it. Hostname is spelled as dcgm-exporter's newest release, 4.5.3-4.8.2, spells it
// (internal/pkg/rendermetrics); its main branch renames it hostname after that release
// (#655).
func gpuLabelNames() []string {
	return []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "hpc_job", "hpc_user", "hpc_job_name"}
}

// Indexes into gpuLabelNames.
const (
	labelGPU      = 0
	labelUUID     = 1
	labelHostname = 5
)

// Handler serves the collectors on /metrics in Prometheus' exposition format (and
// OpenMetrics when asked), with the Go runtime's and the process' own metrics.
func Handler(cs ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range cs {
		reg.MustRegister(c)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}
