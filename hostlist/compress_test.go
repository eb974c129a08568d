package hostlist

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestCompress(t *testing.T) {
	cases := []struct {
		name   string
		hosts  []string
		want   string // `scontrol show hostlist`
		sorted string // `scontrol show hostlistsorted`
	}{
		{"none", nil, "", ""},
		{"one host", []string{"n1"}, "n1", "n1"},
		{"one host without number", []string{"login"}, "login", "login"},
		{"ascending run", []string{"n1", "n2", "n3", "n7"}, "n[1-3,7]", "n[1-3,7]"},
		// The example in Slurm's documentation of scontrol.
		{"descending kept in order", []string{"h003", "h002", "h001"}, "h[003,002,001]", "h[001-003]"},
		{"several prefixes", []string{"a1", "a2", "b1", "b2"}, "a[1-2],b[1-2]", "a[1-2],b[1-2]"},
		{"prefixes interleaved", []string{"a1", "b1", "a2"}, "a1,b1,a2", "a[1-2],b1"},
		{"padding kept", []string{"node001", "node002", "node003", "node010"}, "node[001-003,010]", "node[001-003,010]"},
		{"unpadded across a digit", []string{"n8", "n9", "n10"}, "n[8-10]", "n[8-10]"},
		{"padded across a digit", []string{"n08", "n09", "n10"}, "n[08-10]", "n[08-10]"},
		{"padding that reads differently", []string{"n009", "n10"}, "n[009,10]", "n[009,10]"},
		{"same number, two paddings", []string{"n1", "n01"}, "n[1,01]", "n[1,01]"},
		{"duplicates kept", []string{"n1", "n1", "n2"}, "n[1,1-2]", "n[1,1-2]"},
		{"overlap kept", []string{"n1", "n2", "n2", "n3"}, "n[1-2,2-3]", "n[1-2,2-3]"},
		{"names without numbers", []string{"gpu1-ib", "gpu2-ib"}, "gpu1-ib,gpu2-ib", "gpu1-ib,gpu2-ib"},
		{"bare numbers", []string{"1", "2", "3"}, "[1-3]", "[1-3]"},
		{"number too large for 64 bits", []string{"n99999999999999999999", "n1"}, "n99999999999999999999,n1", "n1,n99999999999999999999"},
		{"largest number", []string{"n18446744073709551614", "n18446744073709551615"}, "n[18446744073709551614-18446744073709551615]", "n[18446744073709551614-18446744073709551615]"},
		{"empty names skipped", []string{"", "n1", "", "n2"}, "n[1-2]", "n[1-2]"},
		{"natural order of prefixes", []string{"rack10-n1", "rack2-n1", "rack1-n1"}, "rack10-n1,rack2-n1,rack1-n1", "rack1-n1,rack2-n1,rack10-n1"},
		{"plain name before numbered", []string{"n2", "n", "n1"}, "n2,n,n1", "n,n[1-2]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(tc.hosts)
			if got := Compress(tc.hosts); got != tc.want {
				t.Errorf("Compress(%q) = %q, want %q", tc.hosts, got, tc.want)
			}
			if got := CompressSorted(tc.hosts); got != tc.sorted {
				t.Errorf("CompressSorted(%q) = %q, want %q", tc.hosts, got, tc.sorted)
			}
			if !slices.Equal(orig, tc.hosts) {
				t.Errorf("hosts changed to %q", tc.hosts)
			}
		})
	}
}

// TestRoundTrip checks that compressing an expansion gives back the same
// hosts, and, for expressions already in the form Slurm writes, the same text.
func TestRoundTrip(t *testing.T) {
	canonical := map[string]string{
		"node[001-003,010]":          "node[001-003,010]",
		"rack[1-2]-node[01-02]":      "rack1-node[01-02],rack2-node[01-02]",
		"gpu[1-2]-ib":                "gpu1-ib,gpu2-ib",
		"a,b[1-2]":                   "a,b[1-2]",
		"linux[1,2]":                 "linux[1-2]",
		"a1g[0010,0011],b0005,c0007": "a1g[0010-0011],b0005,c0007",
		"n[8-10]":                    "n[8-10]",
		"n[3,1-2]":                   "n[3,1-2]",
	}
	for _, tc := range expandCases {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := Expand(tc.expr)
			if err != nil {
				t.Fatal(err)
			}
			c := Compress(hosts)
			back, err := Expand(c)
			if err != nil {
				t.Fatalf("Expand(Compress(Expand(%q))) = Expand(%q): %v", tc.expr, c, err)
			}
			if !slices.Equal(back, hosts) {
				t.Errorf("Expand(%q) = %q, want %q (Compress of Expand(%q))", c, back, hosts, tc.expr)
			}
			if want, ok := canonical[tc.expr]; ok && c != want {
				t.Errorf("Compress(Expand(%q)) = %q, want %q", tc.expr, c, want)
			}
			// CompressSorted keeps the same hosts, in another order.
			back, err = Expand(CompressSorted(hosts))
			want := slices.Sorted(slices.Values(hosts))
			if slices.Sort(back); err != nil || !slices.Equal(back, want) {
				t.Errorf("Expand(CompressSorted(%q)) sorted = %q, %v; want %q", hosts, back, err, want)
			}
		})
	}
}

func TestNaturalCompare(t *testing.T) {
	ordered := []string{"", "a", "a1", "a01", "a2", "a10", "a10b", "ab", "b"}
	for i := range ordered {
		for j := range ordered {
			got := naturalCompare(ordered[i], ordered[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got != want {
				t.Errorf("naturalCompare(%q, %q) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
}

func TestCompressLongList(t *testing.T) {
	var hosts []string
	for _, rack := range []string{"r1", "r2"} {
		for n := range 1000 {
			if n != 500 {
				hosts = append(hosts, rack+"n"+strings.Repeat("0", 4-len(itoa(n)))+itoa(n))
			}
		}
	}
	want := "r1n[0000-0499,0501-0999],r2n[0000-0499,0501-0999]"
	if got := Compress(hosts); got != want {
		t.Errorf("Compress = %q, want %q", got, want)
	}
}

func itoa(n int) string { return string(appendPadded(nil, uint64(n), 0)) }

// TestCompressExpr: an expression's own ranges keep their prefix and padding, as
// `scontrol show hostlist` writes them (the expected strings are scontrol 22.05's).
func TestCompressExpr(t *testing.T) {
	for _, tc := range []struct {
		exprs []string
		want  string
	}{
		{[]string{"n0[1-3]"}, "n0[1-3]"},
		{[]string{"n0[1-3],n04"}, "n0[1-3],n04"},
		{[]string{"n01,n02,n03"}, "n[01-03]"},
		{[]string{"n[8-010]"}, "n[8-10]"},
		{[]string{"n[3,1-2],n3"}, "n[3,1-3]"},
		{[]string{"rack[1-2]-node[01-02]"}, "rack1-node[01-02],rack2-node[01-02]"},
		{[]string{"a[1-2]b[3-4]c[5-6]"}, "a1b3c[5-6],a2b3c[5-6],a1b4c[5-6],a2b4c[5-6]"},
		{[]string{"n[1-3]", "n4", "n[5-6]"}, "n[1-6]"},
		{[]string{"n9,n10", "n009,n10"}, "n[9-10,009,10]"},
		{[]string{"gpu[1-2]-ib"}, "gpu1-ib,gpu2-ib"},
		{[]string{""}, ""},
	} {
		got, err := CompressExpr(tc.exprs...)
		if err != nil || got != tc.want {
			t.Errorf("CompressExpr(%q) = %q, %v; want %q", tc.exprs, got, err, tc.want)
		}
	}
	if _, err := CompressExpr("n[1-2"); err == nil {
		t.Error("CompressExpr(\"n[1-2\") accepted a malformed expression")
	}
	if _, err := CompressExpr("n[0-99999999999]"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("CompressExpr of 10^11 hosts: %v, want ErrTooLarge", err)
	}
}

// TestSortHosts: SortHosts orders hosts as CompressSorted does (hostlist_sort), and
// leaves its argument as it was.
func TestSortHosts(t *testing.T) {
	in := []string{"rack10", "n10", "rack2", "n09", "n9", "n", "n1", "n9"}
	want := []string{"n", "n1", "n9", "n9", "n09", "n10", "rack2", "rack10"}
	orig := slices.Clone(in)
	if got := SortHosts(in); !slices.Equal(got, want) {
		t.Errorf("SortHosts(%q) = %q, want %q", in, got, want)
	}
	if !slices.Equal(in, orig) {
		t.Errorf("SortHosts changed its argument to %q", in)
	}
	if got, want := CompressSorted(in), Compress(want); got != want {
		t.Errorf("CompressSorted(%q) = %q, want Compress of SortHosts' order, %q", in, got, want)
	}
}
