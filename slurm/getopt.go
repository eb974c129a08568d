package slurm

import (
	"fmt"
	"strings"
)

// argKind is whether an option takes an argument (getopt_long's has_arg).
type argKind int

const (
	noArg argKind = iota
	reqArg
	optArg
)

// option is one option of a Slurm command: its long name, its short letter (0: none)
// and its argument. Unsupported options are known to Slurm but not built by gangrun:
// they are refused with why (docs/slurm.md lists them).
type option struct {
	long  string
	short byte
	arg   argKind
	// unsupported, when set, says why gangrun refuses the option.
	unsupported string
}

// parsed is one option as given: its long name and its argument, and its table
// entry's unsupported (why gangrun refuses it; "" for one it builds).
type parsed struct {
	name, value string
	hasValue    bool
	unsupported string
}

// values are the options given, by long name: the value each was last given (the
// filters squeue, scancel and sacct take as lists: every value, joined with commas).
type values map[string]string

// has reports whether option name was given.
func (v values) has(name string) bool {
	_, ok := v[name]
	return ok
}

// UsageError is a command line Slurm's command would refuse, in its words: Msg is the
// message (lines without the command's name), Code the exit code Slurm's command
// exits with.
type UsageError struct {
	Msg  string
	Code int
	// Before is a line the command prints before it, as Slurm's library prints it
	// (without the command's name); "" for none.
	Before string
}

func (e *UsageError) Error() string { return e.Msg }

// getopt parses args as glibc's getopt_long does for a Slurm command named cmd:
// "--name=value", "--name value", an unambiguous prefix of a long name, "-x value",
// "-xvalue" and grouped short flags ("-vv"). With stopAtFirst (sbatch's, srun's and
// salloc's "+" mode) the first argument that is no option and everything after it
// are returned as rest; otherwise non-options are collected wherever they are. "--"
// ends the options. Errors carry glibc's wording ("unrecognized option '--foo'",
// "option requires an argument -- 'p'") and code, the command's exit code for them.
func getopt(cmd string, table []option, args []string, stopAtFirst bool, code int) ([]parsed, []string, error) {
	try := fmt.Sprintf("\nTry \"%s --help\" for more information", cmd)
	if cmd == "sacct" || cmd == "sstat" {
		try = ""
	}
	bad := func(format string, a ...any) error {
		return &UsageError{Msg: fmt.Sprintf(format, a...) + try, Code: code}
	}
	var out []parsed
	add := func(o option, value string, hasValue bool) {
		out = append(out, parsed{name: o.long, value: value, hasValue: hasValue, unsupported: o.unsupported})
	}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return out, append(rest, args[i+1:]...), nil
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			o, candidates := lookupLong(table, name)
			if len(candidates) > 0 {
				var poss []string
				for _, x := range candidates {
					poss = append(poss, "'--"+x.long+"'")
				}
				return nil, nil, bad("option '--%s' is ambiguous; possibilities: %s", name, strings.Join(poss, " "))
			}
			if o.long == "" {
				return nil, nil, bad("unrecognized option '%s'", a)
			}
			switch o.arg {
			case noArg:
				if hasValue {
					return nil, nil, bad("option '--%s' doesn't allow an argument", o.long)
				}
			case reqArg:
				if !hasValue {
					if i+1 >= len(args) {
						return nil, nil, bad("option '--%s' requires an argument", o.long)
					}
					i++
					value, hasValue = args[i], true
				}
			}
			add(o, value, hasValue)
		case strings.HasPrefix(a, "-") && a != "-":
			for k := 1; k < len(a); k++ {
				o, ok := lookupShort(table, a[k])
				if !ok {
					return nil, nil, bad("invalid option -- '%c'", a[k])
				}
				switch o.arg {
				case noArg:
					add(o, "", false)
					continue
				case optArg:
					if k+1 < len(a) {
						add(o, a[k+1:], true)
					} else {
						add(o, "", false)
					}
					k = len(a) // the rest of the word was the argument
				case reqArg:
					switch {
					case k+1 < len(a):
						add(o, a[k+1:], true)
					case i+1 < len(args):
						i++
						add(o, args[i], true)
					default:
						return nil, nil, bad("option requires an argument -- '%c'", a[k])
					}
					k = len(a)
				}
			}
		default:
			if stopAtFirst {
				return out, append(rest, args[i:]...), nil
			}
			rest = append(rest, a)
		}
	}
	return out, rest, nil
}

// lookupLong finds the long option name: exactly, else the only one it is a prefix of
// (getopt_long's abbreviations). When it is a prefix of several, it returns none and
// those (an ambiguous abbreviation); when of none, neither.
func lookupLong(table []option, name string) (option, []option) {
	var found []option
	for _, o := range table {
		if o.long == name {
			return o, nil
		}
		if name != "" && strings.HasPrefix(o.long, name) {
			found = append(found, o)
		}
	}
	if len(found) == 1 {
		return found[0], nil
	}
	return option{}, found
}

// lookupShort finds the option whose short letter is c; false when none has it.
func lookupShort(table []option, c byte) (option, bool) {
	for _, o := range table {
		if o.short == c && c != 0 {
			return o, true
		}
	}
	return option{}, false
}
