package job

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseArray(t *testing.T) {
	for _, tc := range []struct {
		in          string
		want        []int
		limit, step int
		err         string
	}{
		{"0-3", []int{0, 1, 2, 3}, 0, 1, ""},
		{"0-15%4", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 4, 1, ""},
		{"1,3,5-7", []int{1, 3, 5, 6, 7}, 0, 1, ""},
		{"0-15:2", []int{0, 2, 4, 6, 8, 10, 12, 14}, 0, 2, ""},
		{"1-7:3%1", []int{1, 4, 7}, 1, 3, ""},
		{"7,3,3,1-2", []int{1, 2, 3, 7}, 0, 1, ""},
		{"5", []int{5}, 0, 1, ""},
		{"9999", []int{9999}, 0, 1, ""},
		{"", nil, 0, 0, "no indices"},
		{"%4", nil, 0, 0, "no indices"},
		{"0-3%0", nil, 0, 0, "cap must be a number of at least 1"},
		{"0-3%", nil, 0, 0, "cap must be"},
		{"0-3%x", nil, 0, 0, "cap must be"},
		{"3-1", nil, 0, 0, "ends before it starts"},
		{"a-3", nil, 0, 0, `"a" is no index`},
		{"-1", nil, 0, 0, "index -1 is negative"},
		{"0-3%99999999999999999999", nil, 0, 0, "cap 99999999999999999999 is too large"},
		{"+1", nil, 0, 0, `"+1" is no index`},
		{"0-10000", nil, 0, 0, "index 10000 is over the largest, 9999"},
		{"0-3:0", nil, 0, 0, "step"},
		{"4:2", nil, 0, 0, "needs a range"},
		{"1,,2", nil, 0, 0, `"" is no index`},
	} {
		got, err := ParseArray(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--array \""+tc.in+"\"")):
			t.Errorf("ParseArray(%q): error %v, want one naming the value and saying %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || !reflect.DeepEqual(got.Indices, tc.want) || got.Limit != tc.limit || got.Step != tc.step):
			t.Errorf("ParseArray(%q) = %+v, %v; want %v limit %d step %d", tc.in, got, err, tc.want, tc.limit, tc.step)
		}
	}
	if a, _ := ParseArray("0-3,5,7-8%2"); a.String() != "0-3,5,7-8%2" {
		t.Errorf("String = %q", a.String())
	}
}

func TestJobLess(t *testing.T) {
	ids := []string{"10", "2", "3_10", "3_2", "3", "x"}
	jobs := make([]Job, len(ids))
	for i, id := range ids {
		jobs[i].Spec.ID = id
	}
	sortJobs(jobs)
	var got []string
	for _, j := range jobs {
		got = append(got, j.Spec.ID)
	}
	if want := []string{"2", "3", "3_2", "3_10", "10", "x"}; !reflect.DeepEqual(got, want) {
		t.Errorf("sorted %v, want %v", got, want)
	}
}

func TestArrayTaskEnviron(t *testing.T) {
	a := &ArrayTask{JobID: "7", TaskID: 2, Count: 4, Min: 0, Max: 3, Step: 1}
	env := strings.Join(a.Environ(), " ")
	for _, want := range []string{"GANGRUN_ARRAY_JOB_ID=7", "GANGRUN_ARRAY_TASK_ID=2", "GANGRUN_ARRAY_TASK_COUNT=4", "GANGRUN_ARRAY_TASK_MIN=0",
		"GANGRUN_ARRAY_TASK_MAX=3", "SLURM_ARRAY_JOB_ID=7", "SLURM_ARRAY_TASK_ID=2", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_STEP=1"} {
		if !strings.Contains(env, want) {
			t.Errorf("environ lacks %s: %s", want, env)
		}
	}
	s := Spec{ID: "7_2", Name: "n", User: "u", WorkDir: "/w", Output: "o-%A_%a-%j.out", Array: a}
	if p := s.OutputPath("gpu-a"); p != "/w/o-7_2-7_2.out" {
		t.Errorf("OutputPath = %q", p)
	}
}
