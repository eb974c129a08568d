package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// logsPoll is how often Logs with follow looks for more output and for the job's end.
const logsPoll = 200 * time.Millisecond

// OutputFiles returns the output files of job j: the one file all its nodes append to,
// or, when --output names the node (%n), one per node it ran on, in the order it first
// ran there.
func OutputFiles(j *Job) []string {
	if !j.Spec.PerNode() {
		return []string{j.Spec.OutputPath("")}
	}
	var nodes []string
	add := func(ns []string) {
		for _, n := range ns {
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	for _, a := range j.State.Attempts {
		add(a.Nodes)
	}
	add(j.State.Nodes)
	for _, l := range j.State.LostNodes {
		add([]string{l.Node})
	}
	var out []string
	for _, n := range nodes {
		out = append(out, j.Spec.OutputPath(n))
	}
	return out
}

// Logs copies job id's output to w, like reading slurm-<id>.out; with follow it goes on
// copying what is appended until the job has ended (as tail -f would, stopping by
// itself), or ctx ends. The files are those OutputFiles names, read where this process
// sees them (the submit directory, on a real cluster shared storage). A file not yet
// written is skipped until it is.
func Logs(ctx context.Context, s store.Store, id string, follow bool, w io.Writer) error {
	j, err := Read(ctx, s, id)
	if err != nil {
		return err
	}
	offsets := map[string]int64{}
	copyNew := func() error {
		for _, p := range OutputFiles(j) {
			f, err := os.Open(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("job %s's output: %w", id, err)
			}
			if _, err := f.Seek(offsets[p], io.SeekStart); err == nil {
				n, cerr := io.Copy(w, f)
				offsets[p] += n
				err = cerr
			}
			f.Close()
			if err != nil {
				return fmt.Errorf("job %s's output %s: %w", id, p, err)
			}
		}
		return nil
	}
	if err := copyNew(); err != nil || !follow {
		return err
	}
	for !j.State.Status.Final() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logsPoll):
		}
		if jj, err := Read(ctx, s, id); err == nil {
			j = jj
		}
		if err := copyNew(); err != nil {
			return err
		}
	}
	return copyNew()
}
