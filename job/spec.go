// Package job is gangrun's cluster jobs: what `gangrun submit` queues (like sbatch), the
// durable record each job keeps in Consul, its states in Slurm's names, its step on
// every granted node (the supervisor `gangrun run` uses, started by the node's agent
// and outliving it, like slurmstepd), and the controller the elected agent runs to move
// jobs through their states: placing them again when they lose a node, finishing them,
// giving their GPUs back.
//
// A job's life: Submit writes its Spec, its State (PENDING) and a durable request for
// its nodes; the scheduler grants the request (allocator), each node's GPU keys held by
// the node's agent; each granted node's agent starts the job's step, which takes its
// node's keys over and runs the job's command in the job's rendezvous; the steps
// record how it ends, and the controller finishes the job and removes its grant.
package job

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/launcher"
)

// Limits of a job's spec.
const (
	// MaxTime bounds --time: a year, in case a number meant in seconds was read as
	// minutes.
	MaxTime = 365 * 24 * time.Hour
	// DefaultSignalBefore is --signal's lead when no @DUR is given: 60 s, as Slurm's.
	DefaultSignalBefore = 60 * time.Second
	// DefaultOutput is --output's default: gangrun-<job id>.out in the submit directory
	// (sbatch's slurm-%j.out).
	DefaultOutput = "gangrun-%j.out"
	// DefaultMaxRestarts is --max-restarts for a job: as `gangrun run`'s.
	DefaultMaxRestarts = 3
	// MaxRestartsLimit bounds --max-restarts.
	MaxRestartsLimit = 10000
	// MaxNodes bounds --nodes and --spare-nodes: as run's --nnodes (launcher.MaxNNodes).
	MaxNodes = 65536
	// MaxPriority bounds --priority either way: Slurm keeps a job's priority as a
	// 32-bit unsigned number (gangrun takes negative ones too).
	MaxPriority = 1<<32 - 1
	// MaxNice bounds --nice either way: Slurm's NICE_OFFSET - 3 (slurm_opt.c).
	MaxNice = 1<<31 - 3
	// DefaultNice is --nice given no value (Slurm's 100).
	DefaultNice = 100
	// MaxNameBytes bounds --name, --account and --partition, in bytes.
	MaxNameBytes = 128
	// maxPathBytes and maxPathComponentBytes bound --output and --checkpoint-dir, in
	// bytes: Linux's PATH_MAX (4096, with its NUL) and NAME_MAX.
	maxPathBytes          = 4095
	maxPathComponentBytes = 255
	// maxArgBytes bounds one word of the command: Linux's MAX_ARG_STRLEN (32 pages).
	maxArgBytes = 128 << 10
)

// checkPathLength refuses a path longer than Linux takes, or with a component longer
// than a file name may be.
func checkPathLength(flag, p string) error {
	if len(p) > maxPathBytes {
		return fmt.Errorf("%s %s: longer than %d bytes (PATH_MAX)", flag, quote.Q(p), maxPathBytes)
	}
	for _, c := range strings.Split(p, "/") {
		if len(c) > maxPathComponentBytes {
			return fmt.Errorf("%s %s: a name of %d bytes in the path: a file name takes at most %d (NAME_MAX)", flag, quote.Q(p), len(c), maxPathComponentBytes)
		}
	}
	return nil
}

// Spec is a submitted job, as `gangrun submit` received it: immutable once queued.
type Spec struct {
	// ID is the job's id, given by Submit: a decimal number, like Slurm's.
	ID string `json:"id"`
	// Name is --name (%x in --output); default: the command's base name.
	Name string `json:"name"`
	// User is the Unix user who submitted the job; Account and Partition as given.
	User      string `json:"user"`
	Account   string `json:"account,omitempty"`
	Partition string `json:"partition,omitempty"`
	// MinNodes and MaxNodes are --nodes N[:M]: the job runs on as many nodes as are free,
	// from MinNodes up to MaxNodes, and shrinks within them when it loses one.
	MinNodes int `json:"min_nodes"`
	MaxNodes int `json:"max_nodes"`
	// GPUsPerNode is --gpus-per-node's count; GPUModel and MIGProfile its type, when
	// given ([TYPE:]COUNT, allocator.ParseGPUs): a GPU model matched in the device name,
	// or a MIG profile ("3g.40gb") whose MIG devices the job gets, one per rank.
	GPUsPerNode int    `json:"gpus_per_node"`
	GPUModel    string `json:"gpu_model,omitempty"`
	MIGProfile  string `json:"mig_profile,omitempty"`
	// Priority orders the queue: higher first, then submission.
	Priority int `json:"priority"`
	// Begin is --begin: the job waits PENDING (reason BeginTime), without a request,
	// until then (zero: no wait; begin.go).
	Begin time.Time `json:"begin,omitzero"`
	// QOS is --qos: a QOS of the policy, whose priority and limits the job gets ("":
	// its account's QOS).
	QOS string `json:"qos,omitempty"`
	// Nice is --nice: the job's priority is lowered by it (raised, when negative: an
	// operator's only, as Slurm's), within ±MaxNice.
	Nice int `json:"nice,omitempty"`
	// TimeLimit is --time; 0: none. At the limit the job gets SIGTERM, --term-timeout
	// to stop, and ends TIMEOUT.
	TimeLimit time.Duration `json:"time_limit,omitempty"`
	// Signal, when set, is sent to the workers SignalBefore ahead of TimeLimit (--signal
	// SIG@DUR, Slurm's --signal), so the trainer can checkpoint; at the start when the
	// lead is as long as TimeLimit or longer (Slurm accepts that too).
	Signal       syscall.Signal `json:"signal,omitempty"`
	SignalBefore time.Duration  `json:"signal_before,omitempty"`
	// SpareNodes are granted with the job and run nothing until a node of the job fails
	// (--spare-nodes).
	SpareNodes int `json:"spare_nodes,omitempty"`
	// CheckpointDir is as `gangrun run`'s.
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
	// Supervision is `gangrun run`'s supervision flags as submitted (--max-restarts,
	// --hang-timeout, --warm-restarts, ...), its members inline in the record: every
	// node's step runs the job with it (Spec.StepSupervision). A record written before
	// it was kept holds max_restarts alone.
	launcher.Supervision
	// TermTimeout is the SIGTERM → SIGKILL grace when the job is stopped.
	TermTimeout time.Duration `json:"term_timeout,omitempty"`
	// Output is --output, a pattern (Expand) relative to WorkDir.
	Output string `json:"output"`
	// Env holds --env KEY=VALUE entries for the workers.
	Env []string `json:"env,omitempty"`
	// Mem is --mem: each node's step is held to this much memory, in bytes, by its
	// cgroup (Slurm's --mem, per node); 0 is no limit.
	Mem int64 `json:"mem,omitempty"`
	// MemPerCPU and MemPerGPU are sbatch's --mem-per-cpu and --mem-per-gpu, in bytes:
	// the node's memory is that times the job's CPUs or GPUs on it (NodeMem). At most
	// one of Mem, MemPerCPU and MemPerGPU is set (Slurm's rule).
	MemPerCPU int64 `json:"mem_per_cpu,omitempty"`
	MemPerGPU int64 `json:"mem_per_gpu,omitempty"`
	// Command is what every node runs, as `gangrun run` would; for a script, the
	// script's arguments: each node runs the interpreter of its #! line (else /bin/sh)
	// on its copy of Script, then these.
	Command []string `json:"command"`
	// Script is the submitted script's text, kept with the job (as sbatch keeps the batch
	// script): the steps run this copy, not the file, which may change meanwhile.
	Script string `json:"script,omitempty"`
	// WorkDir is the directory submit ran in: the command's working directory and where
	// relative paths (--output, --checkpoint-dir) start.
	WorkDir string `json:"work_dir"`
	// Submitted is when the job was queued.
	Submitted time.Time `json:"submitted"`
	// Dependency is --dependency: every term must hold before the job's request is
	// written (it waits PENDING, reason Dependency, until then).
	Dependency []Dependency `json:"dependency,omitempty"`
	// KillInvalidDep is --kill-on-invalid-dep=yes: once its dependencies can never be
	// satisfied the job is cancelled (reason DependencyNeverSatisfied), instead of
	// waiting PENDING with that reason.
	KillInvalidDep bool `json:"kill_invalid_dep,omitempty"`
	// Hold submits the job held by its user (sbatch --hold, -H; `gangrun submit
	// --hold`): it waits PENDING (JobHeldUser) until `scontrol release` (hold.go).
	Hold bool `json:"hold,omitempty"`
	// Array is the job's place in its job array (--array); nil for a job in none.
	Array *ArrayTask `json:"array,omitempty"`
	// Batch makes the job a Slurm batch job (batch.go): its script runs once on the
	// first node and srun starts its steps; nil for gangrun's own jobs.
	Batch *Batch `json:"batch,omitempty"`
	// NodeChoice is --exclusive, --constraint, --nodelist and --exclude, which the
	// job's request carries to the placement pipeline (allocator.NodeChoice).
	allocator.NodeChoice
}

// NodeCPUs is the CPUs the job holds on each node (allocator.Request.CPUsPerNode), by
// Slurm's rule: a batch job's tasks on the node (the most any node gets, Batch.TasksPerNode
// over MinNodes) times --cpus-per-task (default 1); gangrun's own job one per GPU, the
// workers `gangrun run` starts there, and at least one.
func (s Spec) NodeCPUs() int {
	if s.Batch == nil {
		return max(s.GPUsPerNode, 1)
	}
	return slices.Max(s.Batch.TasksPerNode(max(s.MinNodes, 1))) * max(s.Batch.CPUsPerTask, 1)
}

// NodeMem is the memory the job holds on each node, in bytes, and its step's cgroup
// limit there: --mem, or --mem-per-cpu times NodeCPUs, or --mem-per-gpu times the GPUs
// per node (Slurm's pn_min_memory); 0 when none was asked (not held, no limit).
func (s Spec) NodeMem() int64 {
	per, n := s.Mem, int64(1)
	switch {
	case s.MemPerCPU > 0:
		per, n = s.MemPerCPU, int64(s.NodeCPUs())
	case s.MemPerGPU > 0:
		per, n = s.MemPerGPU, int64(s.GPUsPerNode)
	}
	if per > 0 && n > math.MaxInt64/per {
		return math.MaxInt64 // more than any node has: Validate refuses it
	}
	return per * n
}

// StepSupervision is the supervision each node's step runs the job with: the spec's,
// each zero field its default (launcher.Supervision). A record written before the
// spec kept its supervision reads as the defaults, so such a job now restarts warm
// where it restarted cold.
func (s Spec) StepSupervision() launcher.Supervision {
	return s.Supervision
}

// Hidden is what another user's job's private fields read as through gangrun's
// commands under Consul's ACLs (Spec.Redacted).
const Hidden = "(hidden: another user's job)"

// Redacted is s as another user sees it through `gangrun show` under Consul's ACLs,
// as Slurm's PrivateData=jobs keeps a job's details to its user and the operators:
// its command, script, environment, directories and output path read as Hidden; its
// resources, times and states stay. (Consul itself still serves the spec's key to a
// user's token: docs/acl.md, "Limits".)
func (s Spec) Redacted() Spec {
	s.Command, s.Script, s.Env = []string{Hidden}, "", nil
	s.WorkDir, s.Output = Hidden, Hidden
	if s.CheckpointDir != "" {
		s.CheckpointDir = Hidden
	}
	return s
}

// Validate checks the spec's own fields; the cluster checks (a partition that exists,
// nodes with enough GPUs) are Submit's. Errors name the flag and the bad value.
func (s Spec) Validate() error {
	switch {
	case len(s.Command) == 0 && s.Script == "" && (s.Batch == nil || !s.Batch.Allocation):
		return errors.New("no command: give one after --, or a script")
	case s.MinNodes < 1:
		return fmt.Errorf("--nodes %d: must be at least 1", s.MinNodes)
	case s.MaxNodes < s.MinNodes:
		return fmt.Errorf("--nodes %d:%d: want MIN <= MAX", s.MinNodes, s.MaxNodes)
	case s.GPUsPerNode < 0:
		return fmt.Errorf("--gpus-per-node %d: must be at least 1", s.GPUsPerNode)
	case s.SpareNodes < 0:
		return fmt.Errorf("--spare-nodes %d: must not be negative", s.SpareNodes)
	case s.MaxRestarts < 0 || s.MaxRestarts > MaxRestartsLimit:
		return fmt.Errorf("--max-restarts %d: want 0 to %d", s.MaxRestarts, MaxRestartsLimit)
	case s.Mem < 0 || s.Mem > cgroup.MaxMem:
		return fmt.Errorf("--mem %d bytes: want 0 (no limit) to 1P", s.Mem)
	case s.MemPerCPU < 0 || s.MemPerCPU > cgroup.MaxMem || s.MemPerGPU < 0 || s.MemPerGPU > cgroup.MaxMem:
		return fmt.Errorf("--mem-per-cpu %d, --mem-per-gpu %d bytes: want 0 to 1P", s.MemPerCPU, s.MemPerGPU)
	case (s.Mem > 0 && (s.MemPerCPU > 0 || s.MemPerGPU > 0)) || (s.MemPerCPU > 0 && s.MemPerGPU > 0):
		return errors.New("--mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive")
	case s.NodeMem() > cgroup.MaxMem:
		return fmt.Errorf("memory per node %d bytes: want at most 1P", s.NodeMem())
	case s.NodeMem() != 0 && s.NodeMem() < cgroup.MinMem:
		return fmt.Errorf("memory per node %s (--mem-per-cpu or --mem-per-gpu times the node's CPUs or GPUs): want at least 16M: a step needs more to start", cgroup.FormatMem(s.NodeMem()))
	case s.TimeLimit < 0 || s.TimeLimit > MaxTime:
		return fmt.Errorf("--time %s: want at most %s (a year)", FormatSlurmTime(s.TimeLimit), FormatSlurmTime(MaxTime))
	case s.Signal != 0 && s.TimeLimit == 0:
		return fmt.Errorf("--signal %s@%s needs --time (it is sent that long before the time limit)", signalName(s.Signal), s.SignalBefore)
	case s.WorkDir == "" || !filepath.IsAbs(s.WorkDir):
		return fmt.Errorf("work directory %q: want an absolute path", s.WorkDir)
	case s.MaxNodes > MaxNodes:
		return fmt.Errorf("--nodes %d: want at most %d", s.MaxNodes, MaxNodes)
	case s.SpareNodes > MaxNodes:
		return fmt.Errorf("--spare-nodes %d: want at most %d", s.SpareNodes, MaxNodes)
	case s.Priority > MaxPriority || s.Priority < -MaxPriority:
		return fmt.Errorf("--priority %d: want %d to %d (Slurm's job priority is 32-bit)", s.Priority, -MaxPriority, MaxPriority)
	case s.Nice > MaxNice || s.Nice < -MaxNice:
		return fmt.Errorf("--nice %d: Nice value out of range (+/- %d)", s.Nice, MaxNice)
	}
	if err := s.Supervision.Check(); err != nil {
		return err
	}
	if err := s.checkNodeChoice(); err != nil {
		return err
	}
	for _, f := range []struct{ flag, v string }{{"--name", s.Name}, {"--account", s.Account}, {"--partition", s.Partition}, {"--output", s.Output}} {
		if strings.IndexFunc(f.v, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) >= 0 {
			return fmt.Errorf("%s %s: only printable text is allowed", f.flag, quote.Q(f.v))
		}
	}
	for _, f := range []struct{ flag, v string }{{"--name", s.Name}, {"--account", s.Account}, {"--partition", s.Partition}} {
		if len(f.v) > MaxNameBytes {
			return fmt.Errorf("%s %s: longer than %d bytes", f.flag, quote.Q(f.v), MaxNameBytes)
		}
	}
	// An account or a partition is a name in the policy and a key: one word, no '/'.
	for _, f := range []struct{ flag, v string }{{"--account", s.Account}, {"--partition", s.Partition}} {
		if strings.ContainsAny(f.v, "/ \t") {
			return fmt.Errorf("%s %s: want a name without '/' or spaces", f.flag, quote.Q(f.v))
		}
	}
	for _, f := range []struct{ flag, v string }{{"--output", s.Output}, {"--checkpoint-dir", s.CheckpointDir}} {
		if err := checkPathLength(f.flag, f.v); err != nil {
			return err
		}
	}
	for i, w := range s.Command {
		if i == 0 && w == "" && s.Script == "" {
			return errors.New(`command "": an empty word is no command`)
		}
		if len(w) > maxArgBytes {
			return fmt.Errorf("command word %d %s: longer than %d bytes (Linux's MAX_ARG_STRLEN)", i+1, quote.Q(w), maxArgBytes)
		}
	}
	if s.Batch != nil {
		return s.Batch.validate(s) // its patterns are Slurm's (ExpandSlurm)
	}
	if s.Output != "" {
		if _, err := Expand(s.Output, Names{ID: "1", Name: "x", Node: "n", User: "u"}); err != nil {
			return err
		}
	}
	return nil
}

// ParseNodes parses --nodes: "N" or "N:M" (Slurm's --nodes takes "N-M"; both are
// accepted).
func ParseNodes(v string) (lo, hi int, err error) {
	bad := fmt.Errorf("--nodes %s: want N or MIN:MAX, positive numbers", quote.Q(v))
	a, b, ranged := strings.Cut(v, ":")
	if !ranged {
		a, b, ranged = strings.Cut(v, "-")
	}
	lo, err = strconv.Atoi(a)
	if err != nil || lo < 1 {
		return 0, 0, bad
	}
	hi = lo
	if ranged {
		if hi, err = strconv.Atoi(b); err != nil || hi < lo {
			return 0, 0, bad
		}
	}
	if hi > MaxNodes {
		return 0, 0, fmt.Errorf("--nodes %s: want at most %d", quote.Q(v), MaxNodes)
	}
	return lo, hi, nil
}

// ParseTime parses --time as sbatch does (Slurm's time_str2secs, src/common/parse_time.c):
// "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
// "days-hours:minutes" and "days-hours:minutes:seconds", only digits, at most one '-'
// (before any ':') and two ':', and enough numbers for the colons given; "-1",
// "INFINITE" and "UNLIMITED" (any case), and "0", mean no limit (0). Like sbatch, it
// adds the fields up without holding each to its clock range: "99:99:99" is 100 hours,
// 40 minutes and 39 seconds, "1-25" two days and an hour (TimeNote says so). gangrun also
// takes a Go duration ("90m", "2h30m"), keeps seconds (Slurm rounds up to minutes) and
// refuses more than MaxTime and any negative value.
func ParseTime(v string) (time.Duration, error) {
	d, _, err := parseTime(v)
	return d, err
}

// TimeNote returns a line saying how a --time value whose fields run past their clock
// range was read ("--time 99:99:99 is read as 4-04:40:39, as sbatch reads it: the
// fields are added up"), or "" when it reads as it looks (or does not parse).
func TimeNote(v string) string {
	d, canonical, err := parseTime(v)
	if err != nil || canonical {
		return ""
	}
	return fmt.Sprintf("--time %s is read as %s, as sbatch reads it: the fields are added up", quote.Q(v), FormatSlurmTime(d))
}

// FormatSlurmTime writes d as Slurm shows a time limit: D-HH:MM:SS, or HH:MM:SS under
// a day (squeue's and scontrol's form).
func FormatSlurmTime(d time.Duration) string {
	s := int64(d / time.Second)
	days, h, m, sec := s/86400, s/3600%24, s/60%60, s%60
	if days > 0 {
		return fmt.Sprintf("%d-%02d:%02d:%02d", days, h, m, sec)
	}
	return fmt.Sprintf("%02d:%02d:%02d", h, m, sec)
}

// parseTime is ParseTime, also saying whether every field but the first was within
// its clock range.
func parseTime(v string) (d time.Duration, canonical bool, err error) {
	bad := fmt.Errorf("--time %s: want minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] (Slurm's forms) or a duration such as 90m", quote.Q(v))
	if v == "" {
		return 0, false, bad
	}
	if v == "-1" || strings.EqualFold(v, "unlimited") || strings.EqualFold(v, "infinite") {
		return 0, true, nil
	}
	if strings.ContainsAny(v, "hms") {
		dd, perr := time.ParseDuration(v)
		switch {
		case perr != nil && strings.Trim(v, "0123456789.hms") == "" && strings.ContainsAny(v, "0123456789"):
			// Digits and units only: a duration past Go's 292 years.
			return 0, false, fmt.Errorf("--time %s: want at most %s (a year)", quote.Q(v), FormatSlurmTime(MaxTime))
		case perr != nil:
			return 0, false, bad
		case dd < 0:
			return 0, false, fmt.Errorf("--time %s: must not be negative", quote.Q(v))
		case dd > MaxTime:
			return 0, false, fmt.Errorf("--time %s: want at most %s (a year)", quote.Q(v), FormatSlurmTime(MaxTime))
		}
		return dd, true, nil
	}
	if !validTimespec(v) {
		return 0, false, bad
	}
	if strings.HasPrefix(v, "-") {
		return 0, false, fmt.Errorf("--time %s: must not be negative (-1 alone means no limit)", quote.Q(v))
	}
	num := func(f string) (int64, bool) {
		if f == "" {
			return 0, true
		}
		if len(f) > 9 {
			return 0, false
		}
		n, err := strconv.ParseInt(f, 10, 64)
		return n, err == nil
	}
	var fields []int64
	var days int64
	rest := v
	dashed := false
	if dd, r, ok := strings.Cut(v, "-"); ok {
		n, ok := num(dd)
		if !ok {
			return 0, false, fmt.Errorf("--time %s: want at most %s (a year)", quote.Q(v), FormatSlurmTime(MaxTime))
		}
		days, rest, dashed = n, r, true
	}
	if rest != "" || !dashed {
		for _, f := range strings.Split(rest, ":") {
			n, ok := num(f)
			if !ok {
				return 0, false, fmt.Errorf("--time %s: want at most %s (a year)", quote.Q(v), FormatSlurmTime(MaxTime))
			}
			fields = append(fields, n)
		}
	}
	var secs int64
	canonical = true
	over := func(n, limit int64) {
		if n >= limit {
			canonical = false
		}
	}
	switch {
	case dashed: // days-hours[:minutes[:seconds]]
		units := []int64{3600, 60, 1}
		limits := []int64{24, 60, 60}
		for i, n := range fields {
			secs += n * units[i]
			over(n, limits[i])
		}
		secs += days * 86400
	case len(fields) == 1: // minutes
		secs = fields[0] * 60
	case len(fields) == 2: // minutes:seconds
		secs = fields[0]*60 + fields[1]
		over(fields[1], 60)
	default: // hours:minutes:seconds
		secs = fields[0]*3600 + fields[1]*60 + fields[2]
		over(fields[1], 60)
		over(fields[2], 60)
	}
	d = time.Duration(secs) * time.Second
	if secs > int64(MaxTime/time.Second) {
		return 0, false, fmt.Errorf("--time %s: want at most %s (a year)", quote.Q(v), FormatSlurmTime(MaxTime))
	}
	return d, canonical, nil
}

// validTimespec is Slurm's _is_valid_timespec (src/common/parse_time.c): only digits,
// '-' and ':'; no '-' after a ':'; at most one '-' and two ':'; and at least as many
// runs of digits as the form needs (3 for D-H:M, 4 for D-H:M:S, 2 for M:S, 3 for
// H:M:S).
func validTimespec(s string) bool {
	groups, dash, colon := 0, 0, 0
	inDigits := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if !inDigits {
				groups++
				inDigits = true
			}
		case c == '-':
			inDigits = false
			dash++
			if colon > 0 {
				return false
			}
		case c == ':':
			inDigits = false
			colon++
		default:
			return false
		}
	}
	switch {
	case groups == 0, dash > 1, colon > 2:
		return false
	case dash > 0:
		return !(colon == 1 && groups < 3 || colon == 2 && groups < 4)
	}
	return !(colon == 1 && groups < 2 || colon == 2 && groups < 3)
}

// signals are the signals --signal names, as Slurm takes them (with or without SIG).
var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "URG": syscall.SIGURG, "ALRM": syscall.SIGALRM,
}

// ParseSignal parses --signal SIG[@DUR] (Slurm's --signal=sig_num[@sig_time]): a name
// (USR1, SIGUSR1) or number, and the lead before the time limit in seconds or as a Go
// duration; DefaultSignalBefore when no @ is given.
func ParseSignal(v string) (syscall.Signal, time.Duration, error) {
	bad := fmt.Errorf("--signal %q: want SIG[@DUR], as USR1@120 or SIGUSR1@2m", v)
	name, lead, hasLead := strings.Cut(v, "@")
	var sig syscall.Signal
	if n, err := strconv.Atoi(name); err == nil {
		if n < 1 || n > 64 {
			return 0, 0, bad
		}
		sig = syscall.Signal(n)
	} else {
		s, ok := signalNames[strings.TrimPrefix(strings.ToUpper(name), "SIG")]
		if !ok {
			return 0, 0, bad
		}
		sig = s
	}
	d := DefaultSignalBefore
	if hasLead {
		if n, err := strconv.Atoi(lead); err == nil && n >= 0 {
			d = time.Duration(n) * time.Second
		} else if dd, err := time.ParseDuration(lead); err == nil && dd >= 0 {
			d = dd
		} else {
			return 0, 0, bad
		}
	}
	if d > MaxTime {
		return 0, 0, bad
	}
	return sig, d, nil
}

// signalName is "USR1" for SIGUSR1, else the number.
func signalName(s syscall.Signal) string {
	for n, v := range signalNames {
		if v == s {
			return n
		}
	}
	return strconv.Itoa(int(s))
}

// Names are what --output's patterns stand for (Expand).
type Names struct {
	// ID is the job's id (%j); Name its name (%x); Node the node's (%n); User the
	// submitter (%u).
	ID, Name, Node, User string
	// ArrayJobID and ArrayTaskID are %A and %a: the array's id and the task's index;
	// for a job in no array, its id and "0".
	ArrayJobID, ArrayTaskID string
}

// Expand replaces --output's patterns, as sbatch's: %j the job id, %x the job name, %n
// the node's name, %u the user, %A the array's id, %a the array task's index, %% a
// percent sign. Another %letter is an error naming it.
func Expand(pattern string, n Names) (string, error) {
	syn := patternSyntax{flag: "--output", quote: strconv.Quote, want: "%j, %x, %n, %u, %A, %a or %%"}
	return expandPattern(pattern, syn, func(c byte, _ func(string) string) (string, bool) {
		switch c {
		case 'j':
			return n.ID, true
		case 'x':
			return n.Name, true
		case 'n', 'N':
			return n.Node, true
		case 'u':
			return n.User, true
		case 'A':
			return n.ArrayJobID, true
		case 'a':
			return n.ArrayTaskID, true
		}
		return "", false
	})
}

// patternSyntax is one of the file name pattern syntaxes expandPattern reads: gangrun's
// --output (Expand) and Slurm's (ExpandSlurm), which share %% and the walk and differ
// in their letters (%n is the node's name in gangrun's, its index in Slurm's) and
// widths.
type patternSyntax struct {
	// flag and quote name the option and write the pattern at the start of an error;
	// want lists the letters for an error naming another.
	flag  string
	quote func(string) string
	want  string
	// widths lets a number between % and the letter pad the value with zeros to that
	// width ("%4t" is 0003), as Slurm's does.
	widths bool
}

// maxPatternWidth bounds a pattern's width (Slurm's).
const maxPatternWidth = 10

// expandPattern replaces each %letter of pattern by what value gives it (ok false: no
// such letter, an error), %% by a percent sign. value pads what the width asks for with
// pad. Errors: another %letter, a lone % at the end, a width over maxPatternWidth.
func expandPattern(pattern string, syn patternSyntax, value func(c byte, pad func(string) string) (v string, ok bool)) (string, error) {
	fail := func(msg string) error { return errors.New(syn.flag + " " + syn.quote(pattern) + ": " + msg) }
	width := 0
	pad := func(s string) string {
		if len(s) < width {
			return strings.Repeat("0", width-len(s)) + s
		}
		return s
	}
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		width = 0
		for syn.widths && i < len(pattern) && pattern[i] >= '0' && pattern[i] <= '9' {
			width = width*10 + int(pattern[i]-'0')
			if width > maxPatternWidth {
				return "", fail("a pattern's width is at most 10 digits")
			}
			i++
		}
		if i >= len(pattern) {
			return "", fail("a lone % at the end (write %% for a percent sign)")
		}
		if pattern[i] == '%' {
			b.WriteByte('%')
			continue
		}
		v, ok := value(pattern[i], pad)
		if !ok {
			return "", fail("unknown pattern %" + string(pattern[i]) + " (want " + syn.want + ")")
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// OutputPath is the output file of spec's job on node: --output expanded, relative to
// the submit directory.
func (s Spec) OutputPath(node string) string {
	pat := s.Output
	if pat == "" {
		pat = DefaultOutput
	}
	n := Names{ID: s.ID, Name: s.Name, Node: node, User: s.User, ArrayJobID: s.ID, ArrayTaskID: "0"}
	if s.Array != nil {
		n.ArrayJobID, n.ArrayTaskID = s.Array.JobID, strconv.Itoa(s.Array.TaskID)
	}
	p, err := Expand(pat, n)
	if err != nil {
		p = "gangrun-" + s.ID + ".out"
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.WorkDir, p)
	}
	return p
}

// PerNode reports whether each node writes its own output file (the pattern names the
// node); else the nodes append to one shared file.
func (s Spec) PerNode() bool {
	return strings.Contains(s.Output, "%n") || strings.Contains(s.Output, "%N")
}

// checkID checks a job id given on a command line.
func checkID(id string) error { return store.CheckSegment("job id", id) }
