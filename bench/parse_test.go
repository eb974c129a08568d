package bench

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// update rewrites the golden files under testdata/ instead of comparing with them:
// go test ./bench -update.
var update = flag.Bool("update", false, "rewrite golden files under testdata/")

const fixtures = "testdata/nccl-tests"

func parseFile(t *testing.T, name string, opts ParseOptions) []Result {
	t.Helper()
	f, err := os.Open(filepath.Join(fixtures, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := Parse(f, opts)
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return res
}

// TestParseFixtures checks what each documented output style parses into, and that every
// printed busbw follows from the printed size and time by nccl-tests' formulas.
func TestParseFixtures(t *testing.T) {
	cases := []struct {
		file     string
		opts     ParseOptions
		ops      []Op
		ranks    []int
		rows     []int
		avg      []float64 // as printed
		wrongNil bool      // in-place #wrong is N/A
		maxError bool      // older "error" column
	}{
		{file: "all_reduce_perf.txt", ops: []Op{AllReduce}, ranks: []int{8}, rows: []int{16}, avg: []float64{188.059}},
		{file: "alltoall_perf_16ranks.txt", ops: []Op{AllToAll}, ranks: []int{16}, rows: []int{22}, avg: []float64{4.52745}, wrongNil: true},
		{file: "broadcast_perf_unchecked.txt", opts: ParseOptions{Op: Broadcast}, ops: []Op{Broadcast}, ranks: []int{4}, rows: []int{14}, wrongNil: true},
		{file: "all_gather_perf_error_header.txt", opts: ParseOptions{Op: AllGather}, ops: []Op{AllGather}, ranks: []int{4}, rows: []int{14}, maxError: true},
		{file: "broadcast_perf_error_header_root.txt", opts: ParseOptions{Op: Broadcast}, ops: []Op{Broadcast}, ranks: []int{2}, rows: []int{12}, avg: []float64{1.18176}, maxError: true},
		// Each run names its op; --op does not override what the output says.
		{file: "two_runs.txt", opts: ParseOptions{Op: Broadcast}, ops: []Op{AllReduce, ReduceScatter}, ranks: []int{2, 2}, rows: []int{6, 6}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			res := parseFile(t, c.file, c.opts)
			if len(res) != len(c.ops) {
				t.Fatalf("%d results, want %d", len(res), len(c.ops))
			}
			for i, r := range res {
				if r.Op != c.ops[i] || r.Ranks != c.ranks[i] || len(r.Rows) != c.rows[i] || r.Engine != "nccl-tests" {
					t.Errorf("result %d: op %q ranks %d rows %d engine %q; want %q %d %d", i, r.Op, r.Ranks, len(r.Rows), r.Engine, c.ops[i], c.ranks[i], c.rows[i])
				}
				if c.avg != nil && r.AvgBusBW != c.avg[i] {
					t.Errorf("result %d: avg busbw %v, want %v as printed", i, r.AvgBusBW, c.avg[i])
				}
				if c.avg == nil && math.Abs(r.AvgBusBW-MeanBusBW(r.Rows)) > 0.01 {
					t.Errorf("result %d: avg busbw %v, mean of rows %v", i, r.AvgBusBW, MeanBusBW(r.Rows))
				}
				checkRows(t, r, c.wrongNil, c.maxError)
			}
		})
	}
}

func checkRows(t *testing.T, r Result, wrongNil, maxError bool) {
	t.Helper()
	_, elem, err := ParseDType(r.Rows[0].DType)
	if err != nil {
		t.Fatal(err)
	}
	prev := int64(0)
	for i, row := range r.Rows {
		if row.Op != r.Op {
			t.Errorf("row %d: op %q in a %q result", i, row.Op, r.Op)
		}
		// Halves alternate: out-of-place, then in-place, of the same size.
		if row.InPlace != (i%2 == 1) {
			t.Errorf("row %d: in_place %v", i, row.InPlace)
		}
		if i%2 == 0 && row.SizeBytes <= prev {
			t.Errorf("row %d: size %d does not grow from %d", i, row.SizeBytes, prev)
		}
		prev = row.SizeBytes
		if b, n := r.Op.Geometry(row.SizeBytes, elem, r.Ranks); b != row.SizeBytes || n != row.Count {
			t.Errorf("row %d: size %d count %d, nccl-tests' geometry gives %d %d", i, row.SizeBytes, row.Count, b, n)
		}
		// algbw = S/t and busbw = algbw × factor, to the printed precision (two
		// decimals, and the time's own rounding).
		alg := AlgBW(row.SizeBytes, row.Time)
		bus, _ := BusBW(r.Op, r.Ranks, alg)
		tol := 0.006 + 0.002*alg
		if math.Abs(alg-row.AlgBW) > tol || math.Abs(bus-row.BusBW) > tol {
			t.Errorf("row %d: printed algbw %v busbw %v, recomputed %v %v", i, row.AlgBW, row.BusBW, alg, bus)
		}
		switch {
		case maxError:
			if row.Wrong != nil || row.MaxError == nil {
				t.Errorf("row %d: wrong %v max error %v; want the error column", i, row.Wrong, row.MaxError)
			}
		case row.InPlace && wrongNil:
			if row.Wrong != nil {
				t.Errorf("row %d: wrong %d, want nil for N/A", i, *row.Wrong)
			}
		case !row.InPlace && wrongNil && r.Op == Broadcast:
			if row.Wrong != nil {
				t.Errorf("row %d: wrong %d, want nil for N/A", i, *row.Wrong)
			}
		default:
			if row.Wrong == nil || *row.Wrong != 0 {
				t.Errorf("row %d: wrong %v, want 0", i, row.Wrong)
			}
		}
	}
}

func TestParseDetails(t *testing.T) {
	res := parseFile(t, "broadcast_perf_error_header_root.txt", ParseOptions{})
	r := res[0]
	if r.Op != "" {
		t.Errorf("op %q: the output does not name it and no --op was given", r.Op)
	}
	if row := r.Rows[7]; row.MaxError == nil || *row.MaxError != 2 || row.Root != 0 || row.RedOp != "none" {
		t.Errorf("row 7 = %+v; want error 2 (printed 2e+00*), root 0, redop none", row)
	}
	ar := parseFile(t, "all_reduce_perf.txt", ParseOptions{})[0]
	if row := ar.Rows[3]; row.SizeBytes != 2097152 || row.Count != 524288 || row.DType != "float" || row.RedOp != "sum" || row.Root != -1 || !row.InPlace || Micros(row.Time) != 42.48 || row.AlgBW != 49.37 || row.BusBW != 86.40 || row.Wrong == nil || *row.Wrong != 0 {
		t.Errorf("all_reduce row 3 = %+v", row)
	}
}

func TestParseErrors(t *testing.T) {
	header := "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
	cases := []struct {
		name, in, err string
	}{
		{"empty", "", "no table found"},
		{"no header", "     1024   256   float   sum   -1   1.0   1.0   1.0   0   1.0   1.0   1.0   0\n", "no table found"},
		{"fields", header + "        1024           256     float     sum      -1    10.0    0.10    0.10      0    10.0\n", "line 2: 10 fields, want 13"},
		{"time", header + "        1024           256     float     sum      -1    abc    0.10    0.10      0    10.0    0.10    0.10      0\n", `line 2: time "abc"`},
		{"negative time", header + "        1024           256     float     sum      -1    -1    0.10    0.10      0    10.0    0.10    0.10      0\n", `time "-1"`},
		{"inf", header + "        1024           256     float     sum      -1    0.00     inf     inf      0    10.0    0.10    0.10      0\n", `algbw "inf": not a finite number`},
		{"wrong", header + "        1024           256     float     sum      -1    10.0    0.10    0.10    1.5    10.0    0.10    0.10      0\n", `#wrong "1.5"`},
		{"count", header + "        1024          -256     float     sum      -1    10.0    0.10    0.10      0    10.0    0.10    0.10      0\n", `count "-256"`},
		{"size in exponent form", header + "       1.5e6        375000     float     sum      -1    10.0    0.10    0.10      0    10.0    0.10    0.10      0\n", `line 2: size "1.5e6"`},
		{"size with a suffix", header + "    1048576x        262144     float     sum      -1    10.0    0.10    0.10      0    10.0    0.10    0.10      0\n", `line 2: size "1048576x"`},
		{"size past int64", header + " 99999999999999999999  256  float     sum      -1    10.0    0.10    0.10      0    10.0    0.10    0.10      0\n", `size "99999999999999999999"`},
		{"root", header + "        1024           256     float     sum      x    10.0    0.10    0.10      0    10.0    0.10    0.10      0\n", `root "x"`},
		{"column", "#  size  count  flavour  time  algbw  busbw  #wrong\n", `header column "flavour"`},
		{"half", "#  size  count  type  time  algbw  busbw\n", "a half needs time"},
		{"avg", header + "# Avg bus bandwidth    : lots\n", `avg bus bandwidth "lots"`},
		{"long line", header + strings.Repeat("x", MaxLineBytes+1), "longer than"},
	}
	for _, c := range cases {
		_, err := Parse(strings.NewReader(c.in), ParseOptions{})
		if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: Parse error %v, want one line with %q", c.name, err, c.err)
		}
	}
}

// TestParseGolden prints every fixture in every format and compares with the golden
// files (go test ./bench -update rewrites them).
func TestParseGolden(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(fixtures, "*.txt"))
	if len(files) < 6 {
		t.Fatalf("fixtures: %v", files)
	}
	for _, file := range files {
		base := strings.TrimSuffix(filepath.Base(file), ".txt")
		op, _ := OpFromProgram(base)
		res := parseFile(t, filepath.Base(file), ParseOptions{Op: op, OpSource: "file name"})
		for _, f := range []struct {
			ext    string
			format Format
		}{{"table", Table}, {"json", JSON}, {"csv", CSV}} {
			var buf bytes.Buffer
			if err := Write(&buf, f.format, res); err != nil {
				t.Fatalf("%s %s: %v", base, f.ext, err)
			}
			golden := filepath.Join("testdata", "golden", base+"."+f.ext)
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./bench -update)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("%s: output differs from %s:\n%s", base, golden, buf.String())
			}
		}
	}
}

// TestTableRoundTrip: the table printed for parsed output parses back to the same rows,
// for the printed columns are nccl-tests' own.
func TestTableRoundTrip(t *testing.T) {
	for _, name := range []string{"all_reduce_perf.txt", "alltoall_perf_16ranks.txt", "broadcast_perf_error_header_root.txt", "two_runs.txt"} {
		res := parseFile(t, name, ParseOptions{})
		var buf bytes.Buffer
		if err := WriteTable(&buf, res); err != nil {
			t.Fatal(err)
		}
		back, err := Parse(&buf, ParseOptions{})
		if err != nil {
			t.Fatalf("%s: table does not parse back: %v", name, err)
		}
		if len(back) != len(res) {
			t.Fatalf("%s: %d results back, want %d", name, len(back), len(res))
		}
		for i := range res {
			if back[i].AvgBusBW != res[i].AvgBusBW || len(back[i].Rows) != len(res[i].Rows) {
				t.Errorf("%s result %d: avg %v rows %d back; want %v %d", name, i, back[i].AvgBusBW, len(back[i].Rows), res[i].AvgBusBW, len(res[i].Rows))
				continue
			}
			for j, row := range res[i].Rows {
				b := back[i].Rows[j]
				row.Op, b.Op = "", ""
				if !sameRow(row, b) {
					t.Errorf("%s row %d: %+v back, want %+v", name, j, b, row)
				}
			}
		}
	}
}

func sameRow(a, b Row) bool {
	eqI := func(x, y *int64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqF := func(x, y *float64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.SizeBytes == b.SizeBytes && a.Count == b.Count && a.DType == b.DType && a.RedOp == b.RedOp &&
		a.Root == b.Root && a.InPlace == b.InPlace && a.Time == b.Time && a.AlgBW == b.AlgBW && a.BusBW == b.BusBW &&
		eqI(a.Wrong, b.Wrong) && eqF(a.MaxError, b.MaxError)
}
