package topology

import "strconv"

// Device is one thing a scheduler may hand to a worker: a whole GPU or a MIG device.
// It is the one device type of the allocator too: a node's record in the cluster
// lists its allocatable devices in this form, and placement chooses among them. Its
// JSON form (the record's) is id, gpu, model, mig_profile (MIG devices only),
// memory_bytes and health; the UUID is left out of it, since the record names devices
// by ID and the node's inventory, stored beside it, has the rest.
type Device struct {
	// ID is what CUDA_VISIBLE_DEVICES takes: the GPU's NVML index ("3") for a whole GPU,
	// the MIG device's UUID ("MIG-...") for a MIG device.
	ID string `json:"id"`
	// GPU is the NVML index of the (parent) GPU.
	GPU int `json:"gpu"`
	// UUID is the GPU's or the MIG device's UUID.
	UUID string `json:"-"`
	// Model is the GPU's product name ("NVIDIA H100 80GB HBM3").
	Model string `json:"model"`
	// MIGProfile is the MIG profile ("3g.20gb"); empty for a whole GPU.
	MIGProfile string `json:"mig_profile,omitempty"`
	// MemoryBytes is the device's memory in bytes.
	MemoryBytes uint64 `json:"memory_bytes"`
	// Health is the (parent) GPU's health: Healthy or Degraded (Allocatable leaves
	// failed GPUs out).
	Health HealthState `json:"health"`
}

// Allocatable returns what a scheduler may hand out on this node, in GPU index order:
// every GPU whose health is not failed, except that a GPU with MIG enabled contributes
// its MIG devices that exist (by UUID, in MIG index order) instead of itself, and none
// when it has none. Degraded GPUs are included: they still work, and the operator
// decides when to drain them.
func (inv *Inventory) Allocatable() []Device {
	out := []Device{}
	for _, g := range inv.GPUs {
		if g.Health.State == Failed {
			continue
		}
		if !g.MIGEnabled {
			out = append(out, Device{
				ID: strconv.Itoa(g.Index), GPU: g.Index, UUID: g.UUID,
				Model: g.Name, MemoryBytes: g.MemoryBytes, Health: g.Health.State,
			})
			continue
		}
		for _, m := range g.MIGDevices {
			out = append(out, Device{
				ID: m.UUID, GPU: g.Index, UUID: m.UUID,
				Model: g.Name, MIGProfile: m.Profile, MemoryBytes: m.MemoryBytes, Health: g.Health.State,
			})
		}
	}
	return out
}
