package job

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gangrun/gangrun/internal/userfile"
)

// CheckHere checks spec as submit sees it, before anything is written: Validate, then
// what `gangrun run` would refuse of the same values on this host, so the user sees the
// refusal rather than a job that fails on its nodes later. The paths are judged where
// submit runs (on a cluster, shared storage the nodes see alike); a path that does not
// exist yet is fine (the step creates it):
//
//   - the command: an empty word, or a path (with a '/') to a directory or to a file
//     that cannot be executed;
//   - --checkpoint-dir: anything but a directory (a FIFO, a file, a socket, a link
//     loop), or a place on a kernel file system (/proc, /sys) or below a file;
//   - --output (expanded for a node): a directory, anything but a regular file or
//     /dev/null, or a place on a kernel file system or below a file.
//
// Errors name the flag and the value; none of these checks blocks (userfile).
func (s Spec) CheckHere() error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := checkCommandHere(s); err != nil {
		return err
	}
	if s.CheckpointDir != "" {
		if err := checkDirHere("--checkpoint-dir", s.abs(s.CheckpointDir)); err != nil {
			return err
		}
	}
	if s.Batch != nil {
		out, errPath := s.BatchFiles("node")
		if err := checkOutputHere("--output", s.Output, out); err != nil {
			return err
		}
		if errPath != "" {
			if err := checkOutputHere("--error", s.Batch.Error, errPath); err != nil {
				return err
			}
		}
		return nil
	}
	pat := s.Output
	if pat == "" {
		pat = DefaultOutput
	}
	out := s.OutputPath("node")
	if err := checkOutputHere("--output", pat, out); err != nil {
		return err
	}
	return nil
}

// abs resolves p against the submit directory.
func (s Spec) abs(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(s.WorkDir, p)
}

// checkCommandHere refuses a command that cannot run anywhere: an empty word, or a
// path naming a directory or a file without execute permission here.
func checkCommandHere(s Spec) error {
	if s.Script != "" || len(s.Command) == 0 {
		return nil
	}
	c := s.Command[0]
	if c == "" {
		return errors.New(`command "": an empty word is no command`)
	}
	if !strings.ContainsRune(c, '/') {
		return nil // looked up in each node's PATH
	}
	fi, err := os.Stat(s.abs(c))
	switch {
	case err != nil:
		return nil // perhaps only on the nodes
	case fi.IsDir():
		return fmt.Errorf("command %s: is a directory, not a command", c)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("command %s: is %s, not a command", c, userfile.Kind(fi.Mode()))
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("command %s: is not executable (no execute permission)", c)
	}
	return nil
}

// checkDirHere refuses a directory path that names something else, or that no file can
// be made in.
func checkDirHere(flag, dir string) error {
	if fsys := userfile.PseudoFS(dir); fsys != "" {
		return fmt.Errorf("%s %s: cannot be written: %s is in the kernel's %s file system, where no files can be created", flag, dir, userfile.ExistingAncestor(dir), fsys)
	}
	f, err := userfile.OpenDir(dir)
	switch {
	case err == nil:
		f.Close()
		return nil
	case errors.Is(err, fs.ErrNotExist):
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s %s: a dangling symbolic link", flag, dir)
		}
		if a := userfile.ExistingAncestor(dir); a != "" {
			if fi, serr := os.Stat(a); serr == nil && !fi.IsDir() {
				return fmt.Errorf("%s %s: cannot be created: %s is %s, not a directory", flag, dir, a, userfile.Kind(fi.Mode()))
			}
		}
		return nil
	case errors.Is(err, fs.ErrPermission):
		return nil // the job's user may have the access this one lacks
	}
	return fmt.Errorf("%s %w", flag, err)
}

// checkOutputHere refuses an output file path that is a directory, a special file
// other than /dev/null, or on a kernel file system, or below a file; errors name flag
// (--output, --error) and its pattern.
func checkOutputHere(flag, pattern, path string) error {
	if path == "/dev/null" {
		return nil
	}
	if fsys := userfile.PseudoFS(path); fsys != "" {
		return fmt.Errorf("%s %s: cannot be written: %s is in the kernel's %s file system, where no files can be created", flag, pattern, userfile.ExistingAncestor(path), fsys)
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("%s %s: %s is a directory: want a file (sbatch writes slurm-%%j.out into the submit directory; gangrun's default is %s)", flag, pattern, path, DefaultOutput)
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Errorf("%s %s: %s is %s: want a file (or /dev/null)", flag, pattern, path, userfile.Kind(fi.Mode()))
	case err == nil:
		return nil
	}
	if a := userfile.ExistingAncestor(path); a != "" {
		if afi, serr := os.Stat(a); serr == nil && !afi.IsDir() {
			return fmt.Errorf("%s %s: cannot be created: %s is %s, not a directory", flag, pattern, a, userfile.Kind(afi.Mode()))
		}
	}
	return nil
}
