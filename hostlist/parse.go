package hostlist

import (
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// pattern is one separator-delimited element of an expression: literal text
// around zero or more bracket groups, e.g. "rack[1-2]-node[01-04]".
type pattern struct {
	offset int      // byte offset of the pattern in the expression
	lits   []string // the text around the groups: len(groups)+1 pieces
	groups []group  // the bracket groups, left to right
}

// group is the comma-separated ranges of one bracket group, in order.
type group []span

// span is one range of a bracket group: lo..hi inclusive, each number written
// with at least width digits (zero padded), width being the length of the
// range's start as written (Slurm's _parse_single_range).
type span struct {
	lo, hi uint64
	width  int
}

// isSep reports whether c separates patterns: a comma or ASCII whitespace.
// Slurm's hostlist_create separates on comma, space and tab.
func isSep(c byte) bool {
	switch c {
	case ',', ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// checkText refuses what no host name holds and a terminal would show raw or reorder:
// invalid UTF-8, a control character other than the separators (escape, NUL, carriage
// return inside a name...) and a Unicode format character (U+202E right-to-left
// override, U+200B zero-width space, U+FEFF).
func checkText(expr string) error {
	for i, c := range expr {
		switch {
		case c == utf8.RuneError && !strings.HasPrefix(expr[i:], "\uFFFD"):
			return syntaxErr(expr, i, expr[i:i+1], "invalid UTF-8")
		case c < utf8.RuneSelf && isSep(byte(c)):
		case unicode.IsControl(c):
			return syntaxErr(expr, i, string(c), "control character %U", c)
		case unicode.Is(unicode.Cf, c):
			return syntaxErr(expr, i, string(c), "invisible format character %U", c)
		}
	}
	return nil
}

// parse splits expr into its patterns; empty patterns are skipped.
func parse(expr string) ([]pattern, error) {
	if err := checkText(expr); err != nil {
		return nil, err
	}
	var pats []pattern
	for i := 0; i < len(expr); {
		if isSep(expr[i]) {
			i++
			continue
		}
		p, next, err := parsePattern(expr, i)
		if err != nil {
			return nil, err
		}
		pats = append(pats, p)
		i = next
	}
	return pats, nil
}

// parsePattern parses the pattern starting at expr[start] and returns it with
// the offset just past it.
func parsePattern(expr string, start int) (pattern, int, error) {
	p := pattern{offset: start}
	lit := start
	i := start
	for i < len(expr) && !isSep(expr[i]) {
		switch expr[i] {
		case ']':
			return p, 0, syntaxErr(expr, i, "]", "unbalanced bracket: no matching '['")
		case '[':
			p.lits = append(p.lits, expr[lit:i])
			g, next, err := parseGroup(expr, i)
			if err != nil {
				return p, 0, err
			}
			p.groups = append(p.groups, g)
			i, lit = next, next
		default:
			i++
		}
	}
	p.lits = append(p.lits, expr[lit:i])
	return p, i, nil
}

// parseGroup parses the bracket group whose '[' is at expr[open] and returns
// it with the offset just past its ']'.
func parseGroup(expr string, open int) (group, int, error) {
	end := -1
	for j := open + 1; j < len(expr) && end < 0; j++ {
		switch expr[j] {
		case ']':
			end = j
		case '[':
			return nil, 0, syntaxErr(expr, j, "[", "nested bracket inside the '[' at column %d", open+1)
		}
	}
	if end < 0 {
		return nil, 0, syntaxErr(expr, open, "[", "unbalanced bracket: no matching ']'")
	}
	var g group
	item := open + 1
	for j := open + 1; j <= end; j++ {
		if j < end && expr[j] != ',' {
			continue
		}
		s, err := parseSpan(expr, item, j)
		if err != nil {
			return nil, 0, err
		}
		g = append(g, s)
		item = j + 1
	}
	return g, end + 1, nil
}

// parseSpan parses the range expr[from:to], "N" or "N-M".
func parseSpan(expr string, from, to int) (span, error) {
	text := expr[from:to]
	if text == "" {
		return span{}, syntaxErr(expr, from, text, "empty range")
	}
	if strings.IndexByte(text, ':') >= 0 {
		return span{}, syntaxErr(expr, from, text, "unsupported step range (Slurm hostlists have no N-M:STEP form)")
	}
	loText, hiText, isRange := strings.Cut(text, "-")
	if loText == "" {
		return span{}, syntaxErr(expr, from, text, "range without a start (numbers cannot be negative)")
	}
	if isRange && hiText == "" {
		return span{}, syntaxErr(expr, from, text, "range without an end")
	}
	for k := 0; k < len(text); k++ {
		c := text[k]
		if isDigit(c) || (c == '-' && k == len(loText)) {
			continue
		}
		what := "invalid character"
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' {
			what = "whitespace"
		}
		r, _ := utf8.DecodeRuneInString(text[k:]) // the whole character, not its first byte
		return span{}, syntaxErr(expr, from, text, "%s %q in range", what, r)
	}
	lo, err := parseNumber(expr, from, loText)
	if err != nil {
		return span{}, err
	}
	hi := lo
	if isRange {
		if hi, err = parseNumber(expr, from+len(loText)+1, hiText); err != nil {
			return span{}, err
		}
	}
	if lo > hi {
		return span{}, syntaxErr(expr, from, text, "reversed range (%d is greater than %d)", lo, hi)
	}
	return span{lo: lo, hi: hi, width: len(loText)}, nil
}

// parseNumber parses the decimal digits text found at expr[at].
func parseNumber(expr string, at int, text string) (uint64, error) {
	n, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, syntaxErr(expr, at, text, "number too large (the largest is %d)", uint64(math.MaxUint64))
	}
	return n, nil
}
