// Command gangrun is a distributed-training launcher and rendezvous coordinator: it
// reserves GPUs across nodes as a gang, hands every worker torchrun's environment, and
// restarts the whole gang from its latest complete checkpoint when anything fails.
//
// This package is CLI glue only: it parses flags, calls a package and prints. The
// stable command line is documented in README.md and docs/ (docs/run.md for `run`).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/slurm"
)

// Exit codes shared by every subcommand (docs/run.md, "Failures, restarts, exit codes").
const (
	exitOK       = 0
	exitFailure  = 1   // a failure the command reports
	exitUsage    = 2   // usage error: nothing was started
	exitNotExec  = 126 // the command to launch exists but cannot be executed (as in POSIX shells)
	exitNotFound = 127 // the command to launch does not exist (as in POSIX shells)
)

// guardianCommand is the hidden subcommand `gangrun run` starts as its guardian process
// (internal/proc.Guardian): it kills the workers' process groups if gangrun dies.
const guardianCommand = "__guardian"

// env is what a subcommand may touch of the outside world. Tests build their own.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// signals delivers the signals gangrun forwards or acts on; nil in tests that do
	// not need them.
	signals <-chan os.Signal
	// self is the gangrun binary, for re-executing it as the guardian process; "" (in
	// tests that call dispatch in-process) runs without a guardian, since the test
	// binary is not gangrun.
	self string
	// startup stops a command that catches signals when one arrives before its
	// long-running loop reads them (signals.go); nil in tests that call dispatch
	// in-process and for the other commands.
	startup *startup
}

// command is one `gangrun NAME` subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) int
	// signals: the command reads env.signals (it forwards them to workers, or releases
	// what it holds before it exits). The others keep the default dispositions, so
	// Ctrl-C and SIGTERM end them at once whatever they are doing.
	signals bool
}

func commands() []command {
	return []command{
		{"run", "launch and supervise a training command on this node or a gang of nodes", runRun, true},
		{"topo", "show this node's GPUs, links and RDMA NICs (like nvidia-smi topo -m)", runTopo, false},
		{"agent", "register this node with Consul and keep it alive", runAgent, true},
		{"nodes", "list the cluster's nodes and free GPUs (like sinfo)", runNodes, false},
		{"alloc", "reserve a gang of GPUs across nodes, all or nothing (like salloc)", runAlloc, true},
		// submit and cancel catch signals: under a user's token they wait for the elected
		// agent's answer, and a signal takes the request back (job.SubmitAs).
		{"submit", "queue a job the cluster places, launches and supervises (like sbatch)", runSubmit, true},
		{"queue", "list jobs and allocations (like squeue)", runQueue, false},
		{"show", "show one job, grant or request (like scontrol show job)", runShow, false},
		{"cancel", "cancel jobs, release grants or withdraw requests (like scancel)", runCancel, true},
		{"logs", "print a job's output (like reading slurm-JOBID.out)", runLogs, false},
		{"policy", "set or show the scheduling policy: partitions, accounts, limits, priority weights", runPolicy, false},
		{"acct", "list finished jobs and sum their GPU-hours (like sacct and sreport)", runAcct, false},
		{"audit", "list administrative actions: who cancelled, drained, resumed, changed the policy", runAudit, false},
		{"acl", "set up Consul ACL policies and tokens for agents, operators and users", runACL, false},
		{"drain", "mark a node drained: no new grants land on it, and jobs running there are moved off", runDrain, false},
		{"resume", "return a drained node to service", runResume, false},
		{"ckpt", "find, list, verify and prune checkpoints", runCkpt, false},
		{"bench", "benchmark collectives across the gang (nccl-tests figures)", runBench, true},
		{"hostlist", "expand or compress Slurm hostlists", runHostlist, false},
		{"slurm-links", "make links named sbatch, srun, squeue, ... to gangrun in a directory (Slurm's commands)", runSlurmLinks, false},
		{"doctor", "check what this node needs to run the agent: Consul, munge, cgroups, GPUs, NICs, clock, version", runDoctor, false},
		{"version", "print gangrun's version", runVersion, false},
	}
}

func main() {
	if len(os.Args) > 2 && os.Args[1] == job.TaskPIDCommand && os.Args[2] == "--" {
		// Before anything else: the command must start with gangrun's signal
		// dispositions untouched (SIGPIPE is ignored below, and that would be inherited).
		os.Exit(execWithTaskPID(os.Args[3:]))
	}
	args := os.Args[1:]
	if slurm.Is(os.Args[0]) {
		// Called as sbatch, srun, squeue...: Slurm's command of that name.
		args = append([]string{filepath.Base(os.Args[0])}, args...)
	}
	sigs := make(chan os.Signal, 16)
	// The signals gangrun forwards to its workers (docs/run.md, "Processes and signals"), caught only
	// for the commands that act on them (and the guardian, which must outlive them).
	// SIGPIPE is ignored by all: a closed stdout must not kill the supervisor
	// mid-teardown, and a write to it then fails with an error the command reports.
	catches := catchesSignals(args)
	if catches {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	}
	signal.Ignore(syscall.SIGPIPE)
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, signals: sigs}
	if exe, err := os.Executable(); err == nil {
		e.self = exe
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if catches && args[0] != guardianCommand {
		// Until the command's loop takes them over, a terminating signal ends it at once
		// (a caught signal would otherwise wait in sigs while it probes, reads a file or
		// waits for Consul).
		st := newStartup(commandName(args), sigs, cancel, os.Stderr, os.Exit)
		e.startup, e.signals = st, st.signals
		e.stdout, e.stderr = st.writer(os.Stdout), st.writer(os.Stderr)
		code := st.done(dispatch(ctx, e, args))
		os.Exit(code)
	}
	os.Exit(dispatch(ctx, e, args))
}

// commandName is the command args name, as its messages call it: "run", "bench nccl".
func commandName(args []string) string {
	if len(args) > 1 && args[0] == "bench" {
		return "bench " + args[1]
	}
	return args[0]
}

// catchesSignals reports whether the command that args name acts on signals itself.
func catchesSignals(args []string) bool {
	if len(args) == 0 {
		return false
	}
	if args[0] == guardianCommand || args[0] == stepCommand {
		return true
	}
	switch args[0] {
	case "srun", "salloc", "sbatch": // pass signals to the tasks; sbatch -W waits
		return true
	}
	if args[0] == "bench" { // bench nccl runs a gang; bench parse reads a file
		return len(args) > 1 && args[1] == "nccl"
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.signals
		}
	}
	return false
}

// dispatch runs the subcommand named by args[0] and returns the process exit code.
func dispatch(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		usage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "help":
		// help CMD is CMD --help, as git's; a command that does not exist is a usage
		// error, not the list with exit 0.
		if len(args) > 1 && args[1] != "-h" && args[1] != "--help" {
			for _, c := range commands() {
				if c.name == args[1] {
					return c.run(ctx, e, []string{"--help"})
				}
			}
			fmt.Fprintf(e.stderr, "gangrun help: unknown command %s (run 'gangrun help' for the list)\n", oneLine(quote.Q(args[1])))
			return exitUsage
		}
		usage(e.stdout)
		return exitOK
	case "-h", "--help":
		usage(e.stdout)
		return exitOK
	case "-v", "--version":
		return runVersion(ctx, e, nil)
	}
	if args[0] == stepCommand {
		return runStep(ctx, e, args[1:])
	}
	if slurm.Is(args[0]) {
		return runSlurm(ctx, e, args[0], args[1:])
	}
	if args[0] == guardianCommand {
		if err := proc.RunGuardianWith(os.Stdin, e.stderr, proc.GuardianHooks{RemoveCgroup: cgroup.RemoveDir}); err != nil {
			fmt.Fprintf(e.stderr, "gangrun guardian: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, e, args[1:])
		}
	}
	fmt.Fprintf(e.stderr, "gangrun: unknown command %s (run 'gangrun help' for the list)\n", oneLine(quote.Q(args[0])))
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gangrun COMMAND [FLAGS] [-- COMMAND ARGS...]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'gangrun COMMAND --help' for a command's flags.")
}

// runVersion prints gangrun's release version, the commit it was built from, and the
// schema version of each record it keeps in Consul (it writes each at that version, and
// reads that one and every older one: docs/operations.md, "Upgrades"); --json prints
// them as {"version", "commit", "schemas": {kind: version}}. It takes no arguments.
func runVersion(_ context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "version", "[--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "version", "unexpected argument %q: version takes none", fs.Arg(0))
	}
	schemas := map[string]int{}
	for _, k := range schema.Kinds() {
		schemas[string(k)] = k.Version()
	}
	if *asJSON {
		return printJSON(e, struct {
			Version string         `json:"version"`
			Commit  string         `json:"commit"`
			Schemas map[string]int `json:"schemas"`
		}{gangrun.Version(), gangrun.Commit(), schemas})
	}
	fmt.Fprintf(e.stdout, "gangrun %s (commit %s)\n", gangrun.Version(), gangrun.Commit())
	fmt.Fprintln(e.stdout, "record schemas (each written at this version; it and older ones read):")
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	for _, k := range schema.Kinds() {
		fmt.Fprintf(tw, "  %s\t%d\n", k, k.Version())
	}
	tw.Flush()
	return exitOK
}

// newFlagSet returns a pflag set that reports errors instead of exiting, and whose
// --help prints the command's usage line and flags to stdout.
func newFlagSet(e *env, name, synopsis string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("gangrun "+name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "usage: gangrun %s %s\n\n", name, synopsis)
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args into fs. It returns done=true with the exit code to use when
// the command must stop: after --help (0) or on a usage error (2, one line on stderr).
func parseFlags(e *env, fs *pflag.FlagSet, args []string) (done bool, code int) {
	err := fs.Parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		return true, exitOK // pflag already called fs.Usage
	}
	if err != nil {
		msg, ok := flagValueError(err)
		if !ok {
			msg = err.Error()
		}
		if hint := slurmHint(fs, err); hint != "" {
			msg += "; " + hint
		}
		fmt.Fprintf(e.stderr, "%s: %s\n", fs.Name(), oneLine(msg))
		return true, exitUsage
	}
	if name, found := emptyFlag(fs); found {
		fmt.Fprintf(e.stderr, "%s: --%s \"\": must not be empty\n", fs.Name(), name)
		return true, exitUsage
	}
	return false, exitOK
}

// slurmOptions maps sbatch's and salloc's option names (long, and short without its
// dash) that gangrun names otherwise to what to write instead (Slurm's sbatch(1)).
var slurmOptions = map[string]string{
	"job-name": "--name", "J": "--name",
	"N": "--nodes", "t": "--time", "p": "--partition", "A": "--account", "o": "--output",
	"d": "--dependency", "a": "--array", "export": "--env KEY=VALUE (repeatable)",
	"gres": "--gpus-per-node [TYPE:]COUNT", "gpus": "--gpus-per-node [TYPE:]COUNT (per node)", "G": "--gpus-per-node [TYPE:]COUNT (per node)",
	"ntasks-per-node": "--gpus-per-node (one worker per GPU; gangrun run's --nproc-per-node otherwise)",
	"error":           "--output (one file holds both streams)", "e": "--output (one file holds both streams)",
}

// slurmHint says what gangrun calls an sbatch option that submit's or alloc's fs does
// not know, so a Slurm user's habit gets an answer rather than a bare refusal; "" for
// other errors and commands.
func slurmHint(fs *pflag.FlagSet, err error) string {
	var ne *pflag.NotExistError
	if fs.Name() != "gangrun submit" && fs.Name() != "gangrun alloc" || !errors.As(err, &ne) {
		return ""
	}
	if to, ok := slurmOptions[ne.GetSpecifiedName()]; ok {
		return "sbatch's option; gangrun's is " + to
	}
	return ""
}

// usageErr prints a one-line usage error for cmd and returns exit code 2.
func usageErr(e *env, cmd string, format string, a ...any) int {
	fmt.Fprintf(e.stderr, "gangrun %s: %s\n", cmd, oneLine(fmt.Sprintf(format, a...)))
	return exitUsage
}

// failErr prints a one-line failure for cmd and returns exit code 1; 2 when Consul's
// ACLs refused the request (store.ErrPermissionDenied: nothing was done, docs/acl.md).
//
// A Consul that could not be reached at all is said alone, naming its address and where
// that came from (store.UnavailableError), without the operations that wrapped it.
func failErr(e *env, cmd string, err error) int {
	var ue *store.UnavailableError
	if errors.As(err, &ue) && ue.Unreachable() {
		err = ue
	}
	fmt.Fprintf(e.stderr, "gangrun %s: %s\n", cmd, oneLine(err.Error()))
	if errors.Is(err, store.ErrPermissionDenied) {
		return exitUsage
	}
	return exitFailure
}

// oneLine folds a possibly multi-line message onto one line, and escapes what a
// terminal would not show as it is: control characters (an escape sequence), Unicode
// format characters (U+202E reorders the rest of the line) and invalid UTF-8, written
// as \u202e or \xff. Values in messages are quoted with %q where they are built; this
// catches a path or a name that was not.
//
// A word longer than maxWordBytes (a 100 KB value a message quotes) is shortened to its
// first bytes and its length (quote.Short): the value is named, never echoed whole.
func oneLine(s string) string {
	words := strings.Fields(s)
	for i, w := range words {
		if len(w) > maxWordBytes {
			words[i] = shortWord(w)
		}
	}
	s = strings.Join(words, " ")
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// maxWordBytes is the longest word, in bytes, a message shows whole: longer than any
// path or name a message needs (a path is at most 4096 bytes, but one that long is
// better shown shortened too).
const maxWordBytes = 200

// shortWord shortens w to quote.Head and its length, keeping a closing quote and the
// punctuation after it: "xxxx..." (100002 bytes):
func shortWord(w string) string {
	punct := ""
	if n := len(w); n > 0 && (w[n-1] == ':' || w[n-1] == ',' || w[n-1] == ';') {
		w, punct = w[:n-1], w[n-1:]
	}
	closing := ""
	if strings.HasPrefix(w, `"`) && strings.HasSuffix(w, `"`) {
		closing = `"`
	}
	return quote.Head(w) + "..." + closing + " (" + strconv.Itoa(len(w)) + " bytes)" + punct
}

// writeJSON writes v to w as indented JSON, HTML characters unescaped.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
