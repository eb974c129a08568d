package userfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestDirRefusesWhatItShouldNotFollow: every Dir method refuses a link, a name that is
// not one component, and (for reads) anything but a regular file, at once.
func TestDirRefusesWhatItShouldNotFollow(t *testing.T) {
	dir := fixtures(t)
	d, err := OpenDirFD(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, tc := range []struct {
		name, entry string
		call        func(string) error
		want        string
		target      error
	}{
		{"read a regular file", "file", read(d), "", nil},
		{"read a link to a file", "link", read(d), "link: is a symbolic link, which gangrun does not follow here", ErrSymlink},
		{"read a FIFO", "fifo", read(d), "fifo: is a named pipe (FIFO), want a regular file", ErrNotRegular},
		{"read a socket", "socket", read(d), "socket: is a socket, want a regular file", ErrNotRegular},
		{"read a directory", "dir", read(d), "dir: is a directory, want a regular file", ErrNotRegular},
		{"read a dangling link", "dangling", read(d), "dangling: is a symbolic link", ErrSymlink},
		{"read a missing file", "missing", read(d), "missing: no such file or directory", fs.ErrNotExist},
		{"read a path", "dir/inside", read(d), `not a single file name: "dir/inside"`, ErrBadName},
		{"read dot-dot", "..", read(d), `not a single file name: ".."`, ErrBadName},
		{"sub a directory", "dir", sub(d), "", nil},
		{"sub a link to a directory", "dirlink", sub(d), "dirlink: is a symbolic link", ErrSymlink},
		{"sub a FIFO", "fifo", sub(d), "fifo: is a named pipe (FIFO), want a directory", ErrNotDir},
		{"sub a file", "file", sub(d), "file: is a regular file, want a directory", ErrNotDir},
		{"mksub over a link", "dirlink", func(n string) error { s, err := d.MkSub(n, 0o755); closeDir(s); return err }, "dirlink: is a symbolic link", ErrSymlink},
		{"open a link loop", "loop", read(d), "loop: is a symbolic link", ErrSymlink},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			withinASecond(t, func() { err = tc.call(tc.entry) })
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want %q", err, tc.want)
			}
			if !errors.Is(err, tc.target) {
				t.Errorf("err %v is not %v", err, tc.target)
			}
		})
	}
}

func read(d *Dir) func(string) error {
	return func(n string) error { _, err := d.ReadFile(n, 100); return err }
}

func sub(d *Dir) func(string) error {
	return func(n string) error { s, err := d.Sub(n); closeDir(s); return err }
}

func closeDir(d *Dir) {
	if d != nil {
		d.Close()
	}
}

// TestDirWriteReplacesALink: WriteFileAtomic over a link replaces the link; the
// target is untouched.
func TestDirWriteReplacesALink(t *testing.T) {
	dir := fixtures(t)
	d, err := OpenDirFD(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteFileAtomic("link", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "0123456789" {
		t.Errorf("the link's target was written: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("link not replaced by a file: %v %v", fi, err)
	}
}

// TestDirRenameMovesLinksNotTargets: a link renamed through a Dir is moved as a link;
// an existing destination is never replaced.
func TestDirRenameMovesLinksNotTargets(t *testing.T) {
	dir := fixtures(t)
	d, err := OpenDirFD(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sd, err := d.MkSub("moved", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	if err := d.Rename("dirlink", sd, "x"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "moved", "x")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("not moved as a link: %v %v", fi, err)
	}
	if err := d.Rename("file", sd, "x"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("rename over an existing name: %v", err)
	}
}

// TestRemoveAllNeverLeavesTheDir: RemoveAll of a tree full of links to an outside
// directory, while another goroutine keeps swapping the tree's subdirectories for links
// to it, removes the tree and leaves the outside directory whole.
func TestRemoveAllNeverLeavesTheDir(t *testing.T) {
	for round := 0; round < 20; round++ {
		base := t.TempDir()
		outside := filepath.Join(base, "outside")
		for i := 0; i < 5; i++ {
			mustWrite(t, filepath.Join(outside, fmt.Sprintf("d%d", i), "keep.txt"), "keep")
		}
		root := filepath.Join(base, "root")
		for i := 0; i < 5; i++ {
			for j := 0; j < 20; j++ {
				mustWrite(t, filepath.Join(root, "victim", fmt.Sprintf("d%d", i), fmt.Sprintf("f%d", j)), "x")
			}
			if err := os.Symlink(outside, filepath.Join(root, "victim", fmt.Sprintf("d%d", i), "escape")); err != nil {
				t.Fatal(err)
			}
		}
		d, err := OpenDirFD(root)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		wg.Add(1)
		go func() { // the attacker: swap subdirectories for links to outside
			defer wg.Done()
			for i := 0; ; i = (i + 1) % 5 {
				select {
				case <-stop:
					return
				default:
				}
				p := filepath.Join(root, "victim", fmt.Sprintf("d%d", i))
				if os.Rename(p, p+".x") == nil {
					_ = os.Symlink(outside, p)
				}
			}
		}()
		err = d.RemoveAll("victim")
		close(stop)
		wg.Wait()
		d.Close()
		if err != nil && !errors.Is(err, syscall.ENOTEMPTY) {
			t.Logf("round %d: RemoveAll: %v", round, err) // a race may leave the attacker's entries; never outside
		}
		for i := 0; i < 5; i++ {
			if b, err := os.ReadFile(filepath.Join(outside, fmt.Sprintf("d%d", i), "keep.txt")); err != nil || string(b) != "keep" {
				t.Fatalf("round %d: outside file %d gone or changed: %v", round, i, err)
			}
		}
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCreateRefusesInputsAndSpecialFiles: Create never writes onto an input of the same
// command (whatever the spelling), a FIFO, a device or a directory, and truncates
// nothing before it has checked.
func TestCreateRefusesInputsAndSpecialFiles(t *testing.T) {
	dir := fixtures(t)
	in := filepath.Join(dir, "file")
	for _, tc := range []struct {
		name, path string
		want       string
		target     error
	}{
		{"the input itself", in, "file: is also this command's input", ErrIsInput},
		{"the input through a link", filepath.Join(dir, "link"), "link: is the same file as the input " + in, ErrIsInput},
		{"the input by another spelling", dir + "/dir/../file", "is the same file as the input", ErrIsInput},
		{"a FIFO", filepath.Join(dir, "fifo"), "fifo: is a named pipe (FIFO), want a regular file", ErrNotRegular},
		{"a directory", filepath.Join(dir, "dir"), "dir: is a directory, want a regular file", ErrNotRegular},
		{"a device", "/dev/null", "/dev/null: is a character device, want a regular file", ErrNotRegular},
		{"a socket", filepath.Join(dir, "socket"), "socket: is a socket, want a regular file", ErrNotRegular},
		{"a new file", filepath.Join(dir, "new.xml"), "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f *os.File
			var err error
			withinASecond(t, func() { f, err = Create(tc.path, 0o644, in) })
			if f != nil {
				f.Close()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.target) {
				t.Errorf("err %v; want %q (%v)", err, tc.want, tc.target)
			}
			if b, _ := os.ReadFile(in); string(b) != "0123456789" {
				t.Errorf("the input changed: %q", b)
			}
		})
	}
}

// TestOneCauseSaidOnce: the system's reason is said once, not twice.
func TestOneCauseSaidOnce(t *testing.T) {
	dir := t.TempDir()
	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o000); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink("loop", loop); err != nil {
		t.Fatal(err)
	}
	cases := []string{loop}
	if os.Geteuid() != 0 { // root reads anything
		cases = append(cases, filepath.Join(locked, "x"))
	}
	for _, p := range cases {
		_, err := OpenFile(p)
		if err == nil {
			t.Fatalf("%s opened", p)
		}
		msg := err.Error()
		for _, phrase := range []string{"permission denied", "too many levels of symbolic links"} {
			if strings.Count(msg, phrase) > 1 {
				t.Errorf("%q says %q twice", msg, phrase)
			}
		}
	}
}
