package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/internal/cgroup"
)

// Bounds of the duration flags. time.ParseDuration takes up to 2562047h (292 years) and
// pflag calls anything longer "not a duration"; past these bounds a value is a typo (an
// extra digit, h for s), never a wish, and it is refused saying what is accepted.
const (
	// maxWait bounds the flags that say how long to wait for something that may never
	// come (alloc --wait, --hang-timeout): 10000h, about 14 months. 0 (for ever, or
	// off) is the way to say "no limit".
	maxWait = 10000 * time.Hour
	// maxGrace bounds the flags that give processes time to act (--term-timeout, a
	// fixed --restart-backoff, bench --pair-timeout and --join-timeout): 24h.
	maxGrace = 24 * time.Hour
	// minHangTimeout is the shortest --hang-timeout other than 0: it is checked every
	// tenth of itself, but never more often than every 100ms nor less often than
	// every 5s (launcher's hangCheckInterval), so a shorter one cannot be honoured.
	minHangTimeout = time.Second
)

// durationFlag is a duration flag with bounds: a value outside [min, max] (0 accepted
// when zeroOK, whatever min) is refused by Set with one line that says what is wanted.
type durationFlag struct {
	p        *time.Duration
	min, max time.Duration
	zeroOK   bool
	// minWhy says why min is the least (shown when a value is below it).
	minWhy string
}

// durationVar registers a bounded duration flag on fs.
func durationVar(fs *pflag.FlagSet, p *time.Duration, name string, value time.Duration, d durationFlag, usage string) {
	*p = value
	d.p = p
	fs.Var(&d, name, usage)
}

// Set parses s as a Go duration within the bounds.
func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return fmt.Errorf("must be a duration like 30s, 5m or 2h (at most %s)", formatHours(d.max))
	case v < 0:
		return errors.New("must not be negative")
	case v == 0 && d.zeroOK:
	case v < d.min:
		what := "at least " + d.min.String()
		if d.zeroOK {
			what = "0 (off) or at least " + d.min.String()
		}
		if d.minWhy != "" {
			what += ": " + d.minWhy
		}
		return errors.New("must be " + what)
	case v > d.max:
		return fmt.Errorf("must be at most %s", formatHours(d.max))
	}
	*d.p = v
	return nil
}

// String returns the current value ("30s").
func (d *durationFlag) String() string {
	if d.p == nil {
		return "0s"
	}
	return d.p.String()
}

// Type names the value in --help.
func (d *durationFlag) Type() string { return "duration" }

// formatHours writes a whole number of hours as "24h" rather than "24h0m0s".
func formatHours(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}

// emptyFlag returns the first string flag given on the command line with an empty
// value (--checkpoint-dir "", --node-name ""): an empty value is never what such a flag
// means (leaving the flag out gives its default), and was accepted in silence as "not
// given". Repeatable list flags are not judged here: --labels "" is no labels (a
// script's empty variable), and --env "" is refused by its own check (want KEY=VALUE).
func emptyFlag(fs *pflag.FlagSet) (name string, found bool) {
	fs.Visit(func(f *pflag.Flag) {
		if !found && f.Value.Type() == "string" && f.Value.String() == "" {
			name, found = f.Name, true
		}
	})
	return name, found
}

// flagValueError words a pflag value error as `--NAME "VALUE": what is wanted`, the form
// of gangrun's other usage errors, instead of pflag's `invalid argument "VALUE" for
// "--NAME" flag: ...`; ok is false for other errors.
func flagValueError(err error) (msg string, ok bool) {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) {
		return "", false
	}
	cause := errors.Unwrap(ive)
	if cause == nil {
		return "", false
	}
	return fmt.Sprintf("--%s %q: %s", ive.GetFlag().Name, ive.GetValue(), cause), true
}

// memFlag is --mem: a size in Slurm's --mem syntax (cgroup.ParseMem), held in bytes.
type memFlag struct{ p *int64 }

// memVar registers a --mem flag on fs.
func memVar(fs *pflag.FlagSet, p *int64, usage string) { fs.Var(&memFlag{p}, "mem", usage) }

// Set parses s (cgroup.ParseMem); its error is what flagValueError words as
// `--mem "s": what is wanted`.
func (m *memFlag) Set(s string) error {
	n, err := cgroup.ParseMem(s)
	if err != nil {
		_, why, _ := strings.Cut(err.Error(), ": ")
		return errors.New(why)
	}
	*m.p = n
	return nil
}

// String returns the value as --mem takes it ("4G", "0").
func (m *memFlag) String() string {
	if m.p == nil {
		return "0"
	}
	return cgroup.FormatMem(*m.p)
}

// Type names the value in --help.
func (m *memFlag) Type() string { return "size" }
