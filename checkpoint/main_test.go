package checkpoint

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Helper modes: the test binary re-executes itself to act as another process.
const (
	// envPinHelper (DIR) with envPinPath (PATH): pin PATH in DIR as job "helper-job",
	// print "pinned", then block until killed.
	envPinHelper = "GANGRUN_CKPT_TEST_PIN_HELPER"
	envPinPath   = "GANGRUN_CKPT_TEST_PIN_PATH"
	// envLatestHelper (DIR): print Latest(DIR)'s error, or its path.
	envLatestHelper = "GANGRUN_CKPT_TEST_LATEST_HELPER"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envPinHelper); dir != "" {
		path := os.Getenv(envPinPath)
		if _, err := Pin(dir, path, "helper-job"); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("pinned")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	if dir := os.Getenv(envLatestHelper); dir != "" {
		cp, err := Latest(dir, Options{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(0)
		}
		fmt.Println(cp.Path)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pinHelper starts a process that pins path in dir and returns it once the pin is
// written. The caller kills it.
func pinHelper(t *testing.T, dir, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPinHelper+"="+dir, envPinPath+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "pinned" {
		t.Fatalf("pin helper said %q, %v", line, err)
	}
	return cmd
}

// runAsNobody runs the test binary in a helper mode as uid/gid 65534, from a copy the
// unprivileged user can execute. It needs root.
func runAsNobody(t *testing.T, env string) string {
	t.Helper()
	binDir := t.TempDir()
	if err := os.Chmod(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(binDir), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "checkpoint.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as nobody: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}
