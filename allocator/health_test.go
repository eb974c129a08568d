package allocator

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// TestAgentRepublishesHealthChanges: a health source (here a recorded Xid 79 on GPU 3)
// makes the agent publish its node without that GPU among the allocatable devices, so
// the scheduler places nothing more on it.
func TestAgentRepublishesHealthChanges(t *testing.T) {
	s := store.NewMemory()
	xid := make(chan topology.GPUHealthChange, 1)
	recorded := func(ctx context.Context, _ *topology.Inventory, report func(topology.GPUHealthChange)) error {
		select {
		case ch := <-xid:
			report(ch)
		case <-ctx.Done():
		}
		<-ctx.Done()
		return nil
	}
	a, err := NewAgent(s, AgentConfig{Node: "gpu-a", Addr: "10.0.0.1", Inventory: inventory(t, "dgx-h100", "gpu-a"),
		NoScheduler: true, Health: recorded})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	devices := func() []topology.Device {
		c, err := Snapshot(context.Background(), s)
		if err != nil || c.Nodes["gpu-a"] == nil {
			return nil
		}
		return c.Nodes["gpu-a"].Record.Devices
	}
	waitFor(t, 10*time.Second, func() bool { return len(devices()) == 8 }, "the node registered with 8 devices")
	xid <- topology.GPUHealthChange{Index: 3, Xid: 79, GPUInstanceID: -1, ComputeInstanceID: -1,
		Health: topology.Health{State: topology.Failed, Reasons: []string{"Xid 79: GPU has fallen off the bus"}}}
	waitFor(t, 10*time.Second, func() bool { return len(devices()) == 7 }, "the node republished without its failed GPU")
	for _, d := range devices() {
		if d.GPU == 3 {
			t.Errorf("failed GPU 3 still allocatable: %+v", d)
		}
	}
}
