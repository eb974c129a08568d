package slurm

import (
	"bytes"
	"testing"
)

// TestRawLines: srun's stderr writes "\n" as "\r\n" only while the terminal is raw, and
// a switch that failed leaves the mode as it was.
func TestRawLines(t *testing.T) {
	var out bytes.Buffer
	l := &rawLines{w: &out}
	write := func(s string) {
		t.Helper()
		if n, err := l.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	write("a\nb\n")
	l.switchMode(true, func() bool { return true })
	write("c\nd\n\n")
	l.switchMode(false, func() bool { return false }) // the restore failed: still raw
	write("e\n")
	l.switchMode(false, func() bool { return true })
	write("f\n")
	if got, want := out.String(), "a\nb\nc\r\nd\r\n\r\ne\r\nf\n"; got != want {
		t.Errorf("wrote %q, want %q", got, want)
	}
}
