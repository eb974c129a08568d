package job

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gangrun/gangrun/internal/store"
)

// TestLogsOfAJobWithoutOutput: a job that ended without its output file (the file
// refused) is ErrNoOutput naming the file, the end and the recorded reason, with or
// without --follow; a job still running whose file is not there yet prints nothing and
// is no error; an ended job's file is copied.
func TestLogsOfAJobWithoutOutput(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	dir := t.TempDir()
	refused := filepath.Join(dir, "no", "x.out")
	reason := "output " + refused + ": open " + refused + ": permission denied"
	putJob(t, s, Job{Spec: Spec{ID: "2", User: "alice", WorkDir: dir, Output: refused}, State: State{Status: Failed, Reason: reason, ExitCode: 1}})
	want := "job 2 has no output (" + refused + " does not exist): it ended FAILED: " + reason
	for _, follow := range []bool{false, true} {
		var out bytes.Buffer
		err := Logs(ctx, s, "2", follow, &out)
		if !errors.Is(err, ErrNoOutput) || err.Error() != want || out.Len() != 0 {
			t.Errorf("follow %v: %v (%q), want %q and nothing printed", follow, err, out.String(), want)
		}
	}

	putJob(t, s, Job{Spec: Spec{ID: "3", User: "alice", WorkDir: dir}, State: State{Status: Running, Nodes: []string{"a"}}})
	var out bytes.Buffer
	if err := Logs(ctx, s, "3", false, &out); err != nil || out.Len() != 0 {
		t.Errorf("a running job's output not there yet: %v (%q), want no error and nothing", err, out.String())
	}

	if err := os.WriteFile(filepath.Join(dir, "gangrun-4.out"), []byte("[rank0]: done\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	putJob(t, s, Job{Spec: Spec{ID: "4", User: "alice", WorkDir: dir}, State: State{Status: Completed}})
	out.Reset()
	if err := Logs(ctx, s, "4", true, &out); err != nil || out.String() != "[rank0]: done\n" {
		t.Errorf("an ended job's output: %v (%q)", err, out.String())
	}
}
