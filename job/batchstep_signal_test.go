package job

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/proc"
)

// TestBatchStepSendsSIGTERMOnce: a task that got SIGTERM (from srun's forward, say)
// gets none again when the step stops it (terminate through batchStep.signal): only the
// SIGKILL after the grace. A `gangrun run` task takes a second SIGTERM for "kill now".
func TestBatchStepSendsSIGTERMOnce(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "terms")
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command("sh", "-c", `trap 'echo TERM >> "$0"' TERM; : > "$1"; while :; do sleep 0.05; done`, got, ready)
	p, err := proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Signal(syscall.SIGKILL) }()
	bs := &batchStep{termed: map[*proc.Process]bool{}}
	count := func() int { b, _ := os.ReadFile(got); return strings.Count(string(b), "TERM") }
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break // the trap is set
		}
		if time.Now().After(deadline) {
			t.Fatal("the task never set its trap")
		}
	}
	bs.signal(p, syscall.SIGTERM) // srun's forward
	for deadline := time.Now().Add(time.Minute); count() < 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := count(); n != 1 {
		t.Fatalf("after the first SIGTERM the task saw %d", n)
	}
	terminate([]*proc.Process{p}, 500*time.Millisecond, bs.signal) // the step's stop
	if n := count(); n != 1 {
		t.Errorf("the task saw %d SIGTERMs, want 1 (then SIGKILL after the grace)", n)
	}
}
