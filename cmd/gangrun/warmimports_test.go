package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunWarmImportThatFails: a --warm-imports module the standby cannot import is said
// on stderr and the restart is cold, not logged as warm; a name that is no module name
// is refused before anything starts.
func TestRunWarmImportThatFails(t *testing.T) {
	py := python(t)
	mark := testMark(t)
	script := filepath.Join(t.TempDir(), "t.py")
	if err := os.WriteFile(script, []byte("import os, sys\nprint('attempt', os.environ['GANGRUN_ATTEMPT'])\nsys.exit(3 if os.environ['GANGRUN_ATTEMPT'] == '0' else 0)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := runGangrun(t, []string{mark}, "run", "--nproc-per-node", "1", "--max-restarts", "1", "--restart-backoff", "0s",
		"--warm-delay=0s", "--warm-imports", "gangrun_no_such_module", "--", py, script)
	if res.code != 0 || !strings.Contains(res.stdout, "[rank0]: attempt 1") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	if strings.Contains(res.stderr, `"attempt": 1, "warm": 1`) || !strings.Contains(res.stderr, `"attempt": 1, "warm": 0, "cold": 1`) {
		t.Errorf("attempt 1 not cold after a failed warm import; stderr:\n%s", res.stderr)
	}
	if !strings.Contains(res.stderr, "cannot import gangrun_no_such_module (--warm-imports)") {
		t.Errorf("the failed import is not said; stderr:\n%s", res.stderr)
	}
	res = runGangrun(t, []string{mark}, "run", "--warm-imports", "no such;module", "--", py, script)
	if want := `gangrun run: --warm-imports "no such;module": not a Python module name (dotted identifiers, as torch or torch.distributed)`; res.code != 2 || strings.TrimSpace(res.stderr) != want {
		t.Errorf("exit %d, stderr %q; want 2, %q", res.code, res.stderr, want)
	}
}
