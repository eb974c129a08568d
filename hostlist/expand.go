package hostlist

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Limits on one Expand call, checked from the expression alone before any
// host is built, so that an absurd expression such as "n[0-99999999999]" is a
// clear error instead of an out-of-memory. Count is not bound by them.
const (
	// MaxHosts is the most hosts one expression may expand to: 1,048,576,
	// about a hundred times the node count of today's largest clusters.
	MaxHosts = 1 << 20
	// MaxBytes is the most bytes the expanded host names of one expression
	// may add up to: 128 MiB.
	MaxBytes = 128 << 20
)

// Expand returns the hosts of the Slurm hostlist expression expr, in the
// order `scontrol show hostnames` prints them, duplicates included. An empty
// expression, or one of separators only, gives no hosts and no error.
//
// A malformed expression gives a *SyntaxError naming the bad part and its
// position; one that would expand past MaxHosts hosts or MaxBytes bytes gives
// an error wrapping ErrTooLarge. The package documentation has the grammar
// and the differences from Slurm.
func Expand(expr string) ([]string, error) {
	pats, err := parse(expr)
	if err != nil {
		return nil, err
	}
	var hosts, size uint64
	for _, p := range pats {
		n, b := p.size()
		hosts, size = addSat(hosts, n), addSat(size, b)
	}
	if hosts > MaxHosts {
		return nil, fmt.Errorf("%w: %s expands to %s hosts, more than the maximum of %d",
			ErrTooLarge, quote(expr), countString(hosts), MaxHosts)
	}
	if size > MaxBytes {
		return nil, fmt.Errorf("%w: %s expands to %s bytes of host names, more than the maximum of %d",
			ErrTooLarge, quote(expr), countString(size), MaxBytes)
	}
	// All names go into one string; the hosts are slices of it.
	var b strings.Builder
	b.Grow(int(size))
	ends := make([]int, 0, hosts)
	for _, p := range pats {
		ends = p.expand(&b, ends)
	}
	all := b.String()
	out := make([]string, len(ends))
	start := 0
	for i, end := range ends {
		out[i] = all[start:end]
		start = end
	}
	return out, nil
}

// Count returns the number of hosts Expand would return for expr, without
// expanding it and without the MaxHosts limit. A malformed expression gives a
// *SyntaxError; a count that does not fit in an int gives an error wrapping
// ErrTooLarge.
func Count(expr string) (int, error) {
	pats, err := parse(expr)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, p := range pats {
		c, _ := p.size()
		n = addSat(n, c)
	}
	if n > math.MaxInt {
		return 0, fmt.Errorf("%w: %s has %s hosts, more than an int holds", ErrTooLarge, quote(expr), countString(n))
	}
	return int(n), nil
}

// quote quotes expr for an error message, shortened past maxQuoted bytes.
func quote(expr string) string {
	if len(expr) > maxQuoted {
		return strconv.Quote(expr[:maxQuoted]) + "..."
	}
	return strconv.Quote(expr)
}

// countString formats a saturated count: math.MaxUint64 means "at least".
func countString(n uint64) string {
	if n == math.MaxUint64 {
		return "at least 18446744073709551615"
	}
	return strconv.FormatUint(n, 10)
}

// size returns the number of hosts p expands to and the total length of their
// names in bytes, both saturated at math.MaxUint64.
func (p pattern) size() (hosts, bytes uint64) {
	litLen := uint64(0)
	for _, l := range p.lits {
		litLen += uint64(len(l))
	}
	counts := make([]uint64, len(p.groups))
	lens := make([]uint64, len(p.groups))
	hosts = 1
	for i, g := range p.groups {
		for _, s := range g {
			counts[i] = addSat(counts[i], addSat(s.hi-s.lo, 1))
			lens[i] = addSat(lens[i], digitsSum(s))
		}
		hosts = mulSat(hosts, counts[i])
	}
	// Every host has all the literal text; group i's numbers each appear once
	// per combination of the other groups: the product of the counts before i
	// (before) times that of the counts after i (after[i]).
	bytes = mulSat(hosts, litLen)
	after := make([]uint64, len(p.groups)+1)
	after[len(p.groups)] = 1
	for i := len(p.groups) - 1; i >= 0; i-- {
		after[i] = mulSat(after[i+1], counts[i])
	}
	before := uint64(1)
	for i := range p.groups {
		bytes = addSat(bytes, mulSat(lens[i], mulSat(before, after[i+1])))
		before = mulSat(before, counts[i])
	}
	return hosts, bytes
}

// digitsSum returns the total length of s's numbers as written, saturated.
func digitsSum(s span) uint64 {
	var sum uint64
	lo := s.lo
	for {
		d := digits(lo)
		top := s.hi // the last number with d digits, capped at s.hi
		if d < 20 {
			top = min(s.hi, pow10(d)-1)
		}
		sum = addSat(sum, mulSat(addSat(top-lo, 1), uint64(max(d, s.width))))
		if top == s.hi {
			return sum
		}
		lo = top + 1
	}
}

// expand writes the hosts of p to b and appends the end offset of each to
// ends. The last group varies fastest, then the first, second and so on up to
// the second-to-last, which varies slowest: Slurm's _push_range_list expands
// the last group of a pattern in its innermost loop and peels the other
// groups off the prefix from the right, outermost first.
func (p pattern) expand(b *strings.Builder, ends []int) []int {
	k := len(p.groups)
	if k == 0 {
		b.WriteString(p.lits[0])
		return append(ends, b.Len())
	}
	// order lists the groups from the outermost loop to the innermost.
	order := make([]int, 0, k)
	for i := k - 2; i >= 0; i-- {
		order = append(order, i)
	}
	order = append(order, k-1)
	cur := make([][]byte, k) // the number written for each group
	var loop func(depth int)
	loop = func(depth int) {
		gi := order[depth]
		for _, s := range p.groups[gi] {
			cur[gi] = appendPadded(cur[gi][:0], s.lo, s.width)
			for n := s.lo; ; n++ {
				if n != s.lo {
					cur[gi] = increment(cur[gi])
				}
				if depth == k-1 {
					b.WriteString(p.lits[0])
					for i := range k {
						b.Write(cur[i])
						b.WriteString(p.lits[i+1])
					}
					ends = append(ends, b.Len())
				} else {
					loop(depth + 1)
				}
				if n == s.hi {
					break
				}
			}
		}
	}
	loop(0)
	return ends
}

// appendPadded appends n in decimal, zero padded to at least width digits.
func appendPadded(dst []byte, n uint64, width int) []byte {
	var buf [20]byte
	d := strconv.AppendUint(buf[:0], n, 10)
	for range width - len(d) {
		dst = append(dst, '0')
	}
	return append(dst, d...)
}

// increment adds one to the zero-padded decimal number in d, in place, and
// returns it: "0099" becomes "0100" and "99" becomes "100".
func increment(d []byte) []byte {
	for i := len(d) - 1; i >= 0; i-- {
		if d[i] != '9' {
			d[i]++
			return d
		}
		d[i] = '0'
	}
	return append([]byte{'1'}, d...)
}

// digits returns the number of decimal digits of n (1 for 0).
func digits(n uint64) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// pow10 returns 10**d for d <= 19.
func pow10(d int) uint64 {
	p := uint64(1)
	for range d {
		p *= 10
	}
	return p
}

func addSat(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

func mulSat(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}
