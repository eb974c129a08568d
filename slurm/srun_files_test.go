package slurm

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSrunFileOptionRefusals: srun's bad --output, --error and --open-mode values are
// one line naming the value with exit 255, before srun looks for its job; values that
// name no file (all..., -, none, as Slurm's srun reads them) pass on to the job check.
func TestSrunFileOptionRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-o", "x%q", "true"}, 255, `srun: error: --output "x%q": unknown pattern %q`},
		{[]string{"--error=e%", "true"}, 255, `srun: error: --error "e%": a lone % at the end`},
		{[]string{"-o", "3", "true"}, 255, "srun: error: --output=3: one task's output alone on srun's is " + notBuilt},
		{[]string{"-o", "", "true"}, 255, "srun: error: --output: an empty file name"},
		{[]string{"--open-mode=sideways", "true"}, 255, "srun: error: Invalid --open-mode specification"},
		{[]string{"--open-mode=a", "-o", "all_%q", "-e", "NONE", "true"}, 1, "srun: error: no job allocation"},
		{[]string{"-o", "-", "-e", "%j_%t.err", "true"}, 1, "srun: error: no job allocation"},
	} {
		var out, errOut bytes.Buffer
		e := &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }, Environ: func() []string { return nil }}
		code := Srun(context.Background(), e, tc.args)
		if code != tc.code || !strings.HasPrefix(errOut.String(), tc.want) || strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("srun %q: exit %d, %q; want %d and one line beginning %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

// TestSrunOwn: the --output and --error values Slurm's srun takes for no file.
func TestSrunOwn(t *testing.T) {
	for in, want := range map[string][2]bool{"all": {true, false}, "ALL_%j.txt": {true, false}, "-": {true, false}, "-x": {true, false},
		"none": {false, true}, "NoNe": {false, true}, "none.txt": {false, false}, "al": {false, false}, "%j_%t.out": {false, false}} {
		if own, none := srunOwn(in); own != want[0] || none != want[1] {
			t.Errorf("srunOwn(%q) = %v, %v; want %v, %v", in, own, none, want[0], want[1])
		}
	}
}
