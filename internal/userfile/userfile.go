// Package userfile opens the files and directories a user names to gangrun (a
// --topology-file, a --checkpoint-dir, `bench parse FILE`, a checkpoint's pointer
// files) so that a path naming something else is refused at once, in one line, instead
// of blocking: open(2) of a named pipe (FIFO) for reading waits for a writer for ever,
// and a read of a terminal or a device may never end.
//
// Every open is O_NONBLOCK|O_CLOEXEC, so it returns at once whatever the path names;
// the descriptor is then checked with fstat(2) (the thing opened, not a path that may
// have changed since), refused when it is not what was asked for, and put back in
// blocking mode before it is read. Symbolic links are followed: the user chose the
// path.
//
// Linux and other Unix systems only.
package userfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is wrapped by the error OpenFile and ReadFile return for a path that
// exists but is not a regular file (after following links): a directory, a named pipe,
// a socket, a device. Its text ends the message: "PATH: is a named pipe (FIFO), want a
// regular file".
var ErrNotRegular = errors.New("want a regular file")

// ErrNotDir is wrapped by the error OpenDir returns for a path that exists but is not
// a directory (after following links): "PATH: is a named pipe (FIFO), want a directory".
var ErrNotDir = errors.New("want a directory")

// ErrTooLarge is wrapped by the error ReadFile returns for a file longer than its limit.
var ErrTooLarge = errors.New("file too large")

// Error is the error of every function of this package: the path as given, and what is
// wrong with it in one line.
type Error struct {
	// Path is the path as given.
	Path string
	// Err says what is wrong without the path ("is a named pipe (FIFO), want a regular
	// file", "no such file", "permission denied").
	Err error
}

// Error returns "PATH: what is wrong" ("an empty path: ..." for "").
func (e *Error) Error() string {
	if e.Path == "" {
		return "an empty path: " + e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

func pathErr(path string, format string, a ...any) *Error {
	return &Error{Path: path, Err: fmt.Errorf(format, a...)}
}

// OpenFile opens path for reading when it is a regular file (following symbolic
// links). It never blocks in open(2). Errors are an *Error naming path: a missing file
// wraps fs.ErrNotExist ("PATH: no such file"); anything that is not a regular file wraps
// ErrNotRegular and says what it is; other failures wrap the system's error.
func OpenFile(path string) (*os.File, error) {
	return open(path, false)
}

// OpenDir opens path for reading its entries when it is a directory (following
// symbolic links). It never blocks in open(2). Errors are an *Error naming path: a
// missing directory wraps fs.ErrNotExist; anything else wraps ErrNotDir and says what it
// is; other failures wrap the system's error.
func OpenDir(path string) (*os.File, error) {
	return open(path, true)
}

// ReadFile reads the regular file at path, at most limit bytes: a longer one is
// refused with an error wrapping ErrTooLarge. Errors are OpenFile's otherwise.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, pathErr(path, "read: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, pathErr(path, "%w: longer than %d bytes", ErrTooLarge, limit)
	}
	return data, nil
}

func open(path string, dir bool) (*os.File, error) {
	want, wantErr := "a regular file", ErrNotRegular
	if dir {
		want, wantErr = "a directory", ErrNotDir
	}
	if path == "" {
		return nil, &Error{Path: "", Err: wantErr}
	}
	fd, err := openNonblock(path)
	if err != nil {
		// A socket cannot be opened (ENXIO): say what the path is when it exists.
		if fi, serr := os.Stat(path); serr == nil && (fi.IsDir() != dir || !dir && !fi.Mode().IsRegular()) {
			return nil, pathErr(path, "is %s, %w", Kind(fi.Mode()), wantErr)
		}
		return nil, &Error{Path: path, Err: describeOpenError(want, err)}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, pathErr(path, "fstat: %w", err)
	}
	isDir, isReg := st.Mode&unix.S_IFMT == unix.S_IFDIR, st.Mode&unix.S_IFMT == unix.S_IFREG
	if dir && !isDir || !dir && !isReg {
		unix.Close(fd)
		return nil, pathErr(path, "is %s, %w", KindOfStat(st.Mode), wantErr)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, pathErr(path, "%w", err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openNonblock is open(2) with O_RDONLY|O_NONBLOCK|O_CLOEXEC, retried on EINTR.
func openNonblock(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// describeOpenError says in plain words why a path could not be opened.
func describeOpenError(want string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return notExistError{noun(want)}
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("no such %s (a component of the path is not a directory): %w", noun(want), fs.ErrNotExist)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("permission denied: %w", fs.ErrPermission)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("too many levels of symbolic links (a link loop): %w", err)
	case errors.Is(err, unix.ENAMETOOLONG):
		return fmt.Errorf("file name too long: %w", err)
	}
	return err
}

// notExistError is a missing path's error, "no such file" (or directory); it is
// fs.ErrNotExist.
type notExistError struct{ noun string }

func (e notExistError) Error() string        { return "no such " + e.noun }
func (e notExistError) Is(target error) bool { return target == fs.ErrNotExist }

// noun drops the article: "a regular file" -> "file", "a directory" -> "directory".
func noun(want string) string {
	if want == "a directory" {
		return "directory"
	}
	return "file"
}

// Kind names what a file mode describes, with its article, for error messages: "a
// regular file", "a directory", "a symbolic link", "a named pipe (FIFO)", "a socket",
// "a character device", "a block device".
func Kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file"
}

// KindOfStat is Kind for the st_mode of a unix.Stat_t.
func KindOfStat(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return Kind(0)
	case unix.S_IFDIR:
		return Kind(fs.ModeDir)
	case unix.S_IFLNK:
		return Kind(fs.ModeSymlink)
	case unix.S_IFIFO:
		return Kind(fs.ModeNamedPipe)
	case unix.S_IFSOCK:
		return Kind(fs.ModeSocket)
	case unix.S_IFCHR:
		return Kind(fs.ModeDevice | fs.ModeCharDevice)
	case unix.S_IFBLK:
		return Kind(fs.ModeDevice)
	}
	return "of an unknown file type"
}
