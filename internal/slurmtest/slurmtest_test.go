package slurmtest

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestTwoNodes: a two-node cluster comes up idle, and a batch job whose srun step runs
// a task per GPU on both nodes completes with one line per task in slurm-ID.out, each
// task seeing its node's four fake GPUs.
func TestTwoNodes(t *testing.T) {
	c := Start(t, Options{Nodes: []string{"gpu-a", "gpu-b"}})
	lines := runJob(t, c, "#!/bin/sh\n#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:4\nsrun sh -c 'echo task $SLURM_PROCID node $SLURM_NODEID gpus $CUDA_VISIBLE_DEVICES'\n")
	if len(lines) != 8 {
		t.Fatalf("slurm-ID.out has %d lines, want 8 tasks':\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, "gpus 0,1,2,3") {
			t.Errorf("task line %q: want the node's four GPUs", l)
		}
	}
}

// TestNetns: with Options.Netns each node's task sees a host of its own: its host name
// is the node's name, which resolves to the node's own address, and the other node's
// name to the other's.
func TestNetns(t *testing.T) {
	c := Start(t, Options{Nodes: []string{"n1", "n2"}, Netns: true})
	got := runJob(t, c, "#!/bin/sh\n#SBATCH --nodes=2 --ntasks-per-node=1\nsrun sh -c 'echo $SLURM_NODEID $(hostname) $(getent hosts $(hostname)) $(getent hosts n1 n2 | tr \"\\n\" \" \")'\n")
	sort.Strings(got)
	want := []string{"0 n1 10.77.0.10 n1 10.77.0.10 n1 10.77.0.11 n2", "1 n2 10.77.0.11 n2 10.77.0.10 n1 10.77.0.11 n2"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("tasks said:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c.Addrs["n1"] != "10.77.0.10" || c.Addrs["n2"] != "10.77.0.11" {
		t.Errorf("Addrs = %v", c.Addrs)
	}
}

// runJob sbatches script on c, waits for the job to end COMPLETED with exit code 0:0
// (else fails the test) and returns the lines of its slurm-ID.out.
func runJob(t *testing.T, c *Cluster, script string) []string {
	t.Helper()
	dir := t.TempDir()
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
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}
