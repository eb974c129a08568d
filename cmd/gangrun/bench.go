package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/bench/runner"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/launcher"
)

func runBench(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		return usageErr(e, "bench", "want a subcommand: nccl (run collectives across the gang) or parse FILE (read nccl-tests output)")
	}
	switch args[0] {
	case "nccl":
		return runBenchNCCL(ctx, e, args[1:])
	case "parse":
		return runBenchParse(ctx, e, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(e.stdout, "usage: gangrun bench nccl [FLAGS]        run collectives across the gang, nccl-tests figures")
		fmt.Fprintln(e.stdout, "       gangrun bench parse FILE|- [FLAGS] read nccl-tests output")
		return exitOK
	}
	return usageErr(e, "bench", "unknown subcommand %q: want nccl or parse", args[0])
}

// outputFlags are the format flags shared by `bench nccl` and `bench parse`.
type outputFlags struct{ json, csv bool }

func (o *outputFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print JSON: one object per operation (per table for parse), one per line")
	fs.BoolVar(&o.csv, "csv", false, "print CSV: one line per timed half")
}

func (o *outputFlags) format() (bench.Format, error) {
	switch {
	case o.json && o.csv:
		return 0, errors.New("--json and --csv: give one at most")
	case o.json:
		return bench.JSON, nil
	case o.csv:
		return bench.CSV, nil
	}
	return bench.Table, nil
}

func runBenchParse(_ context.Context, e *env, args []string) int {
	const cmd = "bench parse"
	fs := newFlagSet(e, cmd, "FILE|- [--json|--csv] [--op OP]")
	var out outputFlags
	out.register(fs)
	opFlag := fs.String("op", "", "operation of tables whose output does not name it (default: from the file name, as all_reduce_perf.log)")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	format, err := out.format()
	if err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	if fs.NArg() != 1 {
		return usageErr(e, cmd, "want one FILE (or - for standard input), got %d arguments", fs.NArg())
	}
	name := fs.Arg(0)
	var opts bench.ParseOptions
	if *opFlag != "" {
		ops, err := bench.ParseOps(*opFlag)
		if err != nil {
			return usageErr(e, cmd, "%v", err)
		}
		if len(ops) != 1 {
			return usageErr(e, cmd, "--op %q: give one operation", *opFlag)
		}
		opts.Op = ops[0]
	} else if op, ok := bench.OpFromProgram(filepath.Base(name)); ok {
		opts.Op, opts.OpSource = op, "file name"
	}
	var in io.Reader = e.stdin
	if name != "-" {
		// Not os.Open: a named pipe would block it until a writer came (use - to read
		// a pipe on standard input).
		f, err := userfile.OpenFile(name)
		if err != nil {
			return usageErr(e, cmd, "%v", err)
		}
		defer f.Close()
		in = f
	} else if in == nil {
		return usageErr(e, cmd, "- reads standard input, and there is none")
	}
	results, err := bench.Parse(in, opts)
	if err != nil {
		return failErr(e, cmd, fmt.Errorf("%s: %w", name, err))
	}
	if err := bench.Write(e.stdout, format, results); err != nil {
		return failErr(e, cmd, err)
	}
	// The log's own verdict: the results are printed first, as nccl-tests prints its
	// table before "# Out of bounds values : N FAILED" and exits 1.
	code := exitOK
	for i, r := range results {
		if ok, why := r.Verdict(); !ok {
			fmt.Fprintf(e.stderr, "gangrun %s: %s: %s: %s\n", cmd, name, oneLine(tableName(r, i, len(results))), oneLine(why))
			code = exitFailure
		}
	}
	return code
}

// tableName names one parsed table in a message: "all_reduce", "table 2 of 3
// (alltoall, line 40)".
func tableName(r bench.Result, i, n int) string {
	op := string(r.Op)
	if op == "" {
		op = "operation not named"
	}
	switch {
	case n > 1 && r.Line > 0:
		return fmt.Sprintf("table %d of %d (%s, line %d)", i+1, n, op, r.Line)
	case n > 1:
		return fmt.Sprintf("run %d of %d (%s)", i+1, n, op)
	}
	return op
}

// benchFlags are `gangrun bench nccl`'s flags beyond gangFlags.
type benchFlags struct {
	ops, minBytes, maxBytes string
	stepFactor              int
	warmup, iters           int
	dtype                   string
	backend, engine         string
	check                   bool
	pairwise                bool
	slowThreshold           float64
	pairTimeout             time.Duration
	joinTimeout             time.Duration
	python                  string
	out                     outputFlags
}

func (b *benchFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.ops, "op", string(bench.AllReduce), "collectives, a comma list of all_reduce, all_gather, reduce_scatter, alltoall, broadcast")
	fs.StringVar(&b.minBytes, "min-bytes", bench.FormatSize(bench.DefaultMinBytes), "smallest message in bytes; K, M, G suffixes are binary (1K = 1024)")
	fs.StringVar(&b.maxBytes, "max-bytes", bench.FormatSize(bench.DefaultMaxBytes), "largest message in bytes; K, M, G suffixes are binary (64M = 67108864)")
	fs.IntVar(&b.stepFactor, "step-factor", bench.DefaultStepFactor, "multiply the message size by this much each step")
	fs.IntVar(&b.warmup, "warmup", bench.DefaultWarmup, "untimed iterations before each size")
	fs.IntVar(&b.iters, "iters", bench.DefaultIters, "timed iterations per size; the time is their mean")
	fs.StringVar(&b.dtype, "dtype", bench.DefaultDType, "element type: float (float32), half (float16), bfloat16, double (float64), int8, uint8, int32, int64")
	fs.StringVar(&b.backend, "backend", "", "torch.distributed backend: nccl or gloo (default: nccl when the node has GPUs, else gloo)")
	fs.StringVar(&b.engine, "engine", runner.EngineTorch, "torch (the bundled PyTorch script) or nccl-tests (all_reduce_perf … on PATH)")
	fs.BoolVar(&b.check, "check", true, "check each size's result once on known data (the #wrong column)")
	fs.BoolVar(&b.pairwise, "pairwise", false, "benchmark every pair of nodes and print a node × node busbw matrix")
	fs.Float64Var(&b.slowThreshold, "slow-threshold", bench.DefaultSlowThreshold, "with --pairwise: flag a node or pair this fraction below the median")
	durationVar(fs, &b.pairTimeout, "pair-timeout", bench.DefaultPairTimeout, durationFlag{max: maxGrace},
		"with --pairwise: the longest one pair may take on a node (joining its gang, running, stopping); a pair past it fails (at most 24h)")
	durationVar(fs, &b.joinTimeout, "join-timeout", bench.DefaultJoinTimeout, durationFlag{max: maxGrace},
		"with --pairwise: the longest the nodes may take to meet before the first pair (at most 24h)")
	fs.StringVar(&b.python, "python", runner.DefaultPython, "Python interpreter with torch for the torch engine")
	b.out.register(fs)
}

// plan turns the flags into a validated bench.Plan.
func (b *benchFlags) plan() (bench.Plan, error) {
	ops, err := bench.ParseOps(b.ops)
	if err != nil {
		return bench.Plan{}, err
	}
	minB, err := bench.ParseSize(b.minBytes)
	if err != nil {
		return bench.Plan{}, fmt.Errorf("--min-bytes: %w", err)
	}
	maxB, err := bench.ParseSize(b.maxBytes)
	if err != nil {
		return bench.Plan{}, fmt.Errorf("--max-bytes: %w", err)
	}
	dtype, _, err := bench.ParseDType(b.dtype)
	if err != nil {
		return bench.Plan{}, err
	}
	p := bench.Plan{Ops: ops, MinBytes: minB, MaxBytes: maxB, StepFactor: b.stepFactor,
		Warmup: b.warmup, Iters: b.iters, DType: dtype, Check: b.check}
	return p, p.Validate()
}

func runBenchNCCL(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, benchCmd, "[FLAGS]")
	var g gangFlags
	var b benchFlags
	g.register(fs)
	b.register(fs)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	g.nprocGiven, g.nnodesGiven = fs.Changed("nproc-per-node"), fs.Changed("nnodes")
	if fs.NArg() > 0 {
		return usageErr(e, benchCmd, "unexpected argument %q: bench nccl takes flags only", fs.Arg(0))
	}
	format, err := b.out.format()
	if err != nil {
		return usageErr(e, benchCmd, "%v", err)
	}
	plan, err := b.plan()
	if err != nil {
		return usageErr(e, benchCmd, "%v", err)
	}
	cfg := runner.Config{Spec: g.spec(e, nil, nil), Plan: plan, OpsFlag: b.ops, Engine: b.engine, Backend: b.backend,
		Python: b.python, Pairwise: b.pairwise, SlowThreshold: b.slowThreshold, PairTimeout: b.pairTimeout,
		JoinTimeout: b.joinTimeout, HandOver: e.startup.handOver,
		Supervise: func(ctx context.Context, p *launcher.Prepared) launcher.Result {
			_, res := supervise(ctx, e, benchCmd, p)
			return res
		}}
	if err := cfg.Check(); err != nil {
		return benchExit(e, err)
	}
	log, err := newLogger(g.logFormat, e.stderr)
	if err != nil {
		return usageErr(e, benchCmd, "%v", err)
	}
	// Only warnings and errors: stderr carries the progress line and worker output.
	cfg.Spec.Log = log.WithOptions(zap.IncreaseLevel(zapcore.WarnLevel))
	defer cfg.Spec.Log.Sync() //nolint:errcheck // stderr cannot be synced on some systems
	// Standard output carries the results only; worker output goes to stderr, through
	// the progress line on a terminal.
	cfg.Spec.Stdout, cfg.Spec.Stderr = e.stderr, e.stderr
	if isTerminal(e.stdout) {
		pl := &progressLine{w: e.stderr}
		cfg.Spec.Stdout, cfg.Spec.Stderr, cfg.Progress = pl, pl, pl.show
	}
	if b.pairwise {
		sw, err := runner.RunPairwise(ctx, cfg)
		return printSweep(e, format, sw, err)
	}
	results, err := runner.Run(ctx, cfg)
	if results == nil {
		return benchExit(e, err)
	}
	if err := bench.Write(e.stdout, format, results); err != nil {
		return failErr(e, benchCmd, err)
	}
	return benchExit(e, err) // some halves had wrong elements: the results are printed first
}

const benchCmd = "bench nccl"

// benchExit prints err, an error of bench/runner, as gangrun bench nccl reports it and
// returns the exit code: 0 for nil; 2 for a usage error; 127 for a program not on PATH;
// the gang's code for a gang that failed (its supervisor reported it); 128+N for signal
// N; 1 (nothing printed: main says so) when a signal stopped it while it started; else 1.
func benchExit(e *env, err error) int {
	var (
		usage    *runner.UsageError
		notFound *runner.NotFoundError
		gang     *runner.GangError
		sig      *proc.SignalError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &gang):
		return gang.Result.ExitCode
	case errors.As(err, &sig):
		return sig.ExitCode()
	case errors.Is(err, runner.ErrStopped):
		return exitFailure
	case errors.As(err, &notFound):
		fmt.Fprintf(e.stderr, "gangrun %s: %s\n", benchCmd, err)
		return exitNotFound
	case errors.As(err, &usage):
		return usageErr(e, benchCmd, "%v", err)
	}
	return failErr(e, benchCmd, err)
}

// isTerminal reports whether w is a terminal (golang.org/x/term).
func isTerminal(w io.Writer) bool {
	f, ok := rawWriter(w).(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressLine is the one-line progress display on a terminal: it redraws itself in
// place ("\r", erase to end of line) and steps aside for worker output passed through
// its Write, so the two never mix.
type progressLine struct {
	mu   sync.Mutex
	w    io.Writer
	text string
}

// Write prints worker output above the progress line.
func (p *progressLine) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	io.WriteString(p.w, "\r\x1b[K")
	n, err := p.w.Write(b)
	if p.text != "" {
		io.WriteString(p.w, p.text)
	}
	return n, err
}

func (p *progressLine) set(text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.text = text
	io.WriteString(p.w, "\r"+text+"\x1b[K")
}

// done erases the progress line.
func (p *progressLine) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.text != "" {
		io.WriteString(p.w, "\r\x1b[K")
	}
	p.text = ""
}

// show is runner.Config.Progress: it draws text, or erases the line when text is "".
func (p *progressLine) show(text string) {
	if text == "" {
		p.done()
		return
	}
	p.set(text)
}
