package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realLines returns the lines of a collected log between its Markdown fences.
func realLines(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(realLogs, name))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "```") {
			out = append(out, l)
		}
	}
	return out
}

// prefixed prints lines as a launcher would, each with prefix(i).
func prefixed(lines []string, prefix func(i int) string) string {
	var b strings.Builder
	for i, l := range lines {
		b.WriteString(prefix(i) + l + "\n")
	}
	return b.String()
}

// interleave merges several processes' lines one by one, as a terminal shows
// processes that print at the same pace.
func interleave(copies ...string) string {
	var split [][]string
	longest := 0
	for _, c := range copies {
		ls := strings.Split(strings.TrimSuffix(c, "\n"), "\n")
		split = append(split, ls)
		longest = max(longest, len(ls))
	}
	var b strings.Builder
	for i := 0; i < longest; i++ {
		for _, ls := range split {
			if i < len(ls) {
				b.WriteString(ls[i] + "\n")
			}
		}
	}
	return b.String()
}

// TestLauncherPrefixes reads the real log of NVIDIA/nccl-tests#369 (2 ranks, 4 FAILED)
// as each launcher and log collector prints it: the same table, verdict and ranks,
// the launcher's label of the copy taken.
func TestLauncherPrefixes(t *testing.T) {
	lines := realLines(t, "issue369-out-of-bounds.txt")
	cases := []struct {
		name    string
		in      string
		printed string
	}{
		{"none", prefixed(lines, func(int) string { return "" }), ""},
		{"mpirun --tag-output", prefixed(lines, func(int) string { return "[1,0]<stdout>:" }), "[1,0]"},
		{"srun --label", prefixed(lines, func(int) string { return "0: " }), "0"},
		{"srun --label, 16 tasks", prefixed(lines, func(int) string { return " 0: " }), "0"},
		{"pdsh", prefixed(lines, func(int) string { return "gpu-1-1: " }), "gpu-1-1"},
		{"MPICH -prepend-rank", prefixed(lines, func(int) string { return "[0] " }), "[0]"},
		{"kubectl logs --prefix", prefixed(lines, func(int) string { return "[pod/nccl-launcher-x7k2p/mpi-launcher] " }), "pod/nccl-launcher-x7k2p/mpi-launcher"},
		{"SkyPilot", prefixed(lines, func(int) string { return "(head, rank=0, pid=3808) " }), "head rank=0"},
		{"SkyPilot and mpirun", prefixed(lines, func(int) string { return "(head, rank=0, pid=3808) [1,0]<stdout>:" }), "head rank=0 [1,0]"},
		{"kubectl --timestamps", prefixed(lines, func(i int) string { return fmt.Sprintf("2026-01-23T10:15:%02d.123456789Z ", i%60) }), ""},
		{"timestamps and srun", prefixed(lines, func(i int) string { return fmt.Sprintf("[2026-01-23 10:15:%02d] 0: ", i%60) }), "0"},
		{"indented Markdown", prefixed(lines, func(int) string { return "    [1,0]<stdout>:" }), "[1,0]"},
		{"CRLF", strings.ReplaceAll(prefixed(lines, func(int) string { return "[1,0]<stdout>:" }), "\n", "\r\n"), "[1,0]"},
	}
	for _, c := range cases {
		res, err := Parse(strings.NewReader(c.in), ParseOptions{})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		r := res[0]
		if len(res) != 1 || r.Op != AllReduce || r.Ranks != 2 || len(r.Rows) != 50 || r.AvgBusBW != 4.79995 ||
			r.OutOfBounds == nil || r.OutOfBounds.Count != 4 || r.PrintedBy != c.printed || r.Copies != 0 {
			t.Errorf("%s: %d results, op %q ranks %d rows %d avg %v oob %+v printed by %q copies %d", c.name, len(res),
				r.Op, r.Ranks, len(r.Rows), r.AvgBusBW, r.OutOfBounds, r.PrintedBy, r.Copies)
		}
		if ok, why := r.Verdict(); ok || !strings.Contains(why, "Out of bounds values : 4 FAILED") {
			t.Errorf("%s: verdict %v %q", c.name, ok, why)
		}
	}
}

// TestEveryRankPrinted: an nccl-tests built without MPI, started by mpirun or srun on
// two ranks, runs two 1-rank worlds, and each prints its own table. With launcher
// prefixes the lines are told apart and rank 0's table is kept; without them (the copies
// interleaved line by line, as in NVIDIA/nccl-tests#107), "Rank 0" listed twice says so,
// and the repeated header and rows are read once.
func TestEveryRankPrinted(t *testing.T) {
	lines := realLines(t, "issue287-single-gpu-command-only.txt")
	other := make([]string, len(lines))
	for i, l := range lines {
		// The other rank's copy: another pid, another time for the row.
		l = strings.Replace(l, "Pid 2181762 on   GENOA-01", "Pid 2181763 on   GENOA-02", 1)
		other[i] = strings.Replace(l, "   19.56  1715.44", "   19.60  1711.94", 1)
	}
	cases := []struct {
		name    string
		in      string
		printed string
	}{
		{"mpirun --tag-output, rank 1 first", interleave(prefixed(other, func(int) string { return "[1,1]<stdout>:" }), prefixed(lines, func(int) string { return "[1,0]<stdout>:" })), "[1,0]"},
		{"srun --label", interleave(prefixed(lines, func(int) string { return "0: " }), prefixed(other, func(int) string { return "1: " })), "0"},
		{"pdsh", interleave(prefixed(lines, func(int) string { return "GENOA-01: " }), prefixed(other, func(int) string { return "GENOA-02: " })), "GENOA-01"},
		{"no prefix, interleaved", interleave(prefixed(lines, func(int) string { return "" }), prefixed(other, func(int) string { return "" })), ""},
	}
	for _, c := range cases {
		res, err := Parse(strings.NewReader(c.in), ParseOptions{})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		r := res[0]
		if len(res) != 1 || r.Op != AllToAll || r.Ranks != 1 || len(r.Rows) != 2 || r.Copies != 2 || r.PrintedBy != c.printed {
			t.Errorf("%s: %d results, op %q ranks %d rows %d copies %d printed by %q", c.name, len(res), r.Op, r.Ranks, len(r.Rows), r.Copies, r.PrintedBy)
			continue
		}
		if c.printed != "" && Micros(r.Rows[0].Time) != 19.56 {
			t.Errorf("%s: row 0 time %v, want rank 0's 19.56", c.name, Micros(r.Rows[0].Time))
		}
	}
}

// TestCommandLines: the operation comes from a command line that runs the program,
// not from other lines that mention one.
func TestCommandLines(t *testing.T) {
	table := "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n" +
		"     1048576        262144     float     sum      -1    28.56   36.71   64.24      0    28.37   36.96   64.68      0\n"
	cases := []struct {
		before string
		op     Op
	}{
		{"$ ./build/alltoall_perf -b 8 -e 128M -f 2 -g 8\n", AllToAll},
		{"Running: CUDA_VISIBLE_DEVICES=0,1 ./build/all_gather_perf -b 8 -e 10240M -f 2 -g 2\n", AllGather},
		{"+ mpirun -np 16 /opt/nccl-tests/build/reduce_scatter_perf_mpi -b 8\n", ReduceScatter},
		{"[root@test nccl-tests-master]# ./build/broadcast_perf -b 8 -e 128M -f 2 -g 8\n", Broadcast},
		{"srun --mpi=pmix all_reduce_perf_mpi -b 512M -e 8G -f 2 -g 1\n", AllReduce},
		{"    `sendrecv_perf -b 1M`\n", SendRecv},
		// Not a command: the build's link line, a redirection's target, nvidia-smi's
		// process list.
		{"Linking  /home/u/nccl-tests/build/all_gather.o > /home/u/nccl-tests/build/all_gather_perf\n", ""},
		{"mpirun -np 8 ./run.sh > all_reduce_perf.log\n", ""},
		{"|    0   N/A  N/A   3203007      C   ...ests-2.17.8/./build/all_reduce_perf        788MiB |\n", ""},
	}
	for _, c := range cases {
		res, err := Parse(strings.NewReader(c.before+table), ParseOptions{})
		if err != nil {
			t.Errorf("%q: %v", c.before, err)
			continue
		}
		if res[0].Op != c.op || (c.op != "") != (res[0].OpSource == OpFromCommand) || res[0].Rows[0].Op != c.op {
			t.Errorf("%q: op %q from %q, want %q", c.before, res[0].Op, res[0].OpSource, c.op)
		}
	}
	// The log's own line wins over a command line, and the command line over --op.
	res, _ := Parse(strings.NewReader("./build/alltoall_perf\n# Collective test starting: all_gather_perf\n"+table), ParseOptions{Op: Broadcast})
	if res[0].Op != AllGather || res[0].OpSource != OpFromLog || res[0].Program != "all_gather_perf" {
		t.Errorf("collective line: %q from %q", res[0].Op, res[0].OpSource)
	}
	res, _ = Parse(strings.NewReader("./build/alltoall_perf\n"+table), ParseOptions{Op: Broadcast, OpSource: "file name"})
	if res[0].Op != AllToAll {
		t.Errorf("command line and --op: %q", res[0].Op)
	}
	res, _ = Parse(strings.NewReader(table), ParseOptions{Op: Broadcast, OpSource: "file name"})
	if res[0].Op != Broadcast || res[0].OpSource != "file name" {
		t.Errorf("--op from the file name: %q from %q", res[0].Op, res[0].OpSource)
	}
}

// TestSeveralRuns: a file holding several programs' runs, each named only by its
// command line, gives one result per run, each named.
func TestSeveralRuns(t *testing.T) {
	var b strings.Builder
	for _, op := range []Op{AllGather, AllReduce, AllToAll} {
		fmt.Fprintf(&b, "Running: ./build/%s -b 1M -e 2M -f 2 -g 8\n", op.Program())
		b.WriteString("# nThread 1 nGpus 8 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n#\n# Using devices\n")
		for r := 0; r < 8; r++ {
			fmt.Fprintf(&b, "#   Rank %2d Pid  88131 on    seville device %2d [0x36] Tesla V100-SXM3-32GB\n", r, r)
		}
		b.WriteString("#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n")
		b.WriteString("     1048576        262144   float     sum    89.15   11.76   21.56  2e-07    88.14   11.90   21.81  2e-07\n")
		b.WriteString("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 21.685\n#\n")
	}
	res, err := Parse(strings.NewReader(b.String()), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || res[0].Op != AllGather || res[1].Op != AllReduce || res[2].Op != AllToAll {
		t.Fatalf("%d results: %+v", len(res), res)
	}
	for _, r := range res {
		if r.Ranks != 8 || len(r.Rows) != 2 || r.OpSource != OpFromCommand || r.OutOfBounds == nil || r.Line == 0 {
			t.Errorf("%s: ranks %d rows %d from %q oob %v line %d", r.Op, r.Ranks, len(r.Rows), r.OpSource, r.OutOfBounds, r.Line)
		}
	}
}

// TestNewerColumns: nccl-tests 2.17's -S timestamp column and 2.19's -I per-iteration
// columns (src/util.cu writeResultHeader), and NCCL_TESTS_MIN_BW's verdict on the
// average.
func TestNewerColumns(t *testing.T) {
	ts := "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong           timestamp\n" +
		"#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)           %Y-%m-%d %H:%M:%S\n" +
		"     1048576        262144     float     sum      -1    28.56   36.71   64.24       0    28.37   36.96   64.68       0  2025-10-28 12:00:01\n" +
		"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 64.46 FAILED\n"
	res, err := Parse(strings.NewReader(ts), ParseOptions{})
	if err != nil || len(res[0].Rows) != 2 || res[0].AvgBusBWOK == nil || *res[0].AvgBusBWOK {
		t.Fatalf("timestamps: %v %+v", err, res)
	}
	if ok, why := res[0].Verdict(); ok || !strings.Contains(why, "Avg bus bandwidth : 64.46 FAILED") {
		t.Errorf("min bw verdict: %v %q", ok, why)
	}
	per := "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%\n" +
		"     1048576        262144     float     sum      -1    28.56   36.71   64.24       0    27.10    30.02    29.95     1.20    28.37   36.96   64.68       0    27.00    29.80    29.70     1.10\n"
	res, err = Parse(strings.NewReader(per), ParseOptions{})
	if err != nil || len(res[0].Rows) != 2 || res[0].Rows[1].BusBW != 64.68 || !res[0].Rows[1].InPlace {
		t.Fatalf("per-iteration columns: %v %+v", err, res)
	}
}

// TestFailures: where a failure lands and what the verdict says.
func TestFailures(t *testing.T) {
	header := "# nThread 1 nGpus 2 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n" +
		"#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
	row := "           8             2     float     sum      -1    15.60    0.00    0.00      0    15.22    0.00    0.00      0\n"
	cases := []struct {
		name, in string
		results  int
		rows     int
		where    string
	}{
		{"between rows", header + row + "gpu: Test CUDA failure common.cu:422 'uncorrectable ECC error encountered'\n .. gpu pid 1: Test failure common.cu:1189\n",
			1, 2, "after size 8"},
		{"in a row", header + row + "          16             4     float     sum      -1 gpu: Test NCCL failure common.cu:392 'unhandled system error'\n",
			1, 2, `at size 16 (row "16 4 float sum -1")`},
		{"2017's format", header + row + "Cuda failure common.cu:393 'out of memory'\n", 1, 2, "after size 8"},
		{"srun-labelled, from another rank", prefixed(strings.Split(strings.TrimSuffix(header+row, "\n"), "\n"), func(int) string { return "0: " }) +
			"3: gpu-3: Test CUDA failure common.cu:389 'an illegal memory access was encountered'\n", 1, 2, "after size 8"},
		{"after the table", header + row + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0\ngpu: Test CUDA failure common.cu:900 'driver shutting down'\n",
			1, 2, "after size 8"},
		{"no run at all", "gpu: Test CUDA failure common.cu:1030 'system not yet initialized'\n", 1, 0, "before its first row"},
	}
	for _, c := range cases {
		res, err := Parse(strings.NewReader(c.in), ParseOptions{Op: AllReduce})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if len(res) != c.results || len(res[0].Rows) != c.rows || res[0].Failure == nil {
			t.Errorf("%s: %d results, %d rows, failure %v", c.name, len(res), len(res[0].Rows), res[0].Failure)
			continue
		}
		ok, why := res[0].Verdict()
		if ok || !strings.Contains(why, "the run failed "+c.where+": ") || !strings.Contains(why, res[0].Failure.Text) {
			t.Errorf("%s: verdict %v %q, want it to say %q", c.name, ok, why, c.where)
		}
	}
	// Not failures: NCCL's own warning without nccl-tests' FILE:LINE.
	res, err := Parse(strings.NewReader(header+"GENOA-06:4766:4766 [1] enqueue.cc:1500 NCCL WARN Cuda failure 1 'invalid argument'\n"+row), ParseOptions{})
	if err != nil || res[0].Failure != nil || len(res[0].Rows) != 2 {
		t.Errorf("NCCL WARN: %v %+v", err, res)
	}
}

// TestRanksFromRows: when an excerpt lists no ranks, or cuts the list, the ranks are
// the count nccl-tests' bus factor maps algbw to busbw with; when the rows fit several
// counts, none is guessed.
func TestRanksFromRows(t *testing.T) {
	rows := func(alg, bus string) string {
		return "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n" +
			"  8589934592    2147483648     float     sum      -1    33605  " + alg + "  " + bus + "      0    33628  " + alg + "  " + bus + "      0\n"
	}
	cases := []struct {
		name     string
		op       Op
		in       string
		ranks    int
		inferred bool
	}{
		{"all_reduce, 16 ranks (AWS p5 × 2)", AllReduce, rows("255.62", "479.28"), 16, true},
		{"all_gather, 8 ranks", AllGather, rows("200.00", "175.00"), 8, true},
		{"listed ranks win", AllReduce, "#  Rank  0 Group  0 Pid 1 on h device  0 [0x01] GPU\n#  Rank  1 Group  0 Pid 1 on h device  1 [0x02] GPU\n" + rows("255.62", "479.28"), 2, false},
		{"list cut after rank 4", AllReduce, "#   Rank  3 Pid 1 on h device  3 [0x01] GPU\n#   Rank  4 Pid 1 on h device  4 [0x02] GPU\n...\n" + rows("76.31", "147.85"), 32, true},
		{"list cut, op unknown", "", "#   Rank  4 Pid 1 on h device  4 [0x02] GPU\n...\n" + rows("76.31", "147.85"), 0, false},
		{"last rank shown only", AllReduce, "#  Rank 1439 Group  0 Pid 1 on h device  3 [0x01] GPU\n" + rows("203.01", "405.74"), 1440, false},
		{"busbw = algbw (old all_gather): any large count fits", AllGather, rows("129.05", "129.05"), 0, false},
		{"broadcast: the factor does not depend on the ranks", Broadcast, rows("129.05", "129.05"), 0, false},
	}
	for _, c := range cases {
		res, err := Parse(strings.NewReader(c.in), ParseOptions{Op: c.op})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if res[0].Ranks != c.ranks || res[0].RanksInferred != c.inferred {
			t.Errorf("%s: ranks %d inferred %v, want %d %v", c.name, res[0].Ranks, res[0].RanksInferred, c.ranks, c.inferred)
		}
	}
}

// TestBareCommentLines: before 2019 nccl-tests printed its summary lines without '#',
// and a copy from a rendered page loses it; prose that mentions the words is not one.
func TestBareCommentLines(t *testing.T) {
	in := " nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n" +
		"   Rank  0 Pid 1821213 on AI-A100-Beethoven01 device  0 [0x00] NVIDIA A100-SXM4-40GB\n" +
		"   Rank  1 Pid 1821214 on AI-A100-Beethoven01 device  1 [0x00] NVIDIA A100-SXM4-40GB\n" +
		"       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n" +
		"           8             2   float     sum    59.98    0.00    0.00  2e-07    56.81    0.00    0.00  1e-07\n" +
		" Out of bounds values : 0 OK\n Avg bus bandwidth    : 0.5\n" +
		"The Avg bus bandwidth is what to compare: Out of bounds values should be 0.\n"
	res, err := Parse(strings.NewReader(in), ParseOptions{})
	if err != nil || len(res) != 1 || res[0].Ranks != 2 || len(res[0].Rows) != 2 || res[0].AvgBusBW != 0.5 || res[0].OutOfBounds == nil {
		t.Fatalf("%v %+v", err, res)
	}
}
