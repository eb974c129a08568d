package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunWithAFIFOPinStartsAndStops: a checkpoint directory holding a pin that is a
// named pipe (and a .gangrun/lock that is one) neither blocks `run` before it starts
// nor keeps it from ending on SIGTERM: the workers start, resume from the newest
// checkpoint, and the run ends soon after the signal, as 128+15.
func TestRunWithAFIFOPinStartsAndStops(t *testing.T) {
	mark := testMark(t)
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	for _, p := range []string{"checkpoint-1", "checkpoint-2", ".gangrun/pins"} {
		if err := os.MkdirAll(filepath.Join(ckpt, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []string{"checkpoint-1", "checkpoint-2"} {
		if err := os.WriteFile(filepath.Join(ckpt, c, "trainer_state.json"), []byte(`{"global_step": 1}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{".gangrun/pins/pin-f.json", ".gangrun/lock"} {
		if err := syscall.Mkfifo(filepath.Join(ckpt, f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	started := filepath.Join(dir, "started")
	cmd := exec.Command(gangrunBin, "run", "--checkpoint-dir", ckpt, "--term-timeout", "5s", "--",
		"/bin/sh", "-c", `echo "resume=$GANGRUN_RESUME_FROM" > `+started+`; exec sleep 60`)
	cmd.Env = append(os.Environ(), mark)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(started); err == nil && len(b) > 0 {
			if !strings.Contains(string(b), "checkpoint-2") {
				t.Errorf("resumed from %q, want checkpoint-2", b)
			}
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("the workers never started: run blocked on the planted FIFOs; stderr:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("still running 30 s after SIGTERM; stderr:\n%s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d; stderr:\n%s", code, 128+int(syscall.SIGTERM), stderr.String())
	}
}
