package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/userfile"
)

// Modes of what gangrun creates below a log directory: never wider, whatever the umask
// (which can only narrow them).
const (
	logDirMode  = 0o755
	logFileMode = 0o644
)

// attemptPrefix begins the name of an attempt's directory: attempt_K.
const attemptPrefix = "attempt_"

// checkLogDir refuses, before anything starts, a --log-dir that cannot hold logs: one
// that is not a directory, cannot be created or cannot be written, saying why in plain
// words. With fresh, a directory that already holds an attempt_* entry (an earlier
// run's logs) is refused too. It leaves nothing behind: a directory it had to create to
// check it is removed again (the supervisor creates it when the first worker starts).
func checkLogDir(dir string, fresh bool) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		kind := userfile.Kind(fi.Mode())
		if fi.Mode().IsRegular() {
			kind = "a file"
		}
		return fmt.Errorf("--log-dir %s: is %s, not a directory", dir, kind)
	case err == nil:
		if err := checkCreate(dir); err != nil {
			return fmt.Errorf("--log-dir %s: cannot be written: %s", dir, whyNotWritable(dir, err))
		}
		if fresh {
			return checkNoAttempts(dir)
		}
		return nil
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("--log-dir %s: cannot be used: a symbolic link loop", dir)
	case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("--log-dir %s: cannot be used: %s", dir, whyNotWritable(dir, err))
	}
	if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(dir)
		return fmt.Errorf("--log-dir %s: is a dangling symbolic link (to %s)", dir, target)
	}
	// Missing: create it (and its missing parents) to see that it can be, then remove
	// what was created.
	created := missingDirs(dir)
	if err := os.MkdirAll(dir, logDirMode); err != nil {
		removeDirs(created)
		return fmt.Errorf("--log-dir %s: cannot be created: %s", dir, whyNotWritable(dir, err))
	}
	defer removeDirs(created)
	if err := checkCreate(dir); err != nil {
		return fmt.Errorf("--log-dir %s: cannot be written: %s", dir, whyNotWritable(dir, err))
	}
	return nil
}

// checkCreate creates and removes a file in dir.
func checkCreate(dir string) error {
	f, err := os.CreateTemp(dir, ".gangrun-write-check-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// checkNoAttempts refuses a log directory that holds an earlier run's attempt_K.
func checkNoAttempts(dir string) error {
	d, err := userfile.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("--log-dir %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("--log-dir %s: cannot be read: %w", dir, err)
	}
	sort.Strings(names)
	for _, n := range names {
		if strings.HasPrefix(n, attemptPrefix) {
			return fmt.Errorf("--log-dir %s already holds %s (an earlier run's logs): give each run its own directory", dir, n)
		}
	}
	return nil
}

// missingDirs lists dir and those of its parents that do not exist, deepest first.
func missingDirs(dir string) []string {
	var out []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return out
		}
		out = append(out, d)
		if filepath.Dir(d) == d {
			return out
		}
	}
}

// removeDirs removes the empty directories dirs, in order.
func removeDirs(dirs []string) {
	for _, d := range dirs {
		_ = unix.Rmdir(d)
	}
}

// whyNotWritable says in plain words why a file or directory could not be created at
// or in path: the kernel's pseudo file systems (/proc, /sys) are named as such rather
// than as "no such file or directory".
func whyNotWritable(path string, err error) string {
	if fsys := pseudoFS(path); fsys != "" {
		return fmt.Sprintf("%s is in the kernel's %s file system, where no files can be created", existingAncestor(path), fsys)
	}
	var pe *fs.PathError
	where := path
	if errors.As(err, &pe) {
		where, err = pe.Path, pe.Err
	}
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Sprintf("permission denied: this user (uid %d) may not create files in %s", os.Geteuid(), filepath.Dir(where))
	case errors.Is(err, unix.EROFS):
		return "it is on a read-only file system"
	case errors.Is(err, unix.ENOSPC):
		return "no space left on its file system"
	case errors.Is(err, unix.EDQUOT):
		return "the disk quota is exhausted"
	case errors.Is(err, unix.ENOTDIR):
		if a := existingAncestor(path); a != "" {
			if fi, serr := os.Stat(a); serr == nil && !fi.IsDir() {
				return fmt.Sprintf("%s is %s, not a directory", a, userfile.Kind(fi.Mode()))
			}
		}
		return "a component of the path is not a directory"
	case errors.Is(err, unix.ELOOP):
		return "a symbolic link loop"
	case errors.Is(err, unix.ENAMETOOLONG):
		return "the path is too long"
	case errors.Is(err, unix.ENOENT):
		return "the file system does not let files be created there"
	}
	return err.Error()
}

// existingAncestor is userfile.ExistingAncestor.
func existingAncestor(path string) string { return userfile.ExistingAncestor(path) }

// pseudoFS is userfile.PseudoFS.
func pseudoFS(path string) string { return userfile.PseudoFS(path) }

// workerDir creates base/rel[0]/rel[1]/... for a worker and returns the last one open.
// base is the user's --log-dir (or gangrun's scratch directory) and may itself be, or
// pass through, a symbolic link: the user chose it. Below it nothing is followed: each
// component is made with mkdirat(2) and opened with O_NOFOLLOW relative to its parent's
// descriptor, so a link planted as attempt_K or rank_N (dangling or not) is refused
// with an error naming it, as is anything there that is not a directory or is not
// owned by this user. An existing directory of this user's is used as it is (the nodes
// of a job share attempt_K).
func workerDir(base string, rel []string) (*os.File, error) {
	if err := os.MkdirAll(base, logDirMode); err != nil {
		return nil, fmt.Errorf("create %s: %s", base, whyNotWritable(base, err))
	}
	fd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", base, err)
	}
	path := base
	for _, name := range rel {
		next, err := subdir(fd, filepath.Join(path, name), name)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		fd, path = next, filepath.Join(path, name)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// subdir makes (or opens an existing one of this user's) directory name in the
// directory parent, following no link; path names it in errors. An existing one owned
// by another user is refused: its owner could swap our files' names under us.
func subdir(parent int, path, name string) (int, error) {
	err := unix.Mkdirat(parent, name, logDirMode)
	if err != nil && err != unix.EEXIST {
		return -1, fmt.Errorf("create %s: %s", path, whyNotWritable(path, err))
	}
	existed := err == unix.EEXIST
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if what := describeAt(parent, name); what != "" {
			return -1, fmt.Errorf("%s: is %s, not a directory: gangrun makes its log directories itself and follows no link below --log-dir", path, what)
		}
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("fstat %s: %w", path, err)
	}
	// Only a directory that was there already is judged by its owner: one just made
	// is this process's, even where the file system says otherwise (NFS root_squash).
	if uid := uint32(os.Geteuid()); existed && st.Uid != uid {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: belongs to uid %d, not to this user (uid %d): refused, as someone else could redirect the logs", path, st.Uid, uid)
	}
	return fd, nil
}

// createLogFile creates the new log file name in the directory dir (path names it in
// errors), mode 0644, with O_EXCL|O_NOFOLLOW: anything already there is refused with
// an error naming it and saying what it is (a link, dangling or not; a named pipe; a
// socket; a device; a directory; a regular file: gangrun never overwrites a log).
func createLogFile(dir *os.File, name string) (*os.File, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, logFileMode)
	if errors.Is(err, unix.EEXIST) {
		what := describeAt(int(dir.Fd()), name)
		if what == "a regular file" {
			return nil, fmt.Errorf("%s: already exists (an earlier run's log?): gangrun never overwrites a log; give each run its own --log-dir", path)
		}
		return nil, fmt.Errorf("%s: is %s: refused, a log file must be new (gangrun follows no link below --log-dir)", path, what)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s: %s", path, whyNotWritable(path, err))
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// describeAt says what name in the directory dir is, a symbolic link with its target
// ("a symbolic link to /etc/passwd"); "" when it cannot be stat'ed.
func describeAt(dir int, name string) string {
	var st unix.Stat_t
	if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return ""
	}
	what := userfile.KindOfStat(st.Mode)
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dir, name, buf); err == nil {
			what += " to " + strconv.Quote(string(buf[:n]))
		}
	}
	return what
}

// removeStaleAt removes name from the directory dir when it is there (a worker's error
// file from an earlier attempt with the same number); a directory there is an error.
func removeStaleAt(dir *os.File, name string) error {
	err := unix.Unlinkat(int(dir.Fd()), name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("remove stale %s: %w", filepath.Join(dir.Name(), name), err)
}
