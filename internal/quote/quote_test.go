package quote

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestQ(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"node-1", `"node-1"`},
		{"a\x1b[2Jb", `"a\x1b[2Jb"`},
		{strings.Repeat("x", Max), `"` + strings.Repeat("x", Max) + `"`},
		{strings.Repeat("x", 100000), `"` + strings.Repeat("x", Keep) + `"... (100000 bytes)`},
		// A cut inside a multi-byte character falls back to its start.
		{strings.Repeat("x", Keep-1) + strings.Repeat("é", 40), `"` + strings.Repeat("x", Keep-1) + `"... (139 bytes)`},
	} {
		if got := Q(tc.in); got != tc.want {
			t.Errorf("Q(%.20q...) = %s, want %s", tc.in, got, tc.want)
		}
	}
	if got := Short(strings.Repeat("/a", 100)); got != strings.Repeat("/a", 30)+"... (200 bytes)" {
		t.Errorf("Short: %s", got)
	}
}

func FuzzQ(f *testing.F) {
	f.Add("x")
	f.Add(strings.Repeat("é", 100))
	f.Fuzz(func(t *testing.T, s string) {
		q := Q(s)
		if len(q) > 4*Keep+40 {
			t.Errorf("Q of %d bytes is %d bytes long", len(s), len(q))
		}
		if utf8.ValidString(s) && !utf8.ValidString(Head(s)) {
			t.Errorf("Head cut a character: %q", Head(s))
		}
	})
}

// TestPlain: an ordinary value is shown as it is; one with a control byte, an escape
// sequence, a quote or too long is quoted (Q).
func TestPlain(t *testing.T) {
	for in, want := range map[string]string{
		"abc":                  "abc",
		"99999999999999999999": "99999999999999999999",
		"9\x01\x1b[31m":        `"9\x01\x1b[31m"`,
		`a"b`:                  `"a\"b"`,
	} {
		if got := Plain(in); got != want {
			t.Errorf("Plain(%q) = %s, want %s", in, got, want)
		}
	}
	if long := strings.Repeat("a", Max+1); Plain(long) != Q(long) {
		t.Errorf("Plain of %d bytes: %s, want Q's", len(long), Plain(long))
	}
}
