package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/topology"
)

func waitFor(t *testing.T, within time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGPUWasteMarksAnIdleJob: on a real Consul, a node agent in this process (its GPUs
// go-nvml's DGX H100 mock) elected scheduler runs a submitted 2-GPU job; while its GPUs
// stay under the threshold for --waste-after the job is marked idle on the node (the
// queue's IDLE, the scheduler's gangrun_job_idle_gpus); once one of them works the mark
// goes. The scheduler's metrics count the grant, the start and the pass.
func TestGPUWasteMarksAnIdleJob(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := consultest.ConsulStore(t, consultest.Start(t))
	m := newMockNode(t, dgxh100.New(), "gpu-w")
	for i := range m.util {
		m.util[i].Store(1) // all but idle
	}
	view := NewView(s, 10*time.Millisecond)
	gpus := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-w", Inventory: func() *topology.Inventory { return m.inv },
		Holders: func(ctx context.Context) (map[int]JobLabels, error) { return view.Holders(ctx, "gpu-w") }, CacheTTL: 10 * time.Millisecond})
	sched := NewSchedulerCollector(s, view)
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: "gpu-w", Addr: "127.0.0.1", Inventory: m.inv, Events: sched,
		Leader: []func(context.Context, store.Store, string) error{job.Control(nil, sched, job.DefaultMinJobAge, nil), sched.Lead}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 20*time.Second, func() bool { return a.Session() != "" }, "the agent registered")

	id, err := job.Submit(ctx, s, job.Spec{Name: "forgotten", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 2,
		Command: []string{"sleep", "600"}, WorkDir: "/", Supervision: launcher.Supervision{MaxRestarts: 1}, Submitted: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		j, err := job.Read(ctx, s, id)
		return err == nil && j.State.Status == job.Running
	}, "the job running")

	go func() {
		_ = WatchWaste(ctx, WasteConfig{Store: s, Node: "gpu-w", Session: a.Session, GPUs: gpus, View: view, Threshold: 5, After: time.Second})
	}()
	var held []int
	waitFor(t, 15*time.Second, func() bool {
		j, err := job.Read(ctx, s, id)
		if err != nil || len(j.Idle) != 1 {
			return false
		}
		held = j.Idle[0].GPUs
		n, _ := j.IdleGPUs()
		return n == 2
	}, "the job marked idle on gpu-w")
	q, err := job.Queue(ctx, s, false)
	if err != nil || len(q) != 1 || q[0].IdleGPUs != 2 || q[0].IdleSince == "" {
		t.Fatalf("queue: %+v %v; want the job with 2 idle GPUs", q, err)
	}
	fams := gather(t, sched)
	if v, _ := series(t, fams, "gangrun_job_idle_gpus", map[string]string{"hpc_job": id, "hpc_user": "alice", "hpc_job_name": "forgotten"}); v != 2 {
		t.Errorf("gangrun_job_idle_gpus: %v, want 2", v)
	}
	for name, want := range map[string]float64{"gangrun_scheduler_leader": 1, "gangrun_grants_total": 1} {
		if v, _ := series(t, fams, name, nil); v != want {
			t.Errorf("%s: %v, want %v", name, v, want)
		}
	}
	if v, _ := series(t, fams, "gangrun_jobs", map[string]string{"state": "RUNNING"}); v != 1 {
		t.Errorf("gangrun_jobs{RUNNING}: %v, want 1", v)
	}
	if n := fams["gangrun_job_wait_time_seconds"]; len(n) != 1 || n[0].GetHistogram().GetSampleCount() != 1 {
		t.Errorf("gangrun_job_wait_time_seconds: %v, want one job's wait", n)
	}

	m.util[held[1]].Store(80) // one of its GPUs works
	waitFor(t, 15*time.Second, func() bool {
		j, err := job.Read(ctx, s, id)
		return err == nil && len(j.Idle) == 0
	}, "the idle mark gone once a GPU works")
	if _, err := job.Cancel(ctx, s, id); err != nil {
		t.Fatal(err)
	}
}
