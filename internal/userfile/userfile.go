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
// path. Create opens a file a command writes for its user with the same care, and never
// onto one of the command's inputs.
//
// What gangrun keeps inside a user's directory (a checkpoint directory's .gangrun/) is
// reached through a Dir instead: one descriptor, names resolved relative to it, no link
// followed (dir.go).
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
		return nil, pathErr(path, "read: %w", bareCause(err))
	}
	if int64(len(data)) > limit {
		return nil, pathErr(path, "%w: longer than %d bytes", ErrTooLarge, limit)
	}
	return data, nil
}

// ErrIsInput is wrapped by the error Create returns for an output path that names the
// same file as one of the command's inputs.
var ErrIsInput = errors.New("gangrun does not write over a file it reads")

// Create opens path for writing a file a command makes for its user (topo
// --nccl-topo-xml FILE), creating it with perm (before the umask) or emptying it. It
// never blocks, and changes nothing before it has checked: what path names must be a
// regular file (a FIFO, a device, a socket or a directory is refused: ErrNotRegular),
// and no input of the same command (inputs, compared by device and inode after
// following links, so two spellings of one file are caught) may be the same file
// (ErrIsInput). Links in path are followed: the user chose it. Errors are an *Error
// naming path.
func Create(path string, perm fs.FileMode, inputs ...string) (*os.File, error) {
	if path == "" {
		return nil, &Error{Path: "", Err: ErrNotRegular}
	}
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		if fi, serr := os.Stat(path); serr == nil && !fi.Mode().IsRegular() {
			return nil, pathErr(path, "is %s, %w", Kind(fi.Mode()), ErrNotRegular)
		}
		if errors.Is(err, unix.EISDIR) {
			return nil, pathErr(path, "is a directory, %w", ErrNotRegular)
		}
		if fsys := PseudoFS(path); fsys != "" {
			return nil, pathErr(path, "cannot be created: %s is in the kernel's %s file system, where no files can be created", ExistingAncestor(path), fsys)
		}
		return nil, &Error{Path: path, Err: describeOpenError("a regular file", err)}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, pathErr(path, "fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, pathErr(path, "is %s, %w", KindOfStat(st.Mode), ErrNotRegular)
	}
	for _, in := range inputs {
		var ist unix.Stat_t
		if in != "" && unix.Stat(in, &ist) == nil && ist.Dev == st.Dev && ist.Ino == st.Ino {
			unix.Close(fd)
			if in == path {
				return nil, pathErr(path, "is also this command's input: %w", ErrIsInput)
			}
			return nil, pathErr(path, "is the same file as the input %s: %w", in, ErrIsInput)
		}
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		unix.Close(fd)
		return nil, pathErr(path, "truncate: %w", err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, pathErr(path, "%w", err)
	}
	return os.NewFile(uintptr(fd), path), nil
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

// describeOpenError says in plain words why a path could not be opened, once: the
// error returned prints its own text alone and unwraps to err (so errors.Is still finds
// fs.ErrPermission, unix.ELOOP...), where wrapping with %w would print the system's text
// a second time ("permission denied: permission denied").
func describeOpenError(want string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return notExistError{noun(want)}
	case errors.Is(err, unix.ENOTDIR):
		return causeError{"no such " + noun(want) + " (a component of the path is not a directory)", fs.ErrNotExist}
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return causeError{"permission denied", err}
	case errors.Is(err, unix.ELOOP):
		return causeError{"too many levels of symbolic links (a link loop)", err}
	case errors.Is(err, unix.ENAMETOOLONG):
		return causeError{"file name too long (over 255 bytes in one name, or 4095 in the path)", err}
	}
	return err
}

// bareCause returns the system's error inside a *fs.PathError (which names the path a
// second time), else err.
func bareCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// causeError is an error whose text is its own, unwrapping to the system's cause.
type causeError struct {
	text  string
	cause error
}

func (e causeError) Error() string { return e.text }
func (e causeError) Unwrap() error { return e.cause }

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
