package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"syscall"

	"github.com/gangrun/gangrun/hostlist"
)

// maxHostlistLine is the longest line `hostlist compress` reads from stdin, in bytes.
const maxHostlistLine = 1 << 20

const hostlistUsage = `usage: gangrun hostlist expand [EXPR...]            one host per line (like scontrol show hostnames)
       gangrun hostlist compress [--sorted] [HOST...]  one line (like scontrol show hostlist)
       gangrun hostlist count [EXPR...]             the number of hosts

expand and count read $SLURM_JOB_NODELIST (else $SLURM_NODELIST) when no EXPR is given.
compress reads hosts or expressions one per line from stdin when no HOST is given.
`

// runHostlist is `gangrun hostlist`: Slurm hostlists expanded, compressed and counted.
func runHostlist(ctx context.Context, e *env, args []string) int {
	stdin := e.stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	return hostlistMain(ctx, e, stdin, args)
}

// hostlistMain is runHostlist with stdin passed in, so tests can feed it.
func hostlistMain(_ context.Context, e *env, stdin io.Reader, args []string) int {
	if len(args) == 0 {
		return usageErr(e, "hostlist", "missing subcommand: expand, compress or count")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, hostlistUsage)
		return exitOK
	case "expand":
		return hostlistExpand(e, args[1:])
	case "compress":
		return hostlistCompress(e, stdin, args[1:])
	case "count":
		return hostlistCount(e, args[1:])
	}
	return usageErr(e, "hostlist", "unknown subcommand %q: want expand, compress or count", args[0])
}

// hostlistArgs returns the expressions given as args, or the job's node list
// from the environment when there are none. An argument that is empty (or separators
// only) is refused: it names no host, and is a variable that was not set.
func hostlistArgs(e *env, cmd string, args []string) ([]string, int) {
	if len(args) > 0 {
		for i, a := range args {
			if code := nonEmptyExpr(e, cmd, i, a); code != exitOK {
				return nil, code
			}
		}
		return args, exitOK
	}
	for _, name := range []string{"SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if v := e.getenv(name); v != "" {
			return []string{v}, exitOK
		}
	}
	return nil, usageErr(e, cmd, "no EXPR given and SLURM_JOB_NODELIST is not set")
}

// nonEmptyExpr refuses argument i (0-based) when it holds no host at all: "" or
// separators only.
func nonEmptyExpr(e *env, cmd string, i int, arg string) int {
	if strings.Trim(arg, ", \t\n\r\v\f") == "" {
		return usageErr(e, cmd, "argument %d %q is empty: want a hostlist expression such as node[01-04]", i+1, arg)
	}
	return exitOK
}

func hostlistExpand(e *env, args []string) int {
	const cmd = "hostlist expand"
	fs := newFlagSet(e, cmd, "[EXPR...]")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	exprs, code := hostlistArgs(e, cmd, fs.Args())
	if exprs == nil {
		return code
	}
	var all [][]string
	for _, expr := range exprs {
		hosts, err := hostlist.Expand(expr)
		if err == nil {
			err = checkHostnames(hosts)
		}
		if err != nil {
			return usageErr(e, cmd, "%v", err)
		}
		all = append(all, hosts)
	}
	w := bufio.NewWriter(e.stdout)
	for _, hosts := range all {
		for _, h := range hosts {
			w.WriteString(h)
			w.WriteByte('\n')
		}
	}
	return hostlistFlush(e, cmd, w)
}

func hostlistCompress(e *env, stdin io.Reader, args []string) int {
	const cmd = "hostlist compress"
	fs := newFlagSet(e, cmd, "[--sorted] [HOST...]")
	sorted := fs.Bool("sorted", false, "sort the hosts first (like scontrol show hostlistsorted)")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	// Each argument or line may itself be a list or an expression, as with
	// scontrol show hostlist, whose ranges (prefix and padding) are kept.
	var exprs []string
	add := func(where, text string) int {
		h, err := hostlist.Expand(text)
		if err == nil {
			err = checkHostnames(h)
		}
		if err != nil {
			return usageErr(e, cmd, "%s: %v", where, err)
		}
		exprs = append(exprs, text)
		return exitOK
	}
	if fs.NArg() > 0 {
		for i, arg := range fs.Args() {
			if code := nonEmptyExpr(e, cmd, i, arg); code != exitOK {
				return code
			}
			if code := add("argument "+strconv.Itoa(i+1), arg); code != exitOK {
				return code
			}
		}
	} else {
		sc := bufio.NewScanner(stdin)
		sc.Buffer(make([]byte, 0, 64<<10), maxHostlistLine)
		for line := 1; sc.Scan(); line++ {
			if code := add("stdin line "+strconv.Itoa(line), sc.Text()); code != exitOK {
				return code
			}
		}
		if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
			return usageErr(e, cmd, "stdin: a line is longer than %d bytes", maxHostlistLine)
		} else if err != nil {
			return failErr(e, cmd, fmt.Errorf("reading stdin: %w", err))
		}
	}
	var out string
	var err error
	if *sorted {
		var hosts []string
		for _, x := range exprs {
			h, _ := hostlist.Expand(x) // checked above
			hosts = append(hosts, h...)
		}
		out = hostlist.CompressSorted(hosts)
	} else if out, err = hostlist.CompressExpr(exprs...); err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	w := bufio.NewWriter(e.stdout)
	w.WriteString(out)
	w.WriteByte('\n')
	return hostlistFlush(e, cmd, w)
}

func hostlistCount(e *env, args []string) int {
	const cmd = "hostlist count"
	fs := newFlagSet(e, cmd, "[EXPR...]")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	exprs, code := hostlistArgs(e, cmd, fs.Args())
	if exprs == nil {
		return code
	}
	total := 0
	for _, expr := range exprs {
		n, err := hostlist.Count(expr)
		if err == nil && n > math.MaxInt-total {
			err = fmt.Errorf("%w: the expressions together have more hosts than an int holds", hostlist.ErrTooLarge)
		}
		if err != nil {
			return usageErr(e, cmd, "%v", err)
		}
		total += n
	}
	fmt.Fprintln(e.stdout, total)
	return exitOK
}

// hostlistFlush flushes w; a reader that went away (EPIPE, as with `| head`)
// ends the command quietly with exit 1, any other write error is reported.
func hostlistFlush(e *env, cmd string, w *bufio.Writer) int {
	err := w.Flush()
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, syscall.EPIPE):
		return exitFailure
	}
	return failErr(e, cmd, fmt.Errorf("writing output: %w", err))
}

// checkHostnames returns the first of hosts that DNS would not take as a host name.
func checkHostnames(hosts []string) error {
	for _, h := range hosts {
		if err := hostlist.CheckHostname(h); err != nil {
			return err
		}
	}
	return nil
}
