package metrics

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gangrun/gangrun/topology"
)

// GPUConfig configures a GPUCollector.
type GPUConfig struct {
	// NVML is the driver's library, initialised by the caller (nvml.Interface.Init) for
	// the collector's life; nil on a node described by a recorded inventory: then only
	// what the inventory knows is exported (gangrun_gpu_info, gangrun_gpu_health), no
	// dcgm-exporter reading.
	NVML nvml.Interface
	// Node is the node's name: the Hostname label.
	Node string
	// Inventory returns the node's inventory as the agent knows it now (health included).
	Inventory func() *topology.Inventory
	// Holders returns the job holding each GPU (by NVML index), as of the last scrape's
	// read of the cluster; nil or an error: no job labels.
	Holders func(ctx context.Context) (map[int]JobLabels, error)
	// CacheTTL is how long readings serve later scrapes; 0 means DefaultCacheTTL.
	CacheTTL time.Duration
}

// dcgmField is one of dcgm-exporter's per-GPU fields and how NVML gives it: read
// returns the value and whether the GPU supports it.
type dcgmField struct {
	name, help string
	kind       prometheus.ValueType
	read       func(d nvml.Device) (float64, bool)
}

// dcgmFields are the fields exported, with dcgm-exporter's names, types and units
// (etc/default-counters.csv of NVIDIA/dcgm-exporter 4.5.3-4.8.2; the ECC and
// retired-page rows are commented out there and exported here where NVML gives them),
// each read through the NVML call DCGM itself makes for it (DcgmCacheManager.cpp). The
// Xid field is not here: NVML reports Xids as events (GPUCollector.NoteHealth); nor are
// the profiling fields (gpm.go) and the NVLink rates (nvlink.go), which need two
// readings.
func dcgmFields() []dcgmField {
	const mib = 1 << 20
	return []dcgmField{
		{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			u, ret := d.GetUtilizationRates()
			return float64(u.Gpu), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			u, ret := d.GetUtilizationRates()
			return float64(u.Memory), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			m, ok := memoryInfo(d)
			return float64(m.Free / mib), ok
		}},
		{"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			m, ok := memoryInfo(d)
			return float64(m.Used / mib), ok
		}},
		{"DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			m, ret := d.GetMemoryInfo_v2()
			return float64(m.Reserved / mib), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			mw, ret := d.GetPowerUsage()
			return float64(mw) / 1000, ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", prometheus.CounterValue, func(d nvml.Device) (float64, bool) {
			mj, ret := d.GetTotalEnergyConsumption()
			return float64(mj), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			c, ret := d.GetTemperature(nvml.TEMPERATURE_GPU)
			return float64(c), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", prometheus.GaugeValue, readMemoryTemp},
		{"DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			u, _, ret := d.GetEncoderUtilization()
			return float64(u), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			u, _, ret := d.GetDecoderUtilization()
			return float64(u), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", prometheus.CounterValue, func(d nvml.Device) (float64, bool) {
			n, ret := d.GetPcieReplayCounter()
			return float64(n), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			c, ret := d.GetClockInfo(nvml.CLOCK_SM)
			return float64(c), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			c, ret := d.GetClockInfo(nvml.CLOCK_MEM)
			return float64(c), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", prometheus.CounterValue, eccReader(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)},
		{"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", prometheus.CounterValue, eccReader(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)},
		{"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.", prometheus.CounterValue, eccReader(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC)},
		{"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", prometheus.CounterValue, eccReader(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)},
		{"DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors.", prometheus.CounterValue, retiredReader(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)},
		{"DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors.", prometheus.CounterValue, retiredReader(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)},
		{"DCGM_FI_DEV_RETIRED_PENDING", "Total number of pages pending retirement.", prometheus.CounterValue, func(d nvml.Device) (float64, bool) {
			s, ret := d.GetRetiredPagesPendingStatus()
			return boolValue(s == nvml.FEATURE_ENABLED), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", prometheus.CounterValue, func(d nvml.Device) (float64, bool) {
			corr, _, _, _, ret := d.GetRemappedRows()
			return float64(corr), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", prometheus.CounterValue, func(d nvml.Device) (float64, bool) {
			_, unc, _, _, ret := d.GetRemappedRows()
			return float64(unc), ret == nvml.SUCCESS
		}},
		{"DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", prometheus.GaugeValue, func(d nvml.Device) (float64, bool) {
			_, _, _, failed, ret := d.GetRemappedRows()
			return boolValue(failed), ret == nvml.SUCCESS
		}},
	}
}

// memoryInfo returns the framebuffer's use as DCGM reads it
// (DcgmCacheManager::ReadAndCacheFBMemoryInfo): nvmlDeviceGetMemoryInfo_v2, whose used
// excludes the memory the driver reserves, or, where the driver has no v2,
// nvmlDeviceGetMemoryInfo. A panic in the binding (a mock leaving a function unset)
// counts as "not supported".
func memoryInfo(d nvml.Device) (m nvml.Memory, ok bool) {
	if v2, ret := safeMemoryInfoV2(d); ret == nvml.SUCCESS {
		return nvml.Memory{Total: v2.Total, Free: v2.Free, Used: v2.Used}, true
	}
	m, ret := d.GetMemoryInfo()
	return m, ret == nvml.SUCCESS
}

func safeMemoryInfoV2(d nvml.Device) (m nvml.Memory_v2, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			m, ret = nvml.Memory_v2{}, nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return d.GetMemoryInfo_v2()
}

// maxMemoryTemp is the highest memory temperature DCGM accepts from NVML, in °C
// (DcgmCacheManager: a reading above 200 is an error).
const maxMemoryTemp = 200

// readMemoryTemp reads NVML_FI_DEV_MEMORY_TEMP, the field DCGM_FI_DEV_MEMORY_TEMP comes
// from (HBM GPUs report it; others answer not supported).
func readMemoryTemp(d nvml.Device) (float64, bool) {
	v := []nvml.FieldValue{{FieldId: nvml.FI_DEV_MEMORY_TEMP}}
	if d.GetFieldValues(v) != nvml.SUCCESS || nvml.Return(v[0].NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	c := fieldUint(v[0])
	return float64(c), c <= maxMemoryTemp
}

func eccReader(kind nvml.MemoryErrorType, counter nvml.EccCounterType) func(nvml.Device) (float64, bool) {
	return func(d nvml.Device) (float64, bool) {
		v, ret := d.GetTotalEccErrors(kind, counter)
		return float64(v), ret == nvml.SUCCESS
	}
}

func retiredReader(cause nvml.PageRetirementCause) func(nvml.Device) (float64, bool) {
	return func(d nvml.Device) (float64, bool) {
		pages, ret := d.GetRetiredPages(cause)
		return float64(len(pages)), ret == nvml.SUCCESS
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// xidField is dcgm-exporter's DCGM_FI_DEV_XID_ERRORS: the last Xid seen (0: none).
const (
	xidField = "DCGM_FI_DEV_XID_ERRORS"
	xidHelp  = "Value of the last XID error encountered."
)

// healthStates are the values of gangrun_gpu_health's state label.
func healthStates() []topology.HealthState {
	return []topology.HealthState{topology.Healthy, topology.Degraded, topology.Failed}
}

// GPUCollector exports the node's GPUs: dcgm-exporter's fields read through NVML (when
// the node has it), each GPU's health and identity, each labelled with the job holding
// the GPU. Readings are taken when a scrape comes and serve the scrapes of the next
// CacheTTL.
type GPUCollector struct {
	cfg    GPUConfig
	fields []dcgmField
	descs  []*prometheus.Desc
	xid    *prometheus.Desc
	info   *prometheus.Desc
	health *prometheus.Desc
	nvlink nvlinkSeries
	prof   []*prometheus.Desc // gpmFields' descriptions

	mu       sync.Mutex
	prevNV   map[int]nvlinkReading // each GPU's last NVLink reading
	gpm      *gpmReader            // nil without NVML
	driver   string                // the driver's version, once read
	at       time.Time
	readings []gpuReading
	lastXid  map[int]uint64
}

// gpuReading is one GPU's readings at one time.
type gpuReading struct {
	gpu    topology.GPU
	labels []string // gpuLabelNames()' values
	values []float64
	has    []bool
	// nv is the NVLink reading (hasNV: NVML gave one); txRate and rxRate the rates
	// since the one before (hasRate: there was one).
	nv             nvlinkReading
	hasNV, hasRate bool
	txRate, rxRate float64
	// prof and hasProf are the profiling fields (gpmFields order) since the reading
	// before.
	prof    []float64
	hasProf []bool
}

// NewGPUCollector returns the collector for cfg.
func NewGPUCollector(cfg GPUConfig) *GPUCollector {
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	c := &GPUCollector{cfg: cfg, fields: dcgmFields(), lastXid: map[int]uint64{}, prevNV: map[int]nvlinkReading{}, nvlink: newNVLinkSeries(),
		prof: gpmDescs()}
	if cfg.NVML != nil {
		c.gpm = newGPMReader(cfg.NVML)
	}
	for _, f := range c.fields {
		c.descs = append(c.descs, prometheus.NewDesc(f.name, f.help, gpuLabelNames(), nil))
	}
	c.xid = prometheus.NewDesc(xidField, xidHelp, gpuLabelNames(), nil)
	c.info = prometheus.NewDesc("gangrun_gpu_info", "A GPU of the node (1), labelled as dcgm-exporter labels it and with the job holding it.", gpuLabelNames(), nil)
	c.health = prometheus.NewDesc("gangrun_gpu_health", "The GPU's health as the agent knows it: 1 for its state (healthy, degraded, failed), 0 for the others.",
		[]string{"gpu", "UUID", "Hostname", "state"}, nil)
	return c
}

// Describe implements prometheus.Collector.
func (c *GPUCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.xid
	ch <- c.info
	ch <- c.health
	c.nvlink.describe(ch)
	for _, d := range c.prof {
		ch <- d
	}
}

// Close frees what the collector holds in NVML (the GPM samples); call it before
// shutting NVML down. A scrape after Close allocates them again.
func (c *GPUCollector) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gpm != nil {
		c.gpm.close()
	}
}

// NoteHealth records a GPU health change the agent saw (its Xid, when it carried one),
// for DCGM_FI_DEV_XID_ERRORS.
func (c *GPUCollector) NoteHealth(ch topology.GPUHealthChange) {
	if ch.Xid == 0 {
		return
	}
	c.mu.Lock()
	c.lastXid[ch.Index] = ch.Xid
	c.mu.Unlock()
}

// Collect implements prometheus.Collector.
func (c *GPUCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	readings, xids := c.read(ctx)
	for _, r := range readings {
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, r.labels...)
		state := r.gpu.Health.State
		if state == "" {
			state = topology.Healthy
		}
		for _, s := range healthStates() {
			ch <- prometheus.MustNewConstMetric(c.health, prometheus.GaugeValue, boolValue(s == state), r.labels[labelGPU], r.labels[labelUUID], r.labels[labelHostname], string(s))
		}
		if c.cfg.NVML == nil {
			continue
		}
		for i, f := range c.fields {
			if r.has[i] {
				ch <- prometheus.MustNewConstMetric(c.descs[i], f.kind, r.values[i], r.labels...)
			}
		}
		ch <- prometheus.MustNewConstMetric(c.xid, prometheus.GaugeValue, float64(xids[r.gpu.Index]), r.labels...)
		if r.hasNV {
			ch <- prometheus.MustNewConstMetric(c.nvlink.txTotal, prometheus.CounterValue, float64(r.nv.tx), r.labels...)
			ch <- prometheus.MustNewConstMetric(c.nvlink.rxTotal, prometheus.CounterValue, float64(r.nv.rx), r.labels...)
		}
		if r.hasRate {
			ch <- prometheus.MustNewConstMetric(c.nvlink.txRate, prometheus.GaugeValue, r.txRate, r.labels...)
			ch <- prometheus.MustNewConstMetric(c.nvlink.rxRate, prometheus.GaugeValue, r.rxRate, r.labels...)
			ch <- prometheus.MustNewConstMetric(c.nvlink.bandwidth, prometheus.CounterValue, dcgmBandwidth(r.txRate, r.rxRate), r.labels...)
		}
		for i, ok := range r.hasProf {
			if ok {
				ch <- prometheus.MustNewConstMetric(c.prof[i], prometheus.GaugeValue, r.prof[i], r.labels...)
			}
		}
	}
}

// Utilization returns each GPU's utilisation in percent (by NVML index), from readings
// at most CacheTTL old; ok is false without NVML.
func (c *GPUCollector) Utilization(ctx context.Context) (map[int]float64, bool) {
	if c.cfg.NVML == nil {
		return nil, false
	}
	readings, _ := c.read(ctx)
	out := map[int]float64{}
	for _, r := range readings {
		if r.has[0] { // DCGM_FI_DEV_GPU_UTIL
			out[r.gpu.Index] = r.values[0]
		}
	}
	return out, true
}

// read returns the readings, taking new ones when the cached ones are older than
// CacheTTL, and the last Xid of each GPU.
func (c *GPUCollector) read(ctx context.Context) ([]gpuReading, map[int]uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readings == nil || time.Since(c.at) >= c.cfg.CacheTTL {
		c.readings, c.at = c.sample(ctx), time.Now()
	}
	xids := make(map[int]uint64, len(c.lastXid))
	for k, v := range c.lastXid {
		xids[k] = v
	}
	return c.readings, xids
}

// sample reads every GPU of the inventory; the caller holds c.mu.
func (c *GPUCollector) sample(ctx context.Context) []gpuReading {
	inv := c.cfg.Inventory()
	var holders map[int]JobLabels
	if c.cfg.Holders != nil {
		holders, _ = c.cfg.Holders(ctx)
	}
	if c.driver == "" && c.cfg.NVML != nil {
		c.driver = driverVersion(c.cfg.NVML)
	}
	out := make([]gpuReading, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		j := holders[g.Index]
		r := gpuReading{gpu: g, labels: []string{strconv.Itoa(g.Index), g.UUID, nvmlBusID(g.PCIBusID), "nvidia" + strconv.Itoa(g.Minor),
			g.Name, c.cfg.Node, c.driver, j.ID, j.User, j.Name}}
		if c.cfg.NVML != nil {
			r.values, r.has = make([]float64, len(c.fields)), make([]bool, len(c.fields))
			if dev, ret := c.cfg.NVML.DeviceGetHandleByIndex(g.Index); ret == nvml.SUCCESS {
				for i, f := range c.fields {
					r.values[i], r.has[i] = safeRead(f.read, dev)
				}
				r.prof, r.hasProf = c.gpm.read(g.Index, dev)
				if r.nv, r.hasNV = readNVLink(dev); r.hasNV {
					prev, ok := c.prevNV[g.Index]
					r.txRate, r.rxRate, r.hasRate = nvlinkRate(prev, r.nv, ok)
					c.prevNV[g.Index] = r.nv
				}
			}
		}
		out = append(out, r)
	}
	return out
}

// driverVersion returns the driver's version (nvmlSystemGetDriverVersion, what DCGM's
// DCGM_FI_DRIVER_VERSION holds), or "" when NVML cannot tell.
func driverVersion(lib nvml.Interface) (v string) {
	defer func() {
		if recover() != nil {
			v = ""
		}
	}()
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		return v
	}
	return ""
}

// safeRead calls read, turning a panic inside the binding (a function a mock leaves
// unset, a broken library) into "not supported": a scrape never crashes the agent.
func safeRead(read func(nvml.Device) (float64, bool), dev nvml.Device) (v float64, ok bool) {
	defer func() {
		if recover() != nil {
			v, ok = 0, false
		}
	}()
	return read(dev)
}

// nvmlBusID turns the inventory's sysfs bus id ("0000:1b:00.0") into NVML's form
// ("00000000:1B:00.0"), the one dcgm-exporter's pci_bus_id label carries.
func nvmlBusID(sysfs string) string {
	dom, rest, ok := strings.Cut(sysfs, ":")
	if !ok {
		return strings.ToUpper(sysfs)
	}
	n, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return strings.ToUpper(sysfs)
	}
	return fmt.Sprintf("%08X:%s", n, strings.ToUpper(rest))
}
