package slurm

import (
	"slices"
	"testing"
)

// TestExpandTasks: an array's tasks as scontrol's job verbs take them, and every other
// id left for the cluster to judge.
func TestExpandTasks(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"7", []string{"7"}},
		{"7_2", []string{"7_2"}},
		{"7_[0-2]", []string{"7_0", "7_1", "7_2"}},
		{"7_[0-1,5]", []string{"7_0", "7_1", "7_5"}},
		{"7_[3]", []string{"7_3"}},
		{"7_[2-1]", []string{"7_[2-1]"}},
		{"7_[a]", []string{"7_[a]"}},
		{"7_[0-1", []string{"7_[0-1"}},
		{"7_[0-999999999]", []string{"7_[0-999999999]"}},
	} {
		if got := expandTasks(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("expandTasks(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
