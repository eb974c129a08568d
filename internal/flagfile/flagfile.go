// Package flagfile reads a command's flags from a file of KEY = VALUE lines: what
// `gangrun agent --config FILE` reads, so that a systemd unit's ExecStart stays one
// fixed line and every agent flag is set in /etc/gangrun/agent.conf
// (docs/operations.md, "The agent's settings").
//
// The format, one setting a line:
//
//	# a comment: a line whose first non-blank character is '#'
//	consul = 10.0.0.1:8500
//	labels = partition=gpu,rack=r12
//	labels = switch=s3          (a repeatable flag takes its key again)
//	no-scheduler = true
//
// KEY is the flag's long name without its dashes. VALUE is the rest of the line with
// the blanks around it removed, and one pair of matching double or single quotes
// around it removed too (no escapes: nothing inside is interpreted). A '#' after a
// value is part of the value. Blank lines are skipped. Refused, naming the file and
// line: a line without '=', an empty key or value (leave the line out to keep the
// default), a key that is no flag of the command, a key given twice for a flag that
// does not repeat, NUL bytes, invalid UTF-8 and DOS line breaks. The format is that of
// systemd's EnvironmentFile= and Slurm's slurm.conf (KEY=VALUE a line), with flag
// names as keys so that `gangrun agent --help` documents it.
//
// Flags given on the command line win over the file (Apply leaves a flag the command
// line set alone), as slurmd's and consul's options win over their files.
package flagfile

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/userfile"
)

// MaxBytes bounds a settings file, in bytes: an agent's settings take a few hundred.
const MaxBytes = 64 << 10

// Setting is one KEY = VALUE line of a settings file.
type Setting struct {
	// Key is the flag's name, Value its value as the line gives it (quotes removed).
	Key, Value string
	// Line is the line's number, from 1.
	Line int
}

// Error is a settings file's error: the file (when known), the line (0 for the file as
// a whole) and what is wrong.
type Error struct {
	Path string
	Line int
	Err  error
}

// Error reads "FILE line N: what is wrong".
func (e *Error) Error() string {
	var b strings.Builder
	if e.Path != "" {
		b.WriteString(quote.Short(e.Path))
	}
	if e.Line > 0 {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "line %d", e.Line)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// ErrUnknownKey is wrapped by the error for a key that is no flag of the command.
var ErrUnknownKey = errors.New("unknown key")

// Read reads and parses the settings file at path (a regular file, at most MaxBytes;
// userfile.ReadFile: a FIFO or a device is refused without blocking). Errors are an
// *Error naming path, or userfile's error naming it.
func Read(path string) ([]Setting, error) {
	data, err := userfile.ReadFile(path, MaxBytes)
	if err != nil {
		return nil, err
	}
	s, err := Parse(data)
	var fe *Error
	if errors.As(err, &fe) {
		fe.Path = path
	}
	return s, err
}

// Parse reads settings from data (see the package doc for the format). Errors are an
// *Error with the line and no path.
func Parse(data []byte) ([]Setting, error) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return nil, &Error{Line: bytes.Count(data[:i], []byte("\n")) + 1, Err: errors.New("holds a NUL byte: not a text file")}
	}
	var out []Setting
	for n, line := range strings.Split(string(data), "\n") {
		num := n + 1
		if !utf8.ValidString(line) {
			return nil, &Error{Line: num, Err: errors.New("is not valid UTF-8")}
		}
		if strings.HasSuffix(line, "\r") {
			return nil, &Error{Line: num, Err: errors.New("ends in a DOS line break (\\r): convert the file with dos2unix")}
		}
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			return nil, &Error{Line: num, Err: fmt.Errorf("%s: want KEY = VALUE", quote.Q(t))}
		}
		k, v = strings.TrimSpace(k), unquote(strings.TrimSpace(v))
		if k == "" {
			return nil, &Error{Line: num, Err: fmt.Errorf("%s: no key before '='", quote.Q(t))}
		}
		if strings.HasPrefix(k, "-") {
			return nil, &Error{Line: num, Err: fmt.Errorf("key %s: write the flag's name without its dashes (%s)", quote.Q(k), strings.TrimLeft(k, "-"))}
		}
		if v == "" {
			return nil, &Error{Line: num, Err: fmt.Errorf("%s has no value: leave the line out to keep the default", k)}
		}
		out = append(out, Setting{Key: k, Value: v, Line: num})
	}
	return out, nil
}

// unquote removes one pair of matching double or single quotes around v.
func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		return v[1 : len(v)-1]
	}
	return v
}

// repeatable reports whether f takes several values (a list flag): its key may repeat.
func repeatable(f *pflag.Flag) bool {
	_, ok := f.Value.(pflag.SliceValue)
	return ok
}

// Check checks settings against fs without setting anything: every key a flag of fs
// and not one of skip (flags the file may not set, such as the one naming the file),
// a key given twice only for a list flag. Errors are an *Error naming path and the
// line; an unknown key's wraps ErrUnknownKey and suggests the flag meant.
func Check(fs *pflag.FlagSet, path string, settings []Setting, skip ...string) error {
	seen := map[string]int{}
	for _, s := range settings {
		f := fs.Lookup(s.Key)
		if f == nil || slices.Contains(skip, s.Key) || f.Name == "help" {
			return &Error{Path: path, Line: s.Line, Err: unknownKey(fs, s.Key, skip)}
		}
		if first, dup := seen[s.Key]; dup && !repeatable(f) {
			return &Error{Path: path, Line: s.Line, Err: fmt.Errorf("%s given twice (first on line %d): it takes one value", s.Key, first)}
		}
		if _, dup := seen[s.Key]; !dup {
			seen[s.Key] = s.Line
		}
	}
	return nil
}

// Apply sets the flags of fs from settings (Check first), in the file's order, leaving
// alone every flag the command line set (fs.Changed): the command line wins. A list
// flag the command line did not set takes every value the file gives it. A value its
// flag refuses is an *Error naming the line: `FILE line N: KEY "VALUE": why`.
func Apply(fs *pflag.FlagSet, path string, settings []Setting, skip ...string) error {
	if err := Check(fs, path, settings, skip...); err != nil {
		return err
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { onCommandLine[f.Name] = true })
	for _, s := range settings {
		if onCommandLine[s.Key] {
			continue
		}
		if err := fs.Set(s.Key, s.Value); err != nil {
			return &Error{Path: path, Line: s.Line, Err: fmt.Errorf("%s %s: %w", s.Key, quote.Q(s.Value), valueCause(fs.Lookup(s.Key), err))}
		}
	}
	return nil
}

// valueCause is why f refused a value: the flag's own error (gangrun's flags word
// theirs as "must be ..."), or for pflag's plain types what they take, instead of
// strconv's words.
func valueCause(f *pflag.Flag, err error) error {
	switch t := f.Value.Type(); {
	case t == "bool":
		return errors.New("want true or false")
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return errors.New("want a whole number")
	case strings.HasPrefix(t, "float"):
		return errors.New("want a number")
	}
	var ive *pflag.InvalidValueError
	if errors.As(err, &ive) && errors.Unwrap(ive) != nil {
		return errors.Unwrap(ive)
	}
	return err
}

// unknownKey words a key fs has no flag for, suggesting the closest flag name.
func unknownKey(fs *pflag.FlagSet, key string, skip []string) error {
	best, bestDist := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || slices.Contains(skip, f.Name) {
			return
		}
		if d := distance(key, f.Name); d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	why := ""
	if slices.Contains(skip, key) {
		why = ": it cannot be set in the file"
	}
	if best != "" {
		return fmt.Errorf("%w %s%s (did you mean %s?)", ErrUnknownKey, quote.Q(key), why, best)
	}
	return fmt.Errorf("%w %s%s (the keys are the command's flags, without their dashes: see its --help)", ErrUnknownKey, quote.Q(key), why)
}

// distance is the Levenshtein distance between a and b, in bytes (keys are ASCII).
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b))
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
