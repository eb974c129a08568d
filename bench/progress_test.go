package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	s := Step{Op: AllGather, SizeBytes: 64 << 20, InPlace: true, Index: 12, Total: 28, BytesBefore: 1 << 20, BytesTotal: 4 << 20}
	left, ok := s.Remaining(10 * time.Second)
	if !ok || left != 30*time.Second {
		t.Errorf("Remaining = %v, %v; want 30s (3 MiB left after 1 MiB in 10s)", left, ok)
	}
	got := ProgressLine(s, "node-a–node-b", 75*time.Second, left, ok)
	want := "all_gather 64M in-place · step 12/28 · pair node-a–node-b · 1:15 elapsed · ~0:30 left"
	if got != want {
		t.Errorf("ProgressLine = %q, want %q", got, want)
	}
	first := Step{Op: AllReduce, SizeBytes: 1024, Index: 1, Total: 7, BytesTotal: 1 << 20}
	if _, ok := first.Remaining(time.Second); ok {
		t.Error("Remaining known before any bytes are done")
	}
	if got := ProgressLine(first, "", 3*time.Hour+2*time.Second, 0, false); got != "all_reduce 1K out-of-place · step 1/7 · 3:00:02 elapsed" {
		t.Errorf("ProgressLine = %q", got)
	}
	if _, err := ParseStep([]byte("{bad")); err == nil {
		t.Error("ParseStep of bad JSON: no error")
	}
}

// TestFollow appends to a file while Follow reads it: every complete line arrives once,
// in order, including the ones written just before the context ends.
func TestFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "progress.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, path, 5*time.Millisecond, func(line []byte) {
			mu.Lock()
			got = append(got, string(line))
			mu.Unlock()
		})
	}()
	time.Sleep(20 * time.Millisecond) // the file does not exist yet
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 0; i < 50; i++ {
		line := strings.Repeat("x", i) + "!"
		want = append(want, line)
		// Write each line in two pieces to exercise partial lines.
		f.WriteString(line[:i/2])
		time.Sleep(time.Millisecond)
		f.WriteString(line[i/2:] + "\n")
	}
	f.WriteString("partial, never ended")
	f.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %d lines %q, want %d", len(got), got, len(want))
	}
}
