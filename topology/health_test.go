package topology

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// TestProbeHealth probes the DGX A100 model with one GPU's NVML readings changed and
// checks the state and reasons the probe derives.
func TestProbeHealth(t *testing.T) {
	tests := []struct {
		name   string
		change func(h *healthReadings)
		want   Health
	}{
		{"healthy", func(h *healthReadings) {}, Health{State: Healthy}},
		{"uncorrected ECC", func(h *healthReadings) { h.eccUncorrected = 3 },
			Health{Degraded, []string{"3 uncorrected ECC errors since the driver loaded"}}},
		{"remap pending", func(h *healthReadings) { h.remapPending = true },
			Health{Degraded, []string{"row remapping pending: reset the GPU"}}},
		{"remap failed", func(h *healthReadings) { h.remapFailed, h.remapPending = true, true },
			Health{Failed, []string{"row remapping failed: the GPU needs service", "row remapping pending: reset the GPU"}}},
		{"hot", func(h *healthReadings) { h.temperatureC = 90 },
			Health{Degraded, []string{"temperature 90 C at or above the slowdown threshold 90 C"}}},
		{"too hot", func(h *healthReadings) { h.temperatureC = 93 },
			Health{Failed, []string{"temperature 93 C at or above the shutdown threshold 92 C"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := dgxA100()
			tc.change(&m.gpus[3].health)
			inv := probeModel(t, m)
			g, _ := inv.GPU(3)
			if !reflect.DeepEqual(g.Health, tc.want) {
				t.Errorf("health %+v, want %+v", g.Health, tc.want)
			}
			other, _ := inv.GPU(2)
			if other.Health.State != Healthy {
				t.Errorf("gpu 2 health %+v, want healthy", other.Health)
			}
			allocatable := map[string]bool{}
			for _, d := range inv.Allocatable() {
				allocatable[d.ID] = true
			}
			if allocatable["3"] != (tc.want.State != Failed) {
				t.Errorf("gpu 3 allocatable=%v with state %s", allocatable["3"], tc.want.State)
			}
		})
	}
}

// TestRetiredPagesBeforeAmpere: a V100 reports pending page retirement instead of row
// remapping.
func TestRetiredPagesBeforeAmpere(t *testing.T) {
	m := dgx1()
	m.gpus[5].health.retiredPending = true
	inv := probeModel(t, m)
	g, _ := inv.GPU(5)
	want := Health{Degraded, []string{"retired pages pending: reset the GPU"}}
	if !reflect.DeepEqual(g.Health, want) {
		t.Errorf("health %+v, want %+v", g.Health, want)
	}
}

func TestXidEffect(t *testing.T) {
	tests := []struct {
		xid   uint64
		state HealthState
	}{
		{13, Healthy}, {31, Healthy}, {43, Healthy}, {45, Healthy}, {68, Healthy}, {109, Healthy},
		{63, Degraded}, {92, Degraded}, {94, Degraded},
		{48, Failed}, {64, Failed}, {74, Failed}, {79, Failed}, {95, Failed}, {119, Failed}, {120, Failed}, {154, Failed},
	}
	for _, tc := range tests {
		state, reason := xidEffect(tc.xid)
		if state != tc.state {
			t.Errorf("Xid %d: %s, want %s", tc.xid, state, tc.state)
		}
		if (state == Healthy) != (reason == "") {
			t.Errorf("Xid %d: state %s with reason %q", tc.xid, state, reason)
		}
	}
}

// eventFeed is a mock NVML event set the test pushes events into.
type eventFeed struct {
	ch         chan nvml.EventData
	mu         sync.Mutex
	registered map[string]uint64 // uuid → event mask
}

func newEventFeed() *eventFeed {
	return &eventFeed{ch: make(chan nvml.EventData, 16), registered: map[string]uint64{}}
}

// attach makes srv's event functions use the feed.
func (f *eventFeed) attach(srv *server.Server) {
	set := &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case e := <-f.ch:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(mask uint64, s nvml.EventSet) nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.registered[dev.UUID] = mask
			return nvml.SUCCESS
		}
	}
}

// TestWatchHealthFollowsXids feeds Xid events through the mock NVML event set and
// checks the changes WatchHealth reports.
func TestWatchHealthFollowsXids(t *testing.T) {
	m := dgxA100()
	inv := probeModel(t, m)
	lib := m.nvml(t).(*server.Server)
	feed := newEventFeed()
	feed.attach(lib)
	dev := func(i int) nvml.Device { return lib.Devices[i] }

	changes := make(chan GPUHealthChange, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchHealth(ctx, ProbeOptions{NVML: lib}, inv, func(c GPUHealthChange) { changes <- c })
	}()

	const none = 0xFFFFFFFF
	feed.ch <- nvml.EventData{Device: dev(2), EventType: nvml.EventTypeXidCriticalError, EventData: 13, GpuInstanceId: none, ComputeInstanceId: none}
	feed.ch <- nvml.EventData{Device: dev(2), EventType: nvml.EventTypeXidCriticalError, EventData: 94, GpuInstanceId: none, ComputeInstanceId: none}
	feed.ch <- nvml.EventData{Device: dev(2), EventType: nvml.EventTypeXidCriticalError, EventData: 94, GpuInstanceId: none, ComputeInstanceId: none}
	feed.ch <- nvml.EventData{Device: dev(5), EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: 1, ComputeInstanceId: 0}
	feed.ch <- nvml.EventData{Device: dev(2), EventType: nvml.EventTypeDoubleBitEccError, GpuInstanceId: none, ComputeInstanceId: none}

	want := []GPUHealthChange{
		{Index: 2, UUID: m.gpus[2].uuid, Xid: 94, GPUInstanceID: -1, ComputeInstanceID: -1,
			Previous: Health{State: Healthy}, Health: Health{Degraded, []string{"Xid 94: contained ECC error"}}},
		{Index: 5, UUID: m.gpus[5].uuid, Xid: 79, GPUInstanceID: 1, ComputeInstanceID: 0,
			Previous: Health{State: Healthy}, Health: Health{Failed, []string{"Xid 79: GPU has fallen off the bus"}}},
		{Index: 2, UUID: m.gpus[2].uuid, GPUInstanceID: -1, ComputeInstanceID: -1,
			Previous: Health{Degraded, []string{"Xid 94: contained ECC error"}},
			Health:   Health{Failed, []string{"Xid 94: contained ECC error", "double-bit ECC error"}}},
	}
	for i, w := range want {
		select {
		case got := <-changes:
			if !reflect.DeepEqual(got, w) {
				t.Errorf("change %d:\n got %+v\nwant %+v", i, got, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("change %d never came", i)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchHealth: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WatchHealth did not return after cancel")
	}
	select {
	case c := <-changes:
		t.Errorf("unexpected change %+v (the repeated and the application Xid change nothing)", c)
	default:
	}
	for _, g := range m.gpus {
		if feed.registered[g.uuid] != nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError {
			t.Errorf("gpu %s registered for %#x", g.uuid, feed.registered[g.uuid])
		}
	}
	if g, _ := inv.GPU(2); g.Health.State != Healthy {
		t.Error("WatchHealth modified the inventory")
	}
}

func TestWatchHealthErrors(t *testing.T) {
	t.Run("no GPUs returns at once", func(t *testing.T) {
		inv := &Inventory{Node: "n"}
		if err := WatchHealth(context.Background(), ProbeOptions{}, inv, func(GPUHealthChange) {}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no driver", func(t *testing.T) {
		m := cpuOnly()
		inv, err := LoadFile(inventoryPath("dgx-h100"))
		if err != nil {
			t.Fatal(err)
		}
		err = WatchHealth(context.Background(), ProbeOptions{NVML: m.nvml(t)}, inv, func(GPUHealthChange) {})
		if err == nil || err.Error() != "watch gpu health on dgx-h100-01: NVML init: ERROR_LIBRARY_NOT_FOUND" {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unknown GPU", func(t *testing.T) {
		m := dgxA100()
		inv, err := LoadFile(inventoryPath("dgx-h100")) // other UUIDs
		if err != nil {
			t.Fatal(err)
		}
		lib := m.nvml(t).(*server.Server)
		newEventFeed().attach(lib)
		err = WatchHealth(context.Background(), ProbeOptions{NVML: lib}, inv, func(GPUHealthChange) {})
		if err == nil {
			t.Fatal("watching GPUs NVML does not know succeeded")
		}
	})
}
