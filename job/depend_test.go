package job

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseDependency(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Dependency
		err  string
	}{
		{"", nil, ""},
		{"afterok:3", []Dependency{{Type: AfterOK, IDs: []string{"3"}}}, ""},
		{"afterok:3:4,singleton", []Dependency{{Type: AfterOK, IDs: []string{"3", "4"}}, {Type: Singleton}}, ""},
		{"afterany:7_2,afternotok:8,after:9", []Dependency{{Type: AfterAny, IDs: []string{"7_2"}}, {Type: AfterNotOK, IDs: []string{"8"}}, {Type: After, IDs: []string{"9"}}}, ""},
		{"AfterOK:3", []Dependency{{Type: AfterOK, IDs: []string{"3"}}}, ""},
		{"afterok", nil, "afterok needs a job id"},
		{"afterok:", nil, `"" is no job id`},
		{"afterok:x", nil, `"x" is no job id`},
		{"afterok:3_", nil, `"3_" is no job id`},
		{"after:3+10:4", []Dependency{{Type: After, IDs: []string{"3", "4"}, Delays: []int{10}}}, ""},
		{"after:3:4+5", []Dependency{{Type: After, IDs: []string{"3", "4"}, Delays: []int{0, 5}}}, ""},
		{"afterok:3+10", nil, "+time is after's only"},
		{"after:3+x", nil, `"x" is no count of minutes`},
		{"afterok:3?afterany:4", []Dependency{{Type: AfterOK, IDs: []string{"3"}, Any: true}, {Type: AfterAny, IDs: []string{"4"}, Any: true}}, ""},
		{"afterok:3?afterany:4,singleton", nil, "not both"},
		{"aftercorr:3", []Dependency{{Type: AfterCorr, IDs: []string{"3"}}}, ""},
		{"singleton:3", nil, "singleton takes no job ids"},
		{"afterok:3,", nil, `unknown type ""`},
	} {
		got, err := ParseDependency(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.in)):
			t.Errorf("ParseDependency(%q): error %v, want one naming the value and saying %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || !reflect.DeepEqual(got, tc.want)):
			t.Errorf("ParseDependency(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, v := range []string{"afterok:3:4,singleton", "after:3+10:4", "afterok:3?afternotok:4", "aftercorr:7"} {
		if d, err := ParseDependency(v); err != nil || FormatDependencies(d) != v {
			t.Errorf("FormatDependencies(ParseDependency(%q)) = %q, %v", v, FormatDependencies(d), err)
		}
	}
}

// TestDependencyHolds: each type against each way the job it names can stand, as
// sbatch's --dependency defines them.
func TestDependencyHolds(t *testing.T) {
	started := State{Status: Running, Started: time.Now()}
	for _, tc := range []struct {
		typ       DependencyType
		st        State
		ok, never bool
	}{
		{After, State{Status: Pending}, false, false},
		{After, started, true, false},
		{After, State{Status: Cancelled}, true, false},
		{AfterAny, started, false, false},
		{AfterAny, State{Status: Failed}, true, false},
		{AfterAny, State{Status: Completed}, true, false},
		{AfterOK, started, false, false},
		{AfterOK, State{Status: Completed}, true, false},
		{AfterOK, State{Status: Failed}, false, true},
		{AfterOK, State{Status: Cancelled}, false, true},
		{AfterOK, State{Status: Timeout}, false, true},
		{AfterOK, State{Status: NodeFail}, false, true},
		{AfterNotOK, started, false, false},
		{AfterNotOK, State{Status: Failed}, true, false},
		{AfterNotOK, State{Status: Timeout}, true, false},
		{AfterNotOK, State{Status: Completed}, false, true},
		{AfterOK, State{Status: Pending, Requeue: true}, false, false},
	} {
		if ok, never := holds(tc.typ, tc.st); ok != tc.ok || never != tc.never {
			t.Errorf("%s on a %s job: holds %v, never %v; want %v, %v", tc.typ, tc.st.Status, ok, never, tc.ok, tc.never)
		}
	}
}

// TestDependencyCheck: a pass's view of the jobs decides: an array's id names all its
// tasks, one task that can never satisfy afterok makes the whole never, and singleton
// lets one job of a name and user through at a time, the oldest first.
func TestDependencyCheck(t *testing.T) {
	job := func(id, name string, st Status, deferred bool, deps ...Dependency) Job {
		j := Job{Spec: Spec{ID: id, Name: name, User: "u", Dependency: deps}, State: State{Status: st, Deferred: deferred}}
		if st == Running {
			j.State.Started = time.Now()
		}
		if a, i, ok := strings.Cut(id, "_"); ok {
			j.Spec.Array = &ArrayTask{JobID: a, TaskID: int(i[0] - '0')}
		}
		return j
	}
	jobs := []Job{
		job("1", "a", Completed, false),
		job("2", "b", Failed, false),
		job("3_0", "arr", Completed, false),
		job("3_1", "arr", Running, false),
		job("4", "s", Running, false),
		job("5", "s", Pending, true, Dependency{Type: Singleton}),
		job("6", "s", Pending, true, Dependency{Type: Singleton}),
		job("7", "t", Pending, true, Dependency{Type: Singleton}),
	}
	x := newDepIndex(jobs)
	if x.active["3"] != 1 {
		t.Errorf("array 3 has %d tasks let through, want 1 (3_1)", x.active["3"])
	}
	for _, tc := range []struct {
		j          Job
		met, never bool
	}{
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"1"}}), true, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"1", "2"}}), false, true},
		{job("9", "x", Pending, true, Dependency{Type: AfterNotOK, IDs: []string{"1"}}), false, true},
		{job("9", "x", Pending, true, Dependency{Type: AfterNotOK, IDs: []string{"2"}}), true, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"3"}}), false, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"3_0"}}), true, false},
		{job("9", "x", Pending, true, Dependency{Type: After, IDs: []string{"3"}}), true, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"1"}}, Dependency{Type: AfterAny, IDs: []string{"4"}}), false, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"99"}}), false, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"2"}, Any: true}, Dependency{Type: AfterOK, IDs: []string{"1"}, Any: true}), true, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"2"}, Any: true}, Dependency{Type: AfterNotOK, IDs: []string{"1"}, Any: true}), false, true},
		{job("9", "x", Pending, true, Dependency{Type: AfterOK, IDs: []string{"2"}, Any: true}, Dependency{Type: AfterAny, IDs: []string{"4"}, Any: true}), false, false},
		{job("9", "x", Pending, true, Dependency{Type: After, IDs: []string{"4"}, Delays: []int{1}}), false, false},
		{job("9_0", "x", Pending, true, Dependency{Type: AfterCorr, IDs: []string{"3"}}), true, false},
		{job("9_1", "x", Pending, true, Dependency{Type: AfterCorr, IDs: []string{"3"}}), false, false},
		{job("9_5", "x", Pending, true, Dependency{Type: AfterCorr, IDs: []string{"3"}}), true, false},
		{job("9", "x", Pending, true, Dependency{Type: AfterCorr, IDs: []string{"3"}}), false, false},
		{jobs[5], false, false}, // 4 of the same name runs
		{jobs[7], true, false},  // alone with its name
	} {
		if met, never := x.check(&tc.j, time.Now()); met != tc.met || never != tc.never {
			t.Errorf("job %s %s: met %v, never %v; want %v, %v", tc.j.Spec.ID, FormatDependencies(tc.j.Spec.Dependency), met, never, tc.met, tc.never)
		}
	}
	jobs[4].State.Status = Completed
	x = newDepIndex(jobs)
	if met, _ := x.check(&jobs[5], time.Now()); !met {
		t.Error("singleton 5: want it let through once 4 ended")
	}
	if met, _ := x.check(&jobs[6], time.Now()); met {
		t.Error("singleton 6: want it held while 5, submitted before it, is yet to end")
	}
}
