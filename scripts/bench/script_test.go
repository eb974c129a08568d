package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/bench"
)

// TestScriptFormat: the script writes the results format bench.DecodeScript accepts.
func TestScriptFormat(t *testing.T) {
	if !strings.Contains(Source(), `FORMAT = "`+bench.ScriptFormat+`"`) {
		t.Errorf("collectives.py does not write format %q", bench.ScriptFormat)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path, err := Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != Source() || path != filepath.Join(dir, ScriptName) {
		t.Errorf("Write wrote %s (%d bytes, %v)", path, len(b), err)
	}
	if _, err := Write(filepath.Join(dir, "missing")); err == nil {
		t.Error("Write into a missing directory: no error")
	}
}

func TestArgs(t *testing.T) {
	p := bench.Plan{Ops: []bench.Op{bench.AllReduce, bench.AllToAll}, MinBytes: 1024, MaxBytes: 1 << 20,
		StepFactor: 4, Warmup: 2, Iters: 9, DType: "half", Check: true}
	got := strings.Join(Args(p, "nccl", "/tmp/out.json", "/tmp/p.jsonl"), " ")
	want := "--ops all_reduce,alltoall --min-bytes 1024 --max-bytes 1048576 --step-factor 4 --warmup 2 --iters 9 --dtype half --backend nccl --check 1 --out /tmp/out.json --progress /tmp/p.jsonl"
	if got != want {
		t.Errorf("Args = %q\nwant   %q", got, want)
	}
	p.Check = false
	if got := strings.Join(Args(p, "gloo", "o", ""), " "); !strings.Contains(got, "--check 0 --out o") || strings.Contains(got, "--progress") {
		t.Errorf("Args without check and progress = %q", got)
	}
}
