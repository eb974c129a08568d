package allocator

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// die abandons a ticket the way a killed holder does: its keepalive stops and its
// session ends without a release (Consul would expire it; destroying it is the same
// invalidation, sooner), so its keys go away through the session and lock-delay applies.
func (t *Ticket) die(ctx context.Context) {
	t.lease.Close()
	_ = t.s.DestroySession(ctx, t.req.Session)
}

// requestWait is how long a request of TestInvariantsUnderConcurrency waits before the
// scheduler refuses it: long enough that a loaded machine's slowness does not turn
// grants into refusals (it was 4 s, and a load of 20 on 2 cores made most requests
// refused).
const requestWait = 30 * time.Second

func TestInvariantsUnderConcurrency(t *testing.T) {
	// 64 nodes × 8 GPUs on a real Consul, 50 requesters asking for random gangs and
	// holders killed at random; after every grant and all along, the store is read
	// directly: no GPU is held by two grants, and every grant is whole.
	s := consultest.ConsulStore(t, consultest.Start(t))
	startCluster(t, s, 64, "dgx-h100", func(i int) map[string]string {
		return map[string]string{LabelSwitch: "leaf" + string(rune('a'+i/8))}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var granted, refused, killed, released atomic.Int64
	stopObserver := make(chan struct{})
	observerDone := make(chan struct{})
	go func() {
		defer close(observerDone)
		for {
			select {
			case <-stopObserver:
				return
			default:
			}
			checkInvariants(t, s)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < 50; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			for i := 0; i < 3; i++ {
				r := Request{Nodes: 1 + rng.IntN(6), GPUsPerNode: 1 + rng.IntN(8), Priority: rng.IntN(3),
					Wait: requestWait, Holder: "requester"}
				tk, err := Submit(ctx, s, r)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("submit: %v", err)
					}
					return
				}
				_, err = tk.Wait(ctx, nil)
				switch {
				case errors.Is(err, ErrRefused):
					refused.Add(1)
					_ = tk.Release(context.Background())
					continue
				case err != nil:
					t.Errorf("wait: %v", err)
					_ = tk.Release(context.Background())
					return
				}
				granted.Add(1)
				checkInvariants(t, s)
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				if rng.IntN(4) == 0 {
					tk.die(context.Background())
					killed.Add(1)
				} else {
					if err := tk.Release(context.Background()); err != nil {
						t.Errorf("release: %v", err)
					}
					released.Add(1)
				}
				checkInvariants(t, s)
			}
		}(uint64(w))
	}
	wg.Wait()
	close(stopObserver)
	<-observerDone
	c := checkInvariants(t, s)
	t.Logf("granted %d, refused %d, killed %d, released %d", granted.Load(), refused.Load(), killed.Load(), released.Load())
	if granted.Load()+refused.Load() != 150 {
		t.Errorf("%d requests answered, want all 150", granted.Load()+refused.Load())
	}
	// Every request fits the cluster; one refused means it waited requestWait with
	// nothing freed for it: on a starved machine that can happen to a few, not to most.
	if granted.Load() < refused.Load() {
		t.Errorf("only %d of 150 requests granted, %d refused after %s: the scheduler is not making progress", granted.Load(), refused.Load(), requestWait)
	}
	if killed.Load() == 0 {
		t.Errorf("no holder was killed: the test did not exercise holder death")
	}
	// Every holder is gone: once the killed holders' lock-delay is over, nothing is held.
	waitFor(t, 30*time.Second, func() bool {
		c = checkInvariants(t, s)
		if t.Failed() {
			return true
		}
		for _, n := range c.NodeList() {
			if n.GPUsFree != n.GPUsTotal {
				return false
			}
		}
		return len(c.Grants) == 0
	}, "every GPU free again")
	if t.Failed() {
		for _, n := range c.NodeList() {
			if n.GPUsFree != n.GPUsTotal {
				t.Logf("node %s: %d of %d free; held %v", n.Name, n.GPUsFree, n.GPUsTotal, c.Nodes[n.Name].Held)
			}
		}
		for id, g := range c.Grants {
			t.Logf("grant %s: %+v", id, g)
		}
	}
}

func TestPriorityAndReservationPreventStarvation(t *testing.T) {
	consultest.EachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		// Six 8-GPU nodes. A holds two; two smalls of 5 GPUs take 5 on two more (best fit
		// puts them on different nodes). Big (3 nodes × 8, high priority) cannot fit: it
		// keeps three nodes for itself. Small requests arriving after it must not take
		// those, but may backfill the free GPUs of the node it does not keep.
		startCluster(t, s, 6, "dgx-a100", nil)
		a, _ := submitAndWait(t, s, Request{Nodes: 2, GPUsPerNode: 8, Holder: "a"})
		small1, _ := submitAndWait(t, s, Request{Nodes: 1, GPUsPerNode: 5, Holder: "small1"})
		small2, _ := submitAndWait(t, s, Request{Nodes: 1, GPUsPerNode: 5, Holder: "small2"})
		big, err := Submit(ctx, s, Request{Nodes: 3, GPUsPerNode: 8, Priority: 10, Holder: "big"})
		if err != nil {
			t.Fatal(err)
		}
		defer big.Release(ctx)
		var kept []string
		waitFor(t, 20*time.Second, func() bool {
			st, _ := ReadStatus(ctx, s)
			kept = st.Reserved[big.Request().ID]
			return len(kept) == 3
		}, "a reservation for big")
		reserved := map[string]bool{}
		for _, n := range kept {
			reserved[n] = true
		}
		var smalls []*Ticket
		for i := 0; i < 3; i++ {
			tk, err := Submit(ctx, s, Request{Nodes: 1, GPUsPerNode: 2, Holder: "late small"})
			if err != nil {
				t.Fatal(err)
			}
			defer tk.Release(ctx)
			smalls = append(smalls, tk)
		}
		// One late small fits in the 3 free GPUs of the partial node big does not keep.
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		g, err := smalls[0].Wait(wctx, nil)
		cancel()
		if err != nil {
			t.Fatalf("the first late small was not backfilled: %v", err)
		}
		if reserved[g.Nodes[0].Name] {
			t.Fatalf("backfilled onto reserved node %s", g.Nodes[0].Name)
		}
		time.Sleep(500 * time.Millisecond)
		c := checkInvariants(t, s)
		early := map[string]bool{a.Request().ID: true, small1.Request().ID: true, small2.Request().ID: true}
		for id, g := range c.Grants {
			if g.State != GrantGranted || early[id] {
				continue
			}
			for _, gn := range g.Nodes {
				if reserved[gn.Name] {
					t.Errorf("request %s was given reserved node %s while big waits", id, gn.Name)
				}
			}
		}
		if _, ok := c.Grants[smalls[2].Request().ID]; ok {
			t.Errorf("the third late small was granted: it can only fit on big's nodes")
		}
		// Releasing a frees big's nodes: big goes first, ahead of the waiting smalls.
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		g, err = big.Wait(wctx, nil)
		if err != nil || g.DeviceCount() != 24 {
			t.Fatalf("big: %+v %v", g, err)
		}
		checkInvariants(t, s)
	})
}
