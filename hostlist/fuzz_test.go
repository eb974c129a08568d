package hostlist

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// fuzzMaxExpand bounds the expansions a fuzz iteration builds, to keep the
// fuzzer fast; larger valid expressions are checked through Count only.
const fuzzMaxExpand = 10000

func FuzzExpand(f *testing.F) {
	for _, tc := range expandCases {
		f.Add(tc.expr)
	}
	for _, s := range []string{"n[1-2", "n1]", "n[1[2]]", "n[10-1]", "a[1-10:2]", "n[]", "n[-1]", "n[1, 2]", "n[0-99999999999]", "n[18446744073709551616]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		n, cerr := Count(expr)
		var se *SyntaxError
		if cerr != nil {
			if errors.As(cerr, &se) {
				checkSyntaxError(t, expr, se)
			} else if !errors.Is(cerr, ErrTooLarge) {
				t.Fatalf("Count(%q) error %v is neither a *SyntaxError nor ErrTooLarge", expr, cerr)
			}
		}
		if cerr == nil && n > fuzzMaxExpand && n <= MaxHosts {
			return
		}
		hosts, err := Expand(expr)
		if err != nil {
			if errors.As(err, &se) {
				checkSyntaxError(t, expr, se)
				if !errors.As(cerr, new(*SyntaxError)) {
					t.Fatalf("Expand(%q) gave %v but Count gave %v", expr, err, cerr)
				}
				return
			}
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Expand(%q) error %v is neither a *SyntaxError nor ErrTooLarge", expr, err)
			}
			if cerr == nil && n <= MaxHosts && !strings.Contains(err.Error(), "bytes") {
				t.Fatalf("Expand(%q) = %v but Count = %d", expr, err, n)
			}
			return
		}
		if cerr != nil || len(hosts) != n {
			t.Fatalf("Expand(%q) = %d hosts but Count = %d, %v", expr, len(hosts), n, cerr)
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "[], \t\n\r\v\f") {
				t.Fatalf("Expand(%q) gave host %q", expr, h)
			}
		}
		c := Compress(hosts)
		back, err := Expand(c)
		if err != nil || !slices.Equal(back, hosts) {
			t.Fatalf("Expand(Compress(Expand(%q))) = Expand(%q) = %q, %v; want %q", expr, c, back, err, hosts)
		}
		ce, err := CompressExpr(expr)
		if err != nil {
			t.Fatalf("CompressExpr(%q): %v, but Expand accepts it", expr, err)
		}
		if back, err = Expand(ce); err != nil || !slices.Equal(back, hosts) {
			t.Fatalf("Expand(CompressExpr(%q)) = Expand(%q) = %q, %v; want %q", expr, ce, back, err, hosts)
		}
	})
}

func FuzzCompress(f *testing.F) {
	f.Add("n1\nn2\nn3")
	f.Add("h003\nh002\nh001")
	f.Add("n08\nn09\nn10\nn1\nn1")
	f.Add("a1\nb1\na2\nlogin\n7\n07")
	f.Add("n18446744073709551615\nn18446744073709551616")
	f.Fuzz(func(t *testing.T, list string) {
		var hosts []string
		for _, h := range strings.Split(list, "\n") {
			// Expand refuses control and format characters and invalid UTF-8: such a
			// host is not one Compress's output must round-trip.
			if h != "" && !strings.ContainsAny(h, "[], \t\r\v\f") && checkText(h) == nil {
				hosts = append(hosts, h)
			}
		}
		c := Compress(hosts)
		back, err := Expand(c)
		if err != nil || !slices.Equal(back, hosts) {
			t.Fatalf("Expand(Compress(%q)) = Expand(%q) = %q, %v", hosts, c, back, err)
		}
		back, err = Expand(CompressSorted(hosts))
		slices.Sort(back)
		if want := slices.Sorted(slices.Values(hosts)); err != nil || !slices.Equal(back, want) {
			t.Fatalf("Expand(CompressSorted(%q)) sorted = %q, %v; want %q", hosts, back, err, want)
		}
	})
}

// checkSyntaxError checks that se points into expr at the part it names.
func checkSyntaxError(t *testing.T, expr string, se *SyntaxError) {
	t.Helper()
	if se.Expr != expr || se.Offset < 0 || se.Offset+len(se.Part) > len(expr) || expr[se.Offset:se.Offset+len(se.Part)] != se.Part {
		t.Fatalf("syntax error %+v does not point into %q", *se, expr)
	}
	if strings.Contains(se.Error(), "\n") {
		t.Fatalf("syntax error %q is not one line", se.Error())
	}
}
