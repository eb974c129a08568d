package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/gangrun/gangrun/internal/userfile"
)

// stateDir is a checkpoint directory opened once, with its .gangrun/ inside it:
// everything gangrun keeps there (pins, the lock, the fence, the trash prune deletes
// from) is reached through these two descriptors by single names, never by a path
// resolved again, and no symbolic link is followed (userfile.Dir). Anyone who can
// write into a shared checkpoint directory can put a link at .gangrun, .gangrun/trash
// or a pin's name; through a stateDir such a link is refused (reads, writes) or
// removed as a link (deletions), so gangrun never reads a FIFO nor deletes a file
// outside the directory it was given because of one.
type stateDir struct {
	// root is the checkpoint directory (the path given, links in it followed).
	root *userfile.Dir
	// dir is root's .gangrun, opened without following a link.
	dir *userfile.Dir
}

// maxPinBytes bounds how much of a pin file is read, in bytes: gangrun writes about
// 300.
const maxPinBytes = 4 << 10

// openState opens dir and its .gangrun; create makes .gangrun when missing. Errors:
// an *userfile.Error naming the path (missing: fs.ErrNotExist; a link at .gangrun:
// userfile.ErrSymlink; not a directory: userfile.ErrNotDir).
func openState(dir string, create bool) (*stateDir, error) {
	root, err := userfile.OpenDirFD(dir)
	if err != nil {
		return nil, err
	}
	var sd *userfile.Dir
	if create {
		sd, err = root.MkSub(stateDirName, 0o755)
	} else {
		sd, err = root.Sub(stateDirName)
	}
	if err != nil {
		root.Close()
		return nil, err
	}
	return &stateDir{root: root, dir: sd}, nil
}

// close closes both descriptors.
func (s *stateDir) close() {
	s.dir.Close()
	s.root.Close()
}

// sub opens (create: makes) the directory name inside .gangrun.
func (s *stateDir) sub(name string, create bool) (*userfile.Dir, error) {
	if create {
		return s.dir.MkSub(name, 0o755)
	}
	return s.dir.Sub(name)
}

// isMissing reports whether err says a path is not there.
func isMissing(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// stateErr says what is wrong with something under .gangrun, for notes and errors:
// the *userfile.Error's text already names the path.
func stateErr(err error) string {
	var ue *userfile.Error
	if errors.As(err, &ue) {
		return ue.Error()
	}
	return fmt.Sprint(err)
}
