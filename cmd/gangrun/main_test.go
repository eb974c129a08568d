package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/mungetest"
)

// update rewrites the golden files under testdata/ instead of comparing with them:
// go test ./cmd/gangrun -update.
var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// gangrunBin is the gangrun binary built once for the tests that run it as a process
// (signals, process groups, a driverless machine).
var gangrunBin string

// testMunge is the package's munged (TestMain): its key is the test cluster's.
var testMunge *mungetest.Daemon

// agentTmp is the TMPDIR of the agents the tests start (agentEnv), made and removed
// by TestMain.
var agentTmp string

// agentEnv is the environment of an agent a test starts: the test's own, with TMPDIR
// the package's agentTmp, then extra (which may set another).
func agentEnv(extra ...string) []string {
	return append(append(os.Environ(), "TMPDIR="+agentTmp), extra...)
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "gangrun-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gangrunBin = filepath.Join(dir, "gangrun")
	// Every user runs it: a Slurm job's tasks, as their user, start through it
	// (job.TaskPIDCommand), as they would from /usr/local/bin.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
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
	// One munged for the package, as every node of a cluster runs one with the
	// cluster's key: the agents the tests start check MUNGE credentials, as a default
	// cluster does, and the commands make them (docs/acl.md#identity).
	munged, err := mungetest.Launch("")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	os.Setenv("MUNGE_SOCKET", munged.Socket)
	testMunge = munged
	// The agents' TMPDIR (agentEnv): their step logs and default state directories
	// (gangrun-agent-NODE-*, gangrun-state-NODE) go there and are removed with it.
	if agentTmp, err = os.MkdirTemp("", "ga"); err == nil {
		err = os.Chmod(agentTmp, 0o1777)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		munged.Stop()
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	munged.Stop()
	os.RemoveAll(dir)
	os.RemoveAll(agentTmp)
	os.Exit(code)
}

// TestSignalsEndCommandsThatDoNotCatchThem: a command with nothing to hand over
// (bench parse -, hostlist compress) blocked reading a pipe that never closes dies of
// SIGINT or SIGTERM at once, as any Unix filter would. (A named pipe given as a file is
// refused before any read: TestNamedPipesAreRefused.)
func TestSignalsEndCommandsThatDoNotCatchThem(t *testing.T) {
	cases := [][]string{
		{"bench", "parse", "-"},
		{"hostlist", "compress"},
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

// TestNamedPipesAreRefused: a named pipe (or a pipe as /dev/stdin) where a command
// reads a file or lists a directory is refused at once with one line naming it and
// exit 2, never opened for a blocking read (open(2) of a FIFO waits for a writer).
func TestNamedPipesAreRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "started")
	touch := []string{"--", "/bin/sh", "-c", "touch " + marker}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"topo", "--topology-file", fifo}, "gangrun topo: --topology-file " + fifo + ": is a named pipe (FIFO), want a regular file"},
		{[]string{"topo", "--topology-file", "/dev/stdin"}, "gangrun topo: --topology-file /dev/stdin: is a named pipe (FIFO), want a regular file"},
		{[]string{"bench", "parse", fifo}, "gangrun bench parse: " + fifo + ": is a named pipe (FIFO), want a regular file"},
		{append([]string{"run", "--topology-file", fifo}, touch...), "gangrun run: --topology-file " + fifo + ": is a named pipe (FIFO), want a regular file"},
		{append([]string{"run", "--checkpoint-dir", fifo}, touch...), "gangrun run: --checkpoint-dir " + fifo + ": is a named pipe (FIFO), want a directory"},
		{append([]string{"run", "--log-dir", fifo}, touch...), "gangrun run: --log-dir " + fifo + ": is a named pipe (FIFO), not a directory"},
		{[]string{"agent", "--consul", "127.0.0.1:1", "--node-name", "n", "--topology-file", fifo}, "gangrun agent: --topology-file " + fifo + ": is a named pipe (FIFO), want a regular file"},
		{[]string{"ckpt", "latest", fifo}, "gangrun ckpt latest: checkpoint dir \"" + fifo + "\": is a named pipe (FIFO), not a directory"},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, gangrunBin, tc.args...)
			stdin, err := cmd.StdinPipe() // a pipe held open, for /dev/stdin
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err = cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("gangrun %v blocked", tc.args)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
				t.Errorf("exit %v, want %d", err, exitUsage)
			}
			if got := strings.TrimSpace(stderr.String()); got != tc.want {
				t.Errorf("stderr %q\nwant   %q", got, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("a worker started")
			}
		})
	}
}

// blackhole is a TCP listener that accepts connections and never answers: a Consul
// agent that hangs. accepted receives one value per connection.
func blackhole(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 64)
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), ch
}

// TestSignalWhileStarting: a command that catches signals (run, alloc) blocked before
// its loop takes them over (here on a Consul agent that never answers) ends at once on
// SIGINT, SIGTERM or SIGHUP with 128+N and one line, starting nothing and leaving
// nothing behind (no worker, no process, no scratch directory).
func TestSignalWhileStarting(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(consul, marker string) []string
		sig  syscall.Signal
		want string
	}{
		{"run SIGTERM", func(c, m string) []string {
			return []string{"run", "--coordinator", "consul://" + c, "--job-id", "x", "--", "/bin/sh", "-c", "touch " + m}
		}, syscall.SIGTERM, "gangrun run: stopped by SIGTERM while starting, before any work began"},
		{"run SIGINT", func(c, m string) []string {
			return []string{"run", "--coordinator", "consul://" + c, "--job-id", "x", "--", "/bin/sh", "-c", "touch " + m}
		}, syscall.SIGINT, "gangrun run: stopped by SIGINT while starting, before any work began"},
		{"run SIGHUP", func(c, m string) []string {
			return []string{"run", "--coordinator", "consul://" + c, "--job-id", "x", "--", "/bin/sh", "-c", "touch " + m}
		}, syscall.SIGHUP, "gangrun run: stopped by SIGHUP while starting, before any work began"},
		{"alloc SIGTERM", func(c, m string) []string {
			return []string{"alloc", "--consul", c, "--", "/bin/sh", "-c", "touch " + m}
		}, syscall.SIGTERM, "gangrun alloc: stopped by SIGTERM before the request was submitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mark := testMark(t)
			consul, accepted := blackhole(t)
			tmp := t.TempDir()
			marker := filepath.Join(tmp, "started")
			scratch := t.TempDir()
			cmd := exec.Command(gangrunBin, tc.args(consul, marker)...)
			cmd.Env = append(os.Environ(), mark, "TMPDIR="+scratch)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-accepted: // gangrun now waits on Consul
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("gangrun never called Consul; stderr:\n%s", stderr.String())
			}
			time.Sleep(200 * time.Millisecond)
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			sent := time.Now()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("still running 10s after %v; stderr:\n%s", tc.sig, stderr.String())
			}
			if took := time.Since(sent); took > 5*time.Second {
				t.Errorf("took %s to stop", took)
			}
			if code := cmd.ProcessState.ExitCode(); code != 128+int(tc.sig) {
				t.Errorf("exit %d, want %d", code, 128+int(tc.sig))
			}
			if got := strings.TrimSpace(stderr.String()); got != tc.want {
				t.Errorf("stderr %q\nwant   %q", got, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the command started")
			}
			if left, _ := os.ReadDir(scratch); len(left) > 0 {
				t.Errorf("left behind in TMPDIR: %v", left)
			}
		})
	}
}
