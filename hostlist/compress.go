package hostlist

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
)

// run is a host, or a run of hosts, as Slurm's hostrange: a prefix and the
// numbers lo..hi written with at least width digits. A name that does not
// end in digits is a run of one with numeric false, written as prefix alone.
type run struct {
	prefix  string
	lo, hi  uint64
	width   int
	numeric bool
}

// Compress returns the shortest hostlist expression Slurm would write for
// hosts, as `scontrol show hostlist` does (hostlist_ranged_string): the order
// is kept and duplicates are kept, so Expand(Compress(hosts)) gives hosts
// back. Each name is split into a prefix and the decimal number that ends it;
// a host whose number is one more than the previous host's, with the same
// prefix and a zero padding that reads the same, extends that range; runs of
// neighbouring ranges with the same prefix share one bracket:
//
//	n1 n2 n3 n7      -> n[1-3,7]
//	n3 n2 n1         -> n[3,2,1]
//	a1 a2 b1 a3      -> a[1-2],b1,a3
//	n08 n09 n10 n1   -> n[08-10,1]
//
// Names that do not end in a digit, or whose number exceeds 2^64-1, are
// written as they are, never bracketed: Slurm's parser rejects text after a
// bracket group, and Compress's output is meant to be one it accepts. Empty
// names are skipped. Names are expected to be host names as Expand returns
// them: one containing a comma, a bracket or whitespace cannot be written in
// a hostlist and is written as it is.
func Compress(hosts []string) string {
	runs := make([]run, 0, len(hosts))
	for _, h := range hosts {
		if h == "" {
			continue
		}
		r := splitHost(h)
		if n := len(runs); n > 0 && runs[n-1].extend(r) {
			continue
		}
		runs = append(runs, r)
	}
	return render(runs)
}

// CompressSorted is Compress on the hosts sorted first, as `scontrol show
// hostlistsorted` does (hostlist_sort): by prefix in natural order (digit
// runs compared as numbers), a name without a number before numbered names of
// the same prefix, then by number, then by padding. Duplicates are kept:
// n1 n1 n2 gives n[1,1-2]. hosts is not modified.
func CompressSorted(hosts []string) string {
	runs := make([]run, 0, len(hosts))
	for _, h := range hosts {
		if h != "" {
			runs = append(runs, splitHost(h))
		}
	}
	slices.SortStableFunc(runs, compareRuns)
	merged := runs[:0]
	for _, r := range runs {
		if n := len(merged); n > 0 && merged[n-1].extend(r) {
			continue
		}
		merged = append(merged, r)
	}
	return render(merged)
}

// compareRuns orders runs as hostlist_sort does: by prefix in natural order, a name
// without a number before numbered names of the same prefix, then by number, then by
// padding.
func compareRuns(a, b run) int {
	if c := naturalCompare(a.prefix, b.prefix); c != 0 {
		return c
	}
	if a.numeric != b.numeric {
		if !a.numeric {
			return -1
		}
		return 1
	}
	return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.width, b.width))
}

// splitHost splits a host name into its prefix and the number ending it.
func splitHost(h string) run {
	i := len(h)
	for i > 0 && isDigit(h[i-1]) {
		i--
	}
	if i == len(h) {
		return run{prefix: h}
	}
	n, err := strconv.ParseUint(h[i:], 10, 64)
	if err != nil {
		return run{prefix: h}
	}
	return run{prefix: h[:i], lo: n, hi: n, width: len(h) - i, numeric: true}
}

// extend adds the single host h to r if it continues r: same prefix, number
// r.hi+1, and written the same with r's padding. This is Slurm's
// hostlist_push_range with _width_equiv: "n9" then "n10" join as n[9-10],
// "n09" then "n10" as n[09-10], but "n009" and "n10" do not.
func (r *run) extend(h run) bool {
	if !r.numeric || !h.numeric || r.prefix != h.prefix || r.hi == math.MaxUint64 || h.lo != r.hi+1 {
		return false
	}
	if max(digits(h.lo), r.width) != h.width {
		return false
	}
	r.hi = h.lo
	return true
}

// render writes runs as Slurm's hostlist_ranged_string does: neighbouring
// numeric runs with the same prefix share one bracket, and a bracket is
// written only around more than one number.
func render(runs []run) string {
	var b strings.Builder
	var num []byte
	for i := 0; i < len(runs); {
		if i > 0 {
			b.WriteByte(',')
		}
		r := runs[i]
		b.WriteString(r.prefix)
		if !r.numeric {
			i++
			continue
		}
		j := i + 1
		for j < len(runs) && runs[j].numeric && runs[j].prefix == r.prefix {
			j++
		}
		bracket := j-i > 1 || r.lo != r.hi
		if bracket {
			b.WriteByte('[')
		}
		for k := i; k < j; k++ {
			if k > i {
				b.WriteByte(',')
			}
			num = appendPadded(num[:0], runs[k].lo, runs[k].width)
			if runs[k].hi != runs[k].lo {
				num = append(num, '-')
				num = appendPadded(num, runs[k].hi, runs[k].width)
			}
			b.Write(num)
		}
		if bracket {
			b.WriteByte(']')
		}
		i = j
	}
	return b.String()
}

// naturalCompare orders strings with runs of digits compared by value, as
// Slurm's strnatcmp does for hostlist_sort: "rack2" < "rack10". Equal values
// with different zero padding order the shorter run first.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			da, db := digitRun(a), digitRun(b)
			ta, tb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if c := cmp.Or(cmp.Compare(len(ta), len(tb)), strings.Compare(ta, tb), cmp.Compare(len(da), len(db))); c != 0 {
				return c
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

// digitRun returns the digits s starts with.
func digitRun(s string) string {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i]
}

// SortHosts returns hosts sorted as CompressSorted orders them: by prefix in natural
// order (digit runs compared as numbers: rack2 before rack10), then by number, then
// by padding. hosts is not modified.
func SortHosts(hosts []string) []string {
	out := slices.Clone(hosts)
	slices.SortStableFunc(out, func(a, b string) int { return compareRuns(splitHost(a), splitHost(b)) })
	return out
}
