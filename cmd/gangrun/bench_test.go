package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/bench"
)

// benchPython is the interpreter with torch the end-to-end tests use: GANGRUN_PYTHON
// (the Makefile sets it), else Debian's /usr/bin/python3.
func benchPython() string {
	if p := os.Getenv("GANGRUN_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

type cliResult struct {
	code           int
	stdout, stderr string
}

// runBenchCLI runs `gangrun ARGS...` in process with stdin and the real environment.
func runBenchCLI(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: os.Getenv}
	code := dispatch(context.Background(), e, args)
	return cliResult{code, out.String(), errOut.String()}
}

// gangArgs run 2 gloo workers on this machine over small messages.
func gangArgs(extra ...string) []string {
	return append([]string{"bench", "nccl", "--python", benchPython(), "--nproc-per-node", "2",
		"--backend", "gloo", "--warmup", "1", "--iters", "5"}, extra...)
}

// TestBenchNCCLGlooJSON runs the bundled script on 2 CPU workers and checks that the
// sizes step by the factor and that algbw and busbw follow from the measured times.
func TestBenchNCCLGlooJSON(t *testing.T) {
	r := runBenchCLI(t, "", gangArgs("--op", "all_reduce,all_gather", "--min-bytes", "1K", "--max-bytes", "64K", "--json")...)
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "\r") || strings.Contains(r.stderr, "step ") {
		t.Errorf("progress on stderr while stdout is not a terminal:\n%q", r.stderr)
	}
	var results []bench.Result
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var res bench.Result
		if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
			t.Fatalf("stdout line %q is not a result: %v", sc.Text(), err)
		}
		results = append(results, res)
	}
	if len(results) != 2 || results[0].Op != bench.AllReduce || results[1].Op != bench.AllGather {
		t.Fatalf("results %+v", results)
	}
	wantSizes := []int64{1024, 2048, 4096, 8192, 16384, 32768, 65536}
	for _, res := range results {
		if res.Ranks != 2 || res.Engine != "torch" || res.Backend != "gloo" || res.Device != "cpu" {
			t.Errorf("%s: ranks %d engine %q backend %q device %q", res.Op, res.Ranks, res.Engine, res.Backend, res.Device)
		}
		halves := map[bench.Op][]bool{bench.AllReduce: {true}, bench.AllGather: {false, true}}[res.Op]
		if len(res.Rows) != len(wantSizes)*len(halves) {
			t.Fatalf("%s: %d rows, want %d", res.Op, len(res.Rows), len(wantSizes)*len(halves))
		}
		var sum float64
		for i, row := range res.Rows {
			size := wantSizes[i/len(halves)]
			count := size / 4
			if res.Op == bench.AllGather {
				count = size / 4 / 2 // per rank (nccl-tests all_gather)
			}
			if row.SizeBytes != size || row.Count != count || row.InPlace != halves[i%len(halves)] || row.DType != "float" {
				t.Errorf("%s row %d: size %d count %d in_place %v dtype %s; want %d %d %v float", res.Op, i, row.SizeBytes, row.Count, row.InPlace, row.DType, size, count, halves[i%len(halves)])
			}
			if row.Time <= 0 || row.Wrong == nil || *row.Wrong != 0 {
				t.Errorf("%s row %d: time %v wrong %v", res.Op, i, row.Time, row.Wrong)
			}
			// Recompute: algbw = bytes / time (GB = 1e9), busbw = algbw × factor.
			alg := float64(row.SizeBytes) / row.Time.Seconds() / 1e9
			factor := 2.0 * (2 - 1) / 2 // all_reduce, 2 ranks
			if res.Op == bench.AllGather {
				factor = (2.0 - 1) / 2
			}
			if !closeTo(row.AlgBW, alg) || !closeTo(row.BusBW, alg*factor) {
				t.Errorf("%s row %d: algbw %v busbw %v; from time %v: %v %v", res.Op, i, row.AlgBW, row.BusBW, row.Time, alg, alg*factor)
			}
			sum += row.BusBW
		}
		if !closeTo(res.AvgBusBW, sum/float64(len(res.Rows))) {
			t.Errorf("%s: avg busbw %v, mean of rows %v", res.Op, res.AvgBusBW, sum/float64(len(res.Rows)))
		}
	}
}

// closeTo compares at the precision time_us carries through JSON (nanoseconds).
func closeTo(a, b float64) bool {
	return math.Abs(a-b) <= 1e-6*math.Max(math.Abs(a), math.Abs(b))+1e-12
}

// TestBenchNCCLGlooTable checks the default table: nccl-tests' columns, which
// `gangrun bench parse` (and anything that reads nccl-tests output) reads back.
func TestBenchNCCLGlooTable(t *testing.T) {
	r := runBenchCLI(t, "", gangArgs("--op", "broadcast,alltoall", "--min-bytes", "4K", "--max-bytes", "64K", "--step-factor", "4")...)
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{
		"# broadcast: 2 ranks, engine torch, backend gloo, device cpu\n",
		"#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n",
		"# Out of bounds values : 0 OK\n",
		"# Avg bus bandwidth    : ",
		"# alltoall: 2 ranks",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	res, err := bench.Parse(strings.NewReader(r.stdout), bench.ParseOptions{})
	if err != nil {
		t.Fatalf("the table does not parse as nccl-tests output: %v\n%s", err, r.stdout)
	}
	if len(res) != 2 {
		t.Fatalf("%d tables, want 2", len(res))
	}
	for i, want := range []struct {
		inPlace bool
		root    int
	}{{true, 0}, {false, -1}} { // broadcast in place only, alltoall out of place only
		sizes := []int64{}
		for _, row := range res[i].Rows {
			sizes = append(sizes, row.SizeBytes)
			if row.InPlace != want.inPlace || row.Root != want.root {
				t.Errorf("table %d row %+v: in_place %v root %d", i, row, want.inPlace, want.root)
			}
			// busbw follows from the printed time and size, to the printed precision.
			alg := bench.AlgBW(row.SizeBytes, row.Time)
			if math.Abs(alg-row.AlgBW) > 0.006+0.01*alg {
				t.Errorf("table %d: printed algbw %v, from size and time %v", i, row.AlgBW, alg)
			}
		}
		if got := fmt.Sprint(sizes); got != "[4096 16384 65536]" {
			t.Errorf("table %d sizes %s, want [4096 16384 65536] (factor 4)", i, got)
		}
	}
}

// TestBenchNCCLUnsupported: gloo in torch 1.13 has no reduce_scatter; it is reported,
// not emulated, and the other operations still run.
func TestBenchNCCLUnsupported(t *testing.T) {
	r := runBenchCLI(t, "", gangArgs("--op", "reduce_scatter,all_reduce", "--min-bytes", "1K", "--max-bytes", "2K", "--csv")...)
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if lines[0] != strings.Join(bench.CSVHeader(), ",") || len(lines) != 3 {
		t.Fatalf("CSV:\n%s", r.stdout)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "all_reduce,2,") {
			t.Errorf("CSV line %q", l)
		}
	}
	j := runBenchCLI(t, "", gangArgs("--op", "reduce_scatter", "--min-bytes", "1K", "--max-bytes", "1K", "--json")...)
	var res bench.Result
	if err := json.Unmarshal([]byte(j.stdout), &res); err != nil || j.code != 0 {
		t.Fatalf("exit %d, %v: %s%s", j.code, err, j.stdout, j.stderr)
	}
	if !strings.HasPrefix(res.Unsupported, "not supported by backend gloo") || len(res.Rows) != 0 || res.Rows == nil {
		t.Errorf("reduce_scatter: %+v", res)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"no subcommand", []string{"bench"}, 2, "want a subcommand"},
		{"unknown subcommand", []string{"bench", "mpi"}, 2, `unknown subcommand "mpi"`},
		{"pairwise one node", []string{"bench", "nccl", "--pairwise"}, 2, "gangrun bench nccl: --pairwise needs --nnodes >= 2"},
		{"pairwise without coordinator", []string{"bench", "nccl", "--pairwise", "--nnodes", "4"}, 2, "--pairwise needs --coordinator consul://HOST:PORT (got embedded)"},
		{"pairwise under slurm", []string{"bench", "nccl", "--pairwise", "--nnodes", "4", "--coordinator", "slurm"}, 2, "--pairwise needs --coordinator consul://HOST:PORT (got slurm)"},
		{"pairwise two ops", []string{"bench", "nccl", "--pairwise", "--nnodes", "2", "--coordinator", "consul://127.0.0.1:1", "--job-id", "j", "--op", "all_reduce,broadcast"}, 2, `--pairwise measures one operation: --op "all_reduce,broadcast" lists 2`},
		{"pairwise pair timeout", []string{"bench", "nccl", "--pairwise", "--nnodes", "2", "--coordinator", "consul://127.0.0.1:1", "--job-id", "j", "--pair-timeout", "0s"}, 2, "--pair-timeout 0s: must be positive"},
		{"pairwise join timeout", []string{"bench", "nccl", "--pairwise", "--nnodes", "2", "--coordinator", "consul://127.0.0.1:1", "--job-id", "j", "--join-timeout", "-1s"}, 2, `--join-timeout "-1s": must not be negative`},
		{"pairwise without job id", []string{"bench", "nccl", "--pairwise", "--nnodes", "2", "--coordinator", "consul://127.0.0.1:1"}, 2, "needs --job-id"},
		{"pairwise consul unreachable", []string{"bench", "nccl", "--pairwise", "--nnodes", "2", "--coordinator", "consul://127.0.0.1:1", "--job-id", "j",
			"--python", benchPython(), "--backend", "gloo", "--topology-file", filepath.Join(inventories, "cpu-only.json")}, 1, "gangrun bench nccl: cannot reach Consul at 127.0.0.1:1 (from --coordinator): connection refused"},
		{"json and csv", []string{"bench", "nccl", "--json", "--csv"}, 2, "--json and --csv"},
		{"bad op", []string{"bench", "nccl", "--op", "all_reduce,gather"}, 2, `unknown operation "gather"`},
		{"bad size", []string{"bench", "nccl", "--min-bytes", "1KB"}, 2, `--min-bytes: size "1KB"`},
		{"reversed sizes", []string{"bench", "nccl", "--min-bytes", "1M", "--max-bytes", "1K"}, 2, "--max-bytes 1024 is below --min-bytes 1048576"},
		{"step factor", []string{"bench", "nccl", "--step-factor", "1"}, 2, "--step-factor 1"},
		{"iters", []string{"bench", "nccl", "--iters", "0"}, 2, "--iters 0"},
		{"dtype", []string{"bench", "nccl", "--dtype", "fp8"}, 2, `--dtype "fp8"`},
		{"engine", []string{"bench", "nccl", "--engine", "mpi"}, 2, `--engine "mpi"`},
		{"backend", []string{"bench", "nccl", "--backend", "mpi"}, 2, `--backend "mpi"`},
		{"threshold", []string{"bench", "nccl", "--slow-threshold", "20"}, 2, "--slow-threshold 20"},
		{"argument", []string{"bench", "nccl", "extra"}, 2, `unexpected argument "extra"`},
		{"nccl without GPUs", []string{"bench", "nccl", "--backend", "nccl", "--topology-file", filepath.Join(inventories, "cpu-only.json")}, 2, "--backend nccl needs GPUs"},
		{"nccl-tests across nodes", []string{"bench", "nccl", "--engine", "nccl-tests", "--nnodes", "2"}, 2, "--engine nccl-tests runs on one node"},
		{"missing python", []string{"bench", "nccl", "--python", "/nonexistent/python3", "--backend", "gloo"}, 127, "/nonexistent/python3"},
		{"parse no file", []string{"bench", "parse"}, 2, "want one FILE"},
		{"parse two formats", []string{"bench", "parse", "--json", "--csv", "x"}, 2, "--json and --csv"},
		{"parse missing file", []string{"bench", "parse", "/nonexistent/out.txt"}, 2, "gangrun bench parse: /nonexistent/out.txt: no such file"},
		{"parse a directory", []string{"bench", "parse", "/tmp"}, 2, "gangrun bench parse: /tmp: is a directory, want a regular file"},
		{"parse a device", []string{"bench", "parse", "/dev/zero"}, 2, "gangrun bench parse: /dev/zero: is a character device, want a regular file"},
		{"parse bad op", []string{"bench", "parse", "--op", "x", "f"}, 2, `unknown operation "x"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runBenchCLI(t, "", c.args...)
			if r.code != c.code || !strings.Contains(r.stderr, c.err) || r.stdout != "" {
				t.Errorf("exit %d, stderr %q, stdout %q; want exit %d and %q", r.code, r.stderr, r.stdout, c.code, c.err)
			}
			if c.code == 2 && strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
				t.Errorf("usage error on several lines: %q", r.stderr)
			}
		})
	}
}

const ncclFixtures = "../../bench/testdata/nccl-tests"

// TestBenchNCCLPythonWithoutTorch gives --python a real interpreter that cannot import
// torch (Debian's python3 with -S, which leaves out dist-packages): one line naming the
// interpreter and the import error, exit 2, and no worker started (no rank output).
func TestBenchNCCLPythonWithoutTorch(t *testing.T) {
	noTorch := filepath.Join(t.TempDir(), "python-no-torch")
	if err := os.WriteFile(noTorch, []byte("#!/bin/sh\nexec "+benchPython()+" -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runBenchCLI(t, "", "bench", "nccl", "--python", noTorch, "--backend", "gloo", "--nproc-per-node", "2")
	if r.code != 2 {
		t.Fatalf("exit %d, want 2\nstderr:\n%s", r.code, r.stderr)
	}
	want := "gangrun bench nccl: --python " + noTorch + ": cannot import torch.distributed: ModuleNotFoundError: No module named 'torch'"
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], want) {
		t.Errorf("stderr = %q, want one line starting %q", r.stderr, want)
	}
}

func TestBenchParseCommand(t *testing.T) {
	file := filepath.Join(ncclFixtures, "all_reduce_perf.txt")
	r := runBenchCLI(t, "", "bench", "parse", file)
	want, err := os.ReadFile("../../bench/testdata/golden/all_reduce_perf.table")
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 0 || r.stdout != string(want) {
		t.Errorf("exit %d, stderr %q, table:\n%s", r.code, r.stderr, r.stdout)
	}
	in, _ := os.ReadFile(filepath.Join(ncclFixtures, "broadcast_perf_error_header_root.txt"))
	r = runBenchCLI(t, string(in), "bench", "parse", "--json", "--op", "broadcast", "-")
	var res bench.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 {
		t.Fatalf("exit %d %v: %s %s", r.code, err, r.stdout, r.stderr)
	}
	if res.Op != bench.Broadcast || res.AvgBusBW != 1.18176 || len(res.Rows) != 12 || res.Rows[7].MaxError == nil {
		t.Errorf("parsed %+v", res)
	}
	r = runBenchCLI(t, "# size count type time algbw busbw #wrong\n 1024 256 float 1.0 x 1.0 0\n", "bench", "parse", "-")
	if r.code != 1 || !strings.Contains(r.stderr, `gangrun bench parse: -: nccl-tests output, line 2: algbw "x": not a number`) {
		t.Errorf("bad input: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestBenchParseRealLogs runs `gangrun bench parse` on every collected nccl-tests log
// (bench/testdata/nccl-tests/real): the table printed is the golden one, the exit status
// the one expect.json gives, and each failed verdict is one line on stderr naming the
// file and the table, with the log's own count or failure.
func TestBenchParseRealLogs(t *testing.T) {
	dir := filepath.Join(ncclFixtures, "real")
	b, err := os.ReadFile(filepath.Join(dir, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var es []struct {
		File string
		Exit int
	}
	if err := json.Unmarshal(b, &es); err != nil {
		t.Fatal(err)
	}
	failing := 0
	for _, e := range es {
		file := filepath.Join(dir, e.File)
		r := runBenchCLI(t, "", "bench", "parse", file)
		want, err := os.ReadFile(filepath.Join("../../bench/testdata/golden/real", strings.TrimSuffix(e.File, ".txt")+".table"))
		if err != nil {
			t.Fatal(err)
		}
		if r.code != e.Exit || r.stdout != string(want) {
			t.Errorf("%s: exit %d (want %d), stderr %q, table:\n%s", e.File, r.code, e.Exit, r.stderr, r.stdout)
		}
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		switch {
		case e.Exit == 0 && r.stderr != "":
			t.Errorf("%s: exit 0 with stderr %q", e.File, r.stderr)
		case e.Exit == 1:
			failing++
			for _, l := range lines {
				if !strings.HasPrefix(l, "gangrun bench parse: "+file+": ") ||
					!(strings.Contains(l, "# Out of bounds values : ") || strings.Contains(l, " failure ")) {
					t.Errorf("%s: stderr line %q", e.File, l)
				}
			}
		}
	}
	if failing < 5 {
		t.Errorf("%d failing logs: the collection lost its failed runs", failing)
	}
	// The log's own count, not the rows with errors (two rows had wrong elements).
	r := runBenchCLI(t, "", "bench", "parse", filepath.Join(dir, "issue369-out-of-bounds.txt"))
	if !strings.Contains(r.stdout, "# Out of bounds values : 4 FAILED\n") ||
		r.stderr != "gangrun bench parse: "+filepath.Join(dir, "issue369-out-of-bounds.txt")+": all_reduce: the log's own data check failed: # Out of bounds values : 4 FAILED\n" {
		t.Errorf("issue 369: stdout %q stderr %q", r.stdout, r.stderr)
	}
	// JSON carries the verdict and the failure.
	r = runBenchCLI(t, "", "bench", "parse", "--json", filepath.Join(dir, "issue355-cut-at-row.txt"))
	var res bench.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 1 {
		t.Fatalf("issue 355: exit %d %v: %s", r.code, err, r.stdout)
	}
	if f := res.Failure; f == nil || f.Kind != "CUDA" || f.File != "common.cu" || f.Line != 389 || f.Row == nil || f.Row.SizeBytes != 2097152 ||
		f.Message != "an illegal memory access was encountered" || res.Op != bench.AllToAll || res.Ranks != 16 {
		t.Errorf("issue 355: %+v failure %+v", res, res.Failure)
	}
	if !strings.Contains(r.stderr, `alltoall: the run failed at size 2097152 (row "2097152 32768 float none -1"): node0: Test CUDA failure common.cu:389 'an illegal memory access was encountered'`) {
		t.Errorf("issue 355: stderr %q", r.stderr)
	}
	// Several runs: one JSON object per line, each naming its operation.
	r = runBenchCLI(t, "", "bench", "parse", "--json", filepath.Join(dir, "issue287-two-runs-command-only.txt"))
	objs := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(objs) != 2 || r.code != 1 || !strings.Contains(r.stderr, "table 2 of 2 (all_reduce, line 54): the run failed before its first row: GENOA-06: Test NCCL failure") {
		t.Errorf("issue 287: exit %d, %d objects, stderr %q", r.code, len(objs), r.stderr)
	}
}

// TestBenchNCCLTestsEngine runs --engine nccl-tests against stand-in binaries on PATH
// (this machine has no GPUs and no nccl-tests): gangrun must pass nccl-tests' flags,
// give it every GPU of the node in one process and parse what it prints.
func TestBenchNCCLTestsEngine(t *testing.T) {
	h100 := filepath.Join(inventories, "dgx-h100.json")
	empty := t.TempDir()
	t.Setenv("PATH", empty+":/usr/bin:/bin")
	r := runBenchCLI(t, "", "bench", "nccl", "--engine", "nccl-tests", "--topology-file", h100)
	if r.code != 127 || !strings.Contains(r.stderr, "--engine nccl-tests: all_reduce_perf not found on PATH") {
		t.Errorf("no binaries: exit %d, stderr %q", r.code, r.stderr)
	}

	bin := t.TempDir()
	argsFile := filepath.Join(bin, "args")
	fixture, _ := filepath.Abs(filepath.Join(ncclFixtures, "all_reduce_perf.txt"))
	stub := "#!/bin/sh\necho \"$0 $*\" >>" + argsFile + "\ncat " + fixture + "\n"
	if err := os.WriteFile(filepath.Join(bin, "all_reduce_perf"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":/usr/bin:/bin")
	r = runBenchCLI(t, "", "bench", "nccl", "--engine", "nccl-tests", "--topology-file", h100, "--min-bytes", "1M", "--max-bytes", "128M", "--json")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	got, _ := os.ReadFile(argsFile)
	if want := filepath.Join(bin, "all_reduce_perf") + " -b 1048576 -e 134217728 -f 2 -w 5 -n 20 -g 8 -d float -c 1\n"; string(got) != want {
		t.Errorf("nccl-tests ran as %q, want %q", got, want)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if res.Op != bench.AllReduce || res.Ranks != 8 || res.Engine != "nccl-tests" || len(res.Rows) != 16 || res.AvgBusBW != 188.059 {
		t.Errorf("result %+v", res)
	}
}

func TestProgressLineWriter(t *testing.T) {
	var buf bytes.Buffer
	p := &progressLine{w: &buf}
	p.set("all_reduce 1K · step 1/7")
	p.Write([]byte("[rank1]: a warning\n"))
	p.done()
	want := "\rall_reduce 1K · step 1/7\x1b[K" + "\r\x1b[K[rank1]: a warning\nall_reduce 1K · step 1/7" + "\r\x1b[K"
	if buf.String() != want {
		t.Errorf("progress output %q, want %q", buf.String(), want)
	}
	if isTerminal(&buf) {
		t.Error("a buffer is a terminal")
	}
}
