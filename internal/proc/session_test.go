package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKillSession: a process started with Setsid leads a session of its own (and a
// process group of the same id); two processes it leaves behind, each in a process
// group of its own (as a shell's jobs), outlive its exit and a SIGKILL to its group,
// and KillSession kills them, while a process of another session is left alone.
func TestKillSession(t *testing.T) {
	dir := t.TempDir()
	// Each child moves to a group of its own, writes its pid and sleeps.
	child := `import os, sys, time
os.setpgid(0, 0)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)`
	script := `for n in 1 2; do /usr/bin/python3 -c "$CHILD" "$DIR/$n" & done; while [ ! -e "$DIR/1" ] || [ ! -e "$DIR/2" ]; do sleep 0.05; done`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "CHILD="+child, "DIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	other := exec.Command("sleep", "600") // the test's own session
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	if sid, _ := unix.Getsid(p.Pid()); sid != p.Pid() {
		t.Fatalf("session of the Setsid process %d: %d, want its own", p.Pid(), sid)
	}
	<-p.Exited()
	var pids []int
	for _, n := range []string{"1", "2"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		pids = append(pids, pid)
		t.Cleanup(func() { _ = unix.Kill(pid, syscall.SIGKILL) })
	}
	_ = p.Signal(syscall.SIGKILL) // the leader's group: not theirs
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("process %d died with its session leader's group: the test proves nothing", pid)
		}
	}
	if n := KillSession(p.Pid()); n != 2 {
		t.Errorf("KillSession killed %d processes, want 2", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("process %d of the session is still alive", pid)
		}
	}
	if !alive(other.Process.Pid) {
		t.Errorf("a process of another session was killed")
	}
	if _, err := p.Release(); err != nil {
		t.Fatal(err)
	}
}

// alive reports whether pid runs (exists and is no zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}
