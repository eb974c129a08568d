package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// The fence names the one attempt of a job entitled to write into a checkpoint
// directory: the fencing-token pattern for storage that cannot check tokens itself. Its
// file is DIR/.gangrun/fence, JSON:
//
//	{"job": "llm-7b", "attempt": 12, "node": "node-a", "written": "2026-12-01T10:00:00Z"}
//
// gangrun writes it just before it starts each attempt's workers, from every node (all
// write the same job and attempt; attempt numbers never go back within a job, even
// across a coordinator that lost its state). The workers carry their own as
// GANGRUN_JOB_ID and GANGRUN_ATTEMPT; a trainer that reads the file before it commits a
// checkpoint and finds another job or attempt there has been superseded: a newer attempt
// runs (its node lost contact with the coordinator, or its gangrun was frozen, and the
// gang re-formed without it) and it must stop without writing.
const (
	fenceFileName = "fence"
	// maxFenceBytes bounds how much of a fence file is read.
	maxFenceBytes = 4 << 10
)

// Fence is the content of a checkpoint directory's fence file.
type Fence struct {
	// Job is the job id (GANGRUN_JOB_ID).
	Job string `json:"job"`
	// Attempt is the attempt (rendezvous round) now running (GANGRUN_ATTEMPT).
	Attempt int `json:"attempt"`
	// Node is the node that wrote the file.
	Node string `json:"node,omitempty"`
	// Written is when it was written.
	Written time.Time `json:"written"`
}

// FencePath returns the fence file's path for checkpoint directory dir.
func FencePath(dir string) string { return filepath.Join(dir, stateDirName, fenceFileName) }

// WriteFence records f as the attempt entitled to write into dir, atomically (readers see
// the old file or the new one). dir is created when missing, as a trainer would.
func WriteFence(dir string, f Fence) error {
	if err := os.MkdirAll(filepath.Join(dir, stateDirName), 0o755); err != nil {
		return fmt.Errorf("write fence in %s: %w", dir, err)
	}
	if f.Written.IsZero() {
		f.Written = time.Now().UTC()
	}
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("write fence in %s: %w", dir, err)
	}
	return writeFileAtomic(FencePath(dir), append(data, '\n'))
}

// ReadFence returns dir's fence; ok is false when there is none. A fence file that is
// not a regular file or does not parse is an error naming it.
func ReadFence(dir string) (f Fence, ok bool, err error) {
	path := FencePath(dir)
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return Fence{}, false, nil
	}
	if err != nil {
		return Fence{}, false, fmt.Errorf("fence %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return Fence{}, false, fmt.Errorf("fence %s: not a regular file", path)
	}
	file, err := os.Open(path)
	if err != nil {
		return Fence{}, false, fmt.Errorf("fence %s: %w", path, err)
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, maxFenceBytes))
	if err != nil {
		return Fence{}, false, fmt.Errorf("fence %s: %w", path, err)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return Fence{}, false, fmt.Errorf("fence %s: not a gangrun fence file: %w", path, err)
	}
	return f, true, nil
}
