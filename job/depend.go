package job

import (
	"fmt"
	"strings"
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
)

// Dependency is one term of --dependency: a type and, except for Singleton, the jobs
// it names. A job id names that job; the id of an array (A, not A_i) names every task
// of the array.
type Dependency struct {
	// Type is the term's kind; IDs the jobs it names (none for Singleton).
	Type DependencyType `json:"type"`
	IDs  []string       `json:"ids,omitempty"`
}

// String is the term as sbatch takes it: "afterok:3:4", "singleton".
func (d Dependency) String() string {
	return strings.Join(append([]string{string(d.Type)}, d.IDs...), ":")
}

// FormatDependencies is deps as --dependency takes them: "afterok:3,singleton".
func FormatDependencies(deps []Dependency) string {
	parts := make([]string, len(deps))
	for i, d := range deps {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

// ParseDependency parses --dependency: comma-separated terms, all of which must hold,
// each "TYPE:ID[:ID...]" (TYPE after, afterany, afterok or afternotok; ID a job id, an
// array's id or an array task's A_i) or "singleton". "" is none. Errors name the value
// and the term at fault; sbatch's "?" (any of) and after's "+time" are not supported.
func ParseDependency(v string) ([]Dependency, error) {
	if v == "" {
		return nil, nil
	}
	if strings.Contains(v, "?") {
		return nil, fmt.Errorf("--dependency %q: '?' (any of) is not supported; join terms with ',' (all of)", v)
	}
	var out []Dependency
	for _, term := range strings.Split(v, ",") {
		parts := strings.Split(term, ":")
		d := Dependency{Type: DependencyType(strings.ToLower(parts[0]))}
		switch d.Type {
		case Singleton:
			if len(parts) > 1 {
				return nil, fmt.Errorf("--dependency %q: singleton takes no job ids", v)
			}
		case After, AfterAny, AfterOK, AfterNotOK:
			if len(parts) < 2 {
				return nil, fmt.Errorf("--dependency %q: %s needs a job id (%s:ID[:ID...])", v, d.Type, d.Type)
			}
			for _, id := range parts[1:] {
				if !validJobRef(id) {
					return nil, fmt.Errorf("--dependency %q: %q is no job id (want N, or N_I for an array task)", v, id)
				}
				d.IDs = append(d.IDs, id)
			}
		default:
			return nil, fmt.Errorf("--dependency %q: unknown type %q (want after, afterany, afterok, afternotok or singleton)", v, parts[0])
		}
		out = append(out, d)
	}
	return out, nil
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

// check reports whether j's dependencies all hold (met), or whether one never can.
func (x *depIndex) check(j *Job) (met, never bool) {
	met = true
	for _, d := range j.Spec.Dependency {
		if d.Type == Singleton {
			if !x.singletonFree(j) {
				met = false
			}
			continue
		}
		for _, id := range d.IDs {
			ts := x.targets(id)
			if len(ts) == 0 {
				met = false // not seen yet (submit refuses an unknown id)
			}
			for _, t := range ts {
				ok, no := holds(d.Type, t.State)
				met = met && ok
				never = never || no
			}
		}
	}
	return met && !never, never
}

// holds reports whether dependency type typ on a job in state st holds, or never can.
func holds(typ DependencyType, st State) (ok, never bool) {
	final := st.Status.Final()
	switch typ {
	case After:
		return final || !st.Started.IsZero(), false
	case AfterAny:
		return final, false
	case AfterOK:
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
