package userfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is a directory opened once, through which the files inside it are reached by
// name relative to its descriptor (the *at system calls), never by resolving a path
// again: what gangrun keeps inside a user's directory (a checkpoint directory's
// .gangrun/ with its pins, lock, fence and trash) is read, written, renamed and
// deleted through a Dir, so that a symbolic link put there, or swapped in meanwhile,
// can neither send a read into a FIFO nor a deletion outside the directory.
//
// Every name given to a Dir's methods is one path component: a name holding '/', or
// "", "." or "..", is refused (ErrBadName), and a name that is a symbolic link is not
// followed (O_NOFOLLOW; ErrSymlink), which is what openat2(2)'s
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS gives, on every kernel. Opens are O_NONBLOCK and
// checked with fstat(2) before any read, as OpenFile's are. The directory the Dir was
// opened on is itself found by following links: the user chose that path.
//
// A Dir is not safe for concurrent Close; its other methods may be called from several
// goroutines.
type Dir struct {
	f *os.File
	// path is the directory's path as given (joined with the names of Sub), for
	// messages only: nothing is opened through it after the first open.
	path string
}

// ErrSymlink is wrapped by the error a Dir's method returns for a name that is a
// symbolic link: "DIR/NAME: is a symbolic link, which gangrun does not follow here".
var ErrSymlink = errors.New("is a symbolic link, which gangrun does not follow here")

// ErrBadName is wrapped by the error a Dir's method returns for a name that is not one
// path component.
var ErrBadName = errors.New("not a single file name")

// maxRemoveDepth bounds how many directory levels Dir.RemoveAll descends, in levels:
// each holds a descriptor open while its children are removed.
const maxRemoveDepth = 512

// OpenDirFD opens the directory at path (following links in path: the user chose it)
// as a Dir. It never blocks. Errors are OpenDir's.
func OpenDirFD(path string) (*Dir, error) {
	f, err := OpenDir(path)
	if err != nil {
		return nil, err
	}
	return &Dir{f: f, path: path}, nil
}

// Path returns the directory's path as given, for messages.
func (d *Dir) Path() string { return d.path }

// Join returns the path of name inside d, for messages.
func (d *Dir) Join(name string) string { return filepath.Join(d.path, name) }

// Close closes the directory's descriptor.
func (d *Dir) Close() error { return d.f.Close() }

// Stat returns the directory's own dev and inode, for telling whether a path still
// names it.
func (d *Dir) Stat() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstat(d.fd(), &st)
	return st, err
}

// SameAs reports whether path (following links) names the directory d has open now.
func (d *Dir) SameAs(path string) bool {
	st, err := d.Stat()
	if err != nil {
		return false
	}
	var pst unix.Stat_t
	if err := unix.Stat(path, &pst); err != nil {
		return false
	}
	return st.Dev == pst.Dev && st.Ino == pst.Ino
}

func (d *Dir) fd() int { return int(d.f.Fd()) }

// checkName refuses what is not one path component.
func (d *Dir) checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.IndexByte(name, 0) >= 0 {
		return &Error{Path: d.Join(name), Err: fmt.Errorf("%w: %q", ErrBadName, name)}
	}
	return nil
}

// openat is openat(2) relative to d with O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC added,
// retried on EINTR. A symbolic link at name is reported as ErrSymlink.
func (d *Dir) openat(name string, flags int, perm uint32) (int, error) {
	if err := d.checkName(name); err != nil {
		return -1, err
	}
	for {
		fd, err := unix.Openat(d.fd(), name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, d.describe(name, err)
		}
		return fd, nil
	}
}

// describe turns err from a call on name into an *Error naming d/name, saying what the
// entry is when it is a link or another kind of file than wanted.
func (d *Dir) describe(name string, err error) error {
	// O_NOFOLLOW on a link: ELOOP; with O_DIRECTORY also ENOTDIR. Look before saying.
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENXIO) {
		var st unix.Stat_t
		if unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFLNK:
				return &Error{Path: d.Join(name), Err: ErrSymlink}
			case unix.S_IFDIR:
			default:
				if errors.Is(err, unix.ENOTDIR) {
					return &Error{Path: d.Join(name), Err: fmt.Errorf("is %s, %w", KindOfStat(st.Mode), ErrNotDir)}
				}
				return &Error{Path: d.Join(name), Err: fmt.Errorf("is %s, %w", KindOfStat(st.Mode), ErrNotRegular)}
			}
		}
	}
	if errors.Is(err, unix.ENOENT) {
		return &Error{Path: d.Join(name), Err: notExistError{"file or directory"}}
	}
	return &Error{Path: d.Join(name), Err: describeOpenError("", err)}
}

// Sub opens the directory name inside d, not following a link. Errors: an *Error
// wrapping fs.ErrNotExist, ErrSymlink, ErrNotDir (with what name is) or the system's.
func (d *Dir) Sub(name string) (*Dir, error) {
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		if err != nil {
			return nil, &Error{Path: d.Join(name), Err: err}
		}
		return nil, &Error{Path: d.Join(name), Err: fmt.Errorf("is %s, %w", KindOfStat(st.Mode), ErrNotDir)}
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.Join(name)), path: d.Join(name)}, nil
}

// MkSub opens the directory name inside d, creating it with perm (before the umask)
// when it is missing. Errors as Sub's.
func (d *Dir) MkSub(name string, perm fs.FileMode) (*Dir, error) {
	if err := d.checkName(name); err != nil {
		return nil, err
	}
	if err := unix.Mkdirat(d.fd(), name, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &Error{Path: d.Join(name), Err: describeOpenError("", err)}
	}
	return d.Sub(name)
}

// ReadFile reads the regular file name inside d, at most limit bytes: a longer one is
// refused (ErrTooLarge). A link, FIFO, device, socket or directory is refused before
// any read (ErrSymlink, ErrNotRegular).
func (d *Dir) ReadFile(name string, limit int64) ([]byte, error) {
	f, err := d.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &Error{Path: d.Join(name), Err: fmt.Errorf("read: %w", err)}
	}
	if int64(len(data)) > limit {
		return nil, &Error{Path: d.Join(name), Err: fmt.Errorf("%w: longer than %d bytes", ErrTooLarge, limit)}
	}
	return data, nil
}

// OpenFile opens the regular file name inside d with flag (os.O_RDONLY, os.O_RDWR,
// os.O_CREATE...) and perm, not following a link, and refuses anything but a regular
// file before returning it. The file is in blocking mode when returned.
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := d.openat(name, flag, uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &Error{Path: d.Join(name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &Error{Path: d.Join(name), Err: fmt.Errorf("is %s, %w", KindOfStat(st.Mode), ErrNotRegular)}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &Error{Path: d.Join(name), Err: err}
	}
	return os.NewFile(uintptr(fd), d.Join(name)), nil
}

// WriteFileAtomic writes data to name inside d through a new temporary file next to
// it, synced and renamed over name, so that readers see the whole file or the old one.
// A link at name is replaced, never followed.
func (d *Dir) WriteFileAtomic(name string, data []byte, perm fs.FileMode) error {
	if err := d.checkName(name); err != nil {
		return err
	}
	tmp := ".tmp-" + randomHex(8)
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(d.fd(), tmp, d.fd(), name)
	}
	if err != nil {
		_ = unix.Unlinkat(d.fd(), tmp, 0)
		return &Error{Path: d.Join(name), Err: fmt.Errorf("write: %w", err)}
	}
	return nil
}

// Lstat returns the mode of the entry name inside d, not following a link.
func (d *Dir) Lstat(name string) (fs.FileMode, error) {
	if err := d.checkName(name); err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, d.describe(name, err)
	}
	return modeOf(st.Mode), nil
}

// Entries lists d's entries, unsorted, without "." and "..".
func (d *Dir) Entries() ([]fs.DirEntry, error) {
	// A fresh descriptor of the same directory: reading entries moves its offset.
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &Error{Path: d.path, Err: describeOpenError("a directory", err)}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, &Error{Path: d.path, Err: fmt.Errorf("read the directory: %w", err)}
	}
	return entries, nil
}

// Remove removes the entry name inside d: a file, a link (not its target) or an empty
// directory. A missing name is not an error.
func (d *Dir) Remove(name string) error {
	if err := d.checkName(name); err != nil {
		return err
	}
	err := unix.Unlinkat(d.fd(), name, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(d.fd(), name, unix.AT_REMOVEDIR)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &Error{Path: d.Join(name), Err: fmt.Errorf("remove: %w", describeOpenError("", err))}
	}
	return nil
}

// RemoveAll removes the entry name inside d and, when it is a directory, everything
// beneath it, each level reached through the descriptor of the one above it and never
// by a path: a link anywhere in the tree is removed, not followed, even one swapped in
// for a directory while the removal runs. A missing name is not an error. Errors: the
// first failure, naming its path; a tree deeper than 512 levels.
func (d *Dir) RemoveAll(name string) error {
	return d.removeAll(name, 0)
}

func (d *Dir) removeAll(name string, depth int) error {
	if err := d.checkName(name); err != nil {
		return err
	}
	// Try it as a file or link first: the common case, and never a descent.
	err := unix.Unlinkat(d.fd(), name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return &Error{Path: d.Join(name), Err: fmt.Errorf("remove: %w", describeOpenError("", err))}
	}
	if depth >= maxRemoveDepth {
		return &Error{Path: d.Join(name), Err: fmt.Errorf("remove: deeper than %d directory levels", maxRemoveDepth)}
	}
	sub, err := d.Sub(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case errors.Is(err, ErrSymlink), errors.Is(err, ErrNotDir):
		// Swapped for a link or a file since unlinkat said directory: remove that.
		return d.Remove(name)
	case err != nil:
		return err
	}
	defer sub.Close()
	for {
		entries, err := sub.Entries()
		if err != nil {
			return err
		}
		if len(entries) == 0 {
			break
		}
		for _, e := range entries {
			if err := sub.removeAll(e.Name(), depth+1); err != nil {
				return err
			}
		}
	}
	if err := unix.Unlinkat(d.fd(), name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &Error{Path: d.Join(name), Err: fmt.Errorf("remove: %w", describeOpenError("", err))}
	}
	return nil
}

// Rename moves the entry name inside d to toName inside to, as renameat2(2) with
// RENAME_NOREPLACE: an existing toName is an error (fs.ErrExist), never replaced. A
// link at name is moved itself, not its target.
func (d *Dir) Rename(name string, to *Dir, toName string) error {
	if err := d.checkName(name); err != nil {
		return err
	}
	if err := to.checkName(toName); err != nil {
		return err
	}
	err := unix.Renameat2(d.fd(), name, to.fd(), toName, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without RENAME_NOREPLACE: look, then rename.
		if _, lerr := to.Lstat(toName); lerr == nil {
			err = unix.EEXIST
		} else {
			err = unix.Renameat(d.fd(), name, to.fd(), toName)
		}
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &Error{Path: d.Join(name), Err: fmt.Errorf("rename to %s: %w", to.Join(toName), fs.ErrExist)}
		}
		return &Error{Path: d.Join(name), Err: fmt.Errorf("rename to %s: %w", to.Join(toName), describeOpenError("", err))}
	}
	return nil
}

// modeOf converts a stat(2) st_mode to an fs.FileMode (type and permission bits).
func modeOf(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	return mode
}

// randomHex returns n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
