package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/userfile"
)

// ErrCommandNotFound means the command to launch does not exist; gangrun exits 127 for
// it, as POSIX shells do.
var ErrCommandNotFound = errors.New("command not found")

// ErrNotExecutable means the command to launch exists but cannot be executed: a
// directory, a file without execute permission, a named pipe; gangrun exits 126 for it,
// as POSIX shells do for a command found but not executable.
var ErrNotExecutable = errors.New("not executable")

// StartExitCode is the exit code for err, an error of the launcher starting a command,
// as POSIX shells give it: 127 when the command does not exist (ErrCommandNotFound),
// 126 when it exists but cannot be executed (ErrNotExecutable), else other. gangrun
// run, the supervisor's failed start and a job's step all exit with it.
func StartExitCode(err error, other int) int {
	switch {
	case errors.Is(err, ErrCommandNotFound):
		return 127
	case errors.Is(err, ErrNotExecutable):
		return 126
	}
	return other
}

// ErrWorkDir means a worker could not enter the working directory: one the user the
// workers run as (Config.User) may not reach.
var ErrWorkDir = errors.New("working directory")

// notExecutableError is "NAME: why" and is ErrNotExecutable.
type notExecutableError struct{ name, why string }

func (e *notExecutableError) Error() string        { return e.name + ": " + e.why }
func (e *notExecutableError) Is(target error) bool { return target == ErrNotExecutable }

// LookCommand finds the command to launch as a shell would: a name with a slash is that
// file, a name without one is searched on PATH. Errors:
//   - wrapping ErrCommandNotFound, "command not found: NAME", when there is no such file
//     (or no executable of that name on PATH, or the name is empty);
//   - being ErrNotExecutable, "NAME: is a directory, not a command" or "NAME: is not
//     executable (no execute permission)", when the file exists but cannot be run.
func LookCommand(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: the command after -- is an empty string", ErrCommandNotFound)
	}
	if !strings.Contains(name, "/") {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("%w: %s", ErrCommandNotFound, name)
		}
		return p, nil
	}
	fi, err := os.Stat(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s", ErrCommandNotFound, name)
	}
	switch {
	case fi.IsDir():
		return "", &notExecutableError{name, "is a directory, not a command"}
	case !fi.Mode().IsRegular():
		return "", &notExecutableError{name, "is " + userfile.Kind(fi.Mode()) + ", not a command"}
	case unix.Access(name, unix.X_OK) != nil:
		return "", &notExecutableError{name, "is not executable (no execute permission)"}
	}
	return name, nil
}

// lookPathAs is exec.LookPath for the user u the workers run as (Config.User): the first
// PATH entry holding name that u may reach (the lookup made with u's file-system ids, so
// each directory must be searchable by u) and execute (the file's mode bits for u's
// uid, groups or others; ACLs are not read). gangrun's own LookPath is root's, which
// finds a command in a directory only root may enter (a pyenv shim under /root) that the
// worker then cannot run. A name with a slash is returned as it is: the worker's exec,
// as u, judges it. Errors: ErrCommandNotFound wrapped, naming the command.
func lookPathAs(u *proc.User, name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			dir = "."
		}
		path := filepath.Join(dir, name)
		var st unix.Stat_t
		if proc.AsUser(u, func() error { return unix.Stat(path, &st) }) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		bit := uint32(0o001)
		switch {
		case st.Uid == u.UID:
			bit = 0o100
		case st.Gid == u.GID || slices.Contains(u.Groups, st.Gid):
			bit = 0o010
		}
		if st.Mode&bit != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w: %s (in the PATH, for user %s)", ErrCommandNotFound, name, u.Name)
}
