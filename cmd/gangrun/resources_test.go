package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/slurmtest"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/topology"
)

// TestCPUOnlyJobAgainstSlurm: CPUs and memory as scheduled resources, on a real Slurm
// 22.05 configured as gangrun schedules (memory consumable, CR_Core_Memory; requests
// no node can meet refused at submit, EnforcePartLimits=ALL; each node's RealMemory
// this machine's, which gangrun's agents count for their recorded inventory) and on
// gangrun:
//
//   - refusals at submit agree in message and exit code: more memory (--mem,
//     --mem-per-cpu) or more CPUs (-c, -n) than a node has, two memory options, bad
//     values;
//   - a CPU-only batch job (no GPU asked) runs: its environment and its srun step's
//     agree (no CUDA_VISIBLE_DEVICES though the submitter had one, no SLURM_JOB_GPUS,
//     its CPUs and memory), and scontrol show job's CPUs and memory agree, and while
//     one runs squeue's and sinfo's lines;
//   - a CPU-only salloc's srun step sees no GPUs, its CPUs and memory.
func TestCPUOnlyJobAgainstSlurm(t *testing.T) {
	mem := topology.HostMemoryMiB()
	if mem <= 0 {
		t.Fatal("this machine's memory: /proc/meminfo has no MemTotal")
	}
	// Slurm's node has the CPUs of gangrun's (its agents' dgx-h100 inventory: 224), so
	// that sinfo's and scontrol show node's CPU counts compare.
	p := startSlurmPairWith(t, slurmtest.Options{MemoryMiB: mem, CPUsPerNode: 224,
		Extra: []string{"EnforcePartLimits=ALL", "SelectTypeParameters=CR_Core_Memory"}}, "gpu-a")
	dir := sharedDir(t)
	if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte("#!/bin/sh\ntrue\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	refusals := [][]string{
		{"--mem=100T"},
		{fmt.Sprintf("--mem=%d", mem+1)},
		{fmt.Sprintf("--mem-per-cpu=%d", mem/2+1), "-c", "2"},
		{"-c", "300"},
		{"-N", "1", "-n", "300"},
		{"--mem=10", "--mem-per-cpu=10"},
		{"--mem-per-gpu=10", "--mem-per-cpu=10", "--gres=gpu:1"},
		{"--mem-per-cpu=abc"},
		{"--mem-per-gpu=1X", "--gres=gpu:1"},
		{"-c", "0"},
	}
	for _, args := range refusals {
		args = append(args, "job.sh")
		rout, rerr, rcode := p.run(realSlurm, dir, "", nil, "sbatch", args...)
		gout, gerr, gcode := p.run(gangrunSide, dir, "", nil, "sbatch", args...)
		if rcode == 0 {
			t.Errorf("sbatch %q: Slurm accepted it: %s", args, rout)
			continue
		}
		if rcode != gcode || rerr != gerr || gout != "" {
			t.Errorf("sbatch %q:\nslurm   exit %d: %q\ngangrun exit %d: %q %q", args, rcode, rerr, gcode, gerr, gout)
		}
	}

	script := `#!/bin/sh
env | grep -E '^(CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|SLURM_JOB_GPUS|SLURM_GPUS_ON_NODE|SLURM_STEP_GPUS|SLURM_MEM_PER_NODE|SLURM_MEM_PER_CPU|SLURM_CPUS_ON_NODE|SLURM_CPUS_PER_TASK|SLURM_JOB_CPUS_PER_NODE|SLURM_NTASKS)=' | sort
srun sh -c 'echo step cvd=${CUDA_VISIBLE_DEVICES-unset} gpus=${SLURM_JOB_GPUS-unset} cpus=$SLURM_CPUS_ON_NODE'
`
	fields := []string{"JobState", "NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "TRES", "MinCPUsNode", "MinMemoryNode", "MinMemoryCPU"}
	for _, args := range [][]string{{"-c", "2", "--mem=200"}, {"-n", "2", "--mem-per-cpu=100"}} {
		var outs, shows [2]string
		for i, s := range []side{realSlurm, gangrunSide} {
			d, id, state := p.submit(s, script, []string{"CUDA_VISIBLE_DEVICES=7"}, args...)
			if state != "COMPLETED" {
				t.Errorf("%s: sbatch %q: the CPU-only job ended %s", s, args, state)
			}
			outs[i] = readFile(d, "slurm-"+id+".out")
			show, _, _ := p.run(s, d, "", nil, "scontrol", "show", "job", id)
			for _, f := range fields {
				shows[i] += f + "=" + slurmtest.Field(show, f) + " "
			}
		}
		if outs[0] == "" || outs[0] != outs[1] {
			t.Errorf("sbatch %q: the job's output:\nslurm   %q\ngangrun %q", args, outs[0], outs[1])
		}
		if shows[0] != shows[1] {
			t.Errorf("sbatch %q: scontrol show job:\nslurm   %s\ngangrun %s", args, shows[0], shows[1])
		}
		if !strings.Contains(outs[1], "step cvd=unset gpus=unset") {
			t.Errorf("sbatch %q: the step saw GPUs: %q", args, outs[1])
		}
		if strings.Contains(outs[1], "CUDA_VISIBLE_DEVICES=") || strings.Contains(outs[1], "SLURM_JOB_GPUS=") {
			t.Errorf("sbatch %q: the batch script saw GPUs: %q", args, outs[1])
		}
	}

	// A CPU-only allocation: salloc's command and its srun step see no GPUs.
	var alloc [2]string
	for i, s := range []side{realSlurm, gangrunSide} {
		out, errOut, code := p.run(s, dir, "", []string{"CUDA_VISIBLE_DEVICES=7"}, "salloc", "-c", "2", "--mem=100",
			"srun", "sh", "-c", "echo cvd=${CUDA_VISIBLE_DEVICES-unset} gpus=${SLURM_JOB_GPUS-unset} cpus=$SLURM_CPUS_ON_NODE mem=$SLURM_MEM_PER_NODE")
		if code != 0 {
			t.Errorf("%s: salloc: exit %d %s", s, code, errOut)
		}
		alloc[i] = out
	}
	if alloc[0] != alloc[1] || alloc[0] == "" || !strings.HasPrefix(alloc[1], "cvd=unset gpus=unset ") {
		t.Errorf("salloc -c 2 --mem=100 srun:\nslurm   %q\ngangrun %q", alloc[0], alloc[1])
	}

	// A running CPU-only job, as squeue and scontrol show it, and its node as sinfo does
	// (mixed: some of its CPUs held).
	var queued, shown [2]string
	for i, s := range []side{realSlurm, gangrunSide} {
		out, errOut, code := p.run(s, dir, "", nil, "sbatch", "--parsable", "-c", "3", "--mem-per-cpu=1536", "--wrap", "sleep 300")
		if code != 0 {
			t.Fatalf("%s: sbatch: exit %d %s", s, code, errOut)
		}
		id := strings.TrimSpace(out)
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			st, _, _ := p.run(s, dir, "", nil, "squeue", "-h", "-j", id, "-o", "%T")
			if strings.TrimSpace(st) == "RUNNING" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: job %s not running after 2 minutes: %q", s, id, st)
			}
		}
		queued[i], _, _ = p.run(s, dir, "", nil, "squeue", "-j", id, "-o", "%C %m %D %b %T")
		o, _, _ := p.run(s, dir, "", nil, "squeue", "-j", id, "-O", "minmemory,numcpus")
		queued[i] += o
		o, _, _ = p.run(s, dir, "", nil, "sinfo", "-h", "-o", "%P %t %A %c %m %C %f")
		queued[i] += o
		o, _, _ = p.run(s, dir, "", nil, "sinfo", "-h", "-O", "cpus,memory,cpusstate")
		queued[i] += o
		show, _, _ := p.run(s, dir, "", nil, "scontrol", "show", "job", id)
		for _, f := range fields {
			shown[i] += f + "=" + slurmtest.Field(show, f) + " "
		}
		// The node's CPUs and memory, and what the job holds of them.
		node, _, _ := p.run(s, dir, "", nil, "scontrol", "show", "node", "gpu-a")
		for _, f := range []string{"CPUAlloc", "CPUTot", "RealMemory", "AllocMem", "AvailableFeatures"} {
			shown[i] += f + "=" + slurmtest.Field(node, f) + " "
		}
		p.run(s, dir, "", nil, "scancel", id)
	}
	if queued[0] != queued[1] || !strings.Contains(queued[1], "3 1.50G 1 N/A RUNNING") || !strings.Contains(queued[1], "gpu* mix 1/0 ") {
		t.Errorf("squeue of a running CPU-only job:\nslurm   %q\ngangrun %q", queued[0], queued[1])
	}
	if shown[0] != shown[1] {
		t.Errorf("scontrol show job of a running CPU-only job:\nslurm   %s\ngangrun %s", shown[0], shown[1])
	}
}

// TestSubmitCPUOnlyJob: `gangrun submit --gpus-per-node 0` runs a CPU-only job of gangrun's
// own: one worker per node, seeing no GPU (an empty CUDA_VISIBLE_DEVICES), on
// the nodes of a GPU job that holds every GPU; its CPUs show in `gangrun nodes --json`
// while it runs. A --mem no node has is refused at submit.
func TestSubmitCPUOnlyJob(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	dir := t.TempDir()
	t.Chdir(dir)
	gpuJob := c.submit("--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	c.waitState(gpuJob, job.Running, 90*time.Second)
	id := c.submit("--nodes", "2", "--gpus-per-node", "0", "--mem", "64M", "--",
		"/bin/sh", "-c", `echo "rank $RANK of $WORLD_SIZE devices=${CUDA_VISIBLE_DEVICES-unset}"; sleep 2`)
	c.waitState(id, job.Running, 90*time.Second)
	code, nodes, _ := c.gangrun("nodes", "--json")
	if code != 0 || !strings.Contains(nodes, `"cpus_used": 9`) || !strings.Contains(nodes, `"memory_used_mib": 64`) {
		t.Errorf("nodes --json while the CPU-only job runs beside the 8-GPU one: want 9 CPUs and 64M held on each node:\n%s", nodes)
	}
	m := c.waitState(id, job.Completed, 90*time.Second)
	if m["exit_code"] != float64(0) {
		t.Errorf("exit code %v, want 0", m["exit_code"])
	}
	out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[rank0]: rank 0 of 2 devices=\n", "[rank1]: rank 1 of 2 devices=\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "devices=0") || strings.Contains(string(out), "devices=1") {
		t.Errorf("the CPU-only job saw GPUs:\n%s", out)
	}
	if code, _, errOut := c.gangrun("cancel", gpuJob); code != 0 {
		t.Errorf("cancel %s: exit %d %s", gpuJob, code, errOut)
	}
	c.waitState(gpuJob, job.Cancelled, 90*time.Second)
	code, _, errOut := c.gangrun("submit", "--gpus-per-node", "0", "--mem", "100T", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "more memory than any node has") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("submit --mem 100T: exit %d %q, want a refusal", code, errOut)
	}
}
