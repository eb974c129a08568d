package checkpoint

import (
	"encoding/json"
	"fmt"
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
// the old file or the new one). dir is created when missing, as a trainer would; the
// file is written through a stateDir (a link at .gangrun or at the fence's name is
// refused or replaced, never followed).
func WriteFence(dir string, f Fence) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write fence in %s: %w", dir, err)
	}
	if f.Written.IsZero() {
		f.Written = time.Now().UTC()
	}
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("write fence in %s: %w", dir, err)
	}
	st, err := openState(dir, true)
	if err != nil {
		return fmt.Errorf("write fence: %w", err)
	}
	defer st.close()
	if err := st.dir.WriteFileAtomic(fenceFileName, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write fence: %w", err)
	}
	return nil
}

// ReadFence returns dir's fence; ok is false when there is none. A fence file that is
// not a regular file (a link, a FIFO), longer than 4 KiB or that does not parse is an
// error naming it.
func ReadFence(dir string) (f Fence, ok bool, err error) {
	st, err := openState(dir, false)
	if isMissing(err) {
		return Fence{}, false, nil
	}
	if err != nil {
		return Fence{}, false, fmt.Errorf("fence: %w", err)
	}
	defer st.close()
	data, err := st.dir.ReadFile(fenceFileName, maxFenceBytes)
	if isMissing(err) {
		return Fence{}, false, nil
	}
	if err != nil {
		return Fence{}, false, fmt.Errorf("fence: %w", err)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return Fence{}, false, fmt.Errorf("fence %s: not a gangrun fence file: %w", FencePath(dir), err)
	}
	return f, true, nil
}
