package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/launcher"
	benchscript "github.com/gangrun/gangrun/scripts/bench"
)

// Engines of `gangrun bench nccl --engine`.
const (
	engineTorch     = "torch"
	engineNCCLTests = "nccl-tests"
)

// torchCheckTimeout bounds checkTorch: importing torch takes a second or two.
const torchCheckTimeout = 2 * time.Minute

// torchUsable refuses, in one line with exit 2, a --python that cannot import torch.
// One that is not found at all is left to the caller, which reports it with exit 127.
func torchUsable(ctx context.Context, e *env, python string) int {
	if _, err := exec.LookPath(python); err != nil {
		return exitOK
	}
	if err := checkTorch(ctx, python); err != nil {
		return usageErr(e, benchCmd, "--python %s: %v; give --python an interpreter that has torch (Debian's: /usr/bin/python3)", python, err)
	}
	return exitOK
}

// checkTorch runs `python -c "import torch.distributed"` so that an interpreter without
// torch is refused in one line before any worker starts, rather than as a gang failure
// with a traceback from every rank. The error holds the interpreter's last line of
// output (e.g. "ModuleNotFoundError: No module named 'torch'").
func checkTorch(ctx context.Context, python string) error {
	ctx, cancel := context.WithTimeout(ctx, torchCheckTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", "import torch.distributed").CombinedOutput()
	if err == nil {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return fmt.Errorf("cannot import torch.distributed: %s", last)
	}
	return fmt.Errorf("cannot import torch.distributed: %w", err)
}

// progressInterval is how often the progress line is redrawn and the progress file read.
const progressInterval = 500 * time.Millisecond

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
	fs.BoolVar(&o.json, "json", false, "print JSON: one object per operation, one per line")
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
		opts.Op = op
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
	return exitOK
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
	fs.StringVar(&b.engine, "engine", engineTorch, "torch (the bundled PyTorch script) or nccl-tests (all_reduce_perf … on PATH)")
	fs.BoolVar(&b.check, "check", true, "check each size's result once on known data (the #wrong column)")
	fs.BoolVar(&b.pairwise, "pairwise", false, "benchmark every pair of nodes and print a node × node busbw matrix")
	fs.Float64Var(&b.slowThreshold, "slow-threshold", bench.DefaultSlowThreshold, "with --pairwise: flag a node or pair this fraction below the median")
	durationVar(fs, &b.pairTimeout, "pair-timeout", bench.DefaultPairTimeout, durationFlag{max: maxGrace},
		"with --pairwise: the longest one pair may take on a node (joining its gang, running, stopping); a pair past it fails (at most 24h)")
	durationVar(fs, &b.joinTimeout, "join-timeout", bench.DefaultJoinTimeout, durationFlag{max: maxGrace},
		"with --pairwise: the longest the nodes may take to meet before the first pair (at most 24h)")
	fs.StringVar(&b.python, "python", "python3", "Python interpreter with torch for the torch engine")
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
	const cmd = "bench nccl"
	fs := newFlagSet(e, cmd, "[FLAGS]")
	var g gangFlags
	var b benchFlags
	g.register(fs)
	b.register(fs)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	g.nprocGiven, g.nnodesGiven = fs.Changed("nproc-per-node"), fs.Changed("nnodes")
	if fs.NArg() > 0 {
		return usageErr(e, cmd, "unexpected argument %q: bench nccl takes flags only", fs.Arg(0))
	}
	format, err := b.out.format()
	if err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	plan, err := b.plan()
	if err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	if b.engine != engineTorch && b.engine != engineNCCLTests {
		return usageErr(e, cmd, "--engine %q: want torch or nccl-tests", b.engine)
	}
	if b.backend != "" && b.backend != "nccl" && b.backend != "gloo" {
		return usageErr(e, cmd, "--backend %q: want nccl or gloo", b.backend)
	}
	if !(b.slowThreshold > 0 && b.slowThreshold < 1) {
		return usageErr(e, cmd, "--slow-threshold %g: want a fraction between 0 and 1 (0.2 is 20%%)", b.slowThreshold)
	}
	_, nmax, err := launcher.ParseNNodes(g.nnodes)
	if err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	if b.pairwise && nmax < 2 {
		return usageErr(e, cmd, "--pairwise needs --nnodes >= 2 (got --nnodes %s): pairs are of nodes", g.nnodes)
	}
	if b.engine == engineNCCLTests && nmax > 1 {
		return usageErr(e, cmd, "--engine nccl-tests runs on one node: across nodes nccl-tests needs MPI (use --engine torch)")
	}
	if b.pairwise {
		if msg := b.checkPairwise(e, g.coordinator, plan); msg != "" {
			return usageErr(e, cmd, "%s", msg)
		}
	}
	log, err := newLogger(g.logFormat, e.stderr)
	if err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	// Only warnings and errors: stderr carries the progress line and worker output.
	log = log.WithOptions(zap.IncreaseLevel(zapcore.WarnLevel))
	defer log.Sync() //nolint:errcheck // stderr cannot be synced on some systems

	dir, err := os.MkdirTemp("", "gangrun-bench-")
	if err != nil {
		return failErr(e, cmd, fmt.Errorf("create a temporary directory: %w", err))
	}
	defer os.RemoveAll(dir)

	var placeholder []string
	if b.engine == engineTorch {
		placeholder = []string{b.python}
	} else {
		placeholder = []string{"/bin/sh"}
	}
	spec := g.spec(e, placeholder, log)
	spec.MaxRestarts = 0
	p, err := launcher.Prepare(ctx, spec)
	if err != nil {
		return usageErr(e, cmd, "%v", err)
	}
	defer p.Close()
	if b.pairwise {
		return runPairwise(ctx, e, p, &b, plan, format, dir, log)
	}
	gpus := len(p.Inventory.Allocatable())
	cfg := p.Config
	cfg.MaxRestarts = 0
	cfg.Stdout, cfg.Stderr = e.stderr, e.stderr // stdout carries the results only
	var pl *progressLine
	if isTerminal(e.stdout) {
		pl = &progressLine{w: e.stderr, start: time.Now()}
		cfg.Stdout, cfg.Stderr = pl, pl
	}
	run := benchRun{e: e, cfg: cfg, g: p, log: log, plan: plan, gpus: gpus, dir: dir, progress: pl}
	var results []bench.Result
	var failed int
	if b.engine == engineNCCLTests {
		results, failed = run.ncclTests(ctx)
	} else {
		results, failed = run.torch(ctx, b.backend, b.python)
	}
	if results == nil {
		return failed
	}
	if err := bench.Write(e.stdout, format, results); err != nil {
		return failErr(e, cmd, err)
	}
	if failed > 0 {
		return failErr(e, cmd, fmt.Errorf("%d timed halves had wrong elements (see the #wrong column)", failed))
	}
	return exitOK
}

// benchRun is one `gangrun bench nccl` on this node's gang.
type benchRun struct {
	e        *env
	cfg      launcher.Config
	g        *launcher.Prepared
	log      *zap.Logger
	plan     bench.Plan
	gpus     int           // allocatable GPUs on this node
	dir      string        // scratch directory for the script, results and progress
	progress *progressLine // nil when stdout is not a terminal
}

const benchCmd = "bench nccl"

// supervise runs the gang with cfg (the prepared one's, adjusted) and returns gangrun's
// exit code.
func (r benchRun) supervise(ctx context.Context, cfg launcher.Config) int {
	p := *r.g
	p.Config = cfg
	code, _ := supervise(ctx, r.e, benchCmd, &p)
	return code
}

// torch runs the bundled script on the gang. It returns the results and the number of
// halves with wrong elements, or nil and the exit code when the run failed.
func (r benchRun) torch(ctx context.Context, backend, python string) ([]bench.Result, int) {
	e := r.e
	if backend == "" {
		backend = "gloo"
		if r.gpus > 0 {
			backend = "nccl"
		}
	}
	if backend == "nccl" && r.gpus == 0 {
		return nil, usageErr(e, benchCmd, "--backend nccl needs GPUs, and this node has none allocatable (use --backend gloo)")
	}
	if code := torchUsable(ctx, e, python); code != exitOK {
		return nil, code
	}
	script, err := benchscript.Write(r.dir)
	if err != nil {
		return nil, failErr(e, benchCmd, err)
	}
	out := filepath.Join(r.dir, "results.json")
	progress := ""
	if r.progress != nil {
		progress = filepath.Join(r.dir, "progress.jsonl")
	}
	cfg := r.cfg
	cfg.Command = append([]string{python, script}, benchscript.Args(r.plan, backend, out, progress)...)

	stop := func() {}
	if r.progress != nil {
		stop = r.progress.follow(ctx, progress)
	}
	code := r.supervise(ctx, cfg)
	stop()
	if code != exitOK {
		return nil, code
	}
	f, err := os.Open(out)
	if errors.Is(err, os.ErrNotExist) {
		return nil, failErr(e, benchCmd, errors.New("no results: rank 0 wrote none (it runs on node rank 0; see that node's output)"))
	}
	if err != nil {
		return nil, failErr(e, benchCmd, err)
	}
	defer f.Close()
	results, err := bench.DecodeScript(f)
	if err != nil {
		return nil, failErr(e, benchCmd, err)
	}
	return results, wrongHalves(results)
}

// ncclTests runs the nccl-tests binaries one after the other, each as one process
// driving all of the node's workers' GPUs (-g), and parses what they print.
func (r benchRun) ncclTests(ctx context.Context) ([]bench.Result, int) {
	e := r.e
	if r.gpus == 0 {
		return nil, usageErr(e, benchCmd, "--engine nccl-tests needs GPUs, and this node has none allocatable")
	}
	nproc := r.cfg.NProcPerNode
	var sh strings.Builder
	sh.WriteString("set -e\n")
	outs := make([]string, len(r.plan.Ops))
	for i, op := range r.plan.Ops {
		if _, err := exec.LookPath(op.Program()); err != nil {
			fmt.Fprintf(e.stderr, "gangrun %s: --engine nccl-tests: %s not found on PATH (build NVIDIA/nccl-tests and put its build/ directory on PATH)\n", benchCmd, op.Program())
			return nil, exitNotFound
		}
		outs[i] = filepath.Join(r.dir, op.Program()+".out")
		sh.WriteString(shellJoin(r.plan.NCCLTestsArgs(op, nproc)) + " >" + shellQuote(outs[i]) + "\n")
	}
	runner := filepath.Join(r.dir, "nccl-tests.sh")
	if err := os.WriteFile(runner, []byte(sh.String()), 0o644); err != nil {
		return nil, failErr(e, benchCmd, fmt.Errorf("write the nccl-tests runner: %w", err))
	}
	cfg := r.cfg
	cfg.Command = []string{"/bin/sh", runner}
	cfg.NProcPerNode = 1 // one nccl-tests process drives every GPU (-g)
	stop := func() {}
	if r.progress != nil {
		stop = r.progress.tick("nccl-tests " + joinOps(r.plan.Ops))
	}
	code := r.supervise(ctx, cfg)
	stop()
	if code != exitOK {
		for _, o := range outs {
			if b, err := os.ReadFile(o); err == nil && len(b) > 0 {
				fmt.Fprintf(e.stderr, "--- %s ---\n%s", filepath.Base(o), b)
			}
		}
		return nil, code
	}
	var results []bench.Result
	for i, op := range r.plan.Ops {
		f, err := os.Open(outs[i])
		if err != nil {
			return nil, failErr(e, benchCmd, err)
		}
		rs, err := bench.Parse(f, bench.ParseOptions{Op: op})
		f.Close()
		if err != nil {
			return nil, failErr(e, benchCmd, fmt.Errorf("%s: %w", op.Program(), err))
		}
		for j := range rs {
			if rs[j].Ranks == 0 {
				rs[j].Ranks = nproc
			}
		}
		results = append(results, rs...)
	}
	return results, wrongHalves(results)
}

// wrongHalves counts the rows with wrong elements.
func wrongHalves(results []bench.Result) int {
	n := 0
	for _, r := range results {
		for _, row := range r.Rows {
			if row.Wrong != nil && *row.Wrong > 0 {
				n++
			}
		}
	}
	return n
}

func joinOps(ops []bench.Op) string {
	s := make([]string, len(ops))
	for i, op := range ops {
		s[i] = string(op)
	}
	return strings.Join(s, ",")
}

// shellQuote quotes s for /bin/sh: in single quotes, each ' written as '\”.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
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
	mu    sync.Mutex
	w     io.Writer
	start time.Time
	text  string
	pair  string // the pair of nodes being measured (--pairwise), "" otherwise
}

// setPair names the pair of nodes the next steps measure.
func (p *progressLine) setPair(pair string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pair = pair
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

// follow shows the bundled script's steps from its progress file until stop is called.
func (p *progressLine) follow(ctx context.Context, path string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var last *bench.Step
	var first time.Time
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = bench.Follow(ctx, path, progressInterval, func(line []byte) {
			s, err := bench.ParseStep(line)
			if err != nil {
				return
			}
			mu.Lock()
			if last == nil {
				first = time.Now()
			}
			last = &s
			mu.Unlock()
		})
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			s, since := last, time.Since(first)
			mu.Unlock()
			p.mu.Lock()
			pair := p.pair
			p.mu.Unlock()
			if s == nil {
				what := "starting the gang"
				if pair != "" {
					what = "starting the gang of pair " + pair
				}
				p.set(fmt.Sprintf("%s · %s elapsed", what, time.Since(p.start).Round(time.Second)))
				continue
			}
			left, ok := s.Remaining(since)
			p.set(bench.ProgressLine(*s, pair, time.Since(p.start), left, ok))
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		p.done()
	}
}

// tick shows what and the time elapsed until stop is called.
func (p *progressLine) tick(what string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.set(fmt.Sprintf("%s · %s elapsed", what, time.Since(p.start).Round(time.Second)))
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		p.done()
	}
}
