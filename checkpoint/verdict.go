package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/gangrun/gangrun/internal/userfile"
)

// verdict is a completion rule's answer for one candidate: the format it reports, and
// complete or the reason why not.
type verdict struct {
	format   Format
	complete bool
	reason   string
}

// done is the verdict of a complete candidate, reported as f.
func done(f Format) verdict { return verdict{format: f, complete: true} }

// notDone is the verdict of an incomplete candidate, reported as f, with the reason
// format and a make.
func notDone(f Format, format string, a ...any) verdict {
	return verdict{format: f, reason: fmt.Sprintf(format, a...)}
}

// describeFSError turns a file-system error met while reading a candidate into a
// reason.
func describeFSError(err error) string {
	switch {
	case errors.Is(err, syscall.ELOOP):
		return "symlink loop"
	case errors.Is(err, fs.ErrNotExist):
		return "missing (a broken symlink, or removed while being read)"
	case errors.Is(err, syscall.ENOTDIR):
		return "not a directory"
	case errors.Is(err, fs.ErrPermission):
		return "unreadable: permission denied"
	case errors.Is(err, userfile.ErrNotRegular), errors.Is(err, userfile.ErrTooLarge):
		var ue *userfile.Error
		if errors.As(err, &ue) {
			return ue.Err.Error()
		}
	}
	return "unreadable: " + err.Error()
}
