package job

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestEndOpenSrunSteps: when a batch job ends, its srun steps with no end (their srun
// was killed with the job before it could say) end CANCELLED by signal 9 at the job's
// end, as slurmctld ends them; a step whose srun said keeps what it said.
func TestEndOpenSrunSteps(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	j := Job{Spec: Spec{ID: "7", User: "alice", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, Batch: &Batch{}}, State: phaseState(running)}
	putJob(t, s, j)
	var steps []StepRequest
	for range 2 {
		r, err := CreateSrunStep(ctx, s, nil, StepRequest{Job: "7", Name: "sleep", Nodes: []string{"gpu-a"}, Tasks: []int{1}, Command: []string{"sleep", "300"}})
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, r)
	}
	done := time.Now().UTC().Add(-time.Minute)
	if err := EndSrunStep(ctx, s, "7", steps[0].Step, SrunState{State: Completed, Ended: done}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	if err := EndOpenSrunSteps(ctx, s, "7", at); err != nil {
		t.Fatal(err)
	}
	got, err := SrunSteps(ctx, s, "7")
	if err != nil || len(got) != 2 {
		t.Fatalf("steps: %+v, %v", got, err)
	}
	if e := got[0].End; e == nil || e.State != Completed || !e.Ended.Equal(done) {
		t.Errorf("step 0, which said COMPLETED: %+v, want it kept", e)
	}
	if e := got[1].End; e == nil || e.State != Cancelled || e.Signal != 9 || !e.Ended.Equal(at) {
		t.Errorf("step 1, its srun silent: %+v, want CANCELLED by signal 9 at the job's end", e)
	}
}
