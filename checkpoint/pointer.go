package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
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
	// who says who writes the file, for the reason given to a newer candidate:
	// "DeepSpeed writes latest".
	who string
	// layout is the layout whose file it is; the scan sets it.
	layout pointerLayout

	resolved bool
	trusted  bool
	// note is the Listing note for an untrusted pointer.
	note string
}

// pointerLayout is a layout whose trainer writes a pointer file naming its newest
// checkpoint (deepspeed.go, megatron.go). The scan calls readPointer on each, in
// layouts order, under auto-detection or when the layout is forced, once the listing's
// candidates are known; then adopt on each pointer read; then, once the pointer is
// trusted, governs for every candidate.
type pointerLayout interface {
	layout
	// readPointer reads the layout's pointer file when the directory holds one and
	// returns it, or nil (no such regular file). It may add the candidates that only
	// the pointer file (or the forced format) makes checkpoints: Megatron's release.
	readPointer(s *scan) *pointer
	// adopt makes p's target a candidate when no name rule took it and the layout's
	// pointer may name any entry (a DeepSpeed tag); called after every readPointer.
	adopt(s *scan, p *pointer)
	// governs reports whether the trusted pointer naming target governs c: c newer
	// than target is then an unfinished save.
	governs(c, target *candidate) bool
}

// readPointers reads the pointer file of every pointer layout the format allows, then
// lets each adopt its target.
func (s *scan) readPointers() {
	for _, l := range s.layouts {
		pl, ok := l.(pointerLayout)
		if !ok || (s.forced != nil && s.forced != l) {
			continue
		}
		if p := pl.readPointer(s); p != nil {
			p.layout = pl
			s.pointers = append(s.pointers, p)
		}
	}
	for _, p := range s.pointers {
		p.layout.adopt(s, p)
	}
}

// pointerOf returns the pointer the layout named f read, or nil.
func (s *scan) pointerOf(f Format) *pointer {
	for _, p := range s.pointers {
		if p.layout.info().format == f {
			return p
		}
	}
	return nil
}

// resolve decides whether pointer p is trusted, and records a note when it is not.
func (s *scan) resolve(p *pointer) {
	if p.resolved {
		return
	}
	p.resolved = true
	switch t := s.byName[p.target]; {
	case p.problem != "":
		p.note = fmt.Sprintf("%s %s: not trusted", p.file, p.problem)
	case t == nil:
		p.note = fmt.Sprintf("%s names %s, which does not exist: not trusted", p.file, p.target)
	default:
		if v := s.own(t); !v.complete {
			p.note = fmt.Sprintf("%s names %s, which is incomplete (%s): not trusted", p.file, p.target, v.reason)
		} else {
			p.trusted = true
		}
	}
	if p.note != "" {
		s.notes = append(s.notes, p.note+"; every candidate is judged by its own files")
	}
}

// pointerOver returns the trusted pointer that governs c and its target, if any.
func (s *scan) pointerOver(c *candidate) (*pointer, *candidate) {
	for _, p := range s.pointers {
		if !p.trusted {
			continue
		}
		if t := s.byName[p.target]; p.layout.governs(c, t) {
			return p, t
		}
	}
	return nil, nil
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
