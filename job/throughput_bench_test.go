package job

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// Settings of BenchmarkJobThroughput; the job count and the time limit can be changed
// with GANGRUN_BENCH_JOBS and GANGRUN_BENCH_TIMEOUT (a Go duration).
const (
	throughputNodes   = 64
	throughputJobs    = 1000
	throughputTimeout = 10 * time.Minute
	// throughputLeaderKey is the scheduler's election key (allocator's schedulerKey):
	// the benchmark waits until an agent holds it.
	throughputLeaderKey = "gangrun/scheduler/leader"
)

// BenchmarkJobThroughput measures how fast a deep queue of one-GPU jobs of `true` is
// started on 64 simulated 8-GPU nodes (the recorded DGX H100 inventory, 512 GPUs): a
// real Consul dev agent, 64 in-process node agents (allocator.Agent, each in the
// scheduler election with the job controller as its leader's task, and a job launcher,
// RunLauncher), 1,000 jobs submitted with Submit by GANGRUN_BENCH_CLIENTS clients at once (default 1:
// one after the other) while the
// scheduler runs. Each iteration starts everything afresh (not timed) and times from
// the first submit to the last job's step being started.
//
// Each sub-benchmark runs twice: auth=none as agents run with --auth none (no
// credential made or checked), and auth=munge with a real munged of its own, every job
// submitted with SubmitSealed and accepted by the controller (auth.go), every step
// checking its attestation: the cost of proving who submits.
//
// Two sub-benchmarks:
//
//   - steps: the launcher's Spawn runs RunStep in a goroutine, the whole step as
//     `gangrun __step` runs it (its session, the GPU hand-over, the job's rendezvous on
//     Consul, a real `true` worker process, its end recorded, the GPUs given back), in
//     this process instead of a process of its own (no Go start-up, no guardian);
//   - control-plane: Spawn only records the start, and a goroutine ends the job's step
//     at once as a step whose workers exited 0 would (COMPLETING, end COMPLETED, the
//     node's step ended), with no session, hand-over, rendezvous or process.
//
// Reported: jobs-started/s (jobs / time from the first submit until the last job's step
// was spawned), submits/s, the grant latency (submit called → the scheduler's commit of
// the job's grant, seen by the scheduler's event sink) and the running latency (submit
// called → the controller's RUNNING, State.Started) as p50/p99 over all jobs, the
// deepest queue (submitted, not yet granted), and how many jobs ended COMPLETED.
//
// An iteration that has not started every job GANGRUN_BENCH_TIMEOUT (default 10m) after
// its first submit stops submitting and reports what it got (a TIMEOUT line in the log);
// give go test's -timeout a few minutes more than that for each sub-benchmark.
//
//	go test ./job -run '^$' -bench JobThroughput -benchtime 1x -timeout 30m
func BenchmarkJobThroughput(b *testing.B) {
	n := throughputJobs
	if v := os.Getenv("GANGRUN_BENCH_JOBS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("GANGRUN_BENCH_JOBS=%q: want a positive number", v)
		}
	}
	clients := 1
	if v := os.Getenv("GANGRUN_BENCH_CLIENTS"); v != "" {
		var err error
		if clients, err = strconv.Atoi(v); err != nil || clients < 1 {
			b.Fatalf("GANGRUN_BENCH_CLIENTS=%q: want a positive number", v)
		}
	}
	limit := throughputTimeout
	if v := os.Getenv("GANGRUN_BENCH_TIMEOUT"); v != "" {
		var err error
		if limit, err = time.ParseDuration(v); err != nil {
			b.Fatalf("GANGRUN_BENCH_TIMEOUT=%q: %v", v, err)
		}
	}
	for _, mode := range []struct {
		name  string
		steps bool
	}{{"control-plane", false}, {"steps", true}} {
		for _, auth := range []string{"none", "munge"} {
			b.Run(fmt.Sprintf("%s/auth=%s/nodes=%d/jobs=%d/clients=%d", mode.name, auth, throughputNodes, n, clients), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					runThroughput(b, n, clients, mode.steps, auth == "munge", limit)
				}
			})
		}
	}
}

// grantTimes is the scheduler's event sink: when each grant was committed.
type grantTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (g *grantTimes) Emit(e event.Event) {
	if e.Kind != event.Granted {
		return
	}
	now := time.Now()
	g.mu.Lock()
	if _, ok := g.at[e.Job]; !ok {
		g.at[e.Job] = now
	}
	g.mu.Unlock()
}

// spawns records when each job's step was first started, and says when all were.
type spawns struct {
	mu   sync.Mutex
	at   map[string]time.Time
	want int
	all  chan struct{}
}

func (sp *spawns) note(id string) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if _, ok := sp.at[id]; ok {
		return
	}
	sp.at[id] = time.Now()
	if len(sp.at) == sp.want {
		close(sp.all)
	}
}

func (sp *spawns) count() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.at)
}

func runThroughput(b *testing.B, n, clients int, realSteps, munge bool, limit time.Duration) {
	b.StopTimer()
	agent := consultest.Start(b)
	var prover Prover
	var sealer Sealer
	if munge {
		m, err := identity.Open(mungetest.Start(b).Socket)
		if err != nil {
			b.Fatal(err)
		}
		prover, sealer = m, m
	}
	s, err := store.NewConsul(agent.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Absolute: a step changes the process's directory to the job's.
	invPath, err := filepath.Abs(filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json"))
	if err != nil {
		b.Fatal(err)
	}
	loadInv := func(node string) (*topology.Inventory, error) {
		inv, err := topology.LoadFile(invPath)
		if err != nil {
			return nil, err
		}
		inv.Node = node
		return inv, nil
	}
	dir := b.TempDir()
	grants := &grantTimes{at: map[string]time.Time{}}
	sp := &spawns{at: map[string]time.Time{}, want: n, all: make(chan struct{})}
	var agents, steps sync.WaitGroup
	for i := range throughputNodes {
		node := fmt.Sprintf("node%02d", i)
		inv, err := loadInv(node)
		if err != nil {
			b.Fatal(err)
		}
		a, err := allocator.NewAgent(s, allocator.AgentConfig{Node: node, Addr: "127.0.0.1", Inventory: inv,
			Events: grants, Leader: []func(context.Context, store.Store, string) error{Control(nil, nil, DefaultMinJobAge, prover)}})
		if err != nil {
			b.Fatal(err)
		}
		spawn := func(id string) error {
			sp.note(id)
			steps.Add(1)
			go func() {
				defer steps.Done()
				if !realSteps {
					endAsCompleted(ctx, s, id, node)
					return
				}
				// A step is a process of its own, with its own Consul client.
				ss, err := store.NewConsul(agent.Addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer ss.Close()
				inv, err := loadInv(node)
				if err != nil {
					b.Error(err)
					return
				}
				RunStep(ctx, StepConfig{Store: ss, ConsulAddr: agent.Addr, Job: id, Node: node, Inventory: inv, Prover: prover})
			}()
			return nil
		}
		agents.Add(2)
		go func() { defer agents.Done(); _ = a.Run(ctx) }()
		go func() { defer agents.Done(); _ = RunLauncher(ctx, LauncherConfig{Store: s, Node: node, Spawn: spawn}) }()
	}
	defer func() {
		cancel()
		agents.Wait()
		steps.Wait()
	}()
	waitClusterUp(b, s, throughputNodes)

	submitted := make(map[string]time.Time, n)
	var subMu sync.Mutex
	var next atomic.Int64
	b.StartTimer()
	t0 := time.Now()
	var submitters sync.WaitGroup
	for range clients {
		submitters.Add(1)
		go func() {
			defer submitters.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if time.Since(t0) > limit {
					b.Logf("TIMEOUT: only %d of %d jobs submitted within %s", i, n, limit)
					return
				}
				at := time.Now()
				id, err := SubmitSealed(ctx, s, Spec{Name: "true", User: benchUser, MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1,
					Command: []string{"true"}, WorkDir: dir}, sealer)
				if err != nil {
					b.Errorf("submit %d: %v", i, err)
					return
				}
				subMu.Lock()
				submitted[id] = at
				subMu.Unlock()
			}
		}()
	}
	submitters.Wait()
	if b.Failed() {
		return
	}
	tSubmitted := time.Now()
	timedOut := false
	select {
	case <-sp.all:
	case <-time.After(max(limit-time.Since(t0), 0)):
		timedOut = true
	}
	tStarted := time.Now()
	b.StopTimer()
	started := sp.count()
	if timedOut {
		b.Logf("TIMEOUT: %d of %d jobs started within %s", started, n, limit)
	}
	var last time.Time
	var order []time.Time // the spawns, in time order
	sp.mu.Lock()
	for _, t := range sp.at {
		order = append(order, t)
		if t.After(last) {
			last = t
		}
	}
	sp.mu.Unlock()
	slices.SortFunc(order, func(x, y time.Time) int { return x.Compare(y) })
	// How the rate changes as jobs accumulate: when the k-th step started.
	var marks []string
	for _, k := range []int{1, n / 10, n / 4, n / 2, 3 * n / 4, n} {
		if k >= 1 && k <= len(order) {
			marks = append(marks, fmt.Sprintf("#%d at %s", k, order[k-1].Sub(t0).Round(time.Millisecond)))
		}
	}
	b.Logf("steps started: %s", strings.Join(marks, ", "))
	if timedOut {
		last = tStarted
	}

	// Let the started jobs end (not timed, at most a minute), to count how they ended.
	deadline := time.Now().Add(time.Minute)
	var jobs []Job
	for {
		if jobs, err = List(ctx, s); err != nil {
			b.Fatal(err)
		}
		final := 0
		for _, j := range jobs {
			if j.State.Status.Final() {
				final++
			}
		}
		if final >= started || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	completed, failed := 0, 0
	var running, granted []time.Duration
	for _, j := range jobs {
		switch j.State.Status {
		case Completed:
			completed++
		case Failed:
			failed++
		}
		if !j.State.Started.IsZero() {
			running = append(running, j.State.Started.Sub(submitted[j.Spec.ID]))
		}
	}
	grants.mu.Lock()
	type point struct {
		at    time.Time
		delta int
	}
	var points []point
	for id, at := range submitted {
		points = append(points, point{at, +1})
		if g, ok := grants.at[id]; ok {
			granted = append(granted, g.Sub(at))
			points = append(points, point{g, -1})
		}
	}
	grants.mu.Unlock()
	sort.Slice(points, func(i, j int) bool { return points[i].at.Before(points[j].at) })
	depth, deepest := 0, 0
	for _, p := range points {
		depth += p.delta
		deepest = max(deepest, depth)
	}
	elapsed := last.Sub(t0)
	b.ReportMetric(float64(started)/elapsed.Seconds(), "jobs-started/s")
	b.ReportMetric(float64(len(submitted))/tSubmitted.Sub(t0).Seconds(), "submits/s")
	b.ReportMetric(ms(percentile(granted, 0.5)), "grant-p50-ms")
	b.ReportMetric(ms(percentile(granted, 0.99)), "grant-p99-ms")
	b.ReportMetric(ms(percentile(running, 0.5)), "running-p50-ms")
	b.ReportMetric(ms(percentile(running, 0.99)), "running-p99-ms")
	b.ReportMetric(float64(deepest), "max-queue")
	b.ReportMetric(float64(completed), "completed")
	b.Logf("%d of %d jobs submitted after %s, %d started after %s (%.1f/s); %d COMPLETED, %d FAILED; grants %d, deepest queue %d",
		len(submitted), n, tSubmitted.Sub(t0).Round(time.Millisecond), started, elapsed.Round(time.Millisecond),
		float64(started)/elapsed.Seconds(), completed, failed, len(granted), deepest)
}

// endAsCompleted ends node's step of job id as a step whose workers all exited 0
// would (recordEnd and markEnded in one change), with nothing run.
func endAsCompleted(ctx context.Context, s store.Store, id, node string) {
	_, _, _ = update(ctx, s, id, func(j *Job) bool {
		if j.State.Status != Running || !slices.Contains(j.State.Nodes, node) {
			return false
		}
		j.State.Status, j.State.End = Completing, Completed
		j.State.StepsEnded = append(j.State.StepsEnded, node)
		return true
	})
}

// waitClusterUp waits until nodes nodes are up and an agent leads.
func waitClusterUp(b testing.TB, s store.Store, nodes int) {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		up := 0
		if c, err := allocator.Snapshot(ctx, s); err == nil {
			for _, ns := range c.Nodes {
				if ns.Up {
					up++
				}
			}
		}
		e, err := s.Get(ctx, throughputLeaderKey)
		if up == nodes && err == nil && e != nil && e.Session != "" {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d nodes up, leader %v, after 2 minutes", up, nodes, e)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// benchUser is the benchmark's jobs' user: this process's (a step runs a job's workers
// as its user, who must exist on the node).
var benchUser = func() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return strconv.Itoa(os.Getuid())
}()
