package slurm

import (
	"testing"

	"github.com/gangrun/gangrun/job"
)

// TestSqueueDependency: squeue's %E and -O dependency print a job's dependencies as
// scontrol show job's Dependency= does, (null) for none, under the header DEPENDENCY.
func TestSqueueDependency(t *testing.T) {
	dep := jobRow{j: job.Job{Spec: job.Spec{ID: "33", Dependency: []job.Dependency{{Type: job.AfterOK, IDs: []string{"32"}}}}}}
	none := jobRow{j: job.Job{Spec: job.Spec{ID: "34"}}}
	if got := dep.value("E"); got != "afterok:32" {
		t.Errorf("%%E of a job with --dependency=afterok:32: %q", got)
	}
	if got := none.value("E"); got != "(null)" {
		t.Errorf("%%E of a job with no dependency: %q, want (null)", got)
	}
	if squeueHeaders(false)["E"] != "DEPENDENCY" || squeueFields["dependency"] != "DEPENDENCY" || fieldLetter["dependency"] != "E" {
		t.Errorf("-O dependency: header %q, field %q, letter %q", squeueHeaders(false)["E"], squeueFields["dependency"], fieldLetter["dependency"])
	}
}
