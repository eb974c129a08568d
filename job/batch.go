package job

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/internal/quote"
)

// Batch makes a job a Slurm batch job (sbatch, or `gangrun submit` of a script with
// #SBATCH lines; docs/slurm.md): its script runs once, as Slurm's batch step, on the
// allocation's first node, with Slurm's environment, and `srun` inside it starts job
// steps across the allocation (srun.go). Every node of the job runs a step of gangrun's
// that serves those srun steps; none runs the script itself. A job without Batch is
// gangrun's own: its command runs on every node under the gang's supervision.
//
// A plain batch job runs once, as Slurm's: MaxRestarts is 0, and a lost node requeues
// it (or ends it NODE_FAIL with NoRequeue). Given gangrun's own supervision options
// (Supervised: --max-restarts, --spare-nodes, --checkpoint-dir), a failed batch script
// is started again on the same nodes, up to MaxRestarts times, with
// GANGRUN_RESUME_FROM naming the newest complete checkpoint and SLURM_RESTART_COUNT the
// restarts so far.
type Batch struct {
	// NTasks is --ntasks (0: not given); NTasksPerNode --ntasks-per-node (0: not
	// given); CPUsPerTask --cpus-per-task (0: not given, one); GPUsPerTask
	// --gpus-per-task (0: not given). They are srun's defaults inside the job and what
	// the job's Slurm variables say.
	NTasks        int `json:"ntasks,omitempty"`
	NTasksPerNode int `json:"ntasks_per_node,omitempty"`
	CPUsPerTask   int `json:"cpus_per_task,omitempty"`
	GPUsPerTask   int `json:"gpus_per_task,omitempty"`
	// TresPerNode is the GPU request as Slurm's scontrol shows it ("gres:gpu:4",
	// "gres:gpu:h100:8"); "" when the GPUs were asked otherwise (--gpus).
	TresPerNode string `json:"tres_per_node,omitempty"`
	// Export is --export as given ("ALL", "NONE", or a list of names and NAME=value);
	// Environ is the batch step's environment it gives, taken on the submitting host
	// (sbatch's --export=ALL is its default: the whole environment).
	Export  string   `json:"export"`
	Environ []string `json:"environ,omitempty"`
	// Error is --error, a pattern as Output's (ExpandSlurm); "" sends stderr to the
	// output file.
	Error string `json:"error,omitempty"`
	// OpenMode is --open-mode: "append", or "truncate" (also ""), the default.
	OpenMode string `json:"open_mode,omitempty"`
	// SignalBatch is --signal's B: the signal goes to the batch shell only; without it,
	// to every job step's tasks and not the batch shell (Slurm's rule).
	SignalBatch bool `json:"signal_batch,omitempty"`
	// WCKey is --wckey, the workload characterization key sacct's WCKey shows; gangrun
	// keeps it for accounting only, as a Slurm without TrackWCKey does.
	WCKey string `json:"wckey,omitempty"`
	// NoRequeue is --no-requeue: a node lost ends the job NODE_FAIL instead of
	// requeuing it.
	NoRequeue bool `json:"no_requeue,omitempty"`
	// MailType and MailUser are --mail-type (Slurm's names, comma-separated) and
	// --mail-user: kept and shown (scontrol show job), and logged by the controller
	// at the job's start and end. gangrun has no mailer: no mail is sent.
	MailType string `json:"mail_type,omitempty"`
	MailUser string `json:"mail_user,omitempty"`
	// ScriptPath is the script's path as sbatch was given it, made absolute (scontrol's
	// Command); "" for --wrap and a script read from stdin.
	ScriptPath string `json:"script_path,omitempty"`
	// SubmitHost is the host sbatch ran on (SLURM_SUBMIT_HOST).
	SubmitHost string `json:"submit_host,omitempty"`
	// SubmitDir is the directory sbatch ran in (SLURM_SUBMIT_DIR), which --chdir
	// does not change; "" for the job's working directory.
	SubmitDir string `json:"submit_dir,omitempty"`
	// Supervised says gangrun's own supervision was asked for (--max-restarts,
	// --spare-nodes or --checkpoint-dir, as options or #GANGRUN lines): the batch
	// script is restarted up to MaxRestarts times.
	Supervised bool `json:"supervised,omitempty"`
	// Allocation is a job of salloc (or of srun outside a job): no script; its steps are
	// the srun steps the allocating command starts, and it ends when that command
	// releases it.
	Allocation bool `json:"allocation,omitempty"`
	// ClusterName is SLURM_CLUSTER_NAME: the cluster's name as the submitting host
	// knows it (its Consul datacenter).
	ClusterName string `json:"cluster_name,omitempty"`
}

// DefaultSlurmOutput is a batch job's --output default, sbatch's: slurm-%j.out, and
// slurm-%A_%a.out for an array's task.
const (
	DefaultSlurmOutput      = "slurm-%j.out"
	DefaultSlurmArrayOutput = "slurm-%A_%a.out"
)

// validate checks b's own fields.
func (b *Batch) validate(s Spec) error {
	switch {
	case b.NTasks < 0:
		return fmt.Errorf("--ntasks %d: must be at least 1", b.NTasks)
	case b.NTasksPerNode < 0:
		return fmt.Errorf("--ntasks-per-node %d: must be at least 1", b.NTasksPerNode)
	case b.CPUsPerTask < 0:
		return fmt.Errorf("--cpus-per-task %d: must be at least 1", b.CPUsPerTask)
	case b.GPUsPerTask < 0:
		return fmt.Errorf("--gpus-per-task %d: must be at least 1", b.GPUsPerTask)
	case b.OpenMode != "" && b.OpenMode != "append" && b.OpenMode != "truncate":
		return fmt.Errorf("--open-mode %s: want append or truncate", quote.Q(b.OpenMode))
	case b.NTasks > 0 && b.NTasks < s.MinNodes:
		return fmt.Errorf("--ntasks %d is fewer than --nodes %d: every node runs at least one task", b.NTasks, s.MinNodes)
	}
	for _, p := range []struct{ flag, v string }{{"--output", s.Output}, {"--error", b.Error}} {
		if p.v == "" {
			continue
		}
		if err := checkPathLength(p.flag, p.v); err != nil {
			return err
		}
		if _, err := ExpandSlurm(p.flag, p.v, SlurmNames{JobID: "1", Name: "x", Node: "n", User: "u", ArrayJobID: "1", ArrayTaskID: "0"}); err != nil {
			return err
		}
	}
	if b.Allocation {
		return nil
	}
	if s.Script == "" {
		return errors.New("a batch job needs a script")
	}
	if !strings.HasPrefix(s.Script, "#!") {
		// sbatch: "This does not look like a batch script. The first line must start
		// with #! followed by the path to an interpreter."
		return errors.New("this does not look like a batch script: the first line must start with #! followed by the path to an interpreter (for instance #!/bin/sh)")
	}
	return nil
}

// TasksPerNode are the job's tasks on each of n nodes, as Slurm lays them out
// (SLURM_TASKS_PER_NODE): --ntasks-per-node on each; else --ntasks spread in blocks,
// the first nodes taking one more when it does not divide; else one per node.
func (b *Batch) TasksPerNode(n int) []int {
	out := make([]int, n)
	for i := range out {
		switch {
		case b.NTasksPerNode > 0:
			out[i] = b.NTasksPerNode
		case b.NTasks > 0:
			out[i] = b.NTasks / n
			if i < b.NTasks%n {
				out[i]++
			}
		default:
			out[i] = 1
		}
	}
	return out
}

// CompressCounts writes per-node counts as Slurm does (SLURM_TASKS_PER_NODE,
// SLURM_JOB_CPUS_PER_NODE): runs of equal counts as COUNT(xN), "2(x3),1".
func CompressCounts(counts []int) string {
	var parts []string
	for i := 0; i < len(counts); {
		j := i
		for j < len(counts) && counts[j] == counts[i] {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%d(x%d)", counts[i], j-i))
		} else {
			parts = append(parts, strconv.Itoa(counts[i]))
		}
		i = j
	}
	return strings.Join(parts, ",")
}

// SlurmNames are what a batch job's file patterns stand for (ExpandSlurm).
type SlurmNames struct {
	// JobID is %j, Name %x, User %u; ArrayJobID and ArrayTaskID %A and %a (the job's
	// id and 4294967294, Slurm's NO_VAL, outside an array).
	JobID, Name, User, ArrayJobID, ArrayTaskID string
	// Node is %N, the node's name; NodeID %n and TaskID %t (0 for the batch step);
	// StepID %s ("batch" for the batch step).
	Node, StepID   string
	NodeID, TaskID int
}

// ExpandSlurm replaces sbatch's and srun's filename patterns in pattern (Slurm's
// "filename pattern", man sbatch): %% a percent sign, %A the array's job id, %a the
// array task's index, %J the job and step ids (JOB.STEP), %j the job id, %N the node's
// short name, %n the node's index in the job, %s the step id, %t the task's rank, %u the
// user, %x the job's name. A number between % and the letter pads it with zeros to that
// width ("%4t" is 0003), as Slurm's. flag names the option in errors: another %letter,
// or a lone % at the end.
func ExpandSlurm(flag, pattern string, n SlurmNames) (string, error) {
	syn := patternSyntax{flag: flag, quote: quote.Q, want: "%A, %a, %J, %j, %N, %n, %s, %t, %u, %x or %%", widths: true}
	return expandPattern(pattern, syn, func(c byte, pad func(string) string) (string, bool) {
		switch c {
		case 'A':
			return pad(n.ArrayJobID), true
		case 'a':
			return pad(n.ArrayTaskID), true
		case 'J':
			return pad(n.JobID) + "." + n.StepID, true
		case 'j':
			return pad(n.JobID), true
		case 'N':
			return n.Node, true
		case 'n':
			return pad(strconv.Itoa(n.NodeID)), true
		case 's':
			return pad(n.StepID), true
		case 't':
			return pad(strconv.Itoa(n.TaskID)), true
		case 'u':
			return n.User, true
		case 'x':
			return n.Name, true
		}
		return "", false
	})
}

// slurmNoVal is Slurm's NO_VAL (4294967294): %a outside an array.
const slurmNoVal = "4294967294"

// batchNames are the names of j's batch step on node for its file patterns.
func batchNames(j *Job, node string) SlurmNames {
	n := SlurmNames{JobID: j.Spec.ID, Name: j.Spec.Name, User: j.Spec.User, ArrayJobID: j.Spec.ID,
		ArrayTaskID: slurmNoVal, Node: node, StepID: "batch"}
	if a := j.Spec.Array; a != nil {
		// A task of an array: %j is its own job number, as Slurm gives each task one;
		// gangrun's task id is A_i, whose number part is the array's.
		n.ArrayJobID, n.ArrayTaskID = a.JobID, strconv.Itoa(a.TaskID)
	}
	return n
}

// BatchFiles returns the paths of job spec's batch output and error files for a batch
// step on node: --output and --error expanded (ExpandSlurm), relative to the work
// directory; errPath is "" when stderr goes to the output file.
func (s Spec) BatchFiles(node string) (outPath, errPath string) {
	j := &Job{Spec: s}
	names := batchNames(j, node)
	pat := s.Output
	if pat == "" {
		pat = DefaultSlurmOutput
		if s.Array != nil {
			pat = DefaultSlurmArrayOutput
		}
	}
	outPath, err := ExpandSlurm("--output", pat, names)
	if err != nil {
		outPath = "slurm-" + s.ID + ".out"
	}
	outPath = s.abs(outPath)
	if s.Batch != nil && s.Batch.Error != "" {
		if p, err := ExpandSlurm("--error", s.Batch.Error, names); err == nil {
			errPath = s.abs(p)
		}
	}
	if errPath == outPath {
		errPath = ""
	}
	return outPath, errPath
}

// SlurmNodes returns the job's nodes in Slurm's order, the hostlist's natural order
// (SLURM_JOB_NODELIST; the first is the batch host, and a node's place is its
// SLURM_NODEID).
func SlurmNodes(nodes []string) []string {
	return hostlist.SortHosts(nodes)
}

// BatchEnvConfig is what the batch step's environment is built from (BatchEnv).
type BatchEnvConfig struct {
	// Job is the job; Nodes its nodes in Slurm's order (SlurmNodes); Node the batch
	// host's name.
	Job   *Job
	Nodes []string
	Node  string
	// GPUs are the GPU indices (CUDA_VISIBLE_DEVICES entries) the job holds on Node.
	GPUs []string
	// UID and GID are the job's user's; Restarts the batch script's restarts so far;
	// ResumeFrom the checkpoint it resumes from ("": none).
	UID, GID   uint32
	Restarts   int
	ResumeFrom string
	// ConsulAddr is the cluster's Consul (CONSUL_HTTP_ADDR for the job's srun, squeue
	// and scancel); LaunchAddr the batch host's address (GANGRUN_NODE_ADDR, where srun listens).
	ConsulAddr, LaunchAddr string
}

// NoPartition is the partition name Slurm's commands show for a job that names none
// on a cluster whose nodes carry no partition label, and for the nodes without one
// (sinfo's and scontrol's "gangrun"); asked for by name, it means any node.
const NoPartition = "gangrun"

// PartitionName is partition p as Slurm's commands and variables show it: NoPartition
// for "".
func PartitionName(p string) string {
	if p == "" {
		return NoPartition
	}
	return p
}

// BatchEnv returns the batch step's environment: the submitter's (Batch.Environ, as
// --export gave it), then Slurm's variables for the batch step (as slurmstepd sets
// them: SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_JOB_NODELIST, SLURM_NNODES,
// SLURM_TASKS_PER_NODE, SLURM_CPUS_ON_NODE, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, ...;
// docs/slurm.md lists them and what differs), the array's, then gangrun's own
// (GANGRUN_JOB_ID, GANGRUN_CHECKPOINT_DIR, GANGRUN_RESUME_FROM, CONSUL_HTTP_ADDR).
func BatchEnv(c BatchEnvConfig) []string {
	b := c.Job.Spec.Batch
	m := newEnv(b.Environ)
	nn := len(c.Nodes)
	tasks := b.TasksPerNode(nn)
	cpt := max(b.CPUsPerTask, 1)
	cpus := make([]int, nn)
	for i, t := range tasks {
		cpus[i] = t * cpt
	}
	nodeID := 0
	for i, n := range c.Nodes {
		if n == c.Node {
			nodeID = i
		}
	}
	setBatchSlurm(m, c, tasks, cpus, nodeID)
	setBatchOwn(m, c)
	return m.list()
}

// setBatchSlurm sets Slurm's variables of the batch step in m, in slurmstepd's order:
// tasks and cpus are each node's counts, nodeID this node's index.
func setBatchSlurm(m *env, c BatchEnvConfig, tasks, cpus []int, nodeID int) {
	spec, b := c.Job.Spec, c.Job.Spec.Batch
	nn := len(c.Nodes)
	total := 0
	for _, t := range tasks {
		total += t
	}
	nodelist := hostlist.Compress(c.Nodes)
	gpus := strings.Join(c.GPUs, ",")
	set := m.set
	set("ENVIRONMENT", "BATCH")
	set("HOSTNAME", c.Node)
	set("SLURMD_NODENAME", c.Node)
	set("SLURM_CLUSTER_NAME", b.ClusterName)
	set("SLURM_CPUS_ON_NODE", strconv.Itoa(cpus[nodeID]))
	set("SLURM_GPUS_ON_NODE", strconv.Itoa(len(c.GPUs)))
	set("SLURM_GTIDS", "0")
	set("SLURM_JOBID", spec.ID)
	set("SLURM_JOB_ID", spec.ID)
	set("SLURM_JOB_CPUS_PER_NODE", CompressCounts(cpus))
	set("SLURM_JOB_GID", strconv.FormatUint(uint64(c.GID), 10))
	set("SLURM_JOB_UID", strconv.FormatUint(uint64(c.UID), 10))
	set("SLURM_JOB_USER", spec.User)
	set("SLURM_JOB_GPUS", gpus)
	set("SLURM_JOB_NAME", spec.Name)
	set("SLURM_JOB_NODELIST", nodelist)
	set("SLURM_JOB_NUM_NODES", strconv.Itoa(nn))
	set("SLURM_JOB_PARTITION", PartitionName(spec.Partition))
	set("SLURM_JOB_ACCOUNT", spec.Account)
	set("SLURM_LOCALID", "0")
	set("SLURM_NNODES", strconv.Itoa(nn))
	set("SLURM_NODEID", "0")
	set("SLURM_NODELIST", nodelist)
	set("SLURM_NODE_ALIASES", "(null)")
	if b.NTasks > 0 || b.NTasksPerNode > 0 {
		set("SLURM_NPROCS", strconv.Itoa(total))
		set("SLURM_NTASKS", strconv.Itoa(total))
	}
	if b.NTasksPerNode > 0 {
		set("SLURM_NTASKS_PER_NODE", strconv.Itoa(b.NTasksPerNode))
	}
	if b.CPUsPerTask > 0 {
		set("SLURM_CPUS_PER_TASK", strconv.Itoa(b.CPUsPerTask))
	}
	if b.GPUsPerTask > 0 {
		set("SLURM_GPUS_PER_TASK", strconv.Itoa(b.GPUsPerTask))
	}
	switch {
	case spec.MemPerCPU > 0:
		set("SLURM_MEM_PER_CPU", strconv.FormatInt(spec.MemPerCPU>>20, 10))
	case spec.MemPerGPU > 0:
		set("SLURM_MEM_PER_GPU", strconv.FormatInt(spec.MemPerGPU>>20, 10))
	case spec.Mem > 0:
		set("SLURM_MEM_PER_NODE", strconv.FormatInt(spec.Mem>>20, 10))
	}
	set("SLURM_PRIO_PROCESS", "0")
	set("SLURM_PROCID", "0")
	submitDir := b.SubmitDir
	if submitDir == "" {
		submitDir = spec.WorkDir
	}
	set("SLURM_SUBMIT_DIR", submitDir)
	set("SLURM_SUBMIT_HOST", b.SubmitHost)
	set("SLURM_TASKS_PER_NODE", CompressCounts(tasks))
	set("SLURM_TOPOLOGY_ADDR", c.Node)
	set("SLURM_TOPOLOGY_ADDR_PATTERN", "node")
}

// setBatchOwn sets the rest of the batch step's variables in m: --export's, the restart
// count, the GPUs' visibility, the array's, then gangrun's own.
func setBatchOwn(m *env, c BatchEnvConfig) {
	spec, b := c.Job.Spec, c.Job.Spec.Batch
	gpus := strings.Join(c.GPUs, ",")
	set := m.set
	if b.Export != "" && b.Export != "ALL" {
		set("SLURM_EXPORT_ENV", b.Export)
	}
	if b.OpenMode != "" {
		// sbatch's --open-mode reaches the job's srun steps as SLURM_OPEN_MODE, "a" or
		// "t" (Slurm's sbatch sets it in the environment it submits).
		set("SLURM_OPEN_MODE", b.OpenMode[:1])
	}
	if c.Restarts > 0 || c.Job.State.Placement > 1 {
		set("SLURM_RESTART_COUNT", strconv.Itoa(c.Restarts+max(c.Job.State.Placement-1, 0)))
	}
	if c.LaunchAddr != "" {
		set("GANGRUN_NODE_ADDR", c.LaunchAddr) // where the job's srun listens for its nodes
	}
	if _, ok := m.vals["TMPDIR"]; !ok {
		set("TMPDIR", "/tmp") // slurmstepd's, from TmpFS
	}
	for _, k := range []string{"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"} {
		set(k, gpus)
	}
	if spec.GPUsPerNode == 0 {
		m.unsetGPUs()
	}
	if spec.Array != nil {
		for _, kv := range spec.Array.Environ() {
			if strings.HasPrefix(kv, "SLURM_") {
				k, v, _ := strings.Cut(kv, "=")
				set(k, v)
			}
		}
	}
	set("GANGRUN_JOB_ID", spec.ID)
	if ckpt := spec.CheckpointPath(); ckpt != "" {
		set("GANGRUN_CHECKPOINT_DIR", ckpt)
	}
	m.unset("GANGRUN_RESUME_FROM")
	if c.ResumeFrom != "" {
		set("GANGRUN_RESUME_FROM", c.ResumeFrom)
	}
	if c.ConsulAddr != "" {
		set("CONSUL_HTTP_ADDR", c.ConsulAddr)
	}
}

// env is an environment being built: entries in order, a later set replacing an
// earlier one in place.
type env struct {
	keys []string
	vals map[string]string
}

func newEnv(base []string) *env {
	m := &env{vals: map[string]string{}}
	for _, kv := range base {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" {
			m.set(k, v)
		}
	}
	return m
}

func (m *env) set(k, v string) {
	if _, ok := m.vals[k]; !ok {
		m.keys = append(m.keys, k)
	}
	m.vals[k] = v
}

// noGPUVars are the variables a job without GPUs has none of: Slurm's gres/gpu plugin
// sets none of them, and unsets the user's CUDA_VISIBLE_DEVICES and the like, in the
// batch step and in every srun task (compared with Slurm 22.05 by
// TestCPUOnlyJobAgainstSlurm).
var noGPUVars = []string{"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
	"SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS"}

// unsetGPUs removes noGPUVars: the environment of a job without GPUs.
func (m *env) unsetGPUs() {
	for _, k := range noGPUVars {
		m.unset(k)
	}
}

func (m *env) unset(k string) {
	if _, ok := m.vals[k]; ok {
		delete(m.vals, k)
		for i, x := range m.keys {
			if x == k {
				m.keys = append(m.keys[:i], m.keys[i+1:]...)
				break
			}
		}
	}
}

func (m *env) list() []string {
	out := make([]string, 0, len(m.keys))
	for _, k := range m.keys {
		out = append(out, k+"="+m.vals[k])
	}
	return out
}

// ExportEnv returns the batch step's environment that --export gives, from the
// submitting environment environ (Slurm's rules, man sbatch): "ALL" (also "") the
// whole of it; "NONE" none of it but a login's variables (HOME, USER, LOGNAME,
// SHELL, PATH of the user's, as sbatch's implied --get-user-env gives); a list
// "[ALL,]NAME[=value],..." those names (taken from environ, or the value given), with
// everything else when it starts with ALL, else a login's variables. SLURM_* variables
// of environ are kept in every case, as sbatch keeps them. Errors name a bad entry.
func ExportEnv(export string, environ []string, login []string) ([]string, error) {
	switch export {
	case "", "ALL":
		return append([]string{}, environ...), nil
	case "NONE":
		return append(slurmVars(environ), login...), nil
	}
	var base *env
	items := strings.Split(export, ",")
	if strings.EqualFold(items[0], "ALL") {
		items = items[1:]
		base = newEnv(environ)
	} else {
		base = newEnv(append(slurmVars(environ), login...))
	}
	have := newEnv(environ)
	for _, it := range items {
		name, value, given := strings.Cut(it, "=")
		if name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("--export %s: %s is no variable name", quote.Q(export), quote.Q(it))
		}
		if given {
			base.set(name, value)
		} else if v, ok := have.vals[name]; ok {
			base.set(name, v)
		}
	}
	return base.list(), nil
}

// slurmVars are environ's SLURM_* entries.
func slurmVars(environ []string) []string {
	var out []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, "SLURM_") {
			out = append(out, kv)
		}
	}
	return out
}

// LoginEnv is what a login gives user u with home directory home and shell sh: the
// variables --export=NONE leaves the batch step (HOME, LOGNAME, SHELL, USER, and a
// PATH of the system's directories).
func LoginEnv(user, home, sh string) []string {
	if sh == "" {
		sh = "/bin/sh"
	}
	return []string{"HOME=" + home, "LOGNAME=" + user, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
		"SHELL=" + sh, "USER=" + user}
}

// SplitWords splits a directive line into words as a POSIX shell would, without
// expanding anything (single and double quotes, backslash escapes); an unterminated
// quote is an error.
func SplitWords(s string) ([]string, error) { return splitWords(s) }

// PlacedSince is when the job's current (or last) placement started running: what
// squeue's TIME counts from.
func (s *State) PlacedSince() time.Time { return s.placedAt() }
