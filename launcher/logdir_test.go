package launcher

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/rendezvous"
)

// TestLogFilesFollowNoLink plants, where attempt 0 of a one-worker run puts its logs,
// each thing an attacker (or an earlier run) could leave there. The attempt must fail
// to start with an error naming the path and what is there, write nothing through a
// link, and start no worker.
func TestLogFilesFollowNoLink(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, logs, outside string) // logs: the --log-dir
		want  string                                   // in the error, after the path
		path  string                                   // the path the error names, below logs
	}{
		{"link to a file as stdout.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0")
			symlink(t, filepath.Join(outside, "victim"), filepath.Join(logs, "attempt_0/rank_0/stdout.log"))
		}, "is a symbolic link to", "attempt_0/rank_0/stdout.log"},
		{"dangling link as stderr.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0")
			symlink(t, filepath.Join(outside, "created-elsewhere"), filepath.Join(logs, "attempt_0/rank_0/stderr.log"))
		}, "is a symbolic link to", "attempt_0/rank_0/stderr.log"},
		{"FIFO as stdout.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0")
			if err := syscall.Mkfifo(filepath.Join(logs, "attempt_0/rank_0/stdout.log"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "is a named pipe (FIFO): refused, a log file must be new", "attempt_0/rank_0/stdout.log"},
		{"socket as stdout.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0")
			l, err := net.Listen("unix", filepath.Join(logs, "attempt_0/rank_0/stdout.log"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, "is a socket: refused", "attempt_0/rank_0/stdout.log"},
		{"device as stdout.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0")
			dev := filepath.Join(logs, "attempt_0/rank_0/stdout.log")
			if err := syscall.Mknod(dev, syscall.S_IFCHR|0o644, 0x103); err != nil { // /dev/null's 1:3
				t.Skipf("mknod: %v (needs CAP_MKNOD)", err)
			}
		}, "is a character device: refused", "attempt_0/rank_0/stdout.log"},
		{"directory as stdout.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0/stdout.log")
		}, "is a directory: refused", "attempt_0/rank_0/stdout.log"},
		{"an earlier run's stdout.log", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0/rank_0")
			if err := os.WriteFile(filepath.Join(logs, "attempt_0/rank_0/stdout.log"), []byte("earlier\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "already exists (an earlier run's log?): gangrun never overwrites a log", "attempt_0/rank_0/stdout.log"},
		{"link as attempt_0", func(t *testing.T, logs, outside string) {
			symlink(t, outside, filepath.Join(logs, "attempt_0"))
		}, "is a symbolic link to", "attempt_0"},
		{"dangling link as attempt_0", func(t *testing.T, logs, outside string) {
			symlink(t, filepath.Join(outside, "made-elsewhere"), filepath.Join(logs, "attempt_0"))
		}, "is a symbolic link to", "attempt_0"},
		{"link as rank_0", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0")
			symlink(t, outside, filepath.Join(logs, "attempt_0/rank_0"))
		}, "is a symbolic link to", "attempt_0/rank_0"},
		{"file as attempt_0", func(t *testing.T, logs, outside string) {
			if err := os.WriteFile(filepath.Join(logs, "attempt_0"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "is a regular file, not a directory", "attempt_0"},
		{"someone else's attempt_0", func(t *testing.T, logs, outside string) {
			mkdirs(t, logs, "attempt_0")
			if err := os.Chown(filepath.Join(logs, "attempt_0"), 65534, 65534); err != nil {
				t.Skipf("chown: %v (needs root)", err)
			}
		}, "belongs to uid 65534, not to this user", "attempt_0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs, outside, marks := t.TempDir(), t.TempDir(), t.TempDir()
			victim := filepath.Join(outside, "victim")
			if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, logs, outside)
			r := newTestRun(t, 1, `touch "`+marks+`/started"; echo out; echo err >&2`)
			r.cfg.LogDir, r.cfg.Tee = logs, false
			res := r.run(t)
			if res.ExitCode != 1 || res.Err == nil {
				t.Fatalf("exit %d, err %v; want exit 1 and an error", res.ExitCode, res.Err)
			}
			msg := res.Err.Error()
			if want := filepath.Join(logs, tc.path) + ": " + tc.want; !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q, want one line containing %q", msg, want)
			}
			if _, err := os.Stat(filepath.Join(marks, "started")); err == nil {
				t.Error("the worker started")
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "precious\n" {
				t.Errorf("a link's target was written: %q, %v", b, err)
			}
			entries, _ := os.ReadDir(outside)
			for _, e := range entries {
				if e.Name() != "victim" {
					t.Errorf("gangrun created %s outside the log directory", e.Name())
				}
			}
		})
	}
}

// TestLogModesIgnoreUmask: with umask 0, the directories gangrun creates are 0755 and
// the log files 0644, never wider; and --log-dir itself may be a link the user chose.
func TestLogModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	real := t.TempDir()
	logs := filepath.Join(t.TempDir(), "logs-link")
	symlink(t, real, logs)
	r := newTestRun(t, 1, `echo out`)
	r.cfg.LogDir, r.cfg.Tee = logs, false
	if res := r.run(t); res.ExitCode != 0 {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	for path, want := range map[string]os.FileMode{
		"attempt_0":                   0o755 | os.ModeDir,
		"attempt_0/rank_0":            0o755 | os.ModeDir,
		"attempt_0/rank_0/stdout.log": 0o644,
		"attempt_0/rank_0/stderr.log": 0o644,
	} {
		fi, err := os.Lstat(filepath.Join(real, path))
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(real, "attempt_0/rank_0/stdout.log")); string(b) != "out\n" {
		t.Errorf("stdout.log = %q", b)
	}
}

// TestNewChecksLogDir: a --log-dir that cannot hold logs is refused by New in plain
// words, before anything starts, and New leaves nothing behind.
func TestNewChecksLogDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	used := filepath.Join(dir, "used")
	mkdirs(t, used, "attempt_3/rank_0")
	dangling := filepath.Join(dir, "dangling")
	symlink(t, filepath.Join(dir, "nowhere"), dangling)
	for _, tc := range []struct {
		name  string
		dir   string
		fresh bool
		want  string
	}{
		{"a file", file, false, "--log-dir " + file + ": is a file, not a directory"},
		{"a FIFO", fifo, false, "--log-dir " + fifo + ": is a named pipe (FIFO), not a directory"},
		{"under a file", filepath.Join(file, "logs"), false, "--log-dir " + filepath.Join(file, "logs") + ": cannot be created: " + file + " is a regular file, not a directory"},
		{"in /proc", "/proc/1", false, "--log-dir /proc/1: cannot be written: /proc/1 is in the kernel's proc file system, where no files can be created"},
		{"below /proc", "/proc/gangrun-logs/x", false, "--log-dir /proc/gangrun-logs/x: cannot be created: /proc is in the kernel's proc file system, where no files can be created"},
		{"in /sys", "/sys/kernel", false, "--log-dir /sys/kernel: cannot be written: /sys/kernel is in the kernel's sysfs file system, where no files can be created"},
		{"dangling link", dangling, false, "--log-dir " + dangling + ": is a dangling symbolic link (to " + filepath.Join(dir, "nowhere") + ")"},
		{"an earlier run's", used, true, "--log-dir " + used + " already holds attempt_3 (an earlier run's logs): give each run its own directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Command: []string{"/bin/true"}, NProcPerNode: 1, JobID: "j", NodeName: "n", LogDir: tc.dir, FreshLogDir: tc.fresh}
			done := make(chan error, 1)
			go func() { _, err := New(c, rendezvous.NewLocal("j", c.MaxRestarts)); done <- err }()
			select {
			case err := <-done:
				if err == nil || err.Error() != tc.want {
					t.Errorf("err = %v\nwant    %s", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("New blocked")
			}
		})
	}
	// Shared by the nodes of a job: an earlier attempt_K is no reason to refuse.
	c := Config{Command: []string{"/bin/true"}, NProcPerNode: 1, JobID: "j", NodeName: "n", LogDir: used}
	if _, err := New(c, rendezvous.NewLocal("j", c.MaxRestarts)); err != nil {
		t.Errorf("a shared log directory with attempts: %v", err)
	}
	// A missing one is checked by creating it, and removed again: the first worker
	// creates it.
	missing := filepath.Join(dir, "new", "logs")
	c.LogDir = missing
	if _, err := New(c, rendezvous.NewLocal("j", c.MaxRestarts)); err != nil {
		t.Fatalf("a missing log directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New left %s behind: %v", filepath.Join(dir, "new"), err)
	}
}

// TestNewRefusesCommandsThatCannotRun: a directory or a file without execute
// permission is ErrNotExecutable (exit 126), a missing one ErrCommandNotFound (127).
func TestNewRefusesCommandsThatCannotRun(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "train.py")
	if err := os.WriteFile(plain, []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		command string
		target  error
		want    string
	}{
		{"directory", dir, ErrNotExecutable, dir + ": is a directory, not a command"},
		{"no execute bit", plain, ErrNotExecutable, plain + ": is not executable (no execute permission)"},
		{"named pipe", fifo, ErrNotExecutable, fifo + ": is a named pipe (FIFO), not a command"},
		{"missing path", filepath.Join(dir, "none"), ErrCommandNotFound, "command not found: " + filepath.Join(dir, "none")},
		{"missing on PATH", "no-such-trainer-xyz", ErrCommandNotFound, "command not found: no-such-trainer-xyz"},
		{"empty", "", ErrCommandNotFound, "command not found: the command after -- is an empty string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Command: []string{tc.command}, NProcPerNode: 1, JobID: "j", NodeName: "n"}
			_, err := New(c, rendezvous.NewLocal("j", c.MaxRestarts))
			if !errors.Is(err, tc.target) || err.Error() != tc.want {
				t.Errorf("err = %v, want %q (%v)", err, tc.want, tc.target)
			}
		})
	}
}

// TestNewRefusesCheckpointFIFO: a named pipe as --checkpoint-dir is refused at once.
func TestNewRefusesCheckpointFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	c := Config{Command: []string{"/bin/true"}, NProcPerNode: 1, JobID: "j", NodeName: "n", CheckpointDir: fifo}
	done := make(chan error, 1)
	go func() { _, err := New(c, rendezvous.NewLocal("j", c.MaxRestarts)); done <- err }()
	select {
	case err := <-done:
		if want := "--checkpoint-dir " + fifo + ": is a named pipe (FIFO), want a directory"; err == nil || err.Error() != want {
			t.Errorf("err = %v, want %q", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("New blocked on a FIFO")
	}
}

func mkdirs(t *testing.T, base, rel string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(base, rel), 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
