package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realLogs holds nccl-tests output collected from public issue threads and cluster
// guides, each file as published (README.md names its source), and expect.json, what
// each must parse into, read off the logs by hand.
const realLogs = "testdata/nccl-tests/real"

// realExpectation is one entry of expect.json.
type realExpectation struct {
	File    string `json:"file"`
	Exit    int    `json:"exit"` // what `gangrun bench parse` exits with: 1 when any result fails its verdict
	Results []struct {
		Op    Op       `json:"op"`
		Ranks int      `json:"ranks"`
		Rows  int      `json:"rows"`
		Avg   *float64 `json:"avg"` // as printed; null: the log has none, the mean of the rows
		OOB   *int64   `json:"oob"` // the log's "Out of bounds values" count; null: none printed
		// Optional.
		OpSource      string `json:"op_source"`
		RanksInferred bool   `json:"ranks_inferred"`
		PrintedBy     string `json:"printed_by"`
		Failure       *struct {
			Kind, File, Host string
			Line             int
			AtSize           int64 `json:"at_size"`
		} `json:"failure"`
	} `json:"results"`
}

func loadRealExpectations(t testing.TB) []realExpectation {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(realLogs, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var es []realExpectation
	if err := json.Unmarshal(b, &es); err != nil {
		t.Fatal(err)
	}
	return es
}

// TestRealLogs parses every collected log and checks it against expect.json: the
// operation and where it came from, the ranks, the number of timed halves, the average
// as printed, the log's own out-of-bounds count, the failure that cut a run short, the
// launcher label of the copy taken, and the exit status the verdicts give.
func TestRealLogs(t *testing.T) {
	es := loadRealExpectations(t)
	files, _ := filepath.Glob(filepath.Join(realLogs, "*.txt"))
	if len(files) != len(es) || len(es) < 25 {
		t.Fatalf("%d logs, %d expectations: every log needs one (and there are at least 25)", len(files), len(es))
	}
	readme, err := os.ReadFile(filepath.Join(realLogs, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		t.Run(e.File, func(t *testing.T) {
			if !bytes.Contains(readme, []byte("`"+e.File+"`")) {
				t.Errorf("README.md does not name the source of %s", e.File)
			}
			f, err := os.Open(filepath.Join(realLogs, e.File))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			res, err := Parse(f, ParseOptions{})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(res) != len(e.Results) {
				t.Fatalf("%d results, want %d", len(res), len(e.Results))
			}
			exit := 0
			for i, want := range e.Results {
				got := res[i]
				if got.Op != want.Op || got.Ranks != want.Ranks || len(got.Rows) != want.Rows {
					t.Errorf("result %d: op %q ranks %d rows %d; want %q %d %d", i, got.Op, got.Ranks, len(got.Rows), want.Op, want.Ranks, want.Rows)
				}
				avg := MeanBusBW(got.Rows)
				if want.Avg != nil {
					avg = *want.Avg
				}
				if math.Abs(got.AvgBusBW-avg) > 1e-9 {
					t.Errorf("result %d: avg busbw %v, want %v", i, got.AvgBusBW, avg)
				}
				switch {
				case want.OOB == nil && got.OutOfBounds != nil:
					t.Errorf("result %d: out of bounds %+v, but the log printed none", i, *got.OutOfBounds)
				case want.OOB != nil && (got.OutOfBounds == nil || got.OutOfBounds.Count != *want.OOB || got.OutOfBounds.OK != (*want.OOB == 0)):
					t.Errorf("result %d: out of bounds %+v, want the log's %d", i, got.OutOfBounds, *want.OOB)
				}
				if want.OpSource != "" && got.OpSource != want.OpSource {
					t.Errorf("result %d: op source %q, want %q", i, got.OpSource, want.OpSource)
				}
				if got.RanksInferred != want.RanksInferred || got.PrintedBy != want.PrintedBy {
					t.Errorf("result %d: ranks inferred %v printed by %q; want %v %q", i, got.RanksInferred, got.PrintedBy, want.RanksInferred, want.PrintedBy)
				}
				switch wf, gf := want.Failure, got.Failure; {
				case wf == nil && gf != nil:
					t.Errorf("result %d: failure %+v, want none", i, *gf)
				case wf != nil && gf == nil:
					t.Errorf("result %d: no failure, want %+v", i, *wf)
				case wf != nil:
					if gf.Kind != wf.Kind || gf.File != wf.File || gf.Line != wf.Line || gf.Host != wf.Host ||
						!strings.Contains(gf.Text, "failure "+wf.File) {
						t.Errorf("result %d: failure %+v, want %+v", i, *gf, *wf)
					}
					if (wf.AtSize != 0) != (gf.Row != nil) || gf.Row != nil && gf.Row.SizeBytes != wf.AtSize {
						t.Errorf("result %d: failed row %+v, want size %d", i, gf.Row, wf.AtSize)
					}
				}
				if ok, why := got.Verdict(); !ok {
					exit = 1
					if strings.Contains(why, "\n") {
						t.Errorf("result %d: verdict on several lines: %q", i, why)
					}
				}
			}
			if exit != e.Exit {
				t.Errorf("verdicts give exit %d, want %d", exit, e.Exit)
			}
		})
	}
}

// TestRealLogsGolden prints every collected log as a table and as JSON and compares
// with testdata/golden/real/ (go test ./bench -update rewrites them); the table must
// parse back to the same rows, verdict and failure.
func TestRealLogsGolden(t *testing.T) {
	for _, e := range loadRealExpectations(t) {
		f, err := os.Open(filepath.Join(realLogs, e.File))
		if err != nil {
			t.Fatal(err)
		}
		res, err := Parse(f, ParseOptions{})
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", e.File, err)
		}
		base := strings.TrimSuffix(e.File, ".txt")
		for _, g := range []struct {
			ext    string
			format Format
		}{{"table", Table}, {"json", JSON}} {
			var buf bytes.Buffer
			if err := Write(&buf, g.format, res); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "golden", "real", base+"."+g.ext)
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
				t.Errorf("%s: output differs from %s:\n%s", e.File, golden, buf.String())
			}
			if g.format != Table {
				continue
			}
			back, err := Parse(&buf, ParseOptions{})
			if err != nil {
				t.Fatalf("%s: the table does not parse back: %v", e.File, err)
			}
			if len(back) != len(res) {
				t.Fatalf("%s: %d results back, want %d", e.File, len(back), len(res))
			}
			for i := range res {
				okA, _ := res[i].Verdict()
				okB, _ := back[i].Verdict()
				if len(back[i].Rows) != len(res[i].Rows) || okA != okB || (back[i].Failure == nil) != (res[i].Failure == nil) {
					t.Errorf("%s result %d: %d rows, verdict %v, failure %v back; want %d %v %v", e.File, i,
						len(back[i].Rows), okB, back[i].Failure != nil, len(res[i].Rows), okA, res[i].Failure != nil)
				}
			}
		}
	}
}
