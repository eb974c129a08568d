package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/checkpoint"
)

// ckptUsage returns `gangrun ckpt --help`. The names looked for and the --format
// values come from the checkpoint package's layouts.
func ckptUsage() string {
	return `usage: gangrun ckpt SUBCOMMAND [FLAGS] ARG

  latest DIR           print the newest complete checkpoint's path (exit 1 when none)
  ls DIR               list every candidate: step, format, complete or why not, size, time
  verify PATH          judge one checkpoint (exit 1 when incomplete)
  prune DIR --keep N   keep the newest N complete checkpoints; a dry run unless --yes

` + wrap("gangrun ckpt looks in DIR for "+checkpoint.NamesLookedFor()+
		". Each layout's completion rule is in docs/checkpoint.md.", ckptHelpWidth) + `

` + wrap("Every subcommand takes --format ("+strings.Join(formatNames(), ", ")+") and --json. "+
		"Exit codes: 0 success; 1 no complete checkpoint, an incomplete checkpoint, or a failed deletion; "+
		"2 bad flags or a DIR/PATH that cannot be used.", ckptHelpWidth) + "\n"
}

// ckptHelpWidth is the column ckptUsage wraps its paragraphs at, in characters.
const ckptHelpWidth = 87

// formatNames returns "auto" and every checkpoint format, in the layouts' order.
func formatNames() []string {
	names := []string{"auto"}
	for _, f := range checkpoint.Formats() {
		names = append(names, string(f))
	}
	return names
}

// wrap breaks text into lines of at most width characters at spaces (a longer word
// stands alone).
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(text) {
		switch {
		case n == 0:
		case n+1+len(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

// runCkpt dispatches `gangrun ckpt SUBCOMMAND`.
func runCkpt(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		return usageErr(e, "ckpt", "missing subcommand (latest, ls, verify or prune)")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, ckptUsage())
		return exitOK
	case "latest":
		return runCkptLatest(ctx, e, args[1:])
	case "ls":
		return runCkptLs(ctx, e, args[1:])
	case "verify":
		return runCkptVerify(ctx, e, args[1:])
	case "prune":
		return runCkptPrune(ctx, e, args[1:])
	}
	return usageErr(e, "ckpt", "unknown subcommand %q (want latest, ls, verify or prune)", args[0])
}

// ckptFlags are the flags every ckpt subcommand shares.
type ckptFlags struct {
	format string
	json   bool
}

func (f *ckptFlags) register(fs *pflag.FlagSet) {
	names := formatNames()
	help := "checkpoint layout: " + strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	fs.StringVar(&f.format, "format", "auto", help)
	fs.BoolVar(&f.json, "json", false, "print JSON")
}

// parseCkptArgs parses a ckpt subcommand's flags and its one positional argument. It
// returns done=true with the exit code when the command must stop.
func parseCkptArgs(e *env, fs *pflag.FlagSet, f *ckptFlags, what string, args []string) (arg string, opts checkpoint.Options, done bool, code int) {
	if done, code := parseFlags(e, fs, args); done {
		return "", opts, true, code
	}
	cmd := strings.TrimPrefix(fs.Name(), "gangrun ")
	format, err := checkpoint.ParseFormat(f.format)
	if err != nil {
		return "", opts, true, usageErr(e, cmd, "--format: %v", err)
	}
	switch fs.NArg() {
	case 1:
		if fs.Arg(0) == "" {
			return "", opts, true, usageErr(e, cmd, "%s is an empty string", what)
		}
	case 0:
		return "", opts, true, usageErr(e, cmd, "missing %s", what)
	default:
		return "", opts, true, usageErr(e, cmd, "want one %s, got %d arguments: %s", what, fs.NArg(), strings.Join(fs.Args(), " "))
	}
	return fs.Arg(0), checkpoint.Options{Format: format}, false, exitOK
}

// ckptErr prints err for cmd: a DIR or PATH that cannot be used is a usage error (2),
// anything else a failure (1).
func ckptErr(e *env, cmd string, err error) int {
	var de *checkpoint.DirError
	if errors.As(err, &de) {
		return usageErr(e, cmd, "%v", err)
	}
	return failErr(e, cmd, err)
}

func runCkptLatest(_ context.Context, e *env, args []string) int {
	var f ckptFlags
	fs := newFlagSet(e, "ckpt latest", "DIR [--format F] [--json]")
	f.register(fs)
	dir, opts, done, code := parseCkptArgs(e, fs, &f, "checkpoint directory DIR", args)
	if done {
		return code
	}
	cp, err := checkpoint.Latest(dir, opts)
	var nc *checkpoint.NoCompleteError
	switch {
	case errors.As(err, &nc):
		noun := "candidates"
		if len(nc.Rejected) == 1 {
			noun = "candidate"
		}
		fmt.Fprintf(e.stderr, "gangrun ckpt latest: %s in %s (%d %s)\n", checkpoint.ErrNoComplete, dir, len(nc.Rejected), noun)
		if len(nc.Rejected) == 0 {
			fmt.Fprintln(e.stderr, "  no candidates: see 'gangrun ckpt --help' for the names looked for")
		}
		for _, r := range nc.Rejected {
			fmt.Fprintf(e.stderr, "  %s: %s\n", r.Path, oneLine(r.Reason))
		}
		for _, n := range nc.Notes {
			fmt.Fprintf(e.stderr, "  note: %s\n", oneLine(n))
		}
		if f.json {
			writeJSON(e.stdout, map[string]any{"dir": dir, "error": checkpoint.ErrNoComplete.Error(), "rejected": nonNil(nc.Rejected), "notes": nc.Notes})
		}
		return exitFailure
	case err != nil:
		return ckptErr(e, "ckpt latest", err)
	}
	if f.json {
		writeJSON(e.stdout, cp)
	} else {
		fmt.Fprintln(e.stdout, cp.Path)
	}
	return exitOK
}

func nonNil(cps []checkpoint.Checkpoint) []checkpoint.Checkpoint {
	if cps == nil {
		return []checkpoint.Checkpoint{}
	}
	return cps
}

func runCkptLs(_ context.Context, e *env, args []string) int {
	var f ckptFlags
	fs := newFlagSet(e, "ckpt ls", "DIR [--format F] [--json]")
	f.register(fs)
	dir, opts, done, code := parseCkptArgs(e, fs, &f, "checkpoint directory DIR", args)
	if done {
		return code
	}
	l, err := checkpoint.Inspect(dir, opts)
	if err != nil {
		return ckptErr(e, "ckpt ls", err)
	}
	if f.json {
		l.Checkpoints = nonNil(l.Checkpoints)
		writeJSON(e.stdout, l)
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tFORMAT\tSTATUS\tSIZE_BYTES\tMODIFIED\tPATH\tDETAIL")
	for _, c := range l.Checkpoints {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", stepText(c.Step), c.Format, status(c), c.SizeBytes, timeText(c.ModTime), c.Path, detail(c))
	}
	tw.Flush()
	for _, n := range l.Notes {
		fmt.Fprintf(e.stderr, "note: %s\n", oneLine(n))
	}
	return exitOK
}

func stepText(step int64) string {
	if step < 0 {
		return "-"
	}
	return strconv.FormatInt(step, 10)
}

func status(c checkpoint.Checkpoint) string {
	s := "incomplete"
	if c.Complete {
		s = "complete"
	}
	if c.Pinned {
		s += ",pinned"
	}
	return s
}

func detail(c checkpoint.Checkpoint) string {
	var parts []string
	if c.Link != "" {
		parts = append(parts, "-> "+c.Link)
	}
	if c.Reason != "" {
		parts = append(parts, oneLine(c.Reason))
	}
	return strings.Join(parts, "; ")
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func runCkptVerify(_ context.Context, e *env, args []string) int {
	var f ckptFlags
	fs := newFlagSet(e, "ckpt verify", "PATH [--format F] [--json]")
	f.register(fs)
	path, opts, done, code := parseCkptArgs(e, fs, &f, "checkpoint PATH", args)
	if done {
		return code
	}
	cp, err := checkpoint.Verify(path, opts)
	if err != nil {
		return ckptErr(e, "ckpt verify", err)
	}
	if f.json {
		writeJSON(e.stdout, cp)
	} else if cp.Complete {
		fmt.Fprintf(e.stdout, "%s: complete (%s, step %s)\n", cp.Path, cp.Format, stepText(cp.Step))
	} else {
		fmt.Fprintf(e.stdout, "%s: incomplete (%s, step %s): %s\n", cp.Path, cp.Format, stepText(cp.Step), oneLine(cp.Reason))
	}
	if !cp.Complete {
		return exitFailure
	}
	return exitOK
}

func runCkptPrune(ctx context.Context, e *env, args []string) int {
	var f ckptFlags
	fs := newFlagSet(e, "ckpt prune", "DIR --keep N [--yes] [--format F] [--json]")
	keep := fs.Int("keep", -1, "how many of the newest complete checkpoints to keep (at least 1; required)")
	yes := fs.Bool("yes", false, "delete; without it, only print what would be deleted")
	f.register(fs)
	dir, opts, done, code := parseCkptArgs(e, fs, &f, "checkpoint directory DIR", args)
	if done {
		return code
	}
	if !fs.Changed("keep") {
		return usageErr(e, "ckpt prune", "--keep N is required")
	}
	if *keep < 1 {
		return usageErr(e, "ckpt prune", "--keep %d: must be at least 1 (the newest complete checkpoint is what a restart resumes from)", *keep)
	}
	plan, err := checkpoint.Prune(dir, *keep, opts)
	if err != nil {
		return ckptErr(e, "ckpt prune", err)
	}
	var applyErr error
	if *yes {
		applyErr = plan.ApplyContext(ctx)
	}
	if f.json {
		writeJSON(e.stdout, struct {
			checkpoint.Plan
			Applied bool `json:"applied"`
		}{plan, *yes && applyErr == nil})
	} else {
		verb := "would delete"
		if *yes {
			verb = "delete"
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		for _, d := range plan.Kept {
			fmt.Fprintf(tw, "keep\t%s\t%s\n", d.Path, d.Why)
		}
		for _, d := range plan.Delete {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", verb, d.Path, d.Why)
		}
		tw.Flush()
		for _, n := range plan.Notes {
			fmt.Fprintf(e.stderr, "note: %s\n", oneLine(n))
		}
		if !*yes && len(plan.Delete) > 0 {
			fmt.Fprintf(e.stderr, "dry run: %d to delete, %d kept; run again with --yes to delete\n", len(plan.Delete), len(plan.Kept))
		}
	}
	if applyErr != nil {
		return failErr(e, "ckpt prune", applyErr)
	}
	return exitOK
}
