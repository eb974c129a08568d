package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/metrics"
	"github.com/gangrun/gangrun/topology"
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// promServer is a real Prometheus server (Debian's prometheus package) the test
// started, scraping targets every second.
type promServer struct {
	t   *testing.T
	url string
}

// startPrometheus starts Prometheus scraping targets (HOST:PORT, /metrics) every
// second, with its data in a test directory; it fails the test when Debian's
// prometheus is not installed (scripts/install-deps.sh prometheus).
func startPrometheus(t *testing.T, targets ...string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: install Debian's prometheus package (scripts/install-deps.sh prometheus)")
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: gangrun
    static_configs:
      - targets: [%s]
`, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	p := &promServer{t: t, url: "http://" + addr}
	waitUntilFor(t, 60*time.Second, func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "prometheus ready")
	return p
}

// promSample is one series of an instant query's answer.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant PromQL query through Prometheus' HTTP API.
func (p *promServer) query(q string) []promSample {
	p.t.Helper()
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		p.t.Fatalf("query %s: %v", q, err)
	}
	if body.Status != "success" {
		p.t.Fatalf("query %s: %s", q, body.Error)
	}
	return body.Data.Result
}

// value returns the single series' value of q, or false when q has no single answer.
func (p *promServer) value(q string) (float64, bool) {
	r := p.query(q)
	if len(r) != 1 {
		return 0, false
	}
	s, _ := r[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// waitValue waits until q answers want.
func (p *promServer) waitValue(q string, want float64, within time.Duration) {
	p.t.Helper()
	var got float64
	var ok bool
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if got, ok = p.value(q); ok && got == want {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	p.t.Errorf("prometheus: %s = %v (answered %v), want %v; all: %+v", q, got, ok, want, p.query(q))
}

// mockGPUEndpoint serves, in this process, a node's GPU metrics read from go-nvml's
// DGX H100 mock: GPU i 10·i % busy. (NVML cannot be mocked inside an agent process;
// the agents run on recorded inventories.)
func mockGPUEndpoint(t *testing.T, node string) string {
	t.Helper()
	srv := dgxh100.New()
	inv := &topology.Inventory{SchemaVersion: topology.SchemaVersion, Node: node}
	for i, dv := range srv.Devices {
		d := dv.(*server.Device)
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: uint32(10 * i)}, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(40 + i), nvml.SUCCESS }
		name, _ := d.GetName()
		inv.GPUs = append(inv.GPUs, topology.GPU{Index: i, UUID: d.UUID, Name: name, PCIBusID: strings.ToLower(d.PciBusID), Minor: i})
	}
	gpus := metrics.NewGPUCollector(metrics.GPUConfig{NVML: srv, Node: node, Inventory: func() *topology.Inventory { return inv }})
	hs := httptest.NewServer(metrics.Handler(gpus))
	t.Cleanup(hs.Close)
	return strings.TrimPrefix(hs.URL, "http://")
}

// TestMetricsScrapedByPrometheus: a real Prometheus server scrapes two agents
// (--metrics-addr, recorded DGX H100 inventories) and a node whose GPUs NVML reads (the
// mock); after two scrapes of each, its HTTP API answers the GPU metrics in
// dcgm-exporter's names with the values NVML gave, each node's state and GPU counts,
// the GPUs of a running job labelled with it, and the queue's metrics from the elected
// agent only.
func TestMetricsScrapedByPrometheus(t *testing.T) {
	ports := map[string]int{"gpu-a": freePort(t), "gpu-b": freePort(t)}
	c := startJobClusterWith(t, func(node string) []string {
		return []string{"--metrics-addr", "127.0.0.1:" + strconv.Itoa(ports[node])}
	}, "gpu-a", "gpu-b")
	mock := mockGPUEndpoint(t, "gpu-mock")
	p := startPrometheus(t, "127.0.0.1:"+strconv.Itoa(ports["gpu-a"]), "127.0.0.1:"+strconv.Itoa(ports["gpu-b"]), mock)

	id := c.submit("--nodes", "1", "--gpus-per-node", "4", "--name", "idle-sleeper", "--", "sleep", "300")
	t.Cleanup(func() { stopJob(c, id) })
	c.waitState(id, job.Running, 60*time.Second)
	pend := c.submit("--nodes", "2", "--gpus-per-node", "8", "--name", "too-big", "--", "true")
	t.Cleanup(func() { stopJob(c, pend) })

	// Two scrapes of every target, each up.
	waitUntilFor(t, 60*time.Second, func() bool {
		v, ok := p.value(`count(count_over_time(up{job="gangrun"}[1m]) >= 2 and up{job="gangrun"} == 1)`)
		return ok && v == 3
	}, "three targets up, each scraped twice")

	p.waitValue(`DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-mock",gpu="3",modelName=~".*H100.*"}`, 30, 20*time.Second)
	p.waitValue(`DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-mock",gpu="7"}`, 47, 20*time.Second)
	p.waitValue(`count(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-mock"})`, 8, 20*time.Second)
	p.waitValue(`count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-a|gpu-b"}) or vector(0)`, 0, 20*time.Second) // recorded: no readings made up
	for _, n := range []string{"gpu-a", "gpu-b"} {
		p.waitValue(`gangrun_node_gpus_total{node="`+n+`"}`, 8, 20*time.Second)
		p.waitValue(`gangrun_node_state{node="`+n+`",state="up"}`, 1, 20*time.Second)
	}
	p.waitValue(`sum(gangrun_node_gpus_held)`, 4, 20*time.Second)
	p.waitValue(`count(gangrun_gpu_info{hpc_job="`+id+`",hpc_job_name="idle-sleeper"})`, 4, 20*time.Second)
	p.waitValue(`sum(gangrun_scheduler_leader)`, 1, 20*time.Second)
	p.waitValue(`count(gangrun_scheduler_leader)`, 2, 20*time.Second)
	p.waitValue(`sum(gangrun_jobs{state="RUNNING"})`, 1, 20*time.Second)
	p.waitValue(`sum(gangrun_pending_jobs{reason="Resources"})`, 1, 20*time.Second)
	p.waitValue(`sum(gangrun_grants_total)`, 1, 20*time.Second)
	p.waitValue(`sum(gangrun_jobs_started_total)`, 1, 20*time.Second)
	p.waitValue(`sum(gangrun_job_wait_time_seconds_count)`, 1, 20*time.Second)
	p.waitValue(`sum(gangrun_scheduling_pass_duration_seconds_count) > bool 0`, 1, 20*time.Second)
	p.waitValue(`gangrun_gpus{state="held"}`, 4, 20*time.Second)
	p.waitValue(`gangrun_idle_nodes`, 1, 20*time.Second)
	p.waitValue(`gangrun_nodes{state="up"}`, 2, 20*time.Second)
}

// stopJob cancels job id and waits for it to end (its steps outlive the agents).
func stopJob(c *jobCluster, id string) {
	c.t.Helper()
	c.gangrun("cancel", id)
	c.waitState(id, job.Cancelled, 60*time.Second)
}

// TestAgentMetricsAddrErrors: a --metrics-addr that is not HOST:PORT, or a bad
// --waste-threshold, is a one-line usage error naming the value (exit 2).
func TestAgentMetricsAddrErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--metrics-addr", "9410"}, `--metrics-addr "9410": want HOST:PORT`},
		{[]string{"--metrics-addr", "localhost:http-alt"}, `--metrics-addr "localhost:http-alt": port "http-alt" is not a number`},
		{[]string{"--metrics-addr", "127.0.0.1:70000"}, `port "70000" is not a number from 0 to 65535`},
		{[]string{"--waste-threshold", "0"}, `--waste-threshold 0: want a utilisation`},
		{[]string{"--waste-after", "10ms"}, `--waste-after`},
	} {
		code, _, errOut := inProcess(append([]string{"agent", "--consul", "127.0.0.1:1"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("agent %v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestQueueAndShowTellGPUWaste: a running job its nodes marked idle shows its idle GPUs
// and for how long in queue's IDLE column, and one GPUWaste line per node in show.
func TestQueueAndShowTellGPUWaste(t *testing.T) {
	since := time.Now().Add(-12 * time.Minute).UTC()
	j := &job.Job{Spec: job.Spec{ID: "42", Name: "forgotten", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 2, Command: []string{"sleep"}},
		State: job.State{Status: job.Running, Nodes: []string{"gpu-a"}, Started: since},
		Idle:  []job.IdleMark{{Node: "gpu-a", GPUs: []int{0, 1}, Since: since, MaxUtil: 1, Threshold: 5}}}
	var out strings.Builder
	e := &env{stdout: &out, stderr: &out}
	printJobs(e, []job.Entry{job.EntryOf(*j, "", time.Now())})
	if !strings.Contains(out.String(), "IDLE") || !strings.Contains(out.String(), "2 gpus 12:0") {
		t.Errorf("queue:\n%s", out.String())
	}
	out.Reset()
	showJob(e, j, false)
	if !strings.Contains(out.String(), "GPUWaste=node gpu-a GPUs 0,1 under 5% utilisation since") {
		t.Errorf("show:\n%s", out.String())
	}
	j.State.Status = job.Completed // marks count while the job runs only
	out.Reset()
	printJobs(e, []job.Entry{job.EntryOf(*j, "", time.Now())})
	if strings.Contains(out.String(), "gpus 12") {
		t.Errorf("an ended job shown idle:\n%s", out.String())
	}
}
