package hostlist

import (
	"strings"
	"testing"
)

// TestCheckHostname: DNS's 63 bytes a label and 253 a name, and nothing else refused.
func TestCheckHostname(t *testing.T) {
	label63, label64 := strings.Repeat("a", 63), strings.Repeat("a", 64)
	long := strings.Repeat(label63+".", 4)[:254]
	for _, tc := range []struct{ host, want string }{
		{"node01", ""}, {label63, ""}, {label63 + "." + label63, ""}, {long[:253], ""},
		{label64, "a label of 64 bytes: DNS allows 63 between dots"},
		{"n." + label64 + ".example", "a label of 64 bytes"},
		{long, "254 bytes: DNS allows 253"},
	} {
		err := CheckHostname(tc.host)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckHostname(%.20q...) = %v; want %q", tc.host, err, tc.want)
		}
	}
}
