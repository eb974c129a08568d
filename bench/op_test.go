package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestBusFactor(t *testing.T) {
	// nccl-tests doc/PERFORMANCE.md, "Summary".
	cases := []struct {
		op    Op
		ranks int
		want  float64
	}{
		{AllReduce, 1, 0}, {AllReduce, 2, 1}, {AllReduce, 4, 1.5}, {AllReduce, 8, 1.75}, {AllReduce, 16, 1.875},
		{AllGather, 2, 0.5}, {AllGather, 8, 0.875},
		{ReduceScatter, 4, 0.75}, {ReduceScatter, 8, 0.875},
		{AllToAll, 16, 0.9375},
		{Broadcast, 1, 1}, {Broadcast, 8, 1},
		{DeviceCopy, 1, 1},
		// The other nccl-tests programs' GetBw (src/gather.cu, scatter.cu, reduce.cu,
		// sendrecv.cu, hypercube.cu, alltoallv.cu).
		{Gather, 4, 0.75}, {Scatter, 8, 0.875}, {AllToAllV, 2, 0.5},
		{Reduce, 8, 1}, {SendRecv, 2, 1}, {HyperCube, 8, 1},
	}
	for _, c := range cases {
		got, err := c.op.BusFactor(c.ranks)
		if err != nil || got != c.want {
			t.Errorf("%s.BusFactor(%d) = %v, %v; want %v", c.op, c.ranks, got, err, c.want)
		}
	}
	for _, bad := range []struct {
		op    Op
		ranks int
	}{{AllReduce, 0}, {"reduce_scatter_v", 2}, {"", 2}} {
		if _, err := bad.op.BusFactor(bad.ranks); err == nil {
			t.Errorf("%q.BusFactor(%d): no error", bad.op, bad.ranks)
		}
	}
}

func TestAlgBWBusBW(t *testing.T) {
	cases := []struct {
		op           Op
		ranks        int
		bytes        int64
		t            time.Duration
		algbw, busbw float64
	}{
		// 1e9 bytes in one second is 1 GB/s (GB = 1e9 bytes, not 2^30).
		{AllReduce, 8, 1e9, time.Second, 1, 1.75},
		{AllGather, 4, 1e9, 500 * time.Millisecond, 2, 1.5},
		{Broadcast, 4, 1 << 30, time.Second, 1.073741824, 1.073741824},
		{AllToAll, 2, 1e6, time.Millisecond, 1, 0.5},
		{AllReduce, 2, 1000, 0, 0, 0},
	}
	for _, c := range cases {
		alg := AlgBW(c.bytes, c.t)
		bus, err := BusBW(c.op, c.ranks, alg)
		if err != nil || math.Abs(alg-c.algbw) > 1e-12 || math.Abs(bus-c.busbw) > 1e-12 {
			t.Errorf("%s %d ranks %d bytes in %s: algbw %v busbw %v (%v); want %v %v", c.op, c.ranks, c.bytes, c.t, alg, bus, err, c.algbw, c.busbw)
		}
	}
}

func TestGeometry(t *testing.T) {
	// nccl-tests getCollByteCount: per-rank ops keep count/ranks elements per rank.
	cases := []struct {
		op           Op
		size, elem   int64
		ranks        int
		bytes, count int64
	}{
		{AllReduce, 1024, 4, 8, 1024, 256},
		{AllReduce, 1026, 4, 8, 1024, 256},
		{Broadcast, 64, 2, 3, 64, 32},
		{AllGather, 1024, 4, 2, 1024, 128},
		{AllGather, 1024, 4, 3, 1020, 85},
		{ReduceScatter, 1 << 20, 4, 8, 1 << 20, 32768},
		{AllToAll, 1024, 4, 16, 1024, 16},
		{AllToAll, 32, 4, 16, 0, 0},
		{AllReduce, 100, 0, 2, 0, 0},
	}
	for _, c := range cases {
		b, n := c.op.Geometry(c.size, c.elem, c.ranks)
		if b != c.bytes || n != c.count {
			t.Errorf("%s.Geometry(%d, %d, %d) = %d, %d; want %d, %d", c.op, c.size, c.elem, c.ranks, b, n, c.bytes, c.count)
		}
	}
}

func TestParseOps(t *testing.T) {
	cases := []struct {
		in   string
		want string
		err  string
	}{
		{in: "all_reduce", want: "all_reduce"},
		{in: "all_reduce, all_gather,ALLTOALL", want: "all_reduce all_gather alltoall"},
		{in: "allreduce,all_to_all,broadcast,reduce_scatter,all_reduce", want: "all_reduce alltoall broadcast reduce_scatter"},
		{in: "", err: `--op "": no operation given`},
		{in: " , ", err: "no operation given"},
		{in: "all_reduce,reduce", err: `unknown operation "reduce"`},
		{in: "device_copy", err: `unknown operation "device_copy"`},
	}
	for _, c := range cases {
		ops, err := ParseOps(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseOps(%q) = %v, %v; want error %q", c.in, ops, err, c.err)
			}
			continue
		}
		var names []string
		for _, op := range ops {
			names = append(names, string(op))
		}
		if err != nil || strings.Join(names, " ") != c.want {
			t.Errorf("ParseOps(%q) = %v, %v; want %s", c.in, names, err, c.want)
		}
	}
}

func TestOpFromProgram(t *testing.T) {
	cases := map[string]Op{
		"all_reduce_perf": AllReduce, "./build/alltoall_perf": AllToAll, "/x/all_gather_perf_mpi": AllGather,
		"reduce_scatter_perf": ReduceScatter, "broadcast_perf": Broadcast,
		"reduce_perf": Reduce, "sendrecv_perf": SendRecv, "gather_perf": Gather, "hypercube_perf": HyperCube,
		"alltoallv_perf": AllToAllV, "all_reduce": "", "allreduce_perf": "", "": "",
	}
	for in, want := range cases {
		got, ok := OpFromProgram(in)
		if got != want || ok != (want != "") {
			t.Errorf("OpFromProgram(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	if AllReduce.Program() != "all_reduce_perf" {
		t.Errorf("AllReduce.Program() = %q", AllReduce.Program())
	}
}

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		err  bool
	}{
		{in: "0", want: 0}, {in: "8", want: 8}, {in: "1K", want: 1024}, {in: "1k", want: 1024},
		{in: "64M", want: 64 << 20}, {in: "2G", want: 2 << 30}, {in: "1T", want: 1 << 40},
		{in: "4KiB", want: 4096}, {in: "16mib", want: 16 << 20}, {in: " 3K ", want: 3072},
		{in: "", err: true}, {in: "K", err: true}, {in: "1.5M", err: true}, {in: "-1K", err: true},
		{in: "1KB", err: true}, {in: "1X", err: true}, {in: "9999999999G", err: true},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d (error %v)", c.in, got, err, c.want, c.err)
		}
		if err != nil && !strings.Contains(err.Error(), `"`+c.in+`"`) {
			t.Errorf("ParseSize(%q) error %q does not name the value", c.in, err)
		}
	}
	for _, b := range []int64{1, 1000, 1024, 3 << 20, 64 << 20, 5 << 30, 1 << 40} {
		s := FormatSize(b)
		if back, err := ParseSize(s); err != nil || back != b {
			t.Errorf("FormatSize(%d) = %q, parses back as %d, %v", b, s, back, err)
		}
	}
}

func TestSizes(t *testing.T) {
	cases := []struct {
		min, max int64
		factor   int
		want     []int64
		err      string
	}{
		{min: 1024, max: 65536, factor: 2, want: []int64{1024, 2048, 4096, 8192, 16384, 32768, 65536}},
		{min: 1024, max: 65535, factor: 2, want: []int64{1024, 2048, 4096, 8192, 16384, 32768}},
		{min: 8, max: 1000, factor: 10, want: []int64{8, 80, 800}},
		{min: 5, max: 5, factor: 2, want: []int64{5}},
		{min: 1 << 62, max: math.MaxInt64, factor: 2, want: []int64{1 << 62}},
		{min: 0, max: 5, factor: 2, err: "--min-bytes 0"},
		{min: 8, max: 4, factor: 2, err: "--max-bytes 4 is below --min-bytes 8"},
		{min: 8, max: 64, factor: 1, err: "--step-factor 1"},
	}
	for _, c := range cases {
		got, err := Sizes(c.min, c.max, c.factor)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Sizes(%d, %d, %d): error %v, want %q", c.min, c.max, c.factor, err, c.err)
			}
			continue
		}
		if err != nil || !equalInts(got, c.want) {
			t.Errorf("Sizes(%d, %d, %d) = %v, %v; want %v", c.min, c.max, c.factor, got, err, c.want)
		}
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseDType(t *testing.T) {
	cases := map[string]struct {
		name string
		size int64
	}{
		"float32": {"float", 4}, "float": {"float", 4}, "FLOAT16": {"half", 2}, "half": {"half", 2},
		"bfloat16": {"bfloat16", 2}, "float64": {"double", 8}, "int8": {"int8", 1}, "uint8": {"uint8", 1},
		"int32": {"int32", 4}, "int64": {"int64", 8},
	}
	for in, want := range cases {
		name, size, err := ParseDType(in)
		if err != nil || name != want.name || size != want.size {
			t.Errorf("ParseDType(%q) = %q, %d, %v; want %q, %d", in, name, size, err, want.name, want.size)
		}
	}
	if _, _, err := ParseDType("fp8"); err == nil || !strings.Contains(err.Error(), `"fp8"`) {
		t.Errorf("ParseDType(fp8): %v", err)
	}
}

func TestPlanValidate(t *testing.T) {
	good := Plan{Ops: []Op{AllReduce}, MinBytes: 1024, MaxBytes: 4096, StepFactor: 2, Warmup: 0, Iters: 1, DType: "float"}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v): %v", good, err)
	}
	cases := []struct {
		name string
		edit func(*Plan)
		err  string
	}{
		{"no ops", func(p *Plan) { p.Ops = nil }, "--op"},
		{"device copy", func(p *Plan) { p.Ops = []Op{DeviceCopy} }, `--op "device_copy"`},
		{"unknown op", func(p *Plan) { p.Ops = []Op{"reduce"} }, `--op "reduce"`},
		{"sizes", func(p *Plan) { p.MaxBytes = 10 }, "--max-bytes 10"},
		{"warmup", func(p *Plan) { p.Warmup = -1 }, "--warmup -1"},
		{"iters", func(p *Plan) { p.Iters = 0 }, "--iters 0"},
		{"too many iters", func(p *Plan) { p.Iters = MaxIters + 1 }, "--iters 1000001: want 1 to 1000000"},
		{"too much warmup", func(p *Plan) { p.Warmup = 99999999999 }, "--warmup 99999999999: want 0 to 1000000"},
		{"dtype", func(p *Plan) { p.DType = "fp4" }, `--dtype "fp4"`},
	}
	for _, c := range cases {
		p := good
		c.edit(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: Validate = %v, want %q", c.name, err, c.err)
		}
	}
	args := Plan{Ops: []Op{AllGather}, MinBytes: 8, MaxBytes: 1 << 20, StepFactor: 4, Warmup: 3, Iters: 7, DType: "half", Check: true}.NCCLTestsArgs(AllGather, 8)
	want := "all_gather_perf -b 8 -e 1048576 -f 4 -w 3 -n 7 -g 8 -d half -c 1"
	if strings.Join(args, " ") != want {
		t.Errorf("NCCLTestsArgs = %q, want %q", strings.Join(args, " "), want)
	}
}
