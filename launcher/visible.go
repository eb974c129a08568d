package launcher

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/topology"
)

// visibleDevices narrows devices, the node's allocatable ones, to those the user's own
// CUDA_VISIBLE_DEVICES (value, inherited by `gangrun run`) lets a process see, so that
// `--nproc-per-node auto` counts them as torchrun's users expect (torchrun's `auto`
// is torch.cuda.device_count(), which counts the visible devices only).
//
// The value is read as CUDA reads it (CUDA C Programming Guide, "CUDA Environment
// Variables"): a comma-separated list of device indices or UUIDs ("GPU-..." or the
// same without the prefix, "MIG-..." for a MIG device), in order, up to the first
// entry that names no device, which CUDA ignores together with every entry after it
// ("-1" hides every GPU). Indices are NVML's, as gangrun's CUDA_DEVICE_ORDER=PCI_BUS_ID
// numbers them. Each device counts once, in the order the list names it.
//
// keep reports that the user's variable can reach the workers unchanged: every entry
// up to the first unknown one is allocatable here. It is false when the list names a
// GPU gangrun does not hand out (failed its health checks, or runs MIG, whose MIG
// devices are named by their own UUIDs): gangrun then sets CUDA_VISIBLE_DEVICES to the
// devices that remain. notes says, in words for the log, what was left out; empty when
// nothing was.
func visibleDevices(inv *topology.Inventory, devices []topology.Device, value string) (visible []topology.Device, keep bool, notes []string) {
	keep = true
	visible = []topology.Device{}
	entries := strings.Split(value, ",")
	for i, e := range entries {
		e = strings.TrimSpace(e)
		if d := slices.IndexFunc(devices, func(d topology.Device) bool { return matchesDevice(e, d.ID, d.UUID) }); d >= 0 {
			if !slices.ContainsFunc(visible, func(v topology.Device) bool { return v.ID == devices[d].ID }) {
				visible = append(visible, devices[d])
			}
			continue
		}
		if g := slices.IndexFunc(inv.GPUs, func(g topology.GPU) bool { return matchesDevice(e, strconv.Itoa(g.Index), g.UUID) }); g >= 0 {
			keep = false
			why := "failed its health checks"
			if inv.GPUs[g].MIGEnabled {
				why = "runs MIG: name its MIG devices by UUID"
			}
			notes = append(notes, fmt.Sprintf("GPU %d left out: it %s", inv.GPUs[g].Index, why))
			continue
		}
		note := fmt.Sprintf("%q names no device of this node: CUDA ignores it", e)
		if rest := entries[i+1:]; len(rest) > 0 {
			note += fmt.Sprintf(" and every entry after it (%s)", strings.Join(rest, ","))
		}
		notes = append(notes, note)
		break
	}
	return visible, keep, notes
}

// matchesDevice reports whether a CUDA_VISIBLE_DEVICES entry names the device with id
// and uuid: its index or MIG UUID (id), its UUID, or its GPU UUID without "GPU-".
func matchesDevice(entry, id, uuid string) bool {
	return entry != "" && (entry == id || (uuid != "" && (entry == uuid || "GPU-"+entry == uuid)))
}
