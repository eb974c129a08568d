// Package quote writes a value a user gave into a one-line message: quoted as Go
// quotes it (so a control character or an escape sequence reaches no terminal raw), and
// shortened when long, so that a 100 KB flag value is refused in one readable line
// instead of being echoed back whole.
package quote

import (
	"strconv"
	"unicode/utf8"
)

// Keep is how many bytes of a long value a message shows, in bytes (the cut falls on a
// character boundary at or before it).
const Keep = 60

// Max is the longest value, in bytes, shown whole; a longer one is shortened to its
// first Keep bytes and its length.
const Max = 80

// Q returns s quoted with strconv.Quote; when s is longer than Max bytes, its first Keep
// bytes quoted, then "..." and its length: "aaaa..."... (100000 bytes).
func Q(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	return strconv.Quote(Head(s)) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// Short returns s unquoted when it is at most Max bytes, else its first Keep bytes, then
// "..." and its length: for a value already quoted by its caller or known printable (a
// path).
func Short(s string) string {
	if len(s) <= Max {
		return s
	}
	return Head(s) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// Head returns the first Keep bytes of s, cut back to a character boundary.
func Head(s string) string {
	if len(s) <= Keep {
		return s
	}
	n := Keep
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Plain returns s as it is when it is short (at most Max bytes) and every character
// is printable (strconv.Quote would add only the quotes), so that a message keeps a
// tool's own words for an ordinary value ("Invalid job id: abc", as Slurm prints it);
// else Q(s), so that no control byte or escape sequence reaches a terminal raw.
func Plain(s string) string {
	if len(s) <= Max && strconv.Quote(s) == `"`+s+`"` {
		return s
	}
	return Q(s)
}
