package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/slurmtest"
)

// templateFiles copies the README's Slurm template and the example trainer it runs
// into a new directory, at the paths the template names (scripts/slurm/train.sbatch,
// scripts/examples/train_ddp.py), and returns the directory: the job's working
// directory, as when a user submits from a clone.
func templateFiles(t *testing.T) string {
	t.Helper()
	dir := sharedDir(t)
	for _, f := range []string{"scripts/slurm/train.sbatch", "scripts/examples/train_ddp.py"} {
		data, err := os.ReadFile(filepath.Join(repoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// stepWorker returns the pid of the worker of local rank local on Slurm node nodeID
// among the processes marked with mark (0 when there is none).
func stepWorker(mark string, nodeID, local int) int {
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range envs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(mark+"\x00")) {
			continue
		}
		if bytes.Contains(data, []byte("\x00SLURM_NODEID="+strconv.Itoa(nodeID)+"\x00")) &&
			bytes.Contains(data, []byte("\x00LOCAL_RANK="+strconv.Itoa(local)+"\x00")) &&
			bytes.Contains(data, []byte("\x00GANGRUN_ATTEMPT=0\x00")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	return 0
}

// TestTrainSbatchUnderSlurm runs the README's template, scripts/slurm/train.sbatch, under
// a real Slurm 22.05 (Debian's slurmctld and two slurmds), each node in network, UTS and
// mount namespaces of its own (its own address on a bridge, its own host name, an
// /etc/hosts naming the nodes), 2 GPUs (fake devices) a node, so two workers a node,
// Debian's torch 1.13 on CPU (gloo). The only changes are sbatch's --gpus-per-node=2 and
// the template's variables: the gangrun binary, the interpreter and a short run of the
// trainer. The two gangruns srun starts meet at the first node's host name (the static
// Slurm rendezvous); once checkpoint step-20 exists a worker of the second node is
// SIGKILLed; both nodes restart (per node, without Consul) and every rank resumes from
// one checkpoint, and the job ends COMPLETED with the trainer finished.
func TestTrainSbatchUnderSlurm(t *testing.T) {
	start := time.Now()
	mark := testMark(t) // first, so that its check for leftovers runs after Slurm has stopped
	c := slurmtest.Start(t, slurmtest.Options{Nodes: []string{"node1", "node2"}, Netns: true, GPUsPerNode: 2, CPUsPerNode: 32})
	t.Logf("Slurm up in %s", time.Since(start).Round(time.Millisecond))
	dir := templateFiles(t)
	env := []string{mark, "GANGRUN=" + gangrunBin, "PYTHON=" + python(t),
		"TRAIN_ARGS=--steps 60 --ckpt-every 10 --step-time 0.1"}
	out, errOut, code := c.Run(context.Background(), dir, env, "sbatch", "--parsable", "--gpus-per-node=2", "scripts/slurm/train.sbatch")
	if code != 0 {
		t.Fatalf("sbatch: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	output := func() string { data, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out")); return string(data) }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gangrun-%s.out:\n%s", id, output())
		}
	})
	ckpt := filepath.Join(dir, "checkpoints", "gangrun-train")
	waitFor(t, 3*time.Minute, "checkpoint step-20", func() (bool, string) {
		_, err := os.Stat(filepath.Join(ckpt, "step-20", ".complete"))
		return err == nil, output()
	})
	pid := stepWorker(mark, 1, 1)
	if pid == 0 {
		t.Fatalf("no worker of local rank 1 on node 1 (attempt 0):\n%s", output())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec := c.WaitJob(id, 3*time.Minute)
	log := output()
	if st, ec := slurmtest.Field(rec, "JobState"), slurmtest.Field(rec, "ExitCode"); st != "COMPLETED" || ec != "0:0" {
		t.Fatalf("job %s: JobState=%s ExitCode=%s, want COMPLETED 0:0:\n%s\n%s", id, st, ec, rec, log)
	}
	t.Logf("job %s COMPLETED: %s from the harness's start", id, time.Since(start).Round(time.Millisecond))
	checkTemplateRun(t, id, log, "node1")
}

// TestTrainSbatchUnderGangrunSbatch runs the same template, with the same changes, on a
// gangrun cluster of two agents (Consul dev, recorded DGX H100 inventories) through
// gangrun's own sbatch and srun (links named so), as TestTrainSbatchUnderSlurm does
// under the real Slurm: the same SIGKILL of a worker of the second node at checkpoint
// step-20, the same checks of gangrun-ID.out and a COMPLETED job. Both agents run on
// this machine, so the first node is named localhost: MASTER_ADDR is its name, which
// every node must resolve.
func TestTrainSbatchUnderGangrunSbatch(t *testing.T) {
	start := time.Now()
	p := &slurmPair{t: t, gr: startJobClusterWith(t, nil, "localhost", "node2"), links: slurmLinks(t)}
	dir := templateFiles(t)
	env := []string{"GANGRUN=" + gangrunBin, "PYTHON=" + python(t), "TRAIN_ARGS=--steps 60 --ckpt-every 10 --step-time 0.1"}
	out, errOut, code := p.run(gangrunSide, dir, "", env, "sbatch", "--parsable", "--gpus-per-node=2", "scripts/slurm/train.sbatch")
	if code != 0 {
		t.Fatalf("sbatch: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	output := func() string { data, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out")); return string(data) }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gangrun-%s.out:\n%s", id, output())
		}
	})
	waitFor(t, 3*time.Minute, "checkpoint step-20", func() (bool, string) {
		_, err := os.Stat(filepath.Join(dir, "checkpoints", "gangrun-train", "step-20", ".complete"))
		return err == nil, output()
	})
	pid := stepWorker(p.gr.mark, 1, 1)
	if pid == 0 {
		t.Fatalf("no worker of local rank 1 on node 1 (attempt 0):\n%s", output())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := p.waitEnd(gangrunSide, id, 3*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s: %s, want COMPLETED", id, st)
	}
	t.Logf("job %s COMPLETED: %s from the cluster's start", id, time.Since(start).Round(time.Millisecond))
	checkTemplateRun(t, id, output(), "localhost")
}

// checkTemplateRun checks the template's output (gangrun-ID.out: both gangruns' logs and
// the workers' lines): two nodes meeting at master, world size 4, a worker's SIGKILL,
// one restart on each node, every rank resuming from one
// checkpoint at step 20 or later, the trainer finished.
func checkTemplateRun(t *testing.T, id, log, master string) {
	t.Helper()
	port := strconv.Itoa(20000 + mustAtoi(id)%10000)
	for _, want := range []string{`"master": "` + master + `:` + port + `"`, `"node_rank": 1`, `"world_size": 4`,
		"training: world size 4", "signal SIGKILL (9)", "finished at step 60"} {
		if !strings.Contains(log, want) {
			t.Errorf("gangrun-%s.out lacks %s", id, want)
		}
	}
	resumed := resumedSteps(log)
	if len(resumed) != 4 {
		t.Errorf("resumed steps by rank = %v, want all 4 ranks", resumed)
	}
	for r, s := range resumed {
		if s != resumed[0] || s < 20 {
			t.Errorf("rank %d resumed from step %d, rank 0 from %d (want one step >= 20)", r, s, resumed[0])
		}
	}
	// One restart on each node: node 2's new workers waited for node 1's store of the new
	// attempt (launcher.StoreRoundKey) rather than join the failed one's and fail again.
	if n := strings.Count(log, `restarting the gang	{"restart": 1,`); n != 2 || strings.Contains(log, `"restart": 2`) {
		t.Errorf("restarts: %d nodes restarted once, and a second restart: %v; want one restart on each node", n, strings.Contains(log, `"restart": 2`))
	}
}
