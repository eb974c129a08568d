package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// scriptJSON is a results file as the bundled script writes it (two ranks, gloo).
const scriptJSON = `{"format": "gangrun-bench-script/1", "torch_version": "1.13.0a0", "backend": "gloo",
 "world_size": 2, "device": "cpu", "results": [
 {"op": "all_reduce", "rows": [
  {"op": "all_reduce", "size_bytes": 1024, "count": 256, "dtype": "float", "redop": "sum", "root": -1, "in_place": true, "time_us": 100.0, "wrong": 0},
  {"op": "all_reduce", "size_bytes": 2048, "count": 512, "dtype": "float", "redop": "sum", "root": -1, "in_place": true, "time_us": 50.0, "wrong": 3}]},
 {"op": "all_gather", "rows": [
  {"op": "all_gather", "size_bytes": 1024, "count": 128, "dtype": "float", "redop": "none", "root": -1, "in_place": false, "time_us": 10.24, "wrong": null}]},
 {"op": "reduce_scatter", "unsupported": "not supported by backend gloo (torch 1.13.0a0: ...)", "rows": []}]}`

func TestDecodeScript(t *testing.T) {
	res, err := DecodeScript(strings.NewReader(scriptJSON))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d results, want 3", len(res))
	}
	ar := res[0]
	if ar.Op != AllReduce || ar.Ranks != 2 || ar.Engine != "torch" || ar.Backend != "gloo" || ar.Device != "cpu" || len(ar.Rows) != 2 {
		t.Fatalf("all_reduce result %+v", ar)
	}
	// 1024 bytes in 100 us: algbw 0.01024 GB/s; busbw × 2(2−1)/2 = × 1.
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	if r := ar.Rows[0]; !near(r.AlgBW, 0.01024) || !near(r.BusBW, 0.01024) || Micros(r.Time) != 100 {
		t.Errorf("row 0 %+v", r)
	}
	if r := ar.Rows[1]; !near(r.AlgBW, 0.04096) || r.Wrong == nil || *r.Wrong != 3 {
		t.Errorf("row 1 %+v", r)
	}
	if !near(ar.AvgBusBW, (0.01024+0.04096)/2) {
		t.Errorf("avg %v", ar.AvgBusBW)
	}
	if total, checked := ar.Wrong(); total != 3 || !checked {
		t.Errorf("Wrong() = %d, %v", total, checked)
	}
	// all_gather on 2 ranks: busbw = algbw × 1/2; 1024 B in 10.24 us = 0.1 GB/s.
	if r := res[1].Rows[0]; !near(r.AlgBW, 0.1) || !near(r.BusBW, 0.05) || r.Wrong != nil {
		t.Errorf("all_gather row %+v", r)
	}
	if _, checked := res[1].Wrong(); checked {
		t.Error("all_gather: unchecked rows count as checked")
	}
	if rs := res[2]; rs.Unsupported == "" || len(rs.Rows) != 0 {
		t.Errorf("reduce_scatter %+v", rs)
	}
	if peak, ok := ar.PeakBusBW(); !ok || !near(peak, 0.04096) {
		t.Errorf("PeakBusBW = %v, %v", peak, ok)
	}
	if _, ok := res[2].PeakBusBW(); ok {
		t.Error("PeakBusBW of no rows: ok")
	}
}

func TestDecodeScriptErrors(t *testing.T) {
	cases := []struct {
		name, edit, with, err string
	}{
		{"format", `gangrun-bench-script/1`, `other/9`, `format "other/9"`},
		{"world", `"world_size": 2`, `"world_size": 0`, "world size 0"},
		{"count", `"count": 256`, `"count": 255`, "want 256 elements"},
		{"per-rank count", `"count": 128`, `"count": 256`, "want 128 elements"},
		{"dtype", `"dtype": "float", "redop": "none"`, `"dtype": "fp4", "redop": "none"`, `--dtype "fp4"`},
		{"time", `"time_us": 50.0`, `"time_us": 0`, "want a positive time"},
		{"op", `{"op": "all_reduce", "size_bytes": 2048`, `{"op": "alltoall", "size_bytes": 2048`, "alltoall row in the all_reduce result"},
		{"json", `"results": [`, `"results": {`, "benchmark script results"},
	}
	for _, c := range cases {
		in := strings.Replace(scriptJSON, c.edit, c.with, 1)
		if in == scriptJSON {
			t.Fatalf("%s: edit %q not found", c.name, c.edit)
		}
		if _, err := DecodeScript(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want %q", c.name, err, c.err)
		}
	}
}

func TestRowJSONRoundTrip(t *testing.T) {
	w := int64(2)
	e := 1e-7
	rows := []Row{
		{Op: AllReduce, SizeBytes: 1024, Count: 256, DType: "float", RedOp: "sum", Root: -1, InPlace: true, Time: 12345, AlgBW: 1.5, BusBW: 2.25, Wrong: &w},
		{Op: Broadcast, SizeBytes: 8, Count: 2, DType: "float", RedOp: "none", Root: 0, Time: 1000, MaxError: &e},
	}
	for _, r := range rows {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var back Row
		if err := back.UnmarshalJSON(b); err != nil {
			t.Fatal(err)
		}
		if !sameRow(r, back) || back.Op != r.Op {
			t.Errorf("%s back as %+v", b, back)
		}
		if !strings.Contains(string(b), `"time_us":`) {
			t.Errorf("%s: no time_us", b)
		}
	}
}

// TestScriptTableGolden prints the script's results as a table: halves the engine did
// not run show "-", unchecked halves N/A, an unsupported op its reason, and wrong
// elements fail the out-of-bounds line (go test ./bench -update rewrites the golden).
func TestScriptTableGolden(t *testing.T) {
	res, err := DecodeScript(strings.NewReader(scriptJSON))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, res); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "golden", "script.table")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./bench -update)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("table differs from %s:\n%s", golden, buf.String())
	}
}
