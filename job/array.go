package job

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxArraySize bounds --array: indices run from 0 to MaxArraySize-1 (Slurm's
// MaxArraySize, whose default is 1001; gangrun's is fixed), so an array has at most
// MaxArraySize tasks.
const MaxArraySize = 10000

// maxArrayBytes bounds the specs an array writes in all (each task keeps a copy of its
// spec, script included): 64 MiB.
const maxArrayBytes = 64 << 20

// Array is a parsed --array: the task indices, ascending, and the cap on the tasks let
// through at once (0: none).
type Array struct {
	// Indices are the tasks' indices, ascending, each once.
	Indices []int
	// Limit is the %N cap; 0: none.
	Limit int
	// Step is the step of a single range ("0-15:2" → 2), else 1: SLURM_ARRAY_TASK_STEP.
	Step int
}

// ParseArray parses --array as sbatch does: comma-separated indices and ranges
// "N-M", a range with a step "N-M:S", then an optional "%L" capping the tasks that
// may run at once: "0-15%4", "1,3,5-7", "0-15:2". Indices repeated are taken once.
// Errors name the value.
func ParseArray(v string) (Array, error) {
	bad := func(why string) (Array, error) {
		return Array{}, fmt.Errorf("--array %q: %s", v, why)
	}
	spec, limit, capped := strings.Cut(v, "%")
	a := Array{Step: 1}
	if capped {
		n, err := strconv.Atoi(limit)
		if err != nil && errors.Is(err, strconv.ErrRange) {
			return bad(fmt.Sprintf("the %%N cap %s is too large (at most the array's size)", limit))
		}
		if err != nil || n < 1 {
			return bad("the %N cap must be a number of at least 1")
		}
		a.Limit = n
	}
	if spec == "" {
		return bad("no indices (want e.g. 0-15%4, 1,3,5-7 or 0-15:2)")
	}
	seen := map[int]bool{}
	terms := strings.Split(spec, ",")
	for _, term := range terms {
		rng, stepText, stepped := strings.Cut(term, ":")
		if strings.HasPrefix(rng, "-") {
			return bad(fmt.Sprintf("index %s is negative (indices are 0 to %d)", rng, MaxArraySize-1))
		}
		loText, hiText, ranged := strings.Cut(rng, "-")
		lo, err := arrayIndex(loText)
		if err != nil {
			return bad(err.Error())
		}
		hi, step := lo, 1
		if ranged {
			if hi, err = arrayIndex(hiText); err != nil {
				return bad(err.Error())
			}
			if hi < lo {
				return bad(fmt.Sprintf("range %s ends before it starts", rng))
			}
		}
		if stepped {
			if !ranged {
				return bad(fmt.Sprintf("a step (%s) needs a range N-M:S", term))
			}
			if step, err = strconv.Atoi(stepText); err != nil || step < 1 {
				return bad(fmt.Sprintf("step %q must be a number of at least 1", stepText))
			}
		}
		if len(terms) == 1 {
			a.Step = step
		}
		for i := lo; i <= hi; i += step {
			if !seen[i] {
				seen[i] = true
				a.Indices = append(a.Indices, i)
			}
		}
	}
	slices.Sort(a.Indices)
	return a, nil
}

// Validate checks an Array that did not come from ParseArray (a request written into a
// box): indices from 0 to MaxArraySize-1, ascending, each once; a cap and a step of at
// least 0 and 1. Errors say which rule fails.
func (a Array) Validate() error {
	switch {
	case len(a.Indices) == 0:
		return errors.New("--array: no indices")
	case len(a.Indices) > MaxArraySize:
		return fmt.Errorf("--array: %d tasks: at most %d", len(a.Indices), MaxArraySize)
	case a.Limit < 0 || a.Step < 0:
		return fmt.Errorf("--array: a cap (%d) and a step (%d) must not be negative", a.Limit, a.Step)
	}
	for i, x := range a.Indices {
		if x < 0 || x >= MaxArraySize {
			return fmt.Errorf("--array: index %d: want 0 to %d", x, MaxArraySize-1)
		}
		if i > 0 && x <= a.Indices[i-1] {
			return fmt.Errorf("--array: indices must ascend, each once (%d after %d)", x, a.Indices[i-1])
		}
	}
	return nil
}

// arrayIndex parses one index of --array: 0 to MaxArraySize-1.
func arrayIndex(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || !digits(s) {
		return 0, fmt.Errorf("%q is no index (want numbers 0 to %d)", s, MaxArraySize-1)
	}
	if n >= MaxArraySize {
		return 0, fmt.Errorf("index %d is over the largest, %d (MaxArraySize %d)", n, MaxArraySize-1, MaxArraySize)
	}
	return n, nil
}

// String is the array as --array takes it, ranges compressed: "0-3%2".
func (a Array) String() string {
	var parts []string
	for i := 0; i < len(a.Indices); {
		j := i
		for j+1 < len(a.Indices) && a.Indices[j+1] == a.Indices[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", a.Indices[i], a.Indices[j]))
		} else {
			parts = append(parts, strconv.Itoa(a.Indices[i]))
		}
		i = j + 1
	}
	s := strings.Join(parts, ",")
	if a.Limit > 0 {
		s += "%" + strconv.Itoa(a.Limit)
	}
	return s
}

// ArrayTask is a job's place in its job array: the array's id A (the task's own id is
// A_TaskID), its index, and the array's shape, as its workers see them.
type ArrayTask struct {
	// JobID is the array's id A; TaskID the task's index i.
	JobID  string `json:"job_id"`
	TaskID int    `json:"task_id"`
	// Count, Min and Max are the array's number of tasks and its lowest and highest
	// index; Step is Array.Step.
	Count int `json:"count"`
	Min   int `json:"min"`
	Max   int `json:"max"`
	Step  int `json:"step"`
	// Limit is the array's %N cap: at most that many of its tasks are let through
	// (their requests written, not yet ended) at once; 0: none.
	Limit int `json:"limit,omitempty"`
}

// TaskID is the id of array a's task with index i: "A_i", as Slurm shows it.
func TaskID(arrayID string, i int) string { return arrayID + "_" + strconv.Itoa(i) }

// Environ is the task's variables for its workers: GANGRUN_ARRAY_JOB_ID,
// GANGRUN_ARRAY_TASK_ID, GANGRUN_ARRAY_TASK_COUNT, _MIN, _MAX, _STEP, and the same
// with SLURM_ARRAY_ for scripts written for Slurm.
func (a *ArrayTask) Environ() []string {
	var out []string
	for _, prefix := range []string{"GANGRUN_ARRAY_", "SLURM_ARRAY_"} {
		out = append(out,
			prefix+"JOB_ID="+a.JobID,
			prefix+"TASK_ID="+strconv.Itoa(a.TaskID),
			prefix+"TASK_COUNT="+strconv.Itoa(a.Count),
			prefix+"TASK_MIN="+strconv.Itoa(a.Min),
			prefix+"TASK_MAX="+strconv.Itoa(a.Max),
			prefix+"TASK_STEP="+strconv.Itoa(a.Step))
	}
	return out
}

// splitID splits a job id into its number and, for an array task "A_i", its index
// (-1 for a plain job); ids of another form sort after as text.
func splitID(id string) (n uint64, task int, ok bool) {
	a, t, isTask := strings.Cut(id, "_")
	n, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	task = -1
	if isTask {
		if task, err = strconv.Atoi(t); err != nil {
			return 0, 0, false
		}
	}
	return n, task, true
}

// jobLess orders job ids by submission: by number, an array's tasks by index.
func jobLess(a, b string) bool {
	na, ta, oka := splitID(a)
	nb, tb, okb := splitID(b)
	switch {
	case oka != okb:
		return oka
	case !oka:
		return a < b
	case na != nb:
		return na < nb
	}
	return ta < tb
}
