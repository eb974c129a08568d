package slurmtest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTwoNodes: a two-node cluster comes up idle, and a batch job whose srun step runs
// a task per GPU on both nodes completes with one line per task in slurm-ID.out, each
// task seeing its node's four fake GPUs.
func TestTwoNodes(t *testing.T) {
	c := Start(t, Options{Nodes: []string{"gpu-a", "gpu-b"}})
	dir := t.TempDir()
	script := "#!/bin/sh\n#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:4\nsrun sh -c 'echo task $SLURM_PROCID node $SLURM_NODEID gpus $CUDA_VISIBLE_DEVICES'\n"
	if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := c.Run(context.Background(), dir, nil, "sbatch", "--parsable", "job.sh")
	if code != 0 {
		t.Fatalf("sbatch: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	rec := c.WaitJob(id, 60*time.Second)
	if st, ec := Field(rec, "JobState"), Field(rec, "ExitCode"); st != "COMPLETED" || ec != "0:0" {
		t.Fatalf("job %s: JobState=%s ExitCode=%s, want COMPLETED 0:0:\n%s", id, st, ec, rec)
	}
	data, err := os.ReadFile(filepath.Join(dir, "slurm-"+id+".out"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 8 {
		t.Fatalf("slurm-%s.out has %d lines, want 8 tasks':\n%s", id, len(lines), data)
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, "gpus 0,1,2,3") {
			t.Errorf("task line %q: want the node's four GPUs", l)
		}
	}
}
