package slurm

import (
	"strings"
	"testing"
)

// TestFormatWidths: -o and -O take a field's width up to maxFieldWidth and refuse a
// wider one in one line (a width past int's range wrapped and panicked in strings.Repeat;
// one of 2^31 built 18 GB lines).
func TestFormatWidths(t *testing.T) {
	known := map[string]string{"i": "JOBID", "jobid": "JOBID"}
	fs, err := parseFormat("%.65535i|", known)
	if err != nil || len(fs) != 2 || fs[0].width != maxFieldWidth || !fs[0].right {
		t.Fatalf("parseFormat of the widest field: %+v, %v", fs, err)
	}
	if got := render(fs, func(string) string { return "7" }); len(got) != maxFieldWidth+1 || !strings.HasSuffix(got, "7|") {
		t.Errorf("the widest field rendered %d bytes, want %d ending in 7|", len(got), maxFieldWidth+1)
	}
	for _, f := range []string{"%65536i", "%99999999999999999999i", "%9223372036854775807i", "%.18446744073709551617i"} {
		_, err := parseFormat(f, known)
		ue, ok := err.(*UsageError)
		if !ok || ue.Code != 1 || ue.Msg != "error: Invalid format specification: a field's width is at most 65535" {
			t.Errorf("parseFormat(%q): %v, want the width refused, exit 1", f, err)
		}
	}
	if fs, bad := parseFieldsLenient("jobid:.65535", known); len(bad) != 0 || len(fs) != 1 || fs[0].width != maxFieldWidth {
		t.Errorf("-O jobid:.65535: %+v, bad %v", fs, bad)
	}
	for _, l := range []string{"jobid:65536", "jobid:99999999999999999999"} {
		if fs, bad := parseFieldsLenient(l, known); len(fs) != 0 || len(bad) != 1 || bad[0] != l {
			t.Errorf("-O %s: fields %+v, bad %v; want it refused", l, fs, bad)
		}
	}
}
