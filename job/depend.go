package job

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// DependencyType is a kind of --dependency, as sbatch names them.
type DependencyType string

// The dependency types (sbatch --dependency). A job's dependencies all must hold
// (comma-separated, sbatch's "," form) before its request is written: until then it
// waits PENDING with reason reason.Dependency, or reason.DependencyNeverSatisfied once
// one of them can never hold.
const (
	// After holds once each named job has started, or ended (a job cancelled while
	// pending never starts).
	After DependencyType = "after"
	// AfterAny holds once each named job has ended, however it ended.
	AfterAny DependencyType = "afterany"
	// AfterOK holds once each named job has ended COMPLETED (exit code 0); it can never
	// hold once one ended otherwise.
	AfterOK DependencyType = "afterok"
	// AfterNotOK holds once each named job has ended other than COMPLETED (FAILED,
	// CANCELLED, TIMEOUT, NODE_FAIL); it can never hold once one ended COMPLETED.
	AfterNotOK DependencyType = "afternotok"
	// Singleton holds while no other job of the same name and user, submitted before
	// this one or already let through, is yet to end: one such job runs at a time.
	Singleton DependencyType = "singleton"
	// AfterCorr, for an array task, holds once the task of the same index of each named
	// array has ended COMPLETED; it can never hold once that task ended otherwise. An
	// array with no such task is nothing to wait for; a job that is no array task waits
	// for every task, as afterok.
	AfterCorr DependencyType = "aftercorr"
)

// Dependency is one term of --dependency: a type and, except for Singleton, the jobs
// it names. A job id names that job; the id of an array (A, not A_i) names every task
// of the array.
type Dependency struct {
	// Type is the term's kind; IDs the jobs it names (none for Singleton).
	Type DependencyType `json:"type"`
	IDs  []string       `json:"ids,omitempty"`
	// Delays are, for After, the minutes after each named job's start it holds
	// ("after:ID+MIN"), one per ID; nil for none.
	Delays []int `json:"delays,omitempty"`
	// Any says the terms are joined with '?' (any of them holds the job's
	// dependencies; sbatch's "?"), not ',': set on every term of such a list.
	Any bool `json:"any,omitempty"`
}

// String is the term as sbatch takes it: "afterok:3:4", "after:3+10", "singleton".
func (d Dependency) String() string {
	parts := []string{string(d.Type)}
	for i, id := range d.IDs {
		if i < len(d.Delays) && d.Delays[i] > 0 {
			id += "+" + strconv.Itoa(d.Delays[i])
		}
		parts = append(parts, id)
	}
	return strings.Join(parts, ":")
}

// FormatDependencies is deps as --dependency takes them: "afterok:3,singleton", or
// "afterok:3?afternotok:4" for any of them.
func FormatDependencies(deps []Dependency) string {
	parts := make([]string, len(deps))
	sep := ","
	for i, d := range deps {
		parts[i] = d.String()
		if d.Any {
			sep = "?"
		}
	}
	return strings.Join(parts, sep)
}

// ParseDependency parses --dependency: terms joined by ',' (all must hold) or by '?'
// (any one holds; not both, as sbatch), each "TYPE:ID[:ID...]" (TYPE after, afterany,
// afterok, afternotok or aftercorr; ID a job id, an array's id or an array task's A_i;
// after's ID may be "ID+MIN", minutes after its start) or "singleton". "" is none.
// Errors name the value and the term at fault.
func ParseDependency(v string) ([]Dependency, error) {
	if v == "" {
		return nil, nil
	}
	sep, anyOf := ",", strings.Contains(v, "?")
	if anyOf {
		if strings.Contains(v, ",") {
			return nil, fmt.Errorf("--dependency %q: join terms with ',' (all of) or '?' (any of), not both", v)
		}
		sep = "?"
	}
	var out []Dependency
	for _, term := range strings.Split(v, sep) {
		d, err := parseTerm(v, term)
		if err != nil {
			return nil, err
		}
		d.Any = anyOf
		out = append(out, d)
	}
	return out, nil
}

// parseTerm parses one term of --dependency v.
func parseTerm(v, term string) (Dependency, error) {
	parts := strings.Split(term, ":")
	d := Dependency{Type: DependencyType(strings.ToLower(parts[0]))}
	switch d.Type {
	case Singleton:
		if len(parts) > 1 {
			return d, fmt.Errorf("--dependency %q: singleton takes no job ids", v)
		}
	case After, AfterAny, AfterOK, AfterNotOK, AfterCorr:
		if len(parts) < 2 {
			return d, fmt.Errorf("--dependency %q: %s needs a job id (%s:ID[:ID...])", v, d.Type, d.Type)
		}
		for _, id := range parts[1:] {
			id, delay, timed := strings.Cut(id, "+")
			minutes, err := strconv.Atoi(delay)
			switch {
			case timed && d.Type != After:
				return d, fmt.Errorf("--dependency %q: +time is after's only (after:ID+MINUTES)", v)
			case timed && (err != nil || minutes < 0 || minutes > int(MaxTime/time.Minute)):
				return d, fmt.Errorf("--dependency %q: %q is no count of minutes (after:ID+MINUTES)", v, delay)
			case !validJobRef(id):
				return d, fmt.Errorf("--dependency %q: %q is no job id (want N, or N_I for an array task)", v, id)
			}
			d.IDs = append(d.IDs, id)
			if timed {
				d.Delays = append(d.Delays, make([]int, len(d.IDs)-1-len(d.Delays))...)
				d.Delays = append(d.Delays, minutes)
			}
		}
	default:
		return d, fmt.Errorf("--dependency %q: unknown type %q (want after, afterany, afterok, afternotok, aftercorr or singleton)", v, parts[0])
	}
	return d, nil
}

// validJobRef reports whether id is a job id as submit gives them: a decimal number,
// or an array task's N_I.
func validJobRef(id string) bool {
	a, t, isTask := strings.Cut(id, "_")
	return digits(a) && (!isTask || digits(t))
}

func digits(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// depIndex finds the jobs a dependency names among a pass's jobs, and counts each
// array's tasks let through (their request written, not yet ended) against its cap.
type depIndex struct {
	byID    map[string]*Job
	byArray map[string][]*Job
	byOwner map[string][]*Job // user NUL name → jobs
	// active counts each array's tasks let through and not ended; the pass adds the
	// ones it lets through.
	active map[string]int
}

func newDepIndex(jobs []Job) *depIndex {
	x := &depIndex{byID: map[string]*Job{}, byArray: map[string][]*Job{}, byOwner: map[string][]*Job{}, active: map[string]int{}}
	for i := range jobs {
		j := &jobs[i]
		x.byID[j.Spec.ID] = j
		if a := j.Spec.Array; a != nil {
			x.byArray[a.JobID] = append(x.byArray[a.JobID], j)
			if !j.State.Status.Final() && !j.State.Deferred {
				x.active[a.JobID]++
			}
		}
		k := j.Spec.User + "\x00" + j.Spec.Name
		x.byOwner[k] = append(x.byOwner[k], j)
	}
	return x
}

// targets are the jobs id names: the job, else every task of the array id.
func (x *depIndex) targets(id string) []*Job {
	if j, ok := x.byID[id]; ok {
		return []*Job{j}
	}
	return x.byArray[id]
}

// check reports whether j's dependencies hold (met), or whether they never can: all
// of them (',') or any one of them ('?', Dependency.Any), at now.
func (x *depIndex) check(j *Job, now time.Time) (met, never bool) {
	deps := j.Spec.Dependency
	if len(deps) == 0 {
		return true, false
	}
	if deps[0].Any {
		never = true
		for _, d := range deps {
			ok, no := x.term(j, d, now)
			if ok {
				return true, false
			}
			never = never && no
		}
		return false, never
	}
	met = true
	for _, d := range deps {
		ok, no := x.term(j, d, now)
		met, never = met && ok, never || no
	}
	return met && !never, never
}

// term reports whether dependency d of job j holds at now, or never can.
func (x *depIndex) term(j *Job, d Dependency, now time.Time) (met, never bool) {
	if d.Type == Singleton {
		return x.singletonFree(j), false
	}
	met = true
	for i, id := range d.IDs {
		ts := x.targets(id)
		if d.Type == AfterCorr && j.Spec.Array != nil && !strings.Contains(id, "_") {
			ts = x.targets(TaskID(id, j.Spec.Array.TaskID)) // the corresponding task; none: nothing to wait for
			if len(ts) == 0 && len(x.byArray[id]) > 0 {
				continue
			}
		}
		if len(ts) == 0 {
			met = false // not seen yet (submit refuses an unknown id)
		}
		for _, t := range ts {
			ok, no := holds(d.Type, t.State)
			if ok && i < len(d.Delays) && d.Delays[i] > 0 && !t.State.Started.IsZero() {
				ok = !now.Before(t.State.Started.Add(time.Duration(d.Delays[i]) * time.Minute))
			}
			met, never = met && ok, never || no
		}
	}
	return met, never
}

// holds reports whether dependency type typ on a job in state st holds, or never can.
func holds(typ DependencyType, st State) (ok, never bool) {
	final := st.Status.Final()
	switch typ {
	case After:
		return final || !st.Started.IsZero(), false
	case AfterAny:
		return final, false
	case AfterOK, AfterCorr:
		return st.Status == Completed, final && st.Status != Completed
	case AfterNotOK:
		return final && st.Status != Completed, st.Status == Completed
	}
	return false, false
}

// singletonFree reports whether no other job of j's name and user that was submitted
// before j, or was let through already, is yet to end.
func (x *depIndex) singletonFree(j *Job) bool {
	for _, o := range x.byOwner[j.Spec.User+"\x00"+j.Spec.Name] {
		if o.Spec.ID == j.Spec.ID || o.State.Status.Final() {
			continue
		}
		if !o.State.Deferred || jobLess(o.Spec.ID, j.Spec.ID) {
			return false
		}
	}
	return true
}

// ErrCircular: a dependency that waits, through other jobs' dependencies, on the job
// it is given to (ESLURM_CIRCULAR_DEPENDENCY, slurmctld's "Circular job dependency").
var ErrCircular = errors.New("Circular job dependency")

// refersTo reports whether dependency reference ref (a job, an array task, or an
// array's tasks) names job id.
func refersTo(ref, id string) bool { return ref == id || strings.HasPrefix(id, ref+"_") }

// checkCycle refuses deps as job id's new dependencies when one names id itself
// (ErrDependency, as slurmctld refuses a job depending on itself) or a job that waits,
// through its own dependencies (pending jobs', followed to any depth), on id
// (ErrCircular): either would wait forever. A new job cannot: its id is not known yet.
func checkCycle(ctx context.Context, s store.Store, id string, deps []Dependency) error {
	var refs []string
	for _, d := range deps {
		for _, ref := range d.IDs {
			if refersTo(ref, id) {
				return fmt.Errorf("%w: %s: job %s would depend on itself", ErrDependency, d, id)
			}
			refs = append(refs, ref)
		}
	}
	if len(refs) == 0 {
		return nil
	}
	jobs, err := List(ctx, s)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for len(refs) > 0 {
		ref := refs[0]
		refs = refs[1:]
		if seen[ref] {
			continue
		}
		seen[ref] = true
		for i := range jobs {
			j := &jobs[i]
			if !refersTo(ref, j.Spec.ID) || j.State.Status.Final() {
				continue
			}
			for _, d := range j.Spec.Dependency {
				for _, next := range d.IDs {
					if refersTo(next, id) {
						return fmt.Errorf("%w: job %s waits on job %s (%s)", ErrCircular, j.Spec.ID, id, d)
					}
					refs = append(refs, next)
				}
			}
		}
	}
	return nil
}
