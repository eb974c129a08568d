package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestChildren finds a child by its parent pid in /proc, also when its command name
// holds spaces and parentheses (the stat line's comm field), and leaves out keep.
func TestChildren(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(t.TempDir(), "a) (b")
	if err := os.Symlink(sleep, odd); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, bin := range []string{sleep, odd} {
		cmd := exec.Command(bin, "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		pids = append(pids, cmd.Process.Pid)
	}
	got := children(os.Getpid(), nil)
	for _, pid := range pids {
		if !slices.Contains(got, pid) {
			t.Errorf("children() = %v, want it to hold %d", got, pid)
		}
	}
	if got := children(os.Getpid(), map[int]bool{pids[0]: true}); slices.Contains(got, pids[0]) || !slices.Contains(got, pids[1]) {
		t.Errorf("children() keeping %d = %v", pids[0], got)
	}
}
