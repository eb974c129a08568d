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
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/store"
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
)

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
	// TimeLimit is --time; 0: none. At the limit the job gets SIGTERM, --term-timeout
	// to stop, and ends TIMEOUT.
	TimeLimit time.Duration `json:"time_limit,omitempty"`
	// Signal, when set, is sent to the workers SignalBefore ahead of TimeLimit (--signal
	// SIG@DUR, Slurm's --signal), so the trainer can checkpoint.
	Signal       syscall.Signal `json:"signal,omitempty"`
	SignalBefore time.Duration  `json:"signal_before,omitempty"`
	// SpareNodes are granted with the job and run nothing until a node of the job fails
	// (--spare-nodes).
	SpareNodes int `json:"spare_nodes,omitempty"`
	// CheckpointDir and MaxRestarts are as `gangrun run`'s.
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
	MaxRestarts   int    `json:"max_restarts"`
	// TermTimeout is the SIGTERM → SIGKILL grace when the job is stopped.
	TermTimeout time.Duration `json:"term_timeout,omitempty"`
	// Output is --output, a pattern (Expand) relative to WorkDir.
	Output string `json:"output"`
	// Env holds --env KEY=VALUE entries for the workers.
	Env []string `json:"env,omitempty"`
	// Mem is --mem: each node's step is held to this much memory, in bytes, by its
	// cgroup (Slurm's --mem, per node); 0 is no limit.
	Mem int64 `json:"mem,omitempty"`
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
	// Array is the job's place in its job array (--array); nil for a job in none.
	Array *ArrayTask `json:"array,omitempty"`
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
	case len(s.Command) == 0 && s.Script == "":
		return errors.New("no command: give one after --, or a script")
	case s.MinNodes < 1:
		return fmt.Errorf("--nodes %d: must be at least 1", s.MinNodes)
	case s.MaxNodes < s.MinNodes:
		return fmt.Errorf("--nodes %d:%d: want MIN <= MAX", s.MinNodes, s.MaxNodes)
	case s.GPUsPerNode < 1:
		return fmt.Errorf("--gpus-per-node %d: must be at least 1", s.GPUsPerNode)
	case s.SpareNodes < 0:
		return fmt.Errorf("--spare-nodes %d: must not be negative", s.SpareNodes)
	case s.MaxRestarts < 0 || s.MaxRestarts > MaxRestartsLimit:
		return fmt.Errorf("--max-restarts %d: want 0 to %d", s.MaxRestarts, MaxRestartsLimit)
	case s.Mem < 0 || s.Mem > cgroup.MaxMem:
		return fmt.Errorf("--mem %d bytes: want 0 (no limit) to 1P", s.Mem)
	case s.TimeLimit < 0 || s.TimeLimit > MaxTime:
		return fmt.Errorf("--time %s: want at most %s", s.TimeLimit, MaxTime)
	case s.Signal != 0 && s.TimeLimit == 0:
		return fmt.Errorf("--signal %s@%s needs --time (it is sent that long before the time limit)", signalName(s.Signal), s.SignalBefore)
	case s.Signal != 0 && s.SignalBefore >= s.TimeLimit:
		return fmt.Errorf("--signal %s@%s: the lead must be shorter than --time %s", signalName(s.Signal), s.SignalBefore, s.TimeLimit)
	case s.WorkDir == "" || !filepath.IsAbs(s.WorkDir):
		return fmt.Errorf("work directory %q: want an absolute path", s.WorkDir)
	}
	for _, f := range []struct{ flag, v string }{{"--name", s.Name}, {"--account", s.Account}, {"--partition", s.Partition}, {"--output", s.Output}} {
		if strings.IndexFunc(f.v, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) >= 0 {
			return fmt.Errorf("%s %q: only printable text is allowed", f.flag, f.v)
		}
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
	bad := fmt.Errorf("--nodes %q: want N or MIN:MAX, positive numbers", v)
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
	return lo, hi, nil
}

// ParseTime parses --time the ways Slurm's --time does — "minutes", "minutes:seconds",
// "hours:minutes:seconds", "days-hours", "days-hours:minutes",
// "days-hours:minutes:seconds" — and as a Go duration ("90m", "2h30m"). "0" or
// "UNLIMITED" means no limit (0).
func ParseTime(v string) (time.Duration, error) {
	bad := fmt.Errorf("--time %q: want minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] (Slurm's forms) or a duration such as 90m", v)
	if v == "" {
		return 0, bad
	}
	if strings.EqualFold(v, "unlimited") || strings.EqualFold(v, "infinite") {
		return 0, nil
	}
	if d, err := time.ParseDuration(v); err == nil && strings.ContainsAny(v, "hms") {
		if d < 0 || d > MaxTime {
			return 0, fmt.Errorf("--time %q: want at most %s", v, MaxTime)
		}
		return d, nil
	}
	days := 0
	rest := v
	if d, r, ok := strings.Cut(v, "-"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			return 0, bad
		}
		days, rest = n, r
	}
	var parts []int
	for _, p := range strings.Split(rest, ":") {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || len(p) > 9 {
			return 0, bad
		}
		parts = append(parts, n)
	}
	var d time.Duration
	switch {
	case strings.Contains(v, "-"): // days-hours[:minutes[:seconds]]
		if len(parts) > 3 {
			return 0, bad
		}
		units := []time.Duration{time.Hour, time.Minute, time.Second}
		for i, n := range parts {
			d += time.Duration(n) * units[i]
		}
	case len(parts) == 1:
		d = time.Duration(parts[0]) * time.Minute
	case len(parts) == 2:
		d = time.Duration(parts[0])*time.Minute + time.Duration(parts[1])*time.Second
	case len(parts) == 3:
		d = time.Duration(parts[0])*time.Hour + time.Duration(parts[1])*time.Minute + time.Duration(parts[2])*time.Second
	default:
		return 0, bad
	}
	d += time.Duration(days) * 24 * time.Hour
	if d > MaxTime {
		return 0, fmt.Errorf("--time %q: want at most %s", v, MaxTime)
	}
	return d, nil
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
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 >= len(pattern) {
			return "", fmt.Errorf("--output %q: a lone %% at the end (write %%%% for a percent sign)", pattern)
		}
		i++
		switch pattern[i] {
		case 'j':
			b.WriteString(n.ID)
		case 'x':
			b.WriteString(n.Name)
		case 'n', 'N':
			b.WriteString(n.Node)
		case 'u':
			b.WriteString(n.User)
		case 'A':
			b.WriteString(n.ArrayJobID)
		case 'a':
			b.WriteString(n.ArrayTaskID)
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("--output %q: unknown pattern %%%c (want %%j, %%x, %%n, %%u, %%A, %%a or %%%%)", pattern, pattern[i])
		}
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
