package allocator

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// inventory loads a recorded inventory from topology's testdata, renamed to node.
func inventory(t testing.TB, name, node string) *topology.Inventory {
	t.Helper()
	inv, err := topology.LoadFile(filepath.Join("..", "topology", "testdata", "inventories", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	inv.Node = node
	return inv
}

// testCluster is a set of in-process agents with recorded inventories.
type testCluster struct {
	t      testing.TB
	s      store.Store
	agents map[string]*Agent
	stops  map[string]context.CancelFunc
	done   map[string]chan struct{}
}

// startCluster starts n agents named prefix0..prefix(n-1) with the recorded inventory
// inv, labels from label(i), and waits until all are up and a scheduler leads.
func startCluster(t testing.TB, s store.Store, n int, inv string, label func(i int) map[string]string) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, s: s, agents: map[string]*Agent{}, stops: map[string]context.CancelFunc{}, done: map[string]chan struct{}{}}
	for i := 0; i < n; i++ {
		var labels map[string]string
		if label != nil {
			labels = label(i)
		}
		tc.add(fmt.Sprintf("node%02d", i), inv, labels, i >= 3) // three scheduler candidates are enough
	}
	tc.waitUp(n)
	t.Cleanup(tc.stopAll)
	return tc
}

func (tc *testCluster) add(name, inv string, labels map[string]string, noScheduler bool) {
	tc.t.Helper()
	a, err := NewAgent(tc.s, AgentConfig{Node: name, Addr: "10.0.0." + strings.TrimLeft(name[4:], "0") + "1", Labels: labels,
		Inventory: inventory(tc.t, inv, name), NoScheduler: noScheduler})
	if err != nil {
		tc.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	tc.agents[name], tc.stops[name], tc.done[name] = a, cancel, done
}

func (tc *testCluster) stop(name string) {
	tc.stops[name]()
	<-tc.done[name]
}

func (tc *testCluster) stopAll() {
	for name := range tc.stops {
		tc.stop(name)
	}
}

// waitUp waits until n nodes are up and a scheduler has published its status.
func (tc *testCluster) waitUp(n int) {
	tc.t.Helper()
	waitFor(tc.t, 60*time.Second, func() bool {
		c, err := Snapshot(context.Background(), tc.s)
		if err != nil {
			return false
		}
		up := 0
		for _, ns := range c.Nodes {
			if ns.State() == NodeUp {
				up++
			}
		}
		e, _ := tc.s.Get(context.Background(), schedulerKey)
		return up == n && e != nil && e.Session != ""
	}, fmt.Sprintf("%d nodes up and a scheduler elected", n))
}

func waitFor(t testing.TB, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkInvariants reads the store directly, in one consistent read, and reports every
// broken invariant (CheckInvariants: no device held by two grants, every grant whole).
// It is safe to call from any goroutine (it reports with t.Errorf).
func checkInvariants(t testing.TB, s store.Store) *Cluster {
	t.Helper()
	entries, idx, err := s.List(context.Background(), ClusterPrefix)
	if err != nil {
		t.Errorf("read the store: %v", err)
		return &Cluster{}
	}
	c, violations := CheckInvariants(entries, idx)
	for _, v := range violations {
		t.Errorf("%s", v)
	}
	return c
}

// submitAndWait submits r and waits for its grant.
func submitAndWait(t testing.TB, s store.Store, r Request) (*Ticket, Grant) {
	t.Helper()
	tk, err := Submit(context.Background(), s, r)
	if err != nil {
		t.Fatalf("submit %+v: %v", r, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g, err := tk.Wait(ctx, nil)
	if err != nil {
		t.Fatalf("wait for %s: %v", tk.Request().ID, err)
	}
	t.Cleanup(func() { _ = tk.Release(context.Background()) })
	return tk, g
}

func TestGrantAllOrNothingAndRelease(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		startCluster(t, s, 3, "dgx-h100", nil)
		ctx := context.Background()
		a, ga := submitAndWait(t, s, Request{Nodes: 2, GPUsPerNode: 8, Holder: "test a"})
		if len(ga.Nodes) != 2 || ga.DeviceCount() != 16 {
			t.Fatalf("grant a = %+v, want 2 nodes × 8", ga)
		}
		// 2×8 more cannot fit (one node left): nothing of it may be held while it waits.
		b, err := Submit(ctx, s, Request{Nodes: 2, GPUsPerNode: 8, Holder: "test b"})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release(ctx)
		waitFor(t, 20*time.Second, func() bool {
			st, _ := ReadStatus(ctx, s)
			return strings.Contains(st.Pending[b.Request().ID], "needs 2 nodes with 8 free GPUs")
		}, "b pending with a reason")
		c := checkInvariants(t, s)
		if g, ok := c.Grants[b.Request().ID]; ok {
			t.Fatalf("b has a grant record while it cannot fit: %+v", g)
		}
		free := 0
		for _, n := range c.NodeList() {
			free += n.GPUsFree
		}
		if free != 8 {
			t.Errorf("free GPUs = %d, want 8 (b must hold none)", free)
		}
		// Releasing a lets b in.
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		gb, err := b.Wait(wctx, nil)
		if err != nil || gb.DeviceCount() != 16 {
			c, _ := Snapshot(ctx, s)
			st, _ := ReadStatus(ctx, s)
			t.Logf("status: %+v", st)
			for id, r := range c.Requests {
				t.Logf("request %s alive=%v", id, r.Alive)
			}
			for id, g := range c.Grants {
				t.Logf("grant %s %s", id, g.State)
			}
			for _, n := range c.NodeList() {
				t.Logf("node %+v", n)
			}
			t.Fatalf("b after a's release: %+v, %v", gb, err)
		}
		checkInvariants(t, s)
	})
}

func TestLargeGangIsNeverVisibleHalfGranted(t *testing.T) {
	// 40 nodes × 8 GPUs = 320 locks: three transactions. An observer reading the store
	// all along must never see a granted grant that is not whole.
	s := consultest.ConsulStore(t, consultest.Start(t))
	startCluster(t, s, 40, "dgx-a100", nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var observed, sawPending int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := checkInvariants(t, s)
			observed++
			for _, g := range c.Grants {
				if g.State == GrantPending {
					sawPending++
				}
			}
		}
	}()
	_, g := submitAndWait(t, s, Request{Nodes: 40, GPUsPerNode: 8, Holder: "big"})
	close(stop)
	wg.Wait()
	if g.DeviceCount() != 320 {
		t.Fatalf("granted %d devices, want 320", g.DeviceCount())
	}
	t.Logf("observer read the store %d times, %d while the grant was pending", observed, sawPending)
}

func TestRequestThatCannotFitIsRefusedAfterWait(t *testing.T) {
	s := store.NewMemory()
	startCluster(t, s, 2, "dgx-h100", nil)
	submitAndWait(t, s, Request{Nodes: 2, GPUsPerNode: 4})
	tk, err := Submit(context.Background(), s, Request{Nodes: 2, GPUsPerNode: 8, Wait: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Release(context.Background())
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = tk.Wait(ctx, nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "waited 1.5s") || !strings.Contains(err.Error(), "needs 2 nodes with 8 free GPUs") {
		t.Fatalf("err = %v, want a refusal with the reason", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("refused after %s", took)
	}
}

func TestCheckFeasibleRejectsBadRequestsBeforeReserving(t *testing.T) {
	s := store.NewMemory()
	startCluster(t, s, 2, "pcie-2socket", func(i int) map[string]string {
		return map[string]string{"partition": "batch", "switch": "sw1"}
	})
	for _, tc := range []struct {
		r    Request
		want string
	}{
		{Request{Nodes: 0, GPUsPerNode: 1}, "--nodes 0"},
		{Request{Nodes: 1, GPUsPerNode: -2}, "--gpus-per-node -2"},
		{Request{Nodes: 1, GPUsPerNode: 8}, "--gpus-per-node 8: no node has more than 4"},
		{Request{Nodes: 3, GPUsPerNode: 1}, "--nodes 3: only 2 registered nodes"},
		{Request{Nodes: 1, GPUsPerNode: 1, Partition: "gpu"}, "--partition gpu: no node is in that partition"},
		{Request{Nodes: 1, GPUsPerNode: 1, Labels: map[string]string{"rack": "r9"}}, "--labels rack=r9: no node has that label"},
		{Request{Nodes: 1, GPUsPerNode: 1, GPUModel: "B200"}, "GPU model B200 (--gpus-per-node B200:1, or --gpu-model): no node has such GPUs"},
		{Request{Nodes: 1, GPUsPerNode: 1, Wait: -time.Second}, "--wait -1s"},
	} {
		_, err := Submit(context.Background(), s, tc.r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Submit(%+v) = %v, want %q", tc.r, err, tc.want)
		}
		if !errors.Is(err, ErrInfeasible) {
			t.Errorf("Submit(%+v) = %v, want an error that is ErrInfeasible", tc.r, err)
		}
	}
	entries, _, _ := s.List(context.Background(), requestsPrefix)
	if len(entries) != 0 {
		t.Errorf("a rejected request left %d keys", len(entries))
	}
}
