package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/torchtest"
	"github.com/gangrun/gangrun/job"
)

// The Slurm clients' own code against gangrun's Slurm commands (issue 32, part 4):
// submitit, Lightning's SLURMEnvironment and dask-jobqueue, from PyPI
// (requirements/clients.txt and requirements/trainers.txt), drive a gangrun cluster
// through the links named sbatch, srun, sacct, scancel, scontrol... on their PATH,
// unchanged. Their scripts are in testdata/clients, each naming the documentation
// example it follows.

// clientCluster is a gangrun cluster whose nodes have 8 GPUs each in partition gpu,
// with Slurm's command links first on PATH, where a client's Python code runs on
// torch 2.x from PyPI with pythonPath's packages.
type clientCluster struct {
	t          *testing.T
	gr         *jobCluster
	links      string
	py         string
	bin        string // the directory of py (a virtual environment's), its `python`
	pythonPath string
}

// startClientCluster starts a gangrun cluster of nodes for a client whose packages are
// in the directories of pythonPath.
func startClientCluster(t *testing.T, pythonPath []string, nodes ...string) *clientCluster {
	t.Helper()
	py := torchtest.PyPI(t)
	gr := startJobClusterWith(t, func(string) []string { return []string{"--labels", "partition=gpu"} }, nodes...)
	links := slurmLinks(t)
	return &clientCluster{t: t, gr: gr, links: links, py: py.Path, bin: py.Bin, pythonPath: strings.Join(pythonPath, ":")}
}

// env is a user's shell on the cluster: the links first on PATH, then torch 2.x's
// virtual environment (its `python`), the cluster's Consul, the clients' packages on PYTHONPATH, no SLURM_* of the
// test's own.
func (c *clientCluster) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "CONSUL_HTTP_ADDR=") && !strings.HasPrefix(kv, "PATH=") &&
			!strings.HasPrefix(kv, "PYTHONPATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "CONSUL_HTTP_ADDR="+c.gr.consul, "PATH="+c.links+":"+c.bin+":"+os.Getenv("PATH"), c.gr.mark,
		"PYTHONPATH="+c.pythonPath, "PYTHONUNBUFFERED=1")
}

// dir is a new directory every user may write, holding the testdata/clients files named.
func (c *clientCluster) dir(files ...string) string {
	c.t.Helper()
	dir := sharedDir(c.t)
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join("testdata", "clients", f))
		if err != nil {
			c.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o755); err != nil {
			c.t.Fatal(err)
		}
	}
	return dir
}

// run runs name with args in dir within d and returns its stdout and stderr together;
// a failure or a timeout fails the test with them.
func (c *clientCluster) run(dir string, d time.Duration, name string, args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	bin := name
	if _, err := os.Lstat(filepath.Join(c.links, name)); err == nil && !strings.Contains(name, "/") {
		bin = filepath.Join(c.links, name) // the cluster's command, not the test's PATH's
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, c.env()
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %v: %v (context: %v)\n%s", name, args, err, ctx.Err(), out)
	}
	return string(out)
}

// python runs one of testdata/clients' scripts with torch 2.x's python in a new
// directory, and returns the directory and the script's output.
func (c *clientCluster) python(script string, d time.Duration, args ...string) (string, string) {
	c.t.Helper()
	dir := c.dir(script)
	return dir, c.run(dir, d, c.py, append([]string{script}, args...)...)
}

// wants fails the test unless out matches each of the regular expressions.
func wants(t *testing.T, what, out string, res ...string) {
	t.Helper()
	for _, re := range res {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("%s: no match for %q in:\n%s", what, re, out)
		}
	}
}

// wantRequeued fails the test unless the cluster's own record of job id (scontrol show
// job, run in dir) counts one requeue: the restart the job's output reports is
// gangrun's, not the client's.
func (c *clientCluster) wantRequeued(dir, id string) {
	c.t.Helper()
	out := c.run(dir, time.Minute, "scontrol", "show", "job", id)
	if f := scontrolFields(out); f["Restarts"] != "1" || f["JobState"] != "COMPLETED" {
		c.t.Errorf("scontrol show job %s: Restarts=%q JobState=%q, want 1 and COMPLETED:\n%s", id, f["Restarts"], f["JobState"], out)
	}
}

// TestSubmititExampleOnGangrun runs submitit's README example with AutoExecutor and
// SlurmExecutor: submitit writes its sbatch script (--wckey=submitit, --signal=USR2@90,
// --open-mode=append, --gpus-per-node, --output/--error with %j_%t patterns), runs it
// through `srun --unbuffered --output ... --error ... python -u -m
// submitit.core._submit DIR`, polls `sacct -o JobID,State,NodeList --parsable2 -j ID`,
// and job.result() returns the function's value.
func TestSubmititExampleOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Clients(t)}, "node1")
	dir, out := c.python("submitit_example.py", 5*time.Minute)
	wants(t, "submitit example", out, `(?m)^auto result 12 state COMPLETED$`, `(?m)^slurm result 12 state COMPLETED$`)
	id := regexp.MustCompile(`(?m)^auto job_id (\d+)$`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no job id in:\n%s", out)
	}
	// srun's --output and --error patterns: task 0's files, beside the batch step's.
	for _, f := range []string{id[1] + "_0_log.out", id[1] + "_0_log.err", id[1] + "_submitted.pkl", id[1] + "_0_result.pkl"} {
		if _, err := os.Stat(filepath.Join(dir, "log_test", f)); err != nil {
			t.Errorf("submitit's %s: %v", f, err)
		}
	}
	wants(t, "the task's stdout (submitit's log)", readFile(filepath.Join(dir, "log_test"), id[1]+"_0_log.out"),
		`Starting with JobEnvironment\(job_id=`+id[1]+`, hostname=`, `Job completed successfully`)
	script := readFile(filepath.Join(dir, "log_test"), id[1]+"_submission.sh")
	wants(t, "submitit's sbatch script", script, `#SBATCH --wckey=submitit`, `#SBATCH --signal=USR2@90`,
		`srun --unbuffered --output .*%j_%t_log.out --error .*%j_%t_log.err`)
	sid := regexp.MustCompile(`(?m)^slurm job_id (\d+)$`).FindStringSubmatch(out)
	if sid == nil {
		t.Fatalf("no job id in:\n%s", out)
	}
	wants(t, "SlurmExecutor's sbatch script", readFile(filepath.Join(dir, "log_test_slurm"), sid[1]+"_submission.sh"), `#SBATCH --mem=1GB`)
	if m := c.gr.show(sid[1])["spec"]; fmt.Sprint(m) == "" || !strings.Contains(fmt.Sprint(m), "mem:1.073741824e+09") {
		t.Errorf("SlurmExecutor's job: --mem=1GB is not 1 GiB in its spec: %v", m)
	}
	acct := c.run(dir, time.Minute, "sacct", "-j", id[1], "-X", "-P", "-n", "-o", "JobID,State,WCKey")
	if got, want := strings.TrimSpace(acct), id[1]+"|COMPLETED|submitit"; got != want {
		t.Errorf("sacct: %q, want %q", got, want)
	}
}

// TestSubmititCancelOnGangrun cancels a running submitit job with job.cancel()
// (scancel ID): sacct then says CANCELLED, and job.result() raises.
func TestSubmititCancelOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Clients(t)}, "node1")
	_, out := c.python("submitit_cancel.py", 5*time.Minute)
	wants(t, "submitit cancel", out, `(?m)^state before cancel RUNNING$`, `(?m)^state after cancel CANCELLED`,
		`(?m)^result raised UncompletedJobError$`)
	id := regexp.MustCompile(`(?m)^job_id (\d+)$`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no job id in:\n%s", out)
	}
	if st := c.gr.show(id[1])["state"]; st != "CANCELLED" {
		t.Errorf("gangrun's state of the job: %v, want CANCELLED", st)
	}
}

// TestSubmititInterruptOnGangrun pre-empts a checkpointable submitit job with
// job._interrupt() (`scancel ID --signal SIGTERM`, then `--signal USR2`): the signals
// reach the task and not the batch shell, submitit's handler checkpoints and requeues
// the job, which resumes from the checkpoint and returns.
func TestSubmititInterruptOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Clients(t)}, "node1")
	dir, out := c.python("submitit_interrupt.py", 8*time.Minute)
	wants(t, "submitit interrupt", out, `(?m)^state before interrupt RUNNING$`,
		`(?m)^result \{'count': 600, 'runs': 2, 'restarts': '1'\}$`)
	id := regexp.MustCompile(`(?m)^job_id (\d+)$`).FindStringSubmatch(out)[1]
	errLog := readFile(filepath.Join(dir, "log_interrupt"), id+"_0_log.err")
	wants(t, "the task's stderr", errLog, `Bypassing signal SIGTERM`, `Caught signal SIGUSR2`)
	c.gr.waitState(id, job.Completed, time.Minute) // COMPLETING while its end is written
	c.wantRequeued(dir, id)
}

// TestSubmititCheckpointRequeueOnGangrun runs a checkpointable submitit job whose first
// run outlasts its --signal=USR2@150 (a 3-minute limit): submitit's USR2 handler in the
// task pickles the callable's state and runs `scontrol requeue ID` from inside the job;
// gangrun requeues it, the batch script runs again (SLURM_RESTART_COUNT=1), and the
// second run resumes from the checkpointed count and returns the result.
func TestSubmititCheckpointRequeueOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Clients(t)}, "node1")
	dir, out := c.python("submitit_checkpoint.py", 8*time.Minute)
	m := regexp.MustCompile(`(?m)^result \{'count': 400, 'runs': 2, 'restarts': '1'\}$`).FindString(out)
	if m == "" {
		t.Fatalf("the job did not end in its second run with the full count:\n%s", out)
	}
	id := regexp.MustCompile(`(?m)^job_id (\d+)$`).FindStringSubmatch(out)[1]
	log := readFile(filepath.Join(dir, "log_ckpt"), id+"_0_log.out")
	// Both runs' output, one file: --open-mode=append reaches srun's --output.
	// submitit logs INFO on stdout, warnings on stderr.
	wants(t, "the task's stdout", log, `(?m)^run 1 from count 0 SLURM_RESTART_COUNT 0$`,
		`Requeued job `+id+` \(2 remaining timeouts\)`, `(?m)^run 2 from count [1-9]\d* SLURM_RESTART_COUNT 1$`)
	errLog := readFile(filepath.Join(dir, "log_ckpt"), id+"_0_log.err")
	wants(t, "the task's stderr", errLog, `Caught signal SIGUSR2 on .*: this job is timed-out`)
	c.gr.waitState(id, job.Completed, time.Minute) // COMPLETING while its end is written
	c.wantRequeued(dir, id)
}

// TestLightningSLURMAutoRequeueOnGangrun runs a Lightning Trainer job with sbatch, as
// Lightning's cluster guide writes it (SLURMEnvironment(requeue_signal=SIGUSR1),
// `#SBATCH --signal=SIGUSR1@180` with a 4-minute limit): at the signal, Lightning's
// handler saves hpc_ckpt_1.ckpt and runs `scontrol requeue $SLURM_JOB_ID`; the
// requeued job's fit resumes from it and trains to the end.
func TestLightningSLURMAutoRequeueOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Trainers(t)}, "node1")
	dir := c.dir("lightning_train.py", "lightning_job.sh")
	id := strings.TrimSpace(c.run(dir, time.Minute, "sbatch", "--parsable", "lightning_job.sh"))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("slurm-%s.out:\n%s", id, readFile(dir, "slurm-"+id+".out"))
		}
	})
	if st := (&slurmPair{t: t, gr: c.gr}).waitEnd(gangrunSide, id, 8*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s ended %s", id, st)
	}
	out := readFile(dir, "slurm-"+id+".out")
	wants(t, "the job's output", out, `(?m)^train start at global_step 0 SLURM_RESTART_COUNT None$`,
		`Handling auto-requeue signal: 10`, `Requeued SLURM job: `+id,
		`(?m)^train start at global_step [1-9]\d* SLURM_RESTART_COUNT 1$`, `(?m)^fit done at global_step 300$`)
	if _, err := os.Stat(filepath.Join(dir, "hpc_ckpt_1.ckpt")); err != nil {
		t.Errorf("Lightning's HPC checkpoint: %v", err)
	}
	c.wantRequeued(dir, id)
}

// wantDaskWorkers fails the test unless gangrun's sacct (run in dir) lists the two
// worker jobs dask-jobqueue submitted: the workers ran as gangrun's jobs.
func (c *clientCluster) wantDaskWorkers(dir string) {
	c.t.Helper()
	out := c.run(dir, time.Minute, "sacct", "-X", "-P", "-n", "-o", "JobName")
	if strings.TrimSpace(out) != "dask-worker\ndask-worker" {
		c.t.Errorf("sacct -X -o JobName: %q, want the two dask-worker jobs", out)
	}
}

// TestDaskJobqueueWithGPUsOnGangrun runs dask-jobqueue's documented SLURMCluster example
// with one GPU a job (job_extra_directives=["--gres=gpu:1"]): cluster.scale(jobs=2)
// sbatches two worker jobs, a Client computes a sum on them, and cluster.close()
// scancels them.
func TestDaskJobqueueWithGPUsOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Clients(t)}, "node1")
	dir, out := c.python("dask_example.py", 6*time.Minute, "gpu")
	wants(t, "dask-jobqueue", out, `#SBATCH --gres=gpu:1`, `(?m)^workers 2$`, `(?m)^sum 285$`, `(?m)^closed$`)
	c.wantDaskWorkers(dir)
}

// TestDaskJobqueueExampleOnGangrun runs dask-jobqueue's documented SLURMCluster example
// as the docs write it: its worker jobs ask for no GPU (CPU-only jobs).
func TestDaskJobqueueExampleOnGangrun(t *testing.T) {
	c := startClientCluster(t, []string{torchtest.Clients(t)}, "node1")
	dir, out := c.python("dask_example.py", 6*time.Minute)
	wants(t, "dask-jobqueue", out, `(?m)^workers 2$`, `(?m)^sum 285$`, `(?m)^closed$`)
	c.wantDaskWorkers(dir)
}

// TestSrunOutputFilesAgainstSlurm runs srun's -o/--output and -e/--error, as submitit
// writes them, in a job with --open-mode=append on a real Slurm 22.05 and on gangrun,
// and compares the files each makes (the job id replaced by ID) and their lines: the
// patterns %j %t %N %s %n, per-task files, one file for every task (no %t), stderr to
// the --output file without -e, -l's labels, "none", a value beginning "all" (srun's
// own output, as Slurm's srun reads it), srun's --open-mode, SLURM_OPEN_MODE in the batch step and the
// append it gives srun's files.
func TestSrunOutputFilesAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "node1", "node2")
	script := `#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --gres=gpu:1 --open-mode=append
echo "mode=${SLURM_OPEN_MODE-unset}"
echo kept > all_$SLURM_JOB_ID.txt
echo kept > e_00.txt
srun -o 'o_%j_%t_%N_%s_%n.txt' -e 'e_%2t.txt' sh -c 'echo out $SLURM_PROCID; echo err $SLURM_PROCID >&2'
srun --output all_%j.txt sh -c 'echo out $SLURM_PROCID; echo err $SLURM_PROCID >&2'
srun -l -n 1 --error=lab_%J.err -o lab_%J.out sh -c 'echo hi; echo ho >&2'
srun -n 1 -o none sh -c 'echo discarded; echo discarded too >&2'
srun -n 1 -o NONE -e e_%s.txt sh -c 'echo discarded; echo err >&2'
echo kept > t.txt
srun -n 1 --open-mode=t -o t.txt echo truncated
echo done
`
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	// %N: Slurm's is the host's short name, gangrun's the node's (docs/slurm.md).
	nodeNames := map[side]*strings.Replacer{realSlurm: strings.NewReplacer("_"+host+"_", "_NODE_"),
		gangrunSide: strings.NewReplacer("_node1_", "_NODE_", "_node2_", "_NODE_")}
	files := map[side]map[string]string{}
	for _, s := range []side{realSlurm, gangrunSide} {
		dir, id, state := p.submit(s, script, nil, "--wckey=submitit") // accepted by both
		if state != "COMPLETED" {
			t.Fatalf("%s: job %s ended %s:\n%s", s, id, state, readFile(dir, "slurm-"+id+".out"))
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		files[s] = map[string]string{}
		for _, e := range entries {
			if e.Name() == "job.sh" {
				continue
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(readFile(dir, e.Name())), "\n") {
				// Slurm's srun may wait for the last step's resources; gangrun's never
				// does (docs/slurm.md, "What differs").
				if !strings.Contains(l, "step creation temporarily disabled") && !strings.HasPrefix(l, "srun: Step created for job") {
					lines = append(lines, l)
				}
			}
			sort.Strings(lines)
			files[s][nodeNames[s].Replace(strings.ReplaceAll(e.Name(), id, "ID"))] = strings.Join(lines, "\n")
		}
	}
	if !reflect.DeepEqual(files[realSlurm], files[gangrunSide]) {
		t.Errorf("the files differ:\nslurm:   %q\ngangrun: %q", files[realSlurm], files[gangrunSide])
	}
	t.Logf("slurm's files: %q", files[realSlurm])
}
