package metrics

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

// Profiling fields. dcgm-exporter's default counters enable DCGM_FI_PROF_GR_ENGINE_ACTIVE,
// _PIPE_TENSOR_ACTIVE, _DRAM_ACTIVE and _PCIE_TX_BYTES / _RX_BYTES. On Hopper and later
// GPUs DCGM computes them from NVML's GPU Performance Monitoring (GPM): it takes GPM
// samples and asks nvmlGpmMetricsGet for the metric between two of them
// (DcgmGpmManager.cpp, GetLatestSample), mapping each field to one GPM metric
// (dcgm_fields.cpp, DcgmFieldIdToNvmlGpmMetricId), percentages divided by 100 into
// ratios and MiB/s multiplied by 2^20 into bytes per second (DcgmCacheManager.cpp). A
// scrape does the same between its reading and the one before (so the first has none).
// GPUs before Hopper have no GPM (nvmlGpmQueryDeviceSupport says so, or the call is
// missing): DCGM reads these fields there through its own profiling module, which NVML
// does not expose, so gangrun exports none of them on such a GPU.

// gpmField is one profiling field: dcgm-exporter's name and help, the GPM metric DCGM
// reads it from, and the factor from GPM's unit to the field's.
type gpmField struct {
	name, help string
	metric     nvml.GpmMetricId
	scale      float64
}

// gpmFields are the profiling fields dcgm-exporter's default counters enable
// (etc/default-counters.csv, 4.5.3-4.8.2), as DcgmFieldIdToNvmlGpmMetricId maps them.
// PIPE_TENSOR_ACTIVE is NVML_GPM_METRIC_ANY_TENSOR_UTIL, every tensor pipe, as DCGM
// reads it on Hopper.
func gpmFields() []gpmField {
	const percent, mib = 0.01, 1 << 20
	return []gpmField{
		{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", nvml.GPM_METRIC_GRAPHICS_UTIL, percent},
		{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", nvml.GPM_METRIC_ANY_TENSOR_UTIL, percent},
		{"DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", nvml.GPM_METRIC_DRAM_BW_UTIL, percent},
		{"DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", nvml.GPM_METRIC_PCIE_TX_PER_SEC, mib},
		{"DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", nvml.GPM_METRIC_PCIE_RX_PER_SEC, mib},
	}
}

// gpmGPU is one GPU's GPM state: whether it has GPM (known after the first look), and
// its two samples, allocated once and swapped at every reading (prev holds the last
// reading when hasPrev).
type gpmGPU struct {
	checked, supported bool
	prev, cur          nvml.GpmSample
	hasPrev            bool
}

// gpmReader takes GPM readings for a collector; the collector's lock guards it.
type gpmReader struct {
	lib    nvml.Interface
	fields []gpmField
	gpus   map[int]*gpmGPU
}

func newGPMReader(lib nvml.Interface) *gpmReader {
	return &gpmReader{lib: lib, fields: gpmFields(), gpus: map[int]*gpmGPU{}}
}

// read takes a GPM sample of GPU index (device d) and returns each field's value since
// the previous sample, and which it has: none on the first reading, on a GPU without
// GPM, or when NVML fails (then the next reading starts afresh). A panic in the binding
// (a mock without GPM) counts as a GPU without GPM.
func (g *gpmReader) read(index int, d nvml.Device) (values []float64, has []bool) {
	st := g.gpus[index]
	if st == nil {
		st = &gpmGPU{}
		g.gpus[index] = st
	}
	defer func() {
		if recover() != nil {
			st.checked, st.supported, st.hasPrev = true, false, false
			values, has = nil, nil
		}
	}()
	if !st.checked {
		st.checked = true
		support, ret := d.GpmQueryDeviceSupport()
		if ret != nvml.SUCCESS || support.IsSupportedDevice == 0 {
			return nil, nil
		}
		var r1, r2 nvml.Return
		st.prev, r1 = g.lib.GpmSampleAlloc()
		st.cur, r2 = g.lib.GpmSampleAlloc()
		if r1 != nvml.SUCCESS || r2 != nvml.SUCCESS {
			return nil, nil
		}
		st.supported = true
	}
	if !st.supported {
		return nil, nil
	}
	if d.GpmSampleGet(st.cur) != nvml.SUCCESS {
		st.hasPrev = false
		return nil, nil
	}
	if st.hasPrev {
		mg := &nvml.GpmMetricsGetType{NumMetrics: uint32(len(g.fields)), Sample1: st.prev, Sample2: st.cur}
		for i, f := range g.fields {
			mg.Metrics[i].MetricId = uint32(f.metric)
		}
		if g.lib.GpmMetricsGet(mg) == nvml.SUCCESS {
			values, has = make([]float64, len(g.fields)), make([]bool, len(g.fields))
			for i, f := range g.fields {
				if nvml.Return(mg.Metrics[i].NvmlReturn) == nvml.SUCCESS {
					values[i], has[i] = mg.Metrics[i].Value*f.scale, true
				}
			}
		}
	}
	st.prev, st.cur = st.cur, st.prev
	st.hasPrev = true
	return values, has
}

// close frees the samples allocated.
func (g *gpmReader) close() {
	for _, st := range g.gpus {
		if st.supported {
			freeSample(g.lib, st.prev)
			freeSample(g.lib, st.cur)
			st.supported, st.checked = false, false
		}
	}
}

func freeSample(lib nvml.Interface, s nvml.GpmSample) {
	defer func() { _ = recover() }()
	if s != nil {
		lib.GpmSampleFree(s)
	}
}

// gpmDescs are the profiling fields' descriptions, in gpmFields order.
func gpmDescs() []*prometheus.Desc {
	var out []*prometheus.Desc
	for _, f := range gpmFields() {
		out = append(out, prometheus.NewDesc(f.name, f.help, gpuLabelNames(), nil))
	}
	return out
}
