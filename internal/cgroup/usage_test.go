package cgroup_test

import (
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
)

// TestStepUsage: a worker that writes 96 MiB and spins on the CPU shows in its step
// cgroup's usage: a peak of at least that much memory (on the node's hierarchy, v1
// here), CPU time, and its process while it runs; once it has ended, the peak stays.
func TestStepUsage(t *testing.T) {
	st := newStep(t, cgroup.Limits{PidsLimit: cgroup.DefaultPidsLimit})
	if u := st.Usage(); u.PeakBytes != 0 || u.Procs != 0 {
		t.Fatalf("a new cgroup's usage: %+v", u)
	}
	python := os.Getenv("GANGRUN_PYTHON")
	if python == "" {
		python = "python3"
	}
	// 96 MiB written, then a second of CPU, then it waits to be read.
	cmd := exec.Command(python, "-c", `import sys, time
b = [b'x' * (16 << 20) for _ in range(6)]
t = time.process_time()
while time.process_time() - t < 1: pass
print('ready', flush=True)
sys.stdin.read()`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := proc.StartPlaced(cmd, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("the worker said %q, %v", buf, err)
	}
	u := st.Usage()
	if u.PeakBytes < 96<<20 || u.CurrentBytes < 96<<20 || u.Procs != 1 || u.CPU < 900*time.Millisecond {
		t.Errorf("usage while it runs: %+v, want peak and current at least 96 MiB, 1 process, about 1 s of CPU", u)
	}
	stdin.Close()
	<-p.Exited()
	p.Release()
	if after := st.Usage(); after.PeakBytes < 96<<20 || after.Procs != 0 {
		t.Errorf("usage once it ended: %+v, want the peak kept and no process", after)
	}
}
