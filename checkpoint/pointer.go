package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gangrun/gangrun/internal/userfile"
)

// maxPointerBytes bounds how much of a pointer file is read: DeepSpeed's `latest`
// holds one tag, Megatron's tracker one number.
const maxPointerBytes = 4096

// pointer is a trainer's file naming its newest checkpoint: DeepSpeed's `latest` or
// Megatron-LM's latest_checkpointed_iteration.txt. Each is written as the save's last
// act (DeepSpeed: rank 0 writes `latest` after its own model and optimizer files,
// deepspeed/runtime/engine.py save_checkpoint; Megatron: rank 0 writes the tracker after
// the barrier that ends the save, megatron/training/checkpointing.py), so a candidate
// newer than a trusted pointer's target is an unfinished save. Both are written in
// place (open "w", write), so a pointer can be empty or cut; DeepSpeed's can land before
// other ranks' files; and storage can lose the target's data after the pointer landed.
// A pointer is trusted only when it parses and names a complete candidate; otherwise it
// is reported in Listing.Notes and ignored, and every candidate is judged on its own
// files.
type pointer struct {
	// file is the pointer's base name.
	file string
	// target is the candidate name it names; "" when it names none.
	target string
	// problem says why the pointer cannot be trusted before looking at its target.
	problem string

	resolved bool
	trusted  bool
	// note is the Listing note for an untrusted pointer.
	note string
}

// readDeepSpeedPointer reads DIR/latest. It returns nil when there is no such regular
// file.
func readDeepSpeedPointer(dir string) *pointer {
	data, err := readSmall(filepath.Join(dir, deepSpeedPointer))
	if err != nil {
		return nil
	}
	p := &pointer{file: deepSpeedPointer}
	tag := strings.TrimSpace(string(data))
	switch {
	case tag == "":
		p.problem = "is empty"
	case !validTag(tag):
		p.problem = fmt.Sprintf("holds %q, not a tag name", clip(tag))
	default:
		p.target = tag
	}
	return p
}

// readMegatronTracker reads DIR/latest_checkpointed_iteration.txt. It returns nil
// when there is no such regular file. Like Megatron's read_metadata it accepts an
// integer (iteration ≥ 0) or "release"; targetFor finds the iter_ directory.
func readMegatronTracker(dir string, targetFor func(iteration int64) string) *pointer {
	data, err := readSmall(filepath.Join(dir, megatronTracker))
	if err != nil {
		return nil
	}
	p := &pointer{file: megatronTracker}
	s := strings.TrimSpace(string(data))
	if s == "" {
		p.problem = "is empty"
		return p
	}
	if s == megatronRelease {
		p.target = megatronRelease
		return p
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		p.problem = fmt.Sprintf("holds %q, neither an iteration nor \"release\"", clip(s))
		return p
	}
	p.target = targetFor(n)
	return p
}

// readSmall reads at most maxPointerBytes of a regular file (following symlinks). A
// named pipe or a device is refused without blocking.
func readSmall(path string) ([]byte, error) {
	f, err := userfile.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxPointerBytes))
}

// clip shortens s for an error message.
func clip(s string) string {
	const max = 40
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

func isLoop(err error) bool { return errors.Is(err, syscall.ELOOP) }

func baseName(path string) string { return filepath.Base(path) }

// isNotExist reports whether err says a path does not exist.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
