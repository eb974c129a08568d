package topology

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlResult is what probing NVML found.
type nvmlResult struct {
	driver, cuda string
	gpus         []nvmlGPU
	// levels holds NVML's common-ancestor level for GPU pairs (by index, a < b) where
	// NVML reported one.
	levels map[[2]int]Level
	notes  []string
}

type nvmlGPU struct {
	gpu GPU
	dev nvml.Device
}

// probeNVML reads the GPUs through lib. An error means no GPU could be listed at all
// (no driver, no devices); it reads as the reason after "no GPUs: ". Problems with one
// GPU or one attribute become notes. A panic inside the binding (a mock function left
// unset, a broken library) is returned as an error too: probing never crashes.
func probeNVML(lib nvml.Interface, cpuWords int) (res nvmlResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = nvmlResult{}, fmt.Errorf("NVML failed: %v", r)
		}
	}()
	ret := lib.Init()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return res, errors.New("NVML library libnvidia-ml.so.1 not found (no NVIDIA driver installed)")
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return res, errors.New("NVML: the NVIDIA kernel driver is not loaded")
	default:
		return res, fmt.Errorf("NVML init: %s", ret.Error())
	}
	defer lib.Shutdown()
	res.levels = map[[2]int]Level{}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		res.driver = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v > 0 {
		res.cuda = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	has := func(symbol string) bool { return lib.Extensions().LookupSymbol(symbol) == nil }

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return res, fmt.Errorf("NVML device count: %s", ret.Error())
	}
	if count == 0 {
		return res, errors.New("NVML found no GPUs")
	}
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			res.notes = append(res.notes, fmt.Sprintf("gpu %d: NVML cannot open it: %s", i, ret.Error()))
			continue
		}
		g, notes := probeGPU(dev, i, cpuWords, has)
		res.notes = append(res.notes, notes...)
		res.gpus = append(res.gpus, nvmlGPU{gpu: g, dev: dev})
	}

	// NVLink remotes that are GPUs of this node, when NVML could not say.
	gpuBus := map[string]bool{}
	for _, g := range res.gpus {
		gpuBus[g.gpu.PCIBusID] = true
	}
	for k := range res.gpus {
		for r := range res.gpus[k].gpu.NVLinks {
			nl := &res.gpus[k].gpu.NVLinks[r]
			if nl.Type == NVLinkRemoteUnknown {
				if gpuBus[nl.PCIBusID] {
					nl.Type = NVLinkRemoteGPU
				} else {
					// Not a GPU of ours: NCCL assumes an NVSwitch (src/graph/xml.cc).
					nl.Type = NVLinkRemoteNVSwitch
				}
			}
		}
	}

	for i := range res.gpus {
		for j := i + 1; j < len(res.gpus); j++ {
			a, b := res.gpus[i], res.gpus[j]
			lvl, ret := a.dev.GetTopologyCommonAncestor(b.dev)
			if ret != nvml.SUCCESS {
				continue
			}
			if l, ok := levelFromNVML(lvl); ok {
				lo, hi := min(a.gpu.Index, b.gpu.Index), max(a.gpu.Index, b.gpu.Index)
				res.levels[[2]int{lo, hi}] = l
			}
		}
	}
	return res, nil
}

// levelFromNVML maps NVML's GPU topology levels to nvidia-smi's codes (the mapping
// nvidia-smi topo -m shows; TOPOLOGY_INTERNAL, two GPUs on one board, counts as PIX).
func levelFromNVML(l nvml.GpuTopologyLevel) (Level, bool) {
	switch l {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE:
		return LevelPIX, true
	case nvml.TOPOLOGY_MULTIPLE:
		return LevelPXB, true
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return LevelPHB, true
	case nvml.TOPOLOGY_NODE:
		return LevelNODE, true
	case nvml.TOPOLOGY_SYSTEM:
		return LevelSYS, true
	}
	return 0, false
}

// probeGPU reads one GPU. Attributes NVML does not support stay at their zero value;
// other failures become notes.
func probeGPU(dev nvml.Device, i, cpuWords int, has func(string) bool) (GPU, []string) {
	g := GPU{Index: i, NUMANode: -1}
	var notes []string
	check := func(what string, ret nvml.Return) bool {
		switch ret {
		case nvml.SUCCESS:
			return true
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
			return false
		}
		notes = append(notes, fmt.Sprintf("gpu %d: %s: %s", i, what, ret.Error()))
		return false
	}

	if idx, ret := dev.GetIndex(); check("index", ret) {
		g.Index = idx
	}
	if v, ret := dev.GetUUID(); check("uuid", ret) {
		g.UUID = v
	}
	if v, ret := dev.GetName(); check("name", ret) {
		g.Name = v
	}
	if m, ret := dev.GetMemoryInfo(); check("memory", ret) {
		g.MemoryBytes = m.Total
	}
	if p, ret := dev.GetPciInfo(); check("pci info", ret) {
		g.PCIBusID = normalizeBusID(cString(p.BusId[:]))
	}
	if v, ret := dev.GetMinorNumber(); check("minor number", ret) {
		g.Minor = v
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); check("compute capability", ret) {
		g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if mask, ret := dev.GetCpuAffinity(cpuWords); check("cpu affinity", ret) {
		g.CPUAffinity = cpuListFromMask(mask)
	}

	var r healthReadings
	if v, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); check("ecc errors", ret) {
		r.eccUncorrected = v
	}
	if v, ret := dev.GetRetiredPagesPendingStatus(); check("retired pages", ret) {
		r.retiredPending = v == nvml.FEATURE_ENABLED
	}
	if has("nvmlDeviceGetRemappedRows") {
		if corr, unc, pending, failed, ret := dev.GetRemappedRows(); check("remapped rows", ret) {
			r.remappedCorrected, r.remappedUncRows = corr, unc
			r.remapPending, r.remapFailed = pending, failed
		}
	}
	if v, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); check("temperature", ret) {
		r.temperatureC = v
		g.TemperatureC = int(v)
	}
	if v, ret := dev.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); check("slowdown temperature", ret) {
		r.slowdownC = v
	}
	if v, ret := dev.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SHUTDOWN); check("shutdown temperature", ret) {
		r.shutdownC = v
	}
	g.Health = r.evaluate()

	if current, pending, ret := dev.GetMigMode(); check("mig mode", ret) {
		g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
		if current != pending {
			notes = append(notes, fmt.Sprintf("gpu %d: MIG mode change pending a GPU reset", i))
		}
	}
	if g.MIGEnabled {
		g.MIGDevices, notes = probeMIG(dev, i, notes)
	}

	g.NVLinks = probeNVLinks(dev, has("nvmlDeviceGetNvLinkRemoteDeviceType"))
	return g, notes
}

// probeMIG lists the MIG devices that exist on a MIG-enabled GPU.
func probeMIG(dev nvml.Device, i int, notes []string) ([]MIGDevice, []string) {
	maxCount, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, append(notes, fmt.Sprintf("gpu %d: MIG device count: %s", i, ret.Error()))
	}
	var out []MIGDevice
	for k := 0; k < maxCount; k++ {
		m, ret := dev.GetMigDeviceHandleByIndex(k)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no MIG device in this slot
		}
		if ret != nvml.SUCCESS {
			notes = append(notes, fmt.Sprintf("gpu %d: MIG device %d: %s", i, k, ret.Error()))
			continue
		}
		md := MIGDevice{Index: k}
		if v, ret := m.GetUUID(); ret == nvml.SUCCESS {
			md.UUID = v
		}
		if v, ret := m.GetName(); ret == nvml.SUCCESS {
			md.Profile = migProfile(v)
		}
		if v, ret := m.GetMemoryInfo(); ret == nvml.SUCCESS {
			md.MemoryBytes = v.Total
		}
		if v, ret := m.GetGpuInstanceId(); ret == nvml.SUCCESS {
			md.GPUInstanceID = v
		}
		if v, ret := m.GetComputeInstanceId(); ret == nvml.SUCCESS {
			md.ComputeInstanceID = v
		}
		out = append(out, md)
	}
	return out, notes
}

// migProfile extracts the profile from a MIG device name: "NVIDIA A100-SXM4-40GB MIG
// 3g.20gb" → "3g.20gb"; a name without " MIG " gives "".
func migProfile(name string) string {
	if i := strings.LastIndex(name, "MIG "); i >= 0 {
		return strings.TrimSpace(name[i+len("MIG "):])
	}
	return ""
}

// probeNVLinks groups a GPU's active NVLinks by remote device. remoteType says whether
// NVML can report the remote device type (drivers since R460); without it the type is
// settled later from the remote bus id.
func probeNVLinks(dev nvml.Device, remoteType bool) []NVLinkRemote {
	var out []NVLinkRemote
	index := map[string]int{}
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := dev.GetNvLinkState(l)
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := dev.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		bus := normalizeBusID(cString(pci.BusId[:]))
		typ := NVLinkRemoteUnknown
		if remoteType {
			if t, ret := dev.GetNvLinkRemoteDeviceType(l); ret == nvml.SUCCESS {
				switch t {
				case nvml.NVLINK_DEVICE_TYPE_GPU:
					typ = NVLinkRemoteGPU
				case nvml.NVLINK_DEVICE_TYPE_SWITCH:
					typ = NVLinkRemoteNVSwitch
				case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
					typ = NVLinkRemoteNPU
				}
			}
		}
		if k, ok := index[bus]; ok {
			out[k].Links++
			continue
		}
		index[bus] = len(out)
		out = append(out, NVLinkRemote{PCIBusID: bus, Type: typ, Links: 1})
	}
	return out
}

// cString converts a NUL-terminated C char array to a string.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// normalizeBusID turns NVML's "00000000:1B:00.0" into sysfs's "0000:1b:00.0" (domains
// above 0xffff keep all their digits). Text that is not a bus id is returned lowercased.
func normalizeBusID(s string) string {
	var domain, bus, device, function uint64
	if n, err := fmt.Sscanf(strings.ToLower(s), "%x:%x:%x.%x", &domain, &bus, &device, &function); n != 4 || err != nil {
		return strings.ToLower(s)
	}
	if domain > 0xffff {
		return fmt.Sprintf("%08x:%02x:%02x.%x", domain, bus, device, function)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, device, function)
}
