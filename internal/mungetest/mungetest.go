// Package mungetest starts real munged daemons for tests, each with its own key,
// socket, pid, seed and log files in a directory of its own, as Debian's munge package
// runs one per host. Two daemons given one key are two hosts of one cluster; a daemon
// with a key of its own is a host outside it. The binaries are Debian's (munged,
// mungekey: `apt-get install munge`, which `make test` runs); a missing one fails the
// test, never skips it.
package mungetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long munged may take to create its socket.
const startTimeout = 10 * time.Second

// Daemon is one running munged.
type Daemon struct {
	// Socket is its socket: what MUNGE_SOCKET names for the processes of its "host".
	Socket string
	// Key is its key file; Dir the directory holding its files.
	Key, Dir string
	pid      int
}

// Env is the environment entry that points a process at d.
func (d *Daemon) Env() string { return "MUNGE_SOCKET=" + d.Socket }

// Start starts a munged with a new key, stopped at the test's end.
func Start(t testing.TB) *Daemon {
	t.Helper()
	return StartWithKey(t, "")
}

// StartWithKey starts a munged with the key file key ("": a new key), stopped at the
// test's end: given another daemon's Key it is a second host of that cluster.
func StartWithKey(t testing.TB, key string) *Daemon {
	t.Helper()
	d, err := Launch(key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

// Launch starts a munged with the key file key ("": a new key) in a new directory
// under the system's temporary directory; Stop stops it and removes the directory.
// For a package's TestMain, where there is no testing.TB.
func Launch(key string) (*Daemon, error) {
	munged, err := exec.LookPath("munged")
	if err != nil {
		munged = "/usr/sbin/munged"
		if _, serr := os.Stat(munged); serr != nil {
			return nil, errors.New("munged not found: install Debian's munge (apt-get install munge; make test does)")
		}
	}
	dir, err := os.MkdirTemp("", "gangrun-munge-")
	if err != nil {
		return nil, err
	}
	// Every user's process connects to the socket: its directory must be searchable
	// by all (munged refuses to start otherwise).
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	d := &Daemon{Dir: dir, Socket: filepath.Join(dir, "socket"), Key: filepath.Join(dir, "munge.key")}
	if key == "" {
		if err := newKey(d.Key); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	} else {
		b, err := os.ReadFile(key)
		if err == nil {
			err = os.WriteFile(d.Key, b, 0o600)
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("copy the munge key %s: %w", key, err)
		}
	}
	pidFile := filepath.Join(dir, "munged.pid")
	cmd := exec.Command(munged, "--socket", d.Socket, "--key-file", d.Key, "--pid-file", pidFile,
		"--seed-file", filepath.Join(dir, "munged.seed"), "--log-file", filepath.Join(dir, "munged.log"))
	if out, err := cmd.CombinedOutput(); err != nil { // it forks and exits once its socket is up
		log, _ := os.ReadFile(filepath.Join(dir, "munged.log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("munged: %v: %s%s", err, out, log)
	}
	deadline := time.Now().Add(startTimeout)
	for {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			if d.pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err == nil && d.pid > 0 {
				if _, err := os.Stat(d.Socket); err == nil {
					return d, nil
				}
			}
		}
		if time.Now().After(deadline) {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("munged did not start within %s in %s", startTimeout, dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newKey writes a new MUNGE key to path with Debian's mungekey.
func newKey(path string) error {
	mungekey, err := exec.LookPath("mungekey")
	if err != nil {
		mungekey = "/usr/sbin/mungekey"
	}
	if out, err := exec.Command(mungekey, "--create", "--keyfile", path).CombinedOutput(); err != nil {
		return fmt.Errorf("mungekey: %v: %s", err, out)
	}
	return nil
}

// Stop stops d (SIGTERM, then SIGKILL after 5 s) and removes its directory.
func (d *Daemon) Stop() {
	if d.pid > 0 {
		_ = syscall.Kill(d.pid, syscall.SIGTERM)
		for i := 0; i < 250 && alive(d.pid); i++ {
			time.Sleep(20 * time.Millisecond)
		}
		_ = syscall.Kill(d.pid, syscall.SIGKILL)
		d.pid = 0
	}
	os.RemoveAll(d.Dir)
}

// alive reports whether process pid runs: it exists and is no zombie (munged forks
// away from its starter, and whoever reaps it may take its time).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses; the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}
