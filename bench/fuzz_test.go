package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary text to Parse: it must never panic, and what it accepts
// must print in every format and parse back from the table with the same rows, the same
// verdict and the same failure. The seeds are the test fixtures and the real logs
// (launcher prefixes, verdicts, failures, several runs).
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(fixtures, "*.txt"))
	real, _ := filepath.Glob(filepath.Join(realLogs, "*.txt"))
	files = append(files, real...)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("#  size count type time algbw busbw #wrong\n 8 2 float 1 0 0 N/A\n")
	f.Add("# size count type redop root time algbw busbw error time algbw busbw error\n 8 2 float sum -1 1 0 0 1e-07* 1 0 0 N/A\n# Avg bus bandwidth : 1e-05\n")
	f.Add("[1,0]<stdout>:#  size count type time algbw busbw #wrong\n[1,1]<stdout>:#  size count type time algbw busbw #wrong\n[1,0]<stdout>: 8 2 float 1 0 0 0\n[1,1]<stdout>: 8 2 float 1 0 0 3\n")
	f.Add(" 0: # size count type redop root time algbw busbw #wrong time algbw busbw #wrong timestamp\n 0:  8 2 float sum -1 1 0 0 0 1 0 0 0 2025-01-02 03:04:05\n 0: # Out of bounds values : 6 FAILED\n")
	f.Add("$ ./build/alltoall_perf -b 8\n#  Rank  0 Group  0 Pid 1 on h device  0 [0x01] GPU\n#  Rank  0 Group  0 Pid 2 on g device  0 [0x01] GPU\n# size count type time algbw busbw #wrong\n# size count type time algbw busbw #wrong\n 8 2 float 1 0 0 0\n 8 2 float 1 0 0 0\n 16 4 float 1 0 0 0 h: Test CUDA failure common.cu:1 'x'\n")
	f.Fuzz(func(t *testing.T, in string) {
		res, err := Parse(strings.NewReader(in), ParseOptions{})
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		for _, format := range []Format{Table, JSON, CSV} {
			if err := Write(&bytes.Buffer{}, format, res); err != nil {
				t.Fatalf("Write(%d): %v", format, err)
			}
		}
		var buf bytes.Buffer
		_ = WriteTable(&buf, res)
		back, err := Parse(&buf, ParseOptions{})
		if err != nil {
			t.Fatalf("printed table does not parse back: %v\n%s", err, buf.String())
		}
		if len(back) != len(res) {
			t.Fatalf("%d results back, want %d\n%s", len(back), len(res), buf.String())
		}
		for i := range res {
			if len(back[i].Rows) != len(res[i].Rows) {
				t.Fatalf("result %d: %d rows back, want %d", i, len(back[i].Rows), len(res[i].Rows))
			}
			okA, _ := res[i].Verdict()
			okB, _ := back[i].Verdict()
			if okA != okB || (res[i].Failure == nil) != (back[i].Failure == nil) {
				t.Fatalf("result %d: verdict %v failure %v back, want %v %v\n%s", i, okB, back[i].Failure, okA, res[i].Failure, buf.String())
			}
			for j, r := range res[i].Rows {
				b := back[i].Rows[j]
				if b.SizeBytes != r.SizeBytes || b.Count != r.Count || b.InPlace != r.InPlace || (b.Wrong == nil) != (r.Wrong == nil) {
					t.Fatalf("result %d row %d: %+v back, want %+v", i, j, b, r)
				}
			}
		}
	})
}
