package doctor

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/gangrun/gangrun/topology"
)

// probe probes the node once, for gpus and nics (topology.NewProber: NVML, sysfs).
func (r *run) probe(ctx context.Context) (*topology.Inventory, error) {
	if r.inv != nil {
		return r.inv, nil
	}
	inv, err := topology.NewProber(topology.ProbeOptions{SysfsRoot: r.cfg.SysfsRoot, NVML: r.cfg.NVML, Node: r.cfg.Node}).Inventory(ctx)
	if err != nil {
		return nil, err
	}
	r.inv = inv
	return inv, nil
}

// noGPUsNote is the probe's note saying why NVML listed no GPU ("" when it did).
func noGPUsNote(inv *topology.Inventory) string {
	for _, n := range inv.Notes {
		if why, ok := strings.CutPrefix(n, "no GPUs: "); ok {
			return why
		}
	}
	return ""
}

// gpus compares what NVML lists with the NVIDIA GPUs the PCI bus shows: GPUs on the
// bus that NVML does not list (no driver, a driver that failed, a GPU fallen off the
// bus) fail; a node with neither is a warning (it offers jobs no GPU); GPUs NVML calls
// degraded or failed are a warning (the agent drains the node for a failed one).
func (r *run) gpus(ctx context.Context) Result {
	inv, err := r.probe(ctx)
	if err != nil {
		return Result{Status: Fail, Detail: "probe: " + err.Error()}
	}
	onBus := topology.NVIDIAGPUsOnPCI(r.cfg.SysfsRoot)
	if len(inv.GPUs) == 0 {
		why := noGPUsNote(inv)
		if len(onBus) > 0 {
			return Result{Status: Fail, Detail: fmt.Sprintf("the PCI bus shows %d NVIDIA GPUs (%s), but %s", len(onBus), busList(onBus), why),
				Fix: "install or load the NVIDIA driver: nvidia-smi must list them (dmesg | grep -i nvrm)"}
		}
		return Result{Status: Warn, Detail: fmt.Sprintf("no NVIDIA GPU: none on the PCI bus, and %s; this node offers no GPUs to jobs", why),
			Fix: "nothing, on a node without GPUs; on a GPU node, check that the GPUs are seated and powered (lspci -d 10de:)"}
	}
	models := map[string]int{}
	var sick []string
	for _, g := range inv.GPUs {
		models[g.Name]++
		if g.Health.State != "" && g.Health.State != topology.Healthy {
			sick = append(sick, fmt.Sprintf("GPU %d %s (%s)", g.Index, g.Health.State, strings.Join(g.Health.Reasons, "; ")))
		}
	}
	var names []string
	for m, n := range models {
		names = append(names, fmt.Sprintf("%d× %s", n, m))
	}
	sort.Strings(names)
	detail := fmt.Sprintf("NVML lists %d GPUs (%s), driver %s, CUDA %s", len(inv.GPUs), strings.Join(names, ", "), orUnknown(inv.Driver), orUnknown(inv.CUDADriver))
	if missing := missingFromNVML(onBus, inv.GPUs); len(missing) > 0 {
		return Result{Status: Fail, Detail: fmt.Sprintf("%s, but the PCI bus shows %d more NVIDIA GPUs it does not list (%s)", detail, len(missing), busList(missing)),
			Fix: "look for the GPU's Xid in dmesg (a GPU fallen off the bus needs a reset or a reboot): nvidia-smi -q"}
	}
	if len(sick) > 0 {
		return Result{Status: Warn, Detail: detail + "; " + strings.Join(sick, "; "),
			Fix: "see nvidia-smi -q; a failed GPU drains the node when the agent runs (gangrun nodes)"}
	}
	return Result{Status: OK, Detail: detail}
}

// missingFromNVML are the bus ids on the bus that no GPU NVML lists has.
func missingFromNVML(onBus []string, gpus []topology.GPU) []string {
	listed := map[string]bool{}
	for _, g := range gpus {
		listed[strings.ToLower(g.PCIBusID)] = true
	}
	var out []string
	for _, b := range onBus {
		if !listed[strings.ToLower(b)] {
			out = append(out, b)
		}
	}
	return out
}

// busList writes bus ids for a message: the first three, then how many more.
func busList(ids []string) string {
	if len(ids) <= 3 {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:3], ", "), len(ids)-3)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// nics reports the network interfaces and RDMA ports and their link state: RDMA
// devices none of whose ports is active, and a node with no interface up but the
// loopback, fail; a port or a physical interface down beside others up is a warning
// (NCCL uses the active ports only: less bandwidth, or a job pinned to that HCA by
// NCCL_IB_HCA fails); the agent's --advertise-addr must be an address of an interface
// here that is up (a loopback one warns: no other machine reaches it).
func (r *run) nics(ctx context.Context) Result {
	inv, err := r.probe(ctx)
	if err != nil {
		return Result{Status: Fail, Detail: "probe: " + err.Error()}
	}
	var up, down []string
	var advertisedOn string
	for _, n := range inv.Netdevs {
		if n.Type == "loopback" {
			if r.cfg.AdvertiseAddr != "" && hasAddr(n.Addresses, r.cfg.AdvertiseAddr) {
				advertisedOn = n.Name // lo's operstate is "unknown": it is up
			}
			continue
		}
		if n.OperState == "up" {
			up = append(up, n.Name)
		} else if !n.Virtual {
			down = append(down, n.Name+" "+orUnknown(n.OperState))
		}
		if r.cfg.AdvertiseAddr != "" && n.OperState == "up" && hasAddr(n.Addresses, r.cfg.AdvertiseAddr) {
			advertisedOn = n.Name
		}
	}
	loopback := false
	if ip, err := netip.ParseAddr(r.cfg.AdvertiseAddr); err == nil {
		loopback = ip.IsLoopback()
	}
	var active, inactive []string
	for _, d := range inv.RDMADevices {
		for _, p := range d.Ports {
			name := fmt.Sprintf("%s/%d", d.Name, p.Port)
			if p.State == topology.PortActive {
				active = append(active, fmt.Sprintf("%s %s", name, orUnknown(p.Rate)))
			} else {
				inactive = append(inactive, fmt.Sprintf("%s %s (%s)", name, orUnknown(p.State), orUnknown(p.PhysState)))
			}
		}
	}
	var parts []string
	parts = append(parts, "interfaces up: "+orNone(up))
	if len(down) > 0 {
		parts = append(parts, "down: "+strings.Join(down, ", "))
	}
	if len(inv.RDMADevices) == 0 {
		parts = append(parts, "no RDMA device (NCCL uses TCP sockets)")
	} else {
		parts = append(parts, fmt.Sprintf("RDMA ports active: %s", orNone(active)))
		if len(inactive) > 0 {
			parts = append(parts, "not active: "+strings.Join(inactive, ", "))
		}
	}
	detail := strings.Join(parts, "; ")
	switch {
	case r.cfg.AdvertiseAddr != "" && advertisedOn == "":
		return Result{Status: Fail, Detail: fmt.Sprintf("advertise-addr %s is on no interface here that is up; %s", r.cfg.AdvertiseAddr, detail),
			Fix: "set advertise-addr to an address of this node the other nodes reach (ip -br addr)"}
	case len(up) == 0:
		return Result{Status: Fail, Detail: detail, Fix: "bring a network interface up: the other nodes and Consul must reach this one (ip link)"}
	case len(inv.RDMADevices) > 0 && len(active) == 0:
		return Result{Status: Fail, Detail: "no RDMA port is active (NCCL would fall back to TCP sockets); " + detail,
			Fix: "check the cables, the switch and the subnet manager (ibstat; ibstatus)"}
	case len(inactive) > 0 || len(down) > 0:
		return Result{Status: Warn, Detail: detail, Fix: "check the cables and the switch (ibstat; ip -br link)"}
	case loopback:
		return Result{Status: Warn, Detail: fmt.Sprintf("advertise-addr %s is a loopback address: no other machine reaches this node there (a one-machine cluster); %s", r.cfg.AdvertiseAddr, detail),
			Fix: "set advertise-addr to an address of this node the other nodes reach (ip -br addr)"}
	}
	if advertisedOn != "" {
		detail += fmt.Sprintf("; advertise-addr %s on %s", r.cfg.AdvertiseAddr, advertisedOn)
	}
	return Result{Status: OK, Detail: detail}
}

// hasAddr reports whether one of the prefixes ("10.0.0.5/24") holds the address ip.
func hasAddr(prefixes []string, ip string) bool {
	want, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	for _, p := range prefixes {
		if pp, err := netip.ParsePrefix(p); err == nil && pp.Addr().Unmap() == want.Unmap() {
			return true
		}
	}
	return false
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// topology reads the agent's --topology-file as the agent does (topology.ForNode); a
// file that does not read fails (the agent would not start). Without one, the agent
// probes the node: skipped.
func (r *run) topology(ctx context.Context) Result {
	if r.cfg.TopologyFile == "" {
		return Result{Status: Skip, Detail: "no topology-file: the agent probes the node (gangrun topo shows what it finds)"}
	}
	inv, err := topology.ForNode(ctx, r.cfg.TopologyFile, r.cfg.Node)
	if err != nil {
		return Result{Status: Fail, Detail: oneLine(err.Error()), Fix: "record the node again: gangrun topo --json > FILE (or nvidia-smi topo -m > FILE), or leave topology-file out to probe"}
	}
	detail := fmt.Sprintf("%s reads as node %s: %d GPUs, %d RDMA devices, %d network interfaces", r.cfg.TopologyFile, inv.Node, len(inv.GPUs), len(inv.RDMADevices), len(inv.Netdevs))
	if probed, err := r.probe(ctx); err == nil && len(probed.GPUs) != len(inv.GPUs) {
		return Result{Status: Warn, Detail: fmt.Sprintf("%s; this node's NVML lists %d: the agent offers the recorded ones", detail, len(probed.GPUs)),
			Fix: "record this node again (gangrun topo --json), unless the file is a drill's"}
	}
	return Result{Status: OK, Detail: detail}
}

// oneLine folds s onto one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
