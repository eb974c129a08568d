package hostlist

import (
	"errors"
	"fmt"
)

// ErrTooLarge is wrapped by the error Expand returns when an expression would
// expand to more than MaxHosts hosts or MaxBytes bytes of host names, and by
// the error Count returns when the count does not fit in an int.
var ErrTooLarge = errors.New("hostlist too large")

// maxQuoted is the longest expression a SyntaxError quotes in full.
const maxQuoted = 80

// SyntaxError reports a malformed hostlist expression: what is wrong, the
// offending part and where it starts.
type SyntaxError struct {
	// Expr is the whole expression that was parsed.
	Expr string
	// Offset is the 0-based byte offset of Part in Expr.
	Offset int
	// Part is the offending text, for example "10-1" in "n[10-1]", or a
	// single bracket.
	Part string
	// Msg says what is wrong with Part, for example "reversed range".
	Msg string
}

// Error returns one line: the problem, the part, its 1-based column and, when
// it is at most 80 bytes long, the whole expression.
func (e *SyntaxError) Error() string {
	s := fmt.Sprintf("hostlist: %s %q at column %d", e.Msg, e.Part, e.Offset+1)
	if len(e.Expr) <= maxQuoted {
		s += fmt.Sprintf(" of %q", e.Expr)
	}
	return s
}

func syntaxErr(expr string, offset int, part, format string, a ...any) *SyntaxError {
	return &SyntaxError{Expr: expr, Offset: offset, Part: part, Msg: fmt.Sprintf(format, a...)}
}
