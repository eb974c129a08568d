package topology

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// HealthState is a GPU's state for scheduling: healthy GPUs are used, degraded GPUs are
// used but should be looked at (and drained by an operator), failed GPUs are never
// handed out (Allocatable leaves them out).
type HealthState string

// The health states, best first.
const (
	Healthy  HealthState = "healthy"
	Degraded HealthState = "degraded"
	Failed   HealthState = "failed"
)

func (s HealthState) rank() int {
	switch s {
	case Healthy:
		return 0
	case Degraded:
		return 1
	case Failed:
		return 2
	}
	return -1
}

func (s HealthState) check() error {
	if s.rank() < 0 {
		return fmt.Errorf("health state %q is not healthy, degraded or failed", string(s))
	}
	return nil
}

// Health is a GPU's state and why it is not healthy.
type Health struct {
	// State is healthy, degraded or failed.
	State HealthState `json:"state"`
	// Reasons says what made the GPU degraded or failed, one line each, sorted; empty
	// when healthy.
	Reasons []string `json:"reasons,omitempty"`
}

// with returns h made at least as bad as s, with reason added (once).
func (h Health) with(s HealthState, reason string) Health {
	out := Health{State: h.State, Reasons: append([]string(nil), h.Reasons...)}
	if out.State == "" {
		out.State = Healthy
	}
	if s.rank() > out.State.rank() {
		out.State = s
	}
	for _, r := range out.Reasons {
		if r == reason {
			return out
		}
	}
	out.Reasons = append(out.Reasons, reason)
	sort.Strings(out.Reasons)
	return out
}

func (h Health) equal(o Health) bool {
	if h.State != o.State || len(h.Reasons) != len(o.Reasons) {
		return false
	}
	for i := range h.Reasons {
		if h.Reasons[i] != o.Reasons[i] {
			return false
		}
	}
	return true
}

// healthReadings are the NVML values a GPU's probe-time health comes from.
type healthReadings struct {
	eccUncorrected    uint64 // volatile uncorrected ECC errors since the driver loaded
	retiredPending    bool   // retired pages waiting for a reset (before Ampere)
	remapPending      bool   // remapped rows waiting for a reset (Ampere and later)
	remapFailed       bool   // row remapping failed: the GPU needs service
	temperatureC      uint32 // 0 when unknown
	slowdownC         uint32 // 0 when unknown
	shutdownC         uint32 // 0 when unknown
	remappedUncRows   int
	remappedCorrected int
}

// evaluate turns readings into a Health. The rules follow NVIDIA's GPU memory error
// management guide: an uncorrectable error or a pending retirement/remap needs a GPU
// reset (degraded: running jobs are at risk, the GPU still works); a failed remap
// needs the GPU replaced (failed). Temperatures at the slowdown threshold degrade, at
// the shutdown threshold fail.
func (r healthReadings) evaluate() Health {
	h := Health{State: Healthy}
	if r.eccUncorrected > 0 {
		h = h.with(Degraded, fmt.Sprintf("%d uncorrected ECC errors since the driver loaded", r.eccUncorrected))
	}
	if r.retiredPending {
		h = h.with(Degraded, "retired pages pending: reset the GPU")
	}
	if r.remapPending {
		h = h.with(Degraded, "row remapping pending: reset the GPU")
	}
	if r.remapFailed {
		h = h.with(Failed, "row remapping failed: the GPU needs service")
	}
	switch {
	case r.temperatureC > 0 && r.shutdownC > 0 && r.temperatureC >= r.shutdownC:
		h = h.with(Failed, fmt.Sprintf("temperature %d C at or above the shutdown threshold %d C", r.temperatureC, r.shutdownC))
	case r.temperatureC > 0 && r.slowdownC > 0 && r.temperatureC >= r.slowdownC:
		h = h.with(Degraded, fmt.Sprintf("temperature %d C at or above the slowdown threshold %d C", r.temperatureC, r.slowdownC))
	}
	return h
}

// xidEffect says what a critical Xid does to a GPU's health, after NVIDIA's Xid
// catalog ("XID Errors", docs.nvidia.com/deploy/xid-errors). Xids the catalog blames
// on the application (13, 31, 43, 45, 68, 109 — the list NVIDIA's Kubernetes device
// plugin also ignores) leave the GPU healthy; Xids that ask for a reset or report a
// contained problem degrade it; every other critical Xid fails it.
func xidEffect(xid uint64) (HealthState, string) {
	switch xid {
	case 13, 31, 43, 45, 68, 109:
		return Healthy, ""
	case 63:
		return Degraded, "Xid 63: ECC page retirement or row remapping recorded"
	case 92:
		return Degraded, "Xid 92: high single-bit ECC error rate"
	case 94:
		return Degraded, "Xid 94: contained ECC error"
	case 48:
		return Failed, "Xid 48: double-bit ECC error"
	case 64:
		return Failed, "Xid 64: ECC page retirement or row remapping failed"
	case 74:
		return Failed, "Xid 74: NVLink error"
	case 79:
		return Failed, "Xid 79: GPU has fallen off the bus"
	case 95:
		return Failed, "Xid 95: uncontained ECC error"
	case 119, 120:
		return Failed, fmt.Sprintf("Xid %d: GPU System Processor error", xid)
	}
	return Failed, fmt.Sprintf("Xid %d: critical error", xid)
}

// GPUHealthChange is one change of a GPU's health that WatchHealth saw.
type GPUHealthChange struct {
	// Index and UUID name the GPU.
	Index int
	UUID  string
	// Xid is the Xid the event carried; 0 for a double-bit ECC event.
	Xid uint64
	// GPUInstanceID and ComputeInstanceID name the MIG instance the event came from;
	// -1 when it concerns the whole GPU.
	GPUInstanceID     int
	ComputeInstanceID int
	// Previous and Health are the GPU's health before and after the event.
	Previous Health
	Health   Health
}

// healthWaitTimeout is how long one NVML event wait blocks, so WatchHealth notices a
// cancelled context within this time.
const healthWaitTimeout = 500 * time.Millisecond

// watchedEvents are the NVML event types WatchHealth registers for.
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// WatchHealth follows NVML events (Xid critical errors, double-bit ECC errors) for the
// GPUs of inv, as an agent does while it runs, and calls fn for every event that makes
// a GPU's health worse or adds a reason; fn runs on WatchHealth's goroutine. It starts
// from the health recorded in inv and never modifies inv. It blocks until ctx is done
// (then returns nil, within about half a second) or NVML fails (then returns the error).
// A node without GPUs returns nil at once. opts.NVML selects the library as for
// NewProber; the other options are unused.
func WatchHealth(ctx context.Context, opts ProbeOptions, inv *Inventory, fn func(GPUHealthChange)) error {
	if len(inv.GPUs) == 0 {
		return nil
	}
	lib := opts.nvmlLib()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("watch gpu health on %s: NVML init: %s", inv.Node, ret.Error())
	}
	defer lib.Shutdown()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("watch gpu health on %s: create NVML event set: %s", inv.Node, ret.Error())
	}
	defer set.Free()
	byUUID, err := registerHealthEvents(lib, set, inv)
	if err != nil {
		return err
	}

	for ctx.Err() == nil {
		data, ret := set.Wait(uint32(healthWaitTimeout / time.Millisecond))
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("watch gpu health on %s: wait for NVML events: %s", inv.Node, ret.Error())
		}
		if data.Device == nil {
			continue
		}
		uuid, ret := data.Device.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		w, ok := byUUID[uuid]
		if !ok {
			continue
		}
		if change, ok := w.change(uuid, data); ok {
			w.health = change.Health
			fn(change)
		}
	}
	return nil
}

// watchedGPU is a GPU WatchHealth follows: its index and its health so far.
type watchedGPU struct {
	index  int
	health Health
}

// registerHealthEvents registers set for the watched NVML events of each of inv's GPUs
// that supports any, and returns those GPUs by UUID, starting from their recorded health
// (Healthy when none is). A GPU NVML does not find, a failed registration, or no GPU
// supporting the events is an error.
func registerHealthEvents(lib nvml.Interface, set nvml.EventSet, inv *Inventory) (map[string]*watchedGPU, error) {
	byUUID := map[string]*watchedGPU{}
	for _, g := range inv.GPUs {
		dev, ret := lib.DeviceGetHandleByUUID(g.UUID)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("watch gpu health on %s: gpu %d (%s): %s", inv.Node, g.Index, g.UUID, ret.Error())
		}
		mask := uint64(watchedEvents)
		if supported, ret := dev.GetSupportedEventTypes(); ret == nvml.SUCCESS {
			mask &= supported
		}
		if mask == 0 {
			continue
		}
		switch ret := dev.RegisterEvents(mask, set); ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED:
			continue
		default:
			return nil, fmt.Errorf("watch gpu health on %s: gpu %d: register events: %s", inv.Node, g.Index, ret.Error())
		}
		h := g.Health
		if h.State == "" {
			h.State = Healthy
		}
		byUUID[g.UUID] = &watchedGPU{index: g.Index, health: h}
	}
	if len(byUUID) == 0 {
		return nil, fmt.Errorf("watch gpu health on %s: no GPU supports Xid events", inv.Node)
	}
	return byUUID, nil
}

// change is the change of w's health (w is the GPU uuid names) that the NVML event data
// makes; false when the event is of no watched type, or changes neither its state nor
// its reasons.
func (w *watchedGPU) change(uuid string, data nvml.EventData) (GPUHealthChange, bool) {
	var state HealthState
	var reason string
	var xid uint64
	switch {
	case data.EventType&nvml.EventTypeXidCriticalError != 0:
		xid = data.EventData
		state, reason = xidEffect(xid)
	case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
		state, reason = Failed, "double-bit ECC error"
	default:
		return GPUHealthChange{}, false
	}
	if reason == "" {
		return GPUHealthChange{}, false
	}
	next := w.health.with(state, reason)
	if next.equal(w.health) {
		return GPUHealthChange{}, false
	}
	change := GPUHealthChange{
		Index: w.index, UUID: uuid, Xid: xid,
		GPUInstanceID: -1, ComputeInstanceID: -1,
		Previous: w.health, Health: next,
	}
	// NVML reports 0xFFFFFFFF when the event is not tied to a MIG instance.
	if data.GpuInstanceId != 0xFFFFFFFF {
		change.GPUInstanceID = int(data.GpuInstanceId)
	}
	if data.ComputeInstanceId != 0xFFFFFFFF {
		change.ComputeInstanceID = int(data.ComputeInstanceId)
	}
	return change, true
}
