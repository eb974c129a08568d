package slurm

import (
	"bytes"
	"context"
	"testing"
)

// TestSprioBadJobID: sprio -j with an id no job can have says so in sprio 22.05's words
// and exits 1 before asking the cluster (Env has none here); control bytes are quoted.
func TestSprioBadJobID(t *testing.T) {
	for id, want := range map[string]string{
		"abc":                  "sprio: error: Invalid job id: abc\n",
		"99999999999999999999": "sprio: error: Invalid job id: 99999999999999999999\n",
		"0":                    "sprio: error: Invalid job id: 0\n",
		"5,x\x1b[31m":          "sprio: error: Invalid job id: \"x\\x1b[31m\"\n",
	} {
		var out, errOut bytes.Buffer
		if code := Sprio(context.Background(), &Env{Stdout: &out, Stderr: &errOut}, []string{"-j", id}); code != 1 || errOut.String() != want || out.Len() != 0 {
			t.Errorf("sprio -j %q: exit %d, %q %q; want 1 and %q", id, code, out.String(), errOut.String(), want)
		}
	}
}
