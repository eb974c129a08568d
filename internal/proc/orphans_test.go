package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
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
	pidsOf := func(cs []child) []int {
		var out []int
		for _, c := range cs {
			if c.pgid != syscall.Getpgrp() {
				t.Errorf("child %d: process group %d, want the test's %d", c.pid, c.pgid, syscall.Getpgrp())
			}
			out = append(out, c.pid)
		}
		return out
	}
	got := pidsOf(children(os.Getpid(), nil))
	for _, pid := range pids {
		if !slices.Contains(got, pid) {
			t.Errorf("children() = %v, want it to hold %d", got, pid)
		}
	}
	if got := pidsOf(children(os.Getpid(), map[int]bool{pids[0]: true})); slices.Contains(got, pids[0]) || !slices.Contains(got, pids[1]) {
		t.Errorf("children() keeping %d = %v", pids[0], got)
	}
}
