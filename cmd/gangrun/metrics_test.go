package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gangrun/gangrun/internal/promtest"
	"github.com/gangrun/gangrun/internal/testport"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/metrics"
	"github.com/gangrun/gangrun/topology"
)

// freePort returns a loopback port nothing listens on now, claimed for this test
// process (testport).
func freePort(t *testing.T) int {
	t.Helper()
	return testport.Get(t)
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
	p := promtest.Start(t, "127.0.0.1:"+strconv.Itoa(ports["gpu-a"]), "127.0.0.1:"+strconv.Itoa(ports["gpu-b"]), mock)

	id := c.submit("--nodes", "1", "--gpus-per-node", "4", "--name", "idle-sleeper", "--", "sleep", "300")
	t.Cleanup(func() { stopJob(c, id) })
	c.waitState(id, job.Running, 60*time.Second)
	pend := c.submit("--nodes", "2", "--gpus-per-node", "8", "--name", "too-big", "--", "true")
	t.Cleanup(func() { stopJob(c, pend) })

	// Two scrapes of every target, each up.
	waitUntilFor(t, 60*time.Second, func() bool {
		v, ok := p.Value(`count(count_over_time(up{job="gangrun"}[1m]) >= 2 and up{job="gangrun"} == 1)`)
		return ok && v == 3
	}, "three targets up, each scraped twice")

	p.WaitValue(`DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-mock",gpu="3",modelName=~".*H100.*"}`, 30, 20*time.Second)
	p.WaitValue(`DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-mock",gpu="7"}`, 47, 20*time.Second)
	p.WaitValue(`count(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-mock"})`, 8, 20*time.Second)
	p.WaitValue(`count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-a|gpu-b"}) or vector(0)`, 0, 20*time.Second) // recorded: no readings made up
	for _, n := range []string{"gpu-a", "gpu-b"} {
		p.WaitValue(`gangrun_node_gpus_total{node="`+n+`"}`, 8, 20*time.Second)
		p.WaitValue(`gangrun_node_state{node="`+n+`",state="up"}`, 1, 20*time.Second)
	}
	p.WaitValue(`sum(gangrun_node_gpus_held)`, 4, 20*time.Second)
	p.WaitValue(`count(gangrun_gpu_info{hpc_job="`+id+`",hpc_job_name="idle-sleeper"})`, 4, 20*time.Second)
	p.WaitValue(`sum(gangrun_scheduler_leader)`, 1, 20*time.Second)
	p.WaitValue(`count(gangrun_scheduler_leader)`, 2, 20*time.Second)
	p.WaitValue(`sum(gangrun_jobs{state="RUNNING"})`, 1, 20*time.Second)
	p.WaitValue(`sum(gangrun_pending_jobs{reason="Resources"})`, 1, 20*time.Second)
	p.WaitValue(`sum(gangrun_grants_total)`, 1, 20*time.Second)
	p.WaitValue(`sum(gangrun_jobs_started_total)`, 1, 20*time.Second)
	p.WaitValue(`sum(gangrun_job_wait_time_seconds_count)`, 1, 20*time.Second)
	p.WaitValue(`sum(gangrun_scheduling_pass_duration_seconds_count) > bool 0`, 1, 20*time.Second)
	p.WaitValue(`gangrun_gpus{state="held"}`, 4, 20*time.Second)
	p.WaitValue(`gangrun_idle_nodes`, 1, 20*time.Second)
	p.WaitValue(`gangrun_nodes{state="up"}`, 2, 20*time.Second)
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

// scrape returns the exposition of the agent at addr (HOST:PORT).
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sample returns the value of the first series of the exposition whose line starts with
// name and holds every label pair of labels (`hpc_job="3"`).
func sample(exposition, name string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		series, value, ok := strings.Cut(line, "} ")
		if !ok {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(series, l)
		}
		if all {
			v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestJobSupervisionMetrics: a 2-node job (agents with --metrics-addr) whose rank 1
// exits 3 after rank 0 completed a checkpoint restarts once from it; the agent of the
// job's node rank 0, and only it, exports its restarts by cause (worker_exit 1, the
// others 0), the time from the failure to the next workers started, the age of the
// checkpoint and the effective training time ratio; promtool finds nothing to say about
// them; and `gangrun show` prints the same from the job's record.
func TestJobSupervisionMetrics(t *testing.T) {
	ports := map[string]int{"gpu-a": freePort(t), "gpu-b": freePort(t)}
	addr := func(n string) string { return "127.0.0.1:" + strconv.Itoa(ports[n]) }
	mapDirs := t.TempDir()
	c := startJobClusterWith(t, func(node string) []string {
		return []string{"--metrics-addr", addr(node), "--dcgm-job-mapping-dir", filepath.Join(mapDirs, node)}
	}, "gpu-a", "gpu-b")
	t.Chdir(t.TempDir())
	script := `if [ -z "$GANGRUN_RESUME_FROM" ]; then
  if [ "$RANK" = 0 ]; then sleep 1; mkdir -p "$GANGRUN_CHECKPOINT_DIR/step-10"; touch "$GANGRUN_CHECKPOINT_DIR/step-10/.complete"; exec sleep 60; fi
  sleep 3; exit 3
fi
exec sleep 300`
	id := c.submit("--nodes", "2", "--gpus-per-node", "1", "--name", "supervised", "--checkpoint-dir", "ckpt", "--", "/bin/sh", "-c", script)
	t.Cleanup(func() { stopJob(c, id) })
	var j *job.Job
	waitUntilFor(t, 90*time.Second, func() bool {
		s := c.show(id)
		b, _ := json.Marshal(s)
		var st struct {
			Attempts []job.Attempt `json:"attempts"`
		}
		_ = json.Unmarshal(b, &st)
		n := len(st.Attempts)
		if n < 2 || st.Attempts[n-1].WorkersStarted.IsZero() || len(st.Attempts[n-1].Nodes) == 0 {
			return false
		}
		j = &job.Job{State: job.State{Status: job.Running, Attempts: st.Attempts}}
		return true
	}, "the job restarted and its second attempt's workers started")
	rank0 := j.State.RankZeroNode()
	other := "gpu-a"
	if rank0 == "gpu-a" {
		other = "gpu-b"
	}
	jl := `hpc_job="` + id + `"`
	var exp string
	waitUntilFor(t, 30*time.Second, func() bool {
		exp = scrape(t, addr(rank0))
		_, ok := sample(exp, "gangrun_job_checkpoint_age_seconds", jl)
		return ok
	}, "the rank-0 agent exporting the job's checkpoint age")
	for cause, want := range map[string]float64{"worker_exit": 1, "signal": 0, "hang": 0, "node_lost": 0, "gpu_health": 0, "other": 0} {
		if v, ok := sample(exp, "gangrun_job_restarts_total", jl, `hpc_job_name="supervised"`, `cause="`+cause+`"`); !ok || v != want {
			t.Errorf("gangrun_job_restarts_total{cause=%s}: %v (present %v), want %v", cause, v, ok, want)
		}
	}
	if v, ok := sample(exp, "gangrun_job_failure_to_workers_started_seconds", jl); !ok || v < 0 || v > 60 {
		t.Errorf("gangrun_job_failure_to_workers_started_seconds: %v (present %v)", v, ok)
	}
	if v, ok := sample(exp, "gangrun_job_checkpoint_age_seconds", jl); !ok || v < 0 || v > 120 {
		t.Errorf("gangrun_job_checkpoint_age_seconds: %v (present %v)", v, ok)
	}
	if v, ok := sample(exp, "gangrun_job_effective_training_time_ratio", jl); !ok || v <= 0 || v > 1 {
		t.Errorf("gangrun_job_effective_training_time_ratio: %v (present %v), want in (0, 1]", v, ok)
	}
	if _, ok := sample(scrape(t, addr(other)), "gangrun_job_restarts_total", jl); ok {
		t.Errorf("the agent of %s (not node rank 0) exports the job's restarts too", other)
	}
	if promtool, err := exec.LookPath("promtool"); err != nil {
		t.Error("promtool not found: install Debian's prometheus package (scripts/install-deps.sh prometheus)")
	} else {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(exp)
		out, _ := cmd.CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "gangrun_job_") {
				t.Errorf("promtool: %s", line)
			}
		}
	}
	for _, line := range strings.Split(exp, "\n") {
		if strings.HasPrefix(line, "gangrun_job_") && strings.Contains(line, jl) {
			t.Logf("%s: %s", rank0, line)
		}
	}
	var out string
	waitUntilFor(t, 20*time.Second, func() bool {
		_, out, _ = c.gangrun("show", id)
		return strings.Contains(out, "NewestCheckpoint=")
	}, "show printing the checkpoint the rank-0 agent noted")
	for _, want := range []string{"RestartsByCause=worker_exit=1\n", " from failure to workers started", "/ckpt/step-10 at ", "ETTR=0."} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	t.Logf("show:\n%s", out)

	// dcgm-exporter's job-mapping files: one GPU of each node holds the job; none once
	// it ended.
	for _, n := range []string{"gpu-a", "gpu-b"} {
		files, _ := filepath.Glob(filepath.Join(mapDirs, n, "[0-9]*"))
		if len(files) != 1 {
			t.Errorf("%s's job-mapping dir: %v, want one GPU's file", n, files)
			continue
		}
		if b, _ := os.ReadFile(files[0]); string(b) != id+"\n" {
			t.Errorf("%s: %q, want the job's id %q", files[0], b, id+"\n")
		}
	}
	stopJob(c, id)
	waitUntilFor(t, 30*time.Second, func() bool {
		files, _ := filepath.Glob(filepath.Join(mapDirs, "*", "[0-9]*"))
		return len(files) == 0
	}, "the job-mapping files removed once the job ended")
}
