package job

import (
	"context"
	"os/user"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/reason"
	"github.com/gangrun/gangrun/topology"
)

// preemptions is an event sink that keeps the controller's JobPreempted events.
type preemptions struct {
	mu sync.Mutex
	ev []event.Event
}

func (p *preemptions) Emit(e event.Event) {
	if e.Kind == event.JobPreempted {
		p.mu.Lock()
		p.ev = append(p.ev, e)
		p.mu.Unlock()
	}
}

func (p *preemptions) all() []event.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]event.Event{}, p.ev...)
}

// TestControllerPreemptsOnlyWhatThePolicyAllows: on one 8-GPU node (a real Consul, an
// in-process agent with the job controller, real steps whose workers are `sleep`), the
// node is full with a job of partition keep (tier 0, preempt_mode off), one of mid
// (tier 5), an old one of low (tier 1, running longer than exempt_time) and a young one
// of low. A job of mid arrives: of the four, only the old low job may be pre-empted —
// keep's tier is lower but its partition is exempt, the young one is within
// exempt_time (and would otherwise go first: the youngest of a tier), mid's own tier is
// not lower. The old one is pre-empted, alone and once; the mid job runs on its GPUs;
// the old one, requeued, is queued again with its restart budget untouched.
func TestControllerPreemptsOnlyWhatThePolicyAllows(t *testing.T) {
	const exempt = 20 * time.Second
	agent := consultest.Start(t)
	s, err := store.NewConsul(agent.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	invPath, err := filepath.Abs(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := topology.LoadFile(invPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir) // the steps change this process's directory to the jobs': restored after
	const node = "gpu-a"
	inv.Node = node
	sink := &preemptions{}
	a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: node, Addr: "127.0.0.1", Inventory: inv, Labels: map[string]string{"pool": "x"},
		Leader: []func(context.Context, store.Store, string) error{Control(nil, sink, 0, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	spawn := func(id string) error {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss, err := store.NewConsul(agent.Addr) // a step has a Consul client of its own
			if err != nil {
				t.Error(err)
				return
			}
			defer ss.Close()
			RunStep(ctx, StepConfig{Store: ss, ConsulAddr: agent.Addr, Job: id, Node: node, Inventory: inv})
		}()
		return nil
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = a.Run(ctx) }()
	go func() { defer wg.Done(); _ = RunLauncher(ctx, LauncherConfig{Store: s, Node: node, Spawn: spawn}) }()
	var ids []string
	defer func() {
		for _, id := range ids {
			_, _ = Cancel(context.Background(), s, id)
		}
		for _, id := range ids {
			waitJob(t, s, id, "final", func(j *Job) bool { return j.State.Status.Final() })
		}
		cancel()
		wg.Wait()
	}()
	waitClusterUp(t, s, 1)
	pol, err := policy.Parse([]byte(`{"preemption": {"type": "partition_prio", "exempt_time": "` + exempt.String() + `", "grace_time": "2s"},
		"partitions": {"keep": {"nodes": {"pool": "x"}, "preempt_mode": "off"}, "low": {"nodes": {"pool": "x"}, "tier": 1},
		"mid": {"nodes": {"pool": "x"}, "tier": 5}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := policy.Save(ctx, s, pol); err != nil {
		t.Fatal(err)
	}
	me, err := user.Current() // the steps run their workers as the job's user
	if err != nil {
		t.Fatal(err)
	}
	submit := func(partition string) string {
		t.Helper()
		id, err := Submit(ctx, s, Spec{Name: partition, User: me.Username, Partition: partition, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 2,
			Command: []string{"sleep", "300"}, WorkDir: dir, TermTimeout: 5 * time.Second, Supervision: launcher.Supervision{MaxRestarts: 0}})
		if err != nil {
			t.Fatalf("submit to %s: %v", partition, err)
		}
		ids = append(ids, id)
		return id
	}
	running := func(j *Job) bool { return j.State.Status == Running }
	keep, midRun, old := submit("keep"), submit("mid"), submit("low")
	for _, id := range []string{keep, midRun, old} {
		waitJob(t, s, id, "RUNNING", running)
	}
	oldJob := waitJob(t, s, old, "running past exempt_time", func(j *Job) bool { return time.Since(j.State.PlacedAt) > exempt })
	young := submit("low")
	youngJob := waitJob(t, s, young, "RUNNING", running)
	mid := submit("mid")

	oldJob = waitJob(t, s, old, "pre-empted", func(j *Job) bool { return len(j.State.Preemptions) > 0 })
	p := oldJob.State.Preemptions[0]
	if p.By != mid || p.Partition != "mid" || p.Grace != 2*time.Second || p.SignalName() != "TERM" {
		t.Errorf("the old low job's pre-emption: %+v, want by %s (mid), SIGTERM, grace 2s", p, mid)
	}
	if age := p.At.Sub(youngJob.State.PlacedAt); age >= exempt {
		t.Fatalf("the young job was %s old at the pre-emption, past exempt_time %s: the machine is too slow for this test's premise", age, exempt)
	}
	waitJob(t, s, mid, "RUNNING", running)
	for _, id := range []string{keep, midRun, young} {
		if j, err := Read(ctx, s, id); err != nil || j.State.Status != Running || len(j.State.Preemptions) > 0 {
			t.Errorf("job %s: %+v %v, want RUNNING and never pre-empted", id, j.State, err)
		}
	}
	oldJob = waitJob(t, s, old, "queued again", func(j *Job) bool { return j.State.Status == Pending && j.State.PreemptedBy == "" })
	c, err := allocator.Snapshot(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Requests[old]; !ok {
		t.Errorf("the old low job's request is not queued again")
	}
	if pr := oldJob.State.Preemptions[0]; pr.Requeued.Before(pr.At) || oldJob.State.Restarts != 0 || oldJob.State.Reason != string(reason.Priority) {
		t.Errorf("the requeued job: requeued %s (pre-empted %s), restarts %d, reason %q; want requeued after, 0 restarts, %s",
			pr.Requeued, pr.At, oldJob.State.Restarts, oldJob.State.Reason, string(reason.Priority))
	}
	if ev := sink.all(); len(ev) != 1 || ev[0].Job != old || ev[0].Cause != mid || ev[0].Partition != "low" {
		t.Errorf("JobPreempted events: %+v, want one: job %s (low) by %s", ev, old, mid)
	}
}

// waitJob polls job id until ok holds (3 minutes at most) and returns it.
func waitJob(t *testing.T, s store.Store, id, what string, ok func(j *Job) bool) *Job {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		j, err := Read(context.Background(), s, id)
		if err == nil && ok(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not %s within 3 minutes: %+v %v", id, what, j, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
