package slurm

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/job"
)

// srunOwn says whether srun's --output or --error value p names no file, as Slurm's
// srun reads it (src/srun/libsrun/fname.c): a value beginning "all" (any case) or "-"
// is srun's own stdout or stderr; "none" (any case) discards the output.
func srunOwn(p string) (own, none bool) {
	switch {
	case len(p) >= 3 && strings.EqualFold(p[:3], "all"), strings.HasPrefix(p, "-"):
		return true, false
	case strings.EqualFold(p, "none"):
		return false, true
	}
	return false, false
}

// stepFiles are an srun step's -o/--output and -e/--error files: each task's stdout
// and stderr file, by path, each path opened once (tasks whose pattern gives the same
// path share it, as Slurm's tasks without %t in their pattern share one file).
type stepFiles struct {
	out, err map[int]io.Writer // by task rank; absent: srun's own stdout or stderr
	opened   map[string]*os.File
}

// checkStepPatterns checks srun's --open-mode (append or truncate, or a prefix of
// either, as sbatch's) and its --output and --error patterns (job.ExpandSlurm's
// syntax) before the step is made: a bad %-letter is refused as sbatch refuses it
// (255). A value that is all digits is Slurm's "only this task's output on srun's"
// form, refused as not built.
func checkStepPatterns(v values) error {
	if m := strings.ToLower(v["open-mode"]); v.has("open-mode") && (m == "" || !strings.HasPrefix("append", m) && !strings.HasPrefix("truncate", m)) {
		return &UsageError{Msg: "error: Invalid --open-mode specification", Code: 255}
	}
	for _, name := range []string{"output", "error"} {
		p, ok := v[name]
		if !ok {
			continue
		}
		if _, err := strconv.Atoi(p); err == nil {
			return &UsageError{Msg: fmt.Sprintf("error: --%s=%s: one task's output alone on srun's is %s", name, p, notBuilt), Code: 255}
		}
		if own, none := srunOwn(p); own || none {
			continue
		}
		if p == "" {
			return &UsageError{Msg: fmt.Sprintf("error: --%s: an empty file name", name), Code: 255}
		}
		if _, err := job.ExpandSlurm("--"+name, p, job.SlurmNames{}); err != nil {
			return &UsageError{Msg: "error: " + err.Error(), Code: 255}
		}
	}
	return nil
}

// openStepFiles opens the files of srun's --output and --error (v) for step req of
// job j, relative to the step's working directory, as Slurm's slurmstepd opens them
// when the tasks start: --error defaults to --output's file; append when srun's
// --open-mode, else the job's SLURM_OPEN_MODE (sbatch's --open-mode: "a"), says so,
// else truncate.
// Unlike Slurm's, the files are written by srun, on the host it runs on (the batch
// host): the same files where the nodes share the file system, as Slurm's users
// expect. It returns nil when neither option was given.
func openStepFiles(j *job.Job, req job.StepRequest, v values, getenv func(string) string) (*stepFiles, error) {
	outPat, hasOut := v["output"]
	errPat, hasErr := v["error"]
	if !hasOut && !hasErr {
		return nil, nil
	}
	openMode := getenv("SLURM_OPEN_MODE")
	if v.has("open-mode") {
		openMode = v["open-mode"]
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if m := strings.ToLower(openMode); m != "" && strings.HasPrefix("append", m) {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f := &stepFiles{out: map[int]io.Writer{}, err: map[int]io.Writer{}, opened: map[string]*os.File{}}
	open := func(flag, pattern string, n job.SlurmNames) (io.Writer, error) {
		switch own, none := srunOwn(pattern); {
		case own:
			return nil, nil
		case none:
			return io.Discard, nil
		}
		p, err := job.ExpandSlurm(flag, pattern, n)
		if err != nil {
			return nil, err
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(req.WorkDir, p)
		}
		if o := f.opened[p]; o != nil {
			return o, nil
		}
		o, err := os.OpenFile(p, flags, 0o644)
		if err != nil {
			return nil, fmt.Errorf("Could not open %s file %s: %v", strings.TrimPrefix(flag, "--"), p, err.(*os.PathError).Err)
		}
		f.opened[p] = o
		return o, nil
	}
	for i, node := range req.Nodes {
		for t := req.FirstTask(i); t < req.FirstTask(i)+req.Tasks[i]; t++ {
			n := stepNames(j, node, i, t, req.Step)
			var out, errOut io.Writer
			var err error
			if hasOut {
				out, err = open("--output", outPat, n)
			}
			switch {
			case err != nil:
			case hasErr:
				errOut, err = open("--error", errPat, n)
			default:
				errOut = out // stderr goes where stdout goes, as Slurm's
			}
			if err != nil {
				f.close()
				return nil, err
			}
			if out != nil {
				f.out[t] = out
			}
			if errOut != nil {
				f.err[t] = errOut
			}
		}
	}
	return f, nil
}

// stepNames are the names of task t of step on node (the step's i-th) for Slurm's
// filename patterns: the batch step's names (an array task's %A and %a) with the
// step's number, the node's index and the task's rank.
func stepNames(j *job.Job, node string, i, t, step int) job.SlurmNames {
	n := job.SlurmNames{JobID: j.Spec.ID, Name: j.Spec.Name, User: j.Spec.User, ArrayJobID: j.Spec.ID,
		ArrayTaskID: "4294967294", Node: node, NodeID: i, TaskID: t, StepID: strconv.Itoa(step)}
	if a := j.Spec.Array; a != nil {
		n.ArrayJobID, n.ArrayTaskID = a.JobID, strconv.Itoa(a.TaskID)
	}
	return n
}

// writer is where task's fd (1 or 2) goes: its file, else srun's stdout or stderr.
func (r *srunRun) writer(task, fd int) io.Writer {
	if r.files != nil {
		m := r.files.out
		if fd == 2 {
			m = r.files.err
		}
		if w, ok := m[task]; ok {
			return w
		}
	}
	if fd == 2 {
		return r.e.Stderr
	}
	return r.e.Stdout
}

// close closes every file opened.
func (f *stepFiles) close() {
	if f == nil {
		return
	}
	for _, o := range f.opened {
		o.Close()
	}
}
