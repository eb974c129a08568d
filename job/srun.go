package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// A batch job's srun steps (Slurm's job steps: ID.0, ID.1, ...). `srun` inside the
// job (or under salloc) writes a StepRequest, sealed with its user's MUNGE credential,
// under gangrun/batch/jobs/<id>/srun/<n>, and listens for the nodes on a TCP port of
// its host (Slurm's srun listens the same way: SLURM_SRUN_COMM_HOST/PORT). The job's
// step on each node the request names (root, as slurmstepd) checks the credential
// against the job's attested user, starts its tasks as that user in the job's cgroup,
// connects back to srun proving it is the node's gangrun (a credential of root's,
// bound to the step and readable by the job's user only), and streams the tasks'
// output and exit codes as Frames; srun writes them to its own stdout and stderr (the
// job's output file, in a batch job) and ends with the highest exit code. srun records
// the step's end under .../srun/<n>/state; a node that loses srun (killed) stops its
// tasks and records the step CANCELLED.

// srunPrefix holds job id's srun steps.
func srunPrefix(id string) string { return jobsPrefix + id + "/srun/" }

// srunKey is step n's request; srunStateKey its end.
func srunKey(id string, n int) string      { return srunPrefix(id) + strconv.Itoa(n) }
func srunStateKey(id string, n int) string { return srunKey(id, n) + "/state" }

// MaxSrunSteps bounds a job's srun steps (Slurm's MaxStepCount is 40000 by default).
const MaxSrunSteps = 40000

// StepRequest is one srun step of a job.
type StepRequest struct {
	// Job is the job's id; Step the step's number (ID.Step).
	Job  string `json:"job"`
	Step int    `json:"step"`
	// Name is the step's name (srun --job-name, else the command's base name).
	Name string `json:"name"`
	// UID is the uid srun ran as (checked against its credential).
	UID uint32 `json:"uid"`
	// Nodes are the step's nodes in Slurm's order; Tasks the tasks on each, in the
	// same order (block distribution: task ranks run in node order).
	Nodes []string `json:"nodes"`
	Tasks []int    `json:"tasks"`
	// Label is srun -l (SLURM_LABELIO in the tasks' environment).
	Label bool `json:"label,omitempty"`
	// Pty, when set, is srun --pty: the step's one task runs on a pseudo-terminal of
	// its node, of this size at first (ptystep.go).
	Pty *Winsize `json:"pty,omitempty"`
	// GPUsPerTask gives each task its own GPUs of its node's (0: every task sees the
	// node's GPUs of the job).
	GPUsPerTask int `json:"gpus_per_task,omitempty"`
	// Command is what every task runs; Env its environment before the per-task
	// variables (srun's own by --export's rules); WorkDir where it runs.
	Command []string `json:"command"`
	Env     []string `json:"env"`
	WorkDir string   `json:"work_dir"`
	// Addr is srun's listener, HOST:PORT, that the nodes connect to; Host the host
	// srun runs on.
	Addr string `json:"addr"`
	Host string `json:"host"`
	// Secret is what a node proves itself with where the cluster checks no MUNGE
	// credentials (--auth none): as good as the store's own protection.
	Secret string `json:"secret,omitempty"`
	// Created is when srun wrote it.
	Created time.Time `json:"created"`
}

// NTasks is the step's task count.
func (r StepRequest) NTasks() int {
	n := 0
	for _, t := range r.Tasks {
		n += t
	}
	return n
}

// FirstTask is the rank of the first task on node i of the step.
func (r StepRequest) FirstTask(i int) int {
	n := 0
	for _, t := range r.Tasks[:i] {
		n += t
	}
	return n
}

// storedStep is a request as written: the request and srun's credential bound to it.
type storedStep struct {
	Request    StepRequest `json:"request"`
	Credential string      `json:"credential,omitempty"`
}

// srunContent is what srun's credential is bound to.
func srunContent(r StepRequest) []byte {
	b, _ := json.Marshal(r)
	return append([]byte("gangrun srun "+r.Job+"."+strconv.Itoa(r.Step)+"\n"), b...)
}

// HelloContent is what a node's credential on its connection to srun is bound to: the
// step, the node, and srun's listener.
func HelloContent(job string, step int, node, addr string) []byte {
	return []byte(fmt.Sprintf("gangrun srun node %s.%d %s %s", job, step, node, addr))
}

// SrunState is an srun step's end, as srun (or a node that lost srun) records it.
type SrunState struct {
	// State is COMPLETED, FAILED or CANCELLED (Slurm's step states).
	State Status `json:"state"`
	// ExitCode is the step's: the highest of its tasks' exit codes, or 128+N for a
	// signal N; Signal is that signal (0 for none), for scontrol's and sacct's
	// EXIT:SIGNAL.
	ExitCode int `json:"exit_code"`
	Signal   int `json:"signal,omitempty"`
	// Ended is when it ended; Reason says why, when it did not complete.
	Ended  time.Time `json:"ended"`
	Reason string    `json:"reason,omitempty"`
}

// SrunStep is a job's srun step as read: the request, and its end once recorded.
type SrunStep struct {
	Request StepRequest
	// End is nil while the step runs.
	End *SrunState
	// credential is srun's, bound to Request (storedStep.Credential).
	credential string
}

// ID is the step's id as Slurm writes it: JOB.STEP.
func (s SrunStep) ID() string { return s.Request.Job + "." + strconv.Itoa(s.Request.Step) }

// CreateSrunStep writes a new srun step of job id with the next free number and returns
// it: sealer (nil where the cluster checks no credentials) seals it with the caller's
// credential. Errors: the job does not exist or does not run (ErrNotFound, or an error
// saying its state), the step limit, the store's.
func CreateSrunStep(ctx context.Context, s store.Store, sealer Sealer, r StepRequest) (StepRequest, error) {
	for tries := 0; ; tries++ {
		entries, _, err := s.List(ctx, srunPrefix(r.Job))
		if err != nil {
			return r, err
		}
		next := 0
		for _, e := range entries {
			rest := strings.TrimPrefix(e.Key, srunPrefix(r.Job))
			if n, err := strconv.Atoi(rest); err == nil && n >= next {
				next = n + 1
			}
		}
		if next >= MaxSrunSteps {
			return r, fmt.Errorf("job %s has %d steps already (the most a job may have)", r.Job, MaxSrunSteps)
		}
		r.Step = next
		r.Created = time.Now().UTC()
		st := storedStep{Request: r}
		if sealer != nil {
			if st.Credential, err = sealer.Seal(ctx, srunContent(r)); err != nil {
				return r, fmt.Errorf("srun's MUNGE credential: %w", err)
			}
		}
		b, _ := json.Marshal(st)
		j, err := Read(ctx, s, r.Job)
		if err != nil {
			return r, err
		}
		if j.State.Status != Running {
			return r, fmt.Errorf("job %s is %s, not running", r.Job, j.State.Status)
		}
		_, err = s.Txn(ctx, []store.Op{
			{Verb: store.CheckIndex, Key: stateKey(r.Job), Index: j.Index},
			{Verb: store.CheckNotExists, Key: srunKey(r.Job, next)},
			{Verb: store.Set, Key: srunKey(r.Job, next), Value: b},
		})
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, store.ErrStaleIndex) && !errors.Is(err, store.ErrKeyExists) || tries > 50 {
			return r, err
		}
	}
}

// EndSrunStep records srun step n of job id's end, unless one is recorded already (the
// first to say wins). An end other than COMPLETED, FAILED or CANCELLED is an error
// wrapping ErrTransition (lifecycle.go).
func EndSrunStep(ctx context.Context, s store.Store, id string, n int, st SrunState) error {
	if err := checkStepEnd(st.State); err != nil {
		return err
	}
	b, _ := json.Marshal(st)
	_, err := s.Txn(ctx, []store.Op{
		{Verb: store.CheckNotExists, Key: srunStateKey(id, n)},
		{Verb: store.Set, Key: srunStateKey(id, n), Value: b},
	})
	if errors.Is(err, store.ErrKeyExists) {
		return nil
	}
	return err
}

// EndOpenSrunSteps records, for each srun step of job id that has no end, the end its
// job's end gave it: CANCELLED at time at, killed with the job (signal 9) before srun
// could say, as slurmctld ends a job's steps with the job. A step whose srun said keeps
// its end (EndSrunStep: the first to say wins).
func EndOpenSrunSteps(ctx context.Context, s store.Store, id string, at time.Time) error {
	steps, err := SrunSteps(ctx, s, id)
	if err != nil {
		return err
	}
	for _, st := range steps {
		if st.End != nil {
			continue
		}
		end := SrunState{State: Cancelled, ExitCode: 128 + 9, Signal: 9, Ended: at, Reason: "ended with its job"}
		if err := EndSrunStep(ctx, s, id, st.Request.Step, end); err != nil {
			return err
		}
	}
	return nil
}

// SrunSteps returns job id's srun steps, by number.
func SrunSteps(ctx context.Context, s store.Store, id string) ([]SrunStep, error) {
	entries, _, err := s.List(ctx, srunPrefix(id))
	if err != nil {
		return nil, err
	}
	return stepsOf(id, entries), nil
}

// stepsOf reads the steps of job id from its srun keys.
func stepsOf(id string, entries []store.Entry) []SrunStep {
	byN := map[int]*SrunStep{}
	for _, e := range entries {
		rest := strings.TrimPrefix(e.Key, srunPrefix(id))
		num, isState := strings.CutSuffix(rest, "/state")
		n, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		st := byN[n]
		if st == nil {
			st = &SrunStep{}
			byN[n] = st
		}
		if isState {
			var end SrunState
			if json.Unmarshal(e.Value, &end) == nil {
				st.End = &end
			}
			continue
		}
		var ss storedStep
		if json.Unmarshal(e.Value, &ss) == nil {
			st.Request, st.credential = ss.Request, ss.Credential
		}
	}
	var out []SrunStep
	for _, n := range slices.Sorted(maps.Keys(byN)) {
		if byN[n].Request.Job != "" {
			out = append(out, *byN[n])
		}
	}
	sort.SliceStable(out, func(i, k int) bool { return out[i].Request.Step < out[k].Request.Step })
	return out
}

// Frame is one message on a node's connection to srun, as one JSON line. From the
// node: Hello first, then Out (a task's output, whole lines; a --pty task's, as it
// comes), Exit (a task's end) and Error (the node cannot run the step: a refused
// credential, a missing command), Done last. From srun: Signal (to deliver to the
// node's tasks), and for a --pty step In and Winsize.
type Frame struct {
	Hello *Hello `json:"hello,omitempty"`
	// Task is the task's rank for Out and Exit; FD is 1 (stdout) or 2 (stderr).
	Task int    `json:"task,omitempty"`
	FD   int    `json:"fd,omitempty"`
	Out  []byte `json:"out,omitempty"`
	// Exit, when set, is the task's end.
	Exit *TaskExit `json:"exit,omitempty"`
	// Error is the node's refusal or failure to start the step.
	Error string `json:"error,omitempty"`
	// Done says the node's tasks have all ended.
	Done bool `json:"done,omitempty"`
	// Signal is a signal number for the node's tasks (from srun).
	Signal int `json:"signal,omitempty"`
	// In is what srun's user typed, for the task's terminal; Winsize srun's terminal's
	// new size (from srun, --pty steps only: ptystep.go).
	In      []byte   `json:"in,omitempty"`
	Winsize *Winsize `json:"winsize,omitempty"`
}

// Hello is a node's first frame: its name and its proof (a MUNGE credential of the
// node's root bound to HelloContent, or the request's Secret).
type Hello struct {
	Node       string `json:"node"`
	Credential string `json:"credential,omitempty"`
	Secret     string `json:"secret,omitempty"`
}

// TaskExit is how a task ended: its exit code, or the signal that killed it.
type TaskExit struct {
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	// OOM counts the kills of the node's job cgroup's OOM killer while the task ran
	// (a SIGKILLed task's only): srun's "Out Of Memory", the step's OUT_OF_MEMORY.
	OOM uint64 `json:"oom,omitempty"`
}
