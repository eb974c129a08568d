package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// A node's ledger of its steps' outcomes (docs/operations.md, "Recovery"): each step
// that ends with an outcome of its own (its workers done, failed, or out of time)
// writes it under its agent's state directory, in ended/job-<id>-<placement>-<t>.json
// (t: the job's submission, in nanoseconds, so that a job of another cluster, or of a
// Consul started afresh, with the same id is never taken for it),
// before it records it in Consul. Consul restored from a snapshot taken before that
// forgets the outcome, and shows the job still running there; the node's launcher then
// finds the outcome in its ledger, records it again instead of starting the step anew,
// and the job ends as it did — never run a second time for that placement. Entries go
// after ledgerKeep.

// ledgerKeep is how long a step's outcome stays in the ledger: longer than any
// snapshot an operator would restore from.
const ledgerKeep = 7 * 24 * time.Hour

// ledgerEntry is one step's outcome.
type ledgerEntry struct {
	Job       string    `json:"job"`
	Submitted time.Time `json:"submitted"`
	Placement int       `json:"placement"`
	Node      string    `json:"node"`
	End       Status    `json:"end"`
	ExitCode  int       `json:"exit_code"`
	Why       string    `json:"why,omitempty"`
	At        time.Time `json:"at"`
}

// ledgerPath is the entry of job id's placement in state directory dir; submitted is
// the job's submission time.
func ledgerPath(dir, id string, placement int, submitted time.Time) string {
	return filepath.Join(dir, "ended", "job-"+id+"-"+strconv.Itoa(placement)+"-"+strconv.FormatInt(submitted.UnixNano(), 10)+".json")
}

// writeLedger writes e under dir (a new file, renamed into place: whole or not at all),
// readable by root only.
func writeLedger(dir string, e ledgerEntry) error {
	path := ledgerPath(dir, e.Job, e.Placement, e.Submitted)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("the node's ledger: %w", err)
	}
	b, _ := json.Marshal(e)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("the node's ledger: %w", err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("the node's ledger: %w", err)
	}
	return nil
}

// readLedger returns the outcome of job id's placement on this node (the job submitted
// at submitted), nil when there is none (or dir is "").
func readLedger(dir, id string, placement int, submitted time.Time) (*ledgerEntry, error) {
	if dir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(ledgerPath(dir, id, placement, submitted))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var e ledgerEntry
	if err := json.Unmarshal(b, &e); err != nil || e.Job != id || e.Placement != placement {
		return nil, fmt.Errorf("the node's ledger %s: not an outcome of job %s placement %d", ledgerPath(dir, id, placement, submitted), id, placement)
	}
	return &e, nil
}

// pruneLedger removes the entries older than ledgerKeep.
func pruneLedger(dir string, now time.Time) {
	if dir == "" {
		return
	}
	entries, err := os.ReadDir(filepath.Join(dir, "ended"))
	if err != nil {
		return
	}
	for _, de := range entries {
		if info, err := de.Info(); err == nil && strings.HasPrefix(de.Name(), "job-") && now.Sub(info.ModTime()) > ledgerKeep {
			os.Remove(filepath.Join(dir, "ended", de.Name()))
		}
	}
}

// recordStepEnd records in job id's state how node's step of placement ended, as the
// step itself does (step.recordEnd): the job goes COMPLETING with end status (the first
// step to say wins) and, when the gang failed, its exit code and root cause; the node
// is noted among the steps that ended and said so. A placement the job has left is
// left alone.
func recordStepEnd(ctx context.Context, s store.Store, id, node string, placement int, end Status, code int, why string) error {
	_, _, err := update(ctx, s, id, func(j *Job) bool {
		if j.State.Placement != placement {
			return false
		}
		changed := false
		if j.State.Status == Running && j.State.apply(Transition{Event: EvEnd, End: end, Words: why}) == nil {
			j.State.ExitCode, changed = code, true
		}
		if !slices.Contains(j.State.StepsEnded, node) {
			j.State.StepsEnded = append(j.State.StepsEnded, node)
			changed = true
		}
		return changed
	})
	return err
}
