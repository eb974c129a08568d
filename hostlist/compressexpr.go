package hostlist

import (
	"fmt"
	"math"
	"strings"
)

// CompressExpr returns the hostlist expression `scontrol show hostlist` writes for
// the expressions exprs taken as one list (hostlist_create, then
// hostlist_ranged_string): each expression's own ranges are kept, with the prefix and
// padding it gives them, so "n0[1-3]" stays n0[1-3] (Compress of the expanded hosts
// n01 n02 n03 would write n[01-03], as scontrol does for those names). A plain host
// name is split into a prefix and the number ending it, as in Compress. A range is
// joined to the one before it when it has the same prefix, starts one after it, and
// the two paddings are equivalent (Slurm's hostlist_push_range and _width_equiv).
//
// A pattern with text after its last bracket group ("gpu[1-2]-ib", which Slurm
// refuses) adds its hosts one by one, as Compress does. Errors are Expand's: a
// malformed expression, or more than MaxHosts hosts in all (checked before anything
// is built).
func CompressExpr(exprs ...string) (string, error) {
	var runs []run
	var hosts uint64
	for _, expr := range exprs {
		pats, err := parse(expr)
		if err != nil {
			return "", err
		}
		for _, p := range pats {
			n, _ := p.size()
			if hosts = addSat(hosts, n); hosts > MaxHosts {
				return "", fmt.Errorf("%w: %s expands to more than the maximum of %d hosts", ErrTooLarge, quote(expr), MaxHosts)
			}
		}
		for _, p := range pats {
			runs = p.pushRuns(runs)
		}
	}
	return render(runs), nil
}

// pushRuns appends p's ranges to runs as Slurm's _push_range_list does: the bracket
// groups but the last are expanded into prefixes (in Expand's order), and each range
// of the last group is pushed with its prefix and width.
func (p pattern) pushRuns(runs []run) []run {
	k := len(p.groups)
	if k == 0 || p.lits[k] != "" {
		var b strings.Builder
		ends := p.expand(&b, nil)
		start, s := 0, b.String()
		for _, end := range ends {
			runs = pushRun(runs, splitHost(s[start:end]))
			start = end
		}
		return runs
	}
	last := p.groups[k-1]
	for _, prefix := range p.prefixes() {
		for _, sp := range last {
			runs = pushRun(runs, run{prefix: prefix, lo: sp.lo, hi: sp.hi, width: sp.width, numeric: true})
		}
	}
	return runs
}

// prefixes are the texts before p's last bracket group, in the order Expand gives
// their hosts: group k-2 (of k) varies slowest, group 0 fastest.
func (p pattern) prefixes() []string {
	k := len(p.groups)
	cur := make([]string, k-1)
	var out []string
	var loop func(gi int)
	loop = func(gi int) {
		if gi < 0 {
			var b strings.Builder
			for i := 0; i < k-1; i++ {
				b.WriteString(p.lits[i])
				b.WriteString(cur[i])
			}
			b.WriteString(p.lits[k-1])
			out = append(out, b.String())
			return
		}
		for _, s := range p.groups[gi] {
			for n := s.lo; ; n++ {
				cur[gi] = string(appendPadded(nil, n, s.width))
				loop(gi - 1)
				if n == s.hi {
					break
				}
			}
		}
	}
	loop(k - 2)
	return out
}

// pushRun appends r to runs, or joins it to the last run when it continues it (Slurm's
// hostlist_push_range): both numeric, the same prefix, r starting one past the last
// run's end, and paddings that _width_equiv finds equivalent.
func pushRun(runs []run, r run) []run {
	if n := len(runs); n > 0 {
		t := &runs[n-1]
		if t.numeric && r.numeric && t.prefix == r.prefix && t.hi != math.MaxUint64 && r.lo == t.hi+1 &&
			widthEquiv(t.lo, &t.width, r.lo, &r.width) {
			t.hi = r.hi
			return runs
		}
	}
	return append(runs, r)
}

// widthEquiv is Slurm's _width_equiv (src/common/hostlist.c): the paddings wn of n
// and wm of m are equivalent when they are equal, or when writing n and m with one
// of them changes the zero padding of neither; it then sets the other to it.
func widthEquiv(n uint64, wn *int, m uint64, wm *int) bool {
	if *wn == *wm {
		return true
	}
	npad, nmpad := zeroPadded(n, *wn), zeroPadded(n, *wm)
	mpad, mnpad := zeroPadded(m, *wm), zeroPadded(m, *wn)
	switch {
	case npad != nmpad && mpad != mnpad:
		return false
	case npad != nmpad:
		*wm = *wn
	default:
		*wn = *wm
	}
	return true
}

// zeroPadded is Slurm's _zero_padded: how many zeros pad num written width wide.
func zeroPadded(num uint64, width int) int {
	return max(width-digits(num), 0)
}
