package metrics

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gangrun/gangrun/topology"
)

// mockNode is a go-nvml mock server whose GPUs read the values the test sets: GPU i
// is 10·i % busy, uses i GiB (512 MiB more reserved), draws 100+i W, has used
// 1,000,000·(i+1) mJ, runs at 40+i °C (its HBM at 60+i) and 1980 MHz, encodes at i %,
// decodes at 2·i %, has retried 3·i PCIe transfers, and has i correctable ECC errors
// and i remapped rows (on Ampere and later). go-nvml's mocks implement none of the
// GPM, energy, encoder, decoder, replay or v2 memory calls: the test sets them on the
// mock's own function fields (extendWithGPM and below), as NVML answers them.
type mockNode struct {
	srv   *server.Server
	inv   *topology.Inventory
	util  []atomic.Uint32 // settable while the test runs
	reads atomic.Int64    // GetUtilizationRates calls
	// nvKiB is each GPU's NVLink data counter per active link (KiB, both directions:
	// RX counts twice TX), nvClock NVML's timestamp of the readings (µs): settable.
	nvKiB   []atomic.Uint64
	nvClock atomic.Int64
	// tensor is each GPU's tensor-pipe activity (%) its next GPM sample records;
	// energy its energy counter (mJ): settable. gpmGets counts GPM samples taken.
	tensor  []atomic.Uint32
	energy  []atomic.Uint64
	gpmGets atomic.Int64
}

// mockGPMSample is a GPM sample of the mock (nvml.GpmSample through go-nvml's own
// mock.GpmSample): what GpmSampleGet recorded in it.
type mockGPMSample struct {
	mock.GpmSample
	taken  bool
	gpu    int
	seq    int64
	tensor uint32
}

// Mock GPM readings: GPU i's graphics engine 10·i % busy (its utilisation), DRAM
// 20+i %, PCIe 100+i MiB/s out and 200+i in, tensor pipes as set.
func (m *mockNode) gpmMetric(s *mockGPMSample, id nvml.GpmMetricId) (float64, bool) {
	switch id {
	case nvml.GPM_METRIC_GRAPHICS_UTIL:
		return float64(m.util[s.gpu].Load()), true
	case nvml.GPM_METRIC_ANY_TENSOR_UTIL:
		return float64(s.tensor), true
	case nvml.GPM_METRIC_DRAM_BW_UTIL:
		return float64(20 + s.gpu), true
	case nvml.GPM_METRIC_PCIE_TX_PER_SEC:
		return float64(100 + s.gpu), true
	case nvml.GPM_METRIC_PCIE_RX_PER_SEC:
		return float64(200 + s.gpu), true
	}
	return 0, false
}

// extendWithGPM gives the mock server the GPM, energy, memory-temperature and
// other calls go-nvml's DGX mocks leave unset, as NVML answers them: GPM on Hopper and
// later only (nvmlGpmQueryDeviceSupport), samples allocated by the library, metrics
// computed between two samples of one GPU taken in order.
func (m *mockNode) extendWithGPM() {
	m.srv.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) { return &mockGPMSample{}, nvml.SUCCESS }
	m.srv.GpmSampleFreeFunc = func(nvml.GpmSample) nvml.Return { return nvml.SUCCESS }
	m.srv.GpmMetricsGetFunc = func(mg *nvml.GpmMetricsGetType) nvml.Return {
		s1, ok1 := mg.Sample1.(*mockGPMSample)
		s2, ok2 := mg.Sample2.(*mockGPMSample)
		if !ok1 || !ok2 || !s1.taken || !s2.taken || s1.gpu != s2.gpu || s1.seq >= s2.seq || mg.NumMetrics > uint32(len(mg.Metrics)) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for i := range mg.Metrics[:mg.NumMetrics] {
			v, ok := m.gpmMetric(s2, nvml.GpmMetricId(mg.Metrics[i].MetricId))
			mg.Metrics[i].Value, mg.Metrics[i].NvmlReturn = v, uint32(nvml.SUCCESS)
			if !ok {
				mg.Metrics[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
		}
		return nvml.SUCCESS
	}
}

// mockNVLinks is how many active NVLinks a mock GPU has: 18 on Hopper, 12 on Ampere.
func mockNVLinks(arch nvml.DeviceArchitecture) int {
	if arch >= nvml.DEVICE_ARCH_HOPPER {
		return 18
	}
	return 12
}

func newMockNode(t testing.TB, srv *server.Server, node string) *mockNode {
	t.Helper()
	m := &mockNode{srv: srv, inv: &topology.Inventory{SchemaVersion: topology.SchemaVersion, Node: node}, util: make([]atomic.Uint32, len(srv.Devices)),
		nvKiB: make([]atomic.Uint64, len(srv.Devices)), tensor: make([]atomic.Uint32, len(srv.Devices)), energy: make([]atomic.Uint64, len(srv.Devices))}
	m.nvClock.Store(1_000_000)
	m.extendWithGPM()
	for i, dv := range srv.Devices {
		d := dv.(*server.Device)
		m.util[i].Store(uint32(10 * i))
		ampere := d.Config.Architecture >= nvml.DEVICE_ARCH_AMPERE
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			m.reads.Add(1)
			return nvml.Utilization{Gpu: m.util[i].Load(), Memory: uint32(5 * i)}, nvml.SUCCESS
		}
		total := d.MemoryInfo.Total
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			used := uint64(i) << 30
			return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { // 512 MiB reserved by the driver
			used, reserved := uint64(i)<<30, uint64(512)<<20
			return nvml.Memory_v2{Total: total, Reserved: reserved, Used: used, Free: total - used - reserved}, nvml.SUCCESS
		}
		m.energy[i].Store(uint64(1_000_000 * (i + 1)))
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return m.energy[i].Load(), nvml.SUCCESS }
		d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return uint32(i), 167_000, nvml.SUCCESS }
		d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return uint32(2 * i), 167_000, nvml.SUCCESS }
		d.GetPcieReplayCounterFunc = func() (int, nvml.Return) { return 3 * i, nvml.SUCCESS }
		hopper := d.Config.Architecture >= nvml.DEVICE_ARCH_HOPPER
		d.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) {
			return nvml.GpmSupport{Version: nvml.GPM_SUPPORT_VERSION, IsSupportedDevice: uint32(boolValue(hopper))}, nvml.SUCCESS
		}
		d.GpmSampleGetFunc = func(s nvml.GpmSample) nvml.Return {
			ms, ok := s.(*mockGPMSample)
			if !hopper || !ok {
				return nvml.ERROR_NOT_SUPPORTED
			}
			ms.taken, ms.gpu, ms.seq, ms.tensor = true, i, m.gpmGets.Add(1), m.tensor[i].Load()
			return nvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return uint32(100_000 + 1000*i), nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(40 + i), nvml.SUCCESS }
		d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			if c == nvml.CLOCK_SM {
				return 1980, nvml.SUCCESS
			}
			return 2619, nvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(kind nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
			if kind == nvml.MEMORY_ERROR_TYPE_CORRECTED {
				return uint64(i), nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) {
			if ampere {
				return nil, nvml.ERROR_NOT_SUPPORTED // row remapping replaced page retirement
			}
			return nil, nvml.SUCCESS
		}
		d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
			if ampere {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			if !ampere {
				return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
			}
			return i, 0, false, false, nvml.SUCCESS
		}
		links := mockNVLinks(d.Config.Architecture)
		d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l < links {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
			for k := range values {
				v := &values[k]
				if v.FieldId == nvml.FI_DEV_MEMORY_TEMP { // HBM: 60+i °C
					v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
					binary.LittleEndian.PutUint32(v.Value[:], uint32(60+i))
					v.NvmlReturn = uint32(nvml.SUCCESS)
					continue
				}
				kib := m.nvKiB[i].Load()
				if v.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX {
					kib *= 2
				}
				v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
				binary.LittleEndian.PutUint64(v.Value[:], kib)
				v.Timestamp = m.nvClock.Load()
				v.NvmlReturn = uint32(nvml.SUCCESS)
			}
			return nvml.SUCCESS
		}
		name, _ := d.GetName()
		m.inv.GPUs = append(m.inv.GPUs, topology.GPU{Index: i, UUID: d.UUID, Name: name, MemoryBytes: total,
			PCIBusID: strings.ToLower(d.PciBusID), Minor: d.Minor, NUMANode: -1, Health: topology.Health{State: topology.Healthy}})
	}
	return m
}

// gather collects c once and returns its series by name.
func gather(t testing.TB, c prometheus.Collector) map[string][]*dto.Metric {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*dto.Metric{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetMetric()
	}
	return out
}

// series returns the value of the series of name whose labels include want.
func series(t testing.TB, fams map[string][]*dto.Metric, name string, want map[string]string) (float64, bool) {
	t.Helper()
	for _, m := range fams[name] {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		}
	}
	return 0, false
}

// TestGPUMetricsFromNVML: on a DGX H100 (go-nvml's mock, values set by the test) every
// GPU exports dcgm-exporter's fields under its names and labels (the driver's version as
// DCGM_FI_DRIVER_VERSION), with the job holding the GPU; framebuffer use as memory info
// v2 gives it (reserved memory apart); Hopper has no page retirement, so no DCGM_FI_DEV_RETIRED_* series; the last
// Xid the health watch saw is DCGM_FI_DEV_XID_ERRORS; a second scrape within the cache
// TTL does not read NVML again.
func TestGPUMetricsFromNVML(t *testing.T) {
	m := newMockNode(t, dgxh100.New(), "gpu-h1")
	c := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-h1", Inventory: func() *topology.Inventory { return m.inv }, CacheTTL: time.Hour,
		Holders: func(context.Context) (map[int]JobLabels, error) {
			return map[int]JobLabels{0: {ID: "7", User: "alice", Name: "llama", IsJob: true}, 1: {ID: "7", User: "alice", Name: "llama", IsJob: true}}, nil
		}})
	c.NoteHealth(topology.GPUHealthChange{Index: 5, Xid: 79})
	fams := gather(t, c)

	g3 := m.inv.GPUs[3]
	labels3 := map[string]string{"gpu": "3", "UUID": g3.UUID, "pci_bus_id": nvmlBusID(g3.PCIBusID), "device": "nvidia3",
		"modelName": g3.Name, "Hostname": "gpu-h1", "DCGM_FI_DRIVER_VERSION": "550.54.15", "hpc_job": ""}
	for name, want := range map[string]float64{
		"DCGM_FI_DEV_GPU_UTIL": 30, "DCGM_FI_DEV_MEM_COPY_UTIL": 15, "DCGM_FI_DEV_FB_USED": 3 * 1024, "DCGM_FI_DEV_FB_RESERVED": 512,
		"DCGM_FI_DEV_FB_FREE": float64(g3.MemoryBytes>>20) - 3*1024 - 512, "DCGM_FI_DEV_POWER_USAGE": 103, "DCGM_FI_DEV_GPU_TEMP": 43,
		"DCGM_FI_DEV_MEMORY_TEMP": 63, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 4_000_000, "DCGM_FI_DEV_ENC_UTIL": 3, "DCGM_FI_DEV_DEC_UTIL": 6,
		"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 9,
		"DCGM_FI_DEV_SM_CLOCK":            1980, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
		"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 3, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
		"DCGM_FI_DEV_XID_ERRORS": 0, "gangrun_gpu_info": 1,
	} {
		if got, ok := series(t, fams, name, labels3); !ok || got != want {
			t.Errorf("%s{gpu 3}: got %v (present %v), want %v", name, got, ok, want)
		}
	}
	if got, _ := series(t, fams, "DCGM_FI_DEV_XID_ERRORS", map[string]string{"gpu": "5"}); got != 79 {
		t.Errorf("DCGM_FI_DEV_XID_ERRORS{gpu 5}: got %v, want 79 (the Xid the health watch saw)", got)
	}
	if got, ok := series(t, fams, "DCGM_FI_DEV_GPU_UTIL", map[string]string{"gpu": "1", "hpc_job": "7", "hpc_user": "alice", "hpc_job_name": "llama"}); !ok || got != 10 {
		t.Errorf("GPU 1 held by job 7: got %v (present %v), want 10 with the job's labels", got, ok)
	}
	if got, _ := series(t, fams, "gangrun_gpu_health", map[string]string{"gpu": "2", "state": "healthy"}); got != 1 {
		t.Errorf("gangrun_gpu_health{gpu 2, healthy}: %v, want 1", got)
	}
	for _, name := range []string{"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"} {
		if n := len(fams[name]); n != 0 {
			t.Errorf("%s: %d series on Hopper, which has no page retirement", name, n)
		}
	}
	if n := len(fams["DCGM_FI_DEV_GPU_UTIL"]); n != 8 {
		t.Errorf("DCGM_FI_DEV_GPU_UTIL: %d series, want 8", n)
	}

	reads := m.reads.Load()
	m.util[3].Store(99)
	fams = gather(t, c)
	if m.reads.Load() != reads {
		t.Errorf("a scrape within the cache TTL read NVML again")
	}
	if got, _ := series(t, fams, "DCGM_FI_DEV_GPU_UTIL", map[string]string{"gpu": "3"}); got != 30 {
		t.Errorf("a cached reading changed: %v", got)
	}
}

// TestGPUMetricsCacheExpires: after the TTL the next scrape reads NVML afresh.
func TestGPUMetricsCacheExpires(t *testing.T) {
	m := newMockNode(t, dgxa100.New(), "gpu-a1")
	c := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-a1", Inventory: func() *topology.Inventory { return m.inv }, CacheTTL: 20 * time.Millisecond})
	gather(t, c)
	m.util[3].Store(77)
	time.Sleep(30 * time.Millisecond)
	fams := gather(t, c)
	if got, _ := series(t, fams, "DCGM_FI_DEV_GPU_UTIL", map[string]string{"gpu": "3"}); got != 77 {
		t.Errorf("after the TTL: %v, want 77", got)
	}
	// Ampere has no retired pages either (row remapping), but the pending status answers
	// not supported: no series.
	if n := len(fams["DCGM_FI_DEV_RETIRED_PENDING"]); n != 0 {
		t.Errorf("DCGM_FI_DEV_RETIRED_PENDING: %d series", n)
	}
}

// TestGPUMetricsFromRecordedInventory: without NVML (a recorded inventory) only what
// the inventory knows is exported — each GPU's identity and health, with its job —
// and no reading is made up.
func TestGPUMetricsFromRecordedInventory(t *testing.T) {
	inv, err := topology.LoadFile("../topology/testdata/inventories/dgx-h100.json")
	if err != nil {
		t.Fatal(err)
	}
	inv.GPUs[2].Health = topology.Health{State: topology.Failed, Reasons: []string{"Xid 79"}}
	c := NewGPUCollector(GPUConfig{Node: "rec", Inventory: func() *topology.Inventory { return inv }})
	fams := gather(t, c)
	for name := range fams {
		if strings.HasPrefix(name, "DCGM_") {
			t.Errorf("%s exported without NVML", name)
		}
	}
	if n := len(fams["gangrun_gpu_info"]); n != len(inv.GPUs) {
		t.Errorf("gangrun_gpu_info: %d series, want %d", n, len(inv.GPUs))
	}
	if got, _ := series(t, fams, "gangrun_gpu_health", map[string]string{"gpu": "2", "state": "failed"}); got != 1 {
		t.Errorf("GPU 2 failed: gangrun_gpu_health %v", got)
	}
}

// TestPromtoolChecksTheExposition: Prometheus' own promtool (Debian's prometheus
// package) parses the exposition of a DGX A100's agent. Its lint findings are allowed
// only on dcgm-exporter's metrics, whose names and labels are fixed by dcgm-exporter
// (upper case, counters without _total), and on the camelCase label of gangrun's
// per-GPU series (modelName: they carry dcgm-exporter's labels, to join on); gangrun's
// others are clean.
func TestPromtoolChecksTheExposition(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/install-deps.sh prometheus)")
	}
	m := newMockNode(t, dgxa100.New(), "gpu-a1")
	gpus := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-a1", Inventory: func() *topology.Inventory { return m.inv }})
	srv := httptest.NewServer(Handler(gpus))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != 0 && code != 3 { // 3: lint findings only
		t.Fatalf("promtool check metrics: exit %d:\n%s", code, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dcgmLabels := strings.HasPrefix(line, "gangrun_gpu_") && strings.HasSuffix(line, "label names should be written in 'snake_case' not 'camelCase'")
		if line != "" && !strings.HasPrefix(line, "DCGM_FI_") && !dcgmLabels {
			t.Errorf("promtool: %s", line)
		}
	}
	for _, name := range []string{"DCGM_FI_DEV_GPU_UTIL{", "gangrun_gpu_nvlink_tx_bytes_total{"} {
		if !bytes.Contains(body, []byte(name)) {
			t.Errorf("no %s in the exposition:\n%s", name, body)
		}
	}
	t.Logf("promtool on %d bytes: exit %d, %d findings on dcgm-exporter's names", len(body), code, strings.Count(string(out), "\n"))
}

// TestNVLinkThroughput: a GPU's NVLink data counters, read per active link through
// NVML's field values, are exported summed in bytes; from the second reading on, the
// rates between the last two (by NVML's timestamps) under dcgm-exporter's
// DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES; a counter that went back (a driver reload) gives no
// rate; a GPU whose NVML has no such field exports none of them.
func TestNVLinkThroughput(t *testing.T) {
	m := newMockNode(t, dgxh100.New(), "gpu-h1")
	c := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-h1", Inventory: func() *topology.Inventory { return m.inv }, CacheTTL: time.Nanosecond})
	m.nvKiB[2].Store(1000)
	fams := gather(t, c)
	gpu2 := map[string]string{"gpu": "2", "Hostname": "gpu-h1"}
	if got, ok := series(t, fams, "gangrun_gpu_nvlink_tx_bytes_total", gpu2); !ok || got != 18*1000*1024 {
		t.Errorf("tx bytes: %v (present %v), want 18 links × 1000 KiB", got, ok)
	}
	if got, ok := series(t, fams, "gangrun_gpu_nvlink_rx_bytes_total", gpu2); !ok || got != 18*2000*1024 {
		t.Errorf("rx bytes: %v (present %v), want 18 links × 2000 KiB", got, ok)
	}
	if n := len(fams["DCGM_FI_PROF_NVLINK_TX_BYTES"]); n != 0 {
		t.Errorf("%d rates after one reading, want none", n)
	}

	// 500 ms later by NVML's clock, 50,000 KiB more on each of GPU 2's 18 links.
	m.nvKiB[2].Store(51_000)
	m.nvClock.Add(500_000)
	time.Sleep(time.Millisecond)
	fams = gather(t, c)
	wantTx := 18 * 50_000 * 1024 / 0.5
	if got, ok := series(t, fams, "DCGM_FI_PROF_NVLINK_TX_BYTES", gpu2); !ok || got != wantTx {
		t.Errorf("tx rate: %v B/s (present %v), want %v", got, ok, wantTx)
	}
	if got, ok := series(t, fams, "DCGM_FI_PROF_NVLINK_RX_BYTES", gpu2); !ok || got != 2*wantTx {
		t.Errorf("rx rate: %v B/s (present %v), want %v", got, ok, 2*wantTx)
	}
	// DCGM's value: (ΔKiB RX + TX) / Δs / 1000 = 18 links × 150,000 KiB / 0.5 s / 1000.
	if got, ok := series(t, fams, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu2); !ok || math.Abs(got-18*150_000/0.5/1000) > 1e-6 {
		t.Errorf("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL: %v (present %v), want %v", got, ok, 18*150_000/0.5/1000)
	}
	if got, ok := series(t, fams, "DCGM_FI_PROF_NVLINK_TX_BYTES", map[string]string{"gpu": "3"}); !ok || got != 0 {
		t.Errorf("idle GPU 3's tx rate: %v (present %v), want 0", got, ok)
	}

	m.nvKiB[2].Store(10) // the driver was reloaded: the counters start again
	m.nvClock.Add(500_000)
	time.Sleep(time.Millisecond)
	fams = gather(t, c)
	if _, ok := series(t, fams, "DCGM_FI_PROF_NVLINK_TX_BYTES", gpu2); ok {
		t.Errorf("a rate across a counter reset")
	}

	d := m.srv.Devices[4].(*server.Device)
	d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	m.nvClock.Add(500_000)
	time.Sleep(time.Millisecond)
	fams = gather(t, c)
	for _, name := range []string{"gangrun_gpu_nvlink_tx_bytes_total", "gangrun_gpu_nvlink_rx_bytes_total", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
		"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} {
		if _, ok := series(t, fams, name, map[string]string{"gpu": "4"}); ok {
			t.Errorf("%s for a GPU whose NVML has no NVLink counters", name)
		}
	}
}

// TestProfilingFieldsFromGPM: on Hopper the profiling fields dcgm-exporter enables by
// default come from NVML's GPM between a scrape's sample and the previous one — none on
// the first scrape, then the graphics engine, tensor pipes and DRAM as ratios (GPM's
// percent / 100) and PCIe in bytes per second (GPM's MiB/s × 2^20), following the tensor
// activity the GPU reports; an Ampere GPU, which has no GPM, exports none of them and
// still exports its other fields; Close frees the samples.
func TestProfilingFieldsFromGPM(t *testing.T) {
	prof := []string{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
		"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}
	m := newMockNode(t, dgxh100.New(), "gpu-h1")
	freed := 0
	m.srv.GpmSampleFreeFunc = func(nvml.GpmSample) nvml.Return { freed++; return nvml.SUCCESS }
	c := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-h1", Inventory: func() *topology.Inventory { return m.inv }, CacheTTL: time.Nanosecond})
	fams := gather(t, c)
	for _, name := range prof {
		if n := len(fams[name]); n != 0 {
			t.Errorf("%s: %d series after one GPM sample, want none", name, n)
		}
	}
	m.tensor[2].Store(87)
	time.Sleep(time.Millisecond)
	fams = gather(t, c)
	gpu2 := map[string]string{"gpu": "2", "Hostname": "gpu-h1"}
	for name, want := range map[string]float64{
		"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.2, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.87, "DCGM_FI_PROF_DRAM_ACTIVE": 0.22,
		"DCGM_FI_PROF_PCIE_TX_BYTES": 102 << 20, "DCGM_FI_PROF_PCIE_RX_BYTES": 202 << 20,
	} {
		if got, ok := series(t, fams, name, gpu2); !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s{gpu 2}: %v (present %v), want %v", name, got, ok, want)
		}
		if n := len(fams[name]); n != 8 {
			t.Errorf("%s: %d series, want 8", name, n)
		}
	}
	m.tensor[2].Store(5)
	time.Sleep(time.Millisecond)
	if got, _ := series(t, gather(t, c), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu2); math.Abs(got-0.05) > 1e-9 {
		t.Errorf("tensor activity after it dropped: %v, want 0.05", got)
	}
	c.Close()
	if freed != 16 {
		t.Errorf("Close freed %d GPM samples, want 2 per GPU (16)", freed)
	}

	a := newMockNode(t, dgxa100.New(), "gpu-a1")
	ca := NewGPUCollector(GPUConfig{NVML: a.srv, Node: "gpu-a1", Inventory: func() *topology.Inventory { return a.inv }, CacheTTL: time.Nanosecond})
	gather(t, ca)
	time.Sleep(time.Millisecond)
	fams = gather(t, ca)
	for _, name := range prof {
		if n := len(fams[name]); n != 0 {
			t.Errorf("%s: %d series on Ampere, which has no GPM", name, n)
		}
	}
	if n := len(fams["DCGM_FI_DEV_GPU_UTIL"]); n != 8 {
		t.Errorf("Ampere: %d DCGM_FI_DEV_GPU_UTIL series, want 8", n)
	}
	if a.gpmGets.Load() != 0 {
		t.Errorf("GPM samples taken on Ampere: %d", a.gpmGets.Load())
	}

	// A binding without GPM at all (go-nvml's mock as shipped): no profiling series, no crash.
	h := newMockNode(t, dgxh100.New(), "gpu-h2")
	h.srv.GpmSampleAllocFunc = nil
	ch := NewGPUCollector(GPUConfig{NVML: h.srv, Node: "gpu-h2", Inventory: func() *topology.Inventory { return h.inv }, CacheTTL: time.Nanosecond})
	gather(t, ch)
	time.Sleep(time.Millisecond)
	if n := len(gather(t, ch)["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]); n != 0 {
		t.Errorf("%d tensor series without the GPM calls", n)
	}
}
