package userfile

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fixtures makes one of each kind of file in a temporary directory.
func fixtures(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "file"), []byte("0123456789"), 0o644))
	must(os.Mkdir(filepath.Join(dir, "dir"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "dir", "inside"), nil, 0o644))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	must(os.Symlink("file", filepath.Join(dir, "link")))
	must(os.Symlink("dir", filepath.Join(dir, "dirlink")))
	must(os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	must(os.Symlink("loop", filepath.Join(dir, "loop")))
	l, err := net.Listen("unix", filepath.Join(dir, "socket"))
	must(err)
	t.Cleanup(func() { l.Close() })
	return dir
}

// withinASecond fails the test when f blocks: the point of the package.
func withinASecond(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("blocked")
	}
}

func TestOpenFile(t *testing.T) {
	dir := fixtures(t)
	for _, tc := range []struct {
		name   string
		path   string
		want   string // error text; "" for success
		target error
	}{
		{"regular file", "file", "", nil},
		{"link to a file", "link", "", nil},
		{"FIFO", "fifo", "fifo: is a named pipe (FIFO), want a regular file", ErrNotRegular},
		{"directory", "dir", "dir: is a directory, want a regular file", ErrNotRegular},
		{"link to a directory", "dirlink", "dirlink: is a directory, want a regular file", ErrNotRegular},
		{"socket", "socket", "socket: is a socket, want a regular file", ErrNotRegular},
		{"missing", "missing", "missing: no such file", fs.ErrNotExist},
		{"dangling link", "dangling", "dangling: no such file", fs.ErrNotExist},
		{"link loop", "loop", "loop: too many levels of symbolic links", nil},
		{"below a file", "file/x", "file/x: no such file", fs.ErrNotExist},
		{"character device", "/dev/null", "/dev/null: is a character device, want a regular file", ErrNotRegular},
		{"empty path", "", "empty path: want a regular file", ErrNotRegular},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path != "" && !filepath.IsAbs(path) {
				path = filepath.Join(dir, path)
			}
			var f *os.File
			var err error
			withinASecond(t, func() { f, err = OpenFile(path) })
			if tc.want == "" {
				if err != nil {
					t.Fatalf("OpenFile: %v", err)
				}
				defer f.Close()
				data, err := io.ReadAll(f)
				if err != nil || string(data) != "0123456789" {
					t.Fatalf("read %q, %v", data, err)
				}
				return
			}
			if err == nil {
				f.Close()
				t.Fatalf("OpenFile(%s) succeeded, want %q", tc.path, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.want)
			}
			if tc.target != nil && !errors.Is(err, tc.target) {
				t.Errorf("error %v is not %v", err, tc.target)
			}
		})
	}
}

func TestOpenDir(t *testing.T) {
	dir := fixtures(t)
	for _, tc := range []struct {
		name, path, want string
	}{
		{"directory", "dir", ""},
		{"link to a directory", "dirlink", ""},
		{"FIFO", "fifo", "fifo: is a named pipe (FIFO), want a directory"},
		{"file", "file", "file: is a regular file, want a directory"},
		{"socket", "socket", "socket: is a socket, want a directory"},
		{"missing", "missing", "missing: no such directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f *os.File
			var err error
			withinASecond(t, func() { f, err = OpenDir(filepath.Join(dir, tc.path)) })
			if tc.want == "" {
				if err != nil {
					t.Fatalf("OpenDir: %v", err)
				}
				defer f.Close()
				names, err := f.Readdirnames(-1)
				if err != nil || len(names) != 1 || names[0] != "inside" {
					t.Fatalf("entries %q, %v", names, err)
				}
				return
			}
			if err == nil {
				f.Close()
				t.Fatalf("OpenDir(%s) succeeded, want %q", tc.path, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q", err, tc.want)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	dir := fixtures(t)
	if data, err := ReadFile(filepath.Join(dir, "file"), 10); err != nil || string(data) != "0123456789" {
		t.Errorf("ReadFile at the limit = %q, %v", data, err)
	}
	if _, err := ReadFile(filepath.Join(dir, "file"), 9); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFile over the limit: %v, want ErrTooLarge", err)
	}
	withinASecond(t, func() {
		if _, err := ReadFile(filepath.Join(dir, "fifo"), 10); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile of a FIFO: %v, want ErrNotRegular", err)
		}
	})
}
