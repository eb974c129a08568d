package cgroup

import (
	"os"
	"testing"
	"time"
)

// TestProcCPU: v1's CPU figure, a process's utime+stime+cutime+cstime from
// /proc/PID/stat, grows as this test process spins (it spins until procCPU shows 100
// ms more, for at most 60 s however loaded the machine), and a pid that is gone
// counts none.
func TestProcCPU(t *testing.T) {
	before := procCPU(os.Getpid())
	var x uint64
	deadline := time.Now().Add(time.Minute)
	for procCPU(os.Getpid())-before < 100*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute of spinning, procCPU grew by %s, want 100ms", procCPU(os.Getpid())-before)
		}
		for i := range 100000 {
			x += uint64(i) ^ x
		}
	}
	_ = x
	if got := procCPU(1 << 30); got != 0 {
		t.Errorf("procCPU of no process: %s, want 0", got)
	}
}
