package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// update rewrites the golden files under testdata/ instead of comparing with them:
// go test ./cmd/gangrun -update.
var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// gangrunBin is the gangrun binary built once for the tests that run it as a process
// (signals, process groups, a driverless machine).
var gangrunBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "gangrun-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gangrunBin = filepath.Join(dir, "gangrun")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	build := exec.Command(goTool, "build", "-o", gangrunBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestSignalsEndCommandsThatDoNotCatchThem: a command with nothing to hand over
// (bench parse, hostlist compress, topo --topology-file) blocked reading a pipe that
// never closes dies of SIGINT or SIGTERM at once, as any Unix filter would.
func TestSignalsEndCommandsThatDoNotCatchThem(t *testing.T) {
	cases := [][]string{
		{"bench", "parse", "/dev/stdin"},
		{"hostlist", "compress"},
		{"topo", "--topology-file", "/dev/stdin"},
	}
	for _, args := range cases {
		for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
			t.Run(strings.Join(args[:2], " ")+" "+sig.String(), func(t *testing.T) {
				cmd := exec.Command(gangrunBin, args...)
				stdin, err := cmd.StdinPipe() // held open: the command blocks reading it
				if err != nil {
					t.Fatal(err)
				}
				defer stdin.Close()
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(200 * time.Millisecond) // let it reach the read
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				select {
				case <-done:
					ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
					if !ws.Signaled() || ws.Signal() != sig {
						t.Errorf("gangrun %v ended with %v, want death by %v", args, cmd.ProcessState, sig)
					}
				case <-time.After(10 * time.Second):
					_ = cmd.Process.Kill()
					<-done
					t.Fatalf("gangrun %v still running 10s after %v", args, sig)
				}
			})
		}
	}
}
