package hostlist

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// expandCases are Slurm hostlist expressions and what `scontrol show
// hostnames` prints for them (Slurm's src/common/hostlist.c), plus the
// extensions this package documents (text after the last bracket).
var expandCases = []struct {
	name string
	expr string
	want []string
}{
	{"plain host", "node1", []string{"node1"}},
	{"list of plain hosts", "a,b,c", []string{"a", "b", "c"}},
	{"padded range and single", "node[001-003,010]", []string{"node001", "node002", "node003", "node010"}},
	{"two groups, product", "rack[1-2]-node[01-02]", []string{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}},
	{"text after brackets", "gpu[1-2]-ib", []string{"gpu1-ib", "gpu2-ib"}},
	{"comma outside brackets", "a,b[1-2]", []string{"a", "b1", "b2"}},
	{"comma inside brackets", "linux[1,2]", []string{"linux1", "linux2"}},
	{"mixed list", "a1g[0010,0011],b0005,c0007", []string{"a1g0010", "a1g0011", "b0005", "c0007"}},
	{"width from start, unpadded", "n[8-10]", []string{"n8", "n9", "n10"}},
	{"width from start, padded", "n[08-10]", []string{"n08", "n09", "n10"}},
	{"width from start, wider than end", "n[008-10]", []string{"n008", "n009", "n010"}},
	{"end width ignored", "n[8-010]", []string{"n8", "n9", "n10"}},
	{"width per range", "n[1,02,003-004]", []string{"n1", "n02", "n003", "n004"}},
	{"number outgrows padding", "n[98-101]", []string{"n98", "n99", "n100", "n101"}},
	{"zero", "n[0-1]", []string{"n0", "n1"}},
	{"padded zero", "n[00]", []string{"n00"}},
	{"order of ranges kept", "n[3,1-2]", []string{"n3", "n1", "n2"}},
	{"duplicates kept", "n[1,1],n1", []string{"n1", "n1", "n1"}},
	{"empty prefix", "[1-3]", []string{"1", "2", "3"}},
	{"digits before bracket", "n1[1-2]", []string{"n11", "n12"}},
	{"adjacent groups", "n[1-2][5-6]", []string{"n15", "n16", "n25", "n26"}},
	{"two groups and suffix", "r[1-2]n[1-2].ib", []string{"r1n1.ib", "r1n2.ib", "r2n1.ib", "r2n2.ib"}},
	// hostlist.c peels prefix groups off from the right, so with three groups
	// the middle one varies slowest and the last fastest.
	{"three groups, Slurm's order", "a[1-2]b[3-4]c[5-6]", []string{
		"a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6",
	}},
	{"four groups, Slurm's order", "[1-2][3-4][5-6][7-8]", []string{
		"1357", "1358", "2357", "2358", "1457", "1458", "2457", "2458",
		"1367", "1368", "2367", "2368", "1467", "1468", "2467", "2468",
	}},
	{"spaces and tabs separate", "a b\tc", []string{"a", "b", "c"}},
	{"newlines separate", "a\nb\r\nc", []string{"a", "b", "c"}},
	{"empty elements skipped", ",a,,b,", []string{"a", "b"}},
	{"largest number", "n[18446744073709551614-18446744073709551615]", []string{"n18446744073709551614", "n18446744073709551615"}},
	{"long padding", "n[0000000000000000000000001]", []string{"n0000000000000000000000001"}},
	{"other punctuation is text", "a.b-c_d:e", []string{"a.b-c_d:e"}},
}

func TestExpand(t *testing.T) {
	for _, tc := range expandCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Expand(tc.expr)
			if err != nil {
				t.Fatalf("Expand(%q): %v", tc.expr, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Expand(%q) = %q, want %q", tc.expr, got, tc.want)
			}
			n, err := Count(tc.expr)
			if err != nil || n != len(tc.want) {
				t.Errorf("Count(%q) = %d, %v; want %d", tc.expr, n, err, len(tc.want))
			}
		})
	}
}

func TestExpandEmpty(t *testing.T) {
	for _, expr := range []string{"", ",", " , \t"} {
		got, err := Expand(expr)
		if err != nil || len(got) != 0 {
			t.Errorf("Expand(%q) = %q, %v; want no hosts, no error", expr, got, err)
		}
	}
}

func TestExpandSyntaxErrors(t *testing.T) {
	cases := []struct {
		name   string
		expr   string
		offset int    // 0-based byte offset of the bad part
		part   string // the bad part
		msg    string // a substring of the message
	}{
		{"unclosed bracket", "n[1-2", 1, "[", "no matching ']'"},
		{"unclosed bracket before comma", "n[1-2,m3", 1, "[", "no matching ']'"},
		{"stray closing bracket", "n1-2]", 4, "]", "no matching '['"},
		{"stray closing bracket in later element", "a[1],b]", 6, "]", "no matching '['"},
		{"nested brackets", "n[1[2]]", 3, "[", "nested bracket"},
		{"reversed range", "n[10-1]", 2, "10-1", "reversed range (10 is greater than 1)"},
		{"reversed range in a later group", "r[1-2]n[5-3]", 8, "5-3", "reversed range"},
		{"step form", "a[1-10:2]", 2, "1-10:2", "unsupported step range"},
		{"empty brackets", "n[]", 2, "", "empty range"},
		{"empty range between commas", "n[1,,2]", 4, "", "empty range"},
		{"trailing comma in brackets", "n[1,]", 4, "", "empty range"},
		{"negative start", "n[-1]", 2, "-1", "without a start"},
		{"missing end", "n[1-]", 2, "1-", "without an end"},
		{"double dash", "n[1--2]", 2, "1--2", "invalid character '-'"},
		{"letters in range", "n[1-a]", 2, "1-a", "invalid character 'a'"},
		{"box notation", "bgl[123x456]", 4, "123x456", "invalid character 'x'"},
		{"fullwidth digit", "a[１-2]", 2, "１-2", "invalid character '１'"},
		{"plus sign", "n[+1]", 2, "+1", "invalid character '+'"},
		{"whitespace in brackets", "n[1, 2]", 4, " 2", "whitespace"},
		{"number too large", "n[18446744073709551616]", 2, "18446744073709551616", "number too large"},
		{"end too large", "n[1-99999999999999999999]", 4, "99999999999999999999", "number too large"},
		{"escape sequence", "n1\x1b[31m", 2, "\x1b", "control character U+001B"},
		{"NUL", "n\x001", 1, "\x00", "control character U+0000"},
		{"DEL", "n\x7f", 1, "\x7f", "control character U+007F"},
		{"C1 control", "n\u0085", 1, "\u0085", "control character U+0085"},
		{"right-to-left override", "node\u202e10", 4, "\u202e", "invisible format character U+202E"},
		{"zero-width space", "n\u200b1", 1, "\u200b", "invisible format character U+200B"},
		{"byte order mark", "\ufeffn1", 0, "\ufeff", "invisible format character U+FEFF"},
		{"invalid UTF-8", "n\xff1", 1, "\xff", "invalid UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, call := range []struct {
				fn  string
				err error
			}{
				{"Expand", second(Expand(tc.expr))},
				{"Count", second(Count(tc.expr))},
			} {
				var se *SyntaxError
				if !errors.As(call.err, &se) {
					t.Fatalf("%s(%q) error = %v, want a *SyntaxError", call.fn, tc.expr, call.err)
				}
				if se.Offset != tc.offset || se.Part != tc.part || !strings.Contains(se.Msg, tc.msg) || se.Expr != tc.expr {
					t.Errorf("%s(%q) = %+v, want offset %d, part %q, message containing %q",
						call.fn, tc.expr, *se, tc.offset, tc.part, tc.msg)
				}
				if msg := call.err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "hostlist: ") {
					t.Errorf("%s(%q) error %q is not one line starting with \"hostlist: \"", call.fn, tc.expr, msg)
				}
			}
		})
	}
}

func TestSyntaxErrorMessage(t *testing.T) {
	_, err := Expand("n[10-1]")
	want := `hostlist: reversed range (10 is greater than 1) "10-1" at column 3 of "n[10-1]"`
	if err == nil || err.Error() != want {
		t.Errorf("Expand error = %v, want %s", err, want)
	}
	long := strings.Repeat("x", 100) + "[2-1]"
	_, err = Expand(long)
	if err == nil || strings.Contains(err.Error(), long) || !strings.Contains(err.Error(), "column 102") {
		t.Errorf("Expand(long) error = %v, want the part and column without the whole expression", err)
	}
}

func TestExpandTooLarge(t *testing.T) {
	cases := []struct {
		name, expr, msg string
	}{
		{"absurd range", "n[0-99999999999]", "expands to 100000000000 hosts, more than the maximum of 1048576"},
		{"one past the limit", "n[1-1048577]", "expands to 1048577 hosts"},
		{"limit across elements", "a[1-1048576],b", "expands to 1048577 hosts"},
		{"product of groups", "r[0-9999]n[0-9999]", "expands to 100000000 hosts"},
		{"beyond 64 bits", "a[0-18446744073709551615]", "at least 18446744073709551615 hosts"},
		{"bytes of names", strings.Repeat("p", 200) + "[1-1000000]", "bytes of host names, more than the maximum of 134217728"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := Expand(tc.expr)
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Expand = %d hosts, error %v; want ErrTooLarge saying %q", len(hosts), err, tc.msg)
			}
		})
	}
	// The limit itself is allowed.
	hosts, err := Expand("n[1-1048576]")
	if err != nil || len(hosts) != MaxHosts || hosts[MaxHosts-1] != "n1048576" {
		t.Errorf("Expand(n[1-1048576]) = %d hosts, %v; want %d ending with n1048576", len(hosts), err, MaxHosts)
	}
}

func TestCountLarge(t *testing.T) {
	cases := []struct {
		expr string
		want int
	}{
		{"n[0-99999999999]", 100000000000},
		{"r[0-9999]n[0-9999],x", 100000001},
		{"n[1-9223372036854775807]", 9223372036854775807},
	}
	for _, tc := range cases {
		got, err := Count(tc.expr)
		if err != nil || got != tc.want {
			t.Errorf("Count(%q) = %d, %v; want %d", tc.expr, got, err, tc.want)
		}
	}
	for _, expr := range []string{"n[0-9223372036854775807]", "a[0-18446744073709551615]", "a[0-4294967296]b[0-4294967296]"} {
		if _, err := Count(expr); !errors.Is(err, ErrTooLarge) {
			t.Errorf("Count(%q) error = %v, want ErrTooLarge", expr, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
