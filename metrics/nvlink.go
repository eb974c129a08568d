package metrics

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

// NVLink throughput. NVML counts each link's data (payload, no protocol headers)
// transmitted and received in KiB, as the field values NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
// and _RX with the link's number as scopeId (nvml.h; Hopper's drivers and later). A
// scrape reads them on every active link and exports their sums as counters in bytes
// (gangrun_gpu_nvlink_{tx,rx}_bytes_total) and, from the last two readings and NVML's
// own timestamps, the rates under dcgm-exporter's names DCGM_FI_PROF_NVLINK_TX_BYTES and
// DCGM_FI_PROF_NVLINK_RX_BYTES (gauges, B/s, data without headers, as dcgm-exporter's
// profiling counters describe them) and DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (DCGM's
// value, below). A GPU whose NVML gives no such field (older drivers, no NVLink)
// exports none of the five.

// nvlinkReading is one GPU's NVLink data counters at one time: bytes over all active
// links, and NVML's timestamp of the reading (µs).
type nvlinkReading struct {
	tx, rx uint64
	at     int64
}

// nvlinkSeries are the NVLink series' descriptions.
type nvlinkSeries struct {
	txTotal, rxTotal, txRate, rxRate *prometheus.Desc
	// bandwidth is DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, which dcgm-exporter's default
	// counters enable (typed counter there). DCGM computes it
	// (DcgmCacheManager::ReadAndCacheNvLinkBandwidth) from the same NVML data counters
	// of every link, RX plus TX: the KiB since its previous reading divided by the
	// seconds between the two and by 1000, which DCGM labels MB/s
	// (DCGM_FIELD_UNIT_BW_MBPS): a rate, despite the counter type. It is exported with
	// DCGM's value and dcgm-exporter's type and help, so dashboards made for
	// dcgm-exporter read it as they do there.
	bandwidth *prometheus.Desc
}

func newNVLinkSeries() nvlinkSeries {
	l := gpuLabelNames()
	return nvlinkSeries{
		txTotal:   prometheus.NewDesc("gangrun_gpu_nvlink_tx_bytes_total", "NVLink data transmitted over all the GPU's active links, without protocol headers (NVML NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX), in bytes.", l, nil),
		rxTotal:   prometheus.NewDesc("gangrun_gpu_nvlink_rx_bytes_total", "NVLink data received over all the GPU's active links, without protocol headers (NVML NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX), in bytes.", l, nil),
		txRate:    prometheus.NewDesc("DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data not including protocol headers transmitted over NVLink (in B/s), between the last two readings.", l, nil),
		rxRate:    prometheus.NewDesc("DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data not including protocol headers received over NVLink (in B/s), between the last two readings.", l, nil),
		bandwidth: prometheus.NewDesc("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "Total number of NVLink bandwidth counters for all lanes.", l, nil),
	}
}

func (s nvlinkSeries) describe(ch chan<- *prometheus.Desc) {
	ch <- s.txTotal
	ch <- s.rxTotal
	ch <- s.txRate
	ch <- s.rxRate
	ch <- s.bandwidth
}

// dcgmBandwidth is DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL's value from the data rates in
// bytes per second: KiB/s of RX plus TX, divided by 1000, as DCGM computes it.
func dcgmBandwidth(txRate, rxRate float64) float64 {
	return (txRate + rxRate) / 1024 / 1000
}

// readNVLink returns d's NVLink data counters summed over its active links, and false
// when it has no active link or NVML gives no counter for one of them (a panic in the
// binding, as a mock without the function raises, counts as that).
func readNVLink(d nvml.Device) (r nvlinkReading, ok bool) {
	defer func() {
		if recover() != nil {
			r, ok = nvlinkReading{}, false
		}
	}()
	var fields []nvml.FieldValue
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		if st, ret := d.GetNvLinkState(l); ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
			continue
		}
		fields = append(fields,
			nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: uint32(l)},
			nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: uint32(l)})
	}
	if len(fields) == 0 || d.GetFieldValues(fields) != nvml.SUCCESS {
		return r, false
	}
	for _, f := range fields {
		if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
			return nvlinkReading{}, false
		}
		kib := fieldUint(f)
		if f.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX {
			r.tx += kib << 10
		} else {
			r.rx += kib << 10
		}
		r.at = max(r.at, f.Timestamp)
	}
	return r, true
}

// fieldUint returns a field value's number as NVML typed it (nvmlValueType_t: unsigned
// double, unsigned int, unsigned long, unsigned long long, signed long long, signed int, in the host's
// byte order, little-endian on every platform NVML ships for).
func fieldUint(f nvml.FieldValue) uint64 {
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		return uint64(math.Float64frombits(binary.LittleEndian.Uint64(f.Value[:])))
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(f.Value[:4]))
	default:
		return binary.LittleEndian.Uint64(f.Value[:])
	}
}

// nvlinkRate returns the bytes per second from prev to cur, and false when there is no
// previous reading, no time between them, or a counter went back (a driver reload).
func nvlinkRate(prev, cur nvlinkReading, havePrev bool) (tx, rx float64, ok bool) {
	if !havePrev || cur.at <= prev.at || cur.tx < prev.tx || cur.rx < prev.rx {
		return 0, 0, false
	}
	dt := time.Duration(cur.at-prev.at) * time.Microsecond
	return float64(cur.tx-prev.tx) / dt.Seconds(), float64(cur.rx-prev.rx) / dt.Seconds(), true
}
