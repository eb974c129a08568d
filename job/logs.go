package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/internal/userfile"
)

// logsPoll is how often Logs with follow looks for more output and for the job's end.
const logsPoll = 200 * time.Millisecond

// OutputFiles returns the output files of job j: the one file all its nodes append to,
// or, when --output names the node (%n), one per node it ran on, in the order it first
// ran there.
func OutputFiles(j *Job) []string {
	if j.Spec.Batch != nil {
		// A batch job's script writes on its batch host only; srun's steps write
		// through srun, into the same files.
		host := ""
		if nodes := SlurmNodes(j.State.Nodes); len(nodes) > 0 {
			host = nodes[0]
		} else if n := len(j.State.Attempts); n > 0 && len(j.State.Attempts[n-1].Nodes) > 0 {
			host = j.State.Attempts[n-1].Nodes[0]
		}
		out, errPath := j.Spec.BatchFiles(host)
		if errPath != "" {
			return []string{out, errPath}
		}
		return []string{out}
	}
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

// ErrNoOutput is what Logs returns (wrapped, with the job's end and its recorded
// reason) for a job that has ended without any output file: its output refused (an
// --output path its user may not write), cancelled before it ran, or the file removed.
var ErrNoOutput = errors.New("no output")

// Logs copies job id's output to w, like reading slurm-<id>.out; with follow it goes on
// copying what is appended until the job has ended (as tail -f would, stopping by
// itself), or ctx ends. The files are those OutputFiles names, read where this process
// sees them (the submit directory, on a real cluster shared storage). A file not yet
// written is skipped until it is; a job that has ended with none of them there is
// ErrNoOutput.
func Logs(ctx context.Context, s store.Store, id string, follow bool, w io.Writer) error {
	j, err := Read(ctx, s, id)
	if err != nil {
		return err
	}
	offsets := map[string]int64{}
	found := false
	copyNew := func() error {
		for _, p := range OutputFiles(j) {
			// Never blocks: an output that is a FIFO, a device or a directory is
			// refused, not opened for a read that waits for ever.
			f, err := userfile.OpenFile(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("job %s's output %w", id, err)
			}
			found = true
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
	ended := func() error {
		if found || !j.State.Status.Final() {
			return nil
		}
		return noOutput(j)
	}
	if err := copyNew(); err != nil {
		return err
	}
	if !follow {
		return ended()
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
	if err := copyNew(); err != nil {
		return err
	}
	return ended()
}

// noOutput is ErrNoOutput for ended job j, naming the files that are not there and
// how the job ended, with its recorded reason: "job 2 has no output (/root/x.out does
// not exist): it ended FAILED: output /root/x.out: open /root/x.out: permission denied".
func noOutput(j *Job) error {
	var where string
	switch files := OutputFiles(j); len(files) {
	case 0:
		where = "it ran on no node"
	case 1:
		where = files[0] + " does not exist"
	default:
		where = "none of " + strings.Join(files, ", ") + " exists"
	}
	why := ""
	if j.State.Reason != "" {
		why = ": " + j.State.Reason
	}
	return fmt.Errorf("job %s has %w (%s): it ended %s%s", j.Spec.ID, ErrNoOutput, where, j.State.Status, why)
}
