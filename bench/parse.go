package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// MaxLineBytes is the longest input line Parse reads.
const MaxLineBytes = 1 << 20

// The sources of a result's operation, as Result.OpSource names them.
const (
	// OpFromLog: the log's own "# Collective test starting: NAME_perf" line (or, when a copy
	// kept only the end, "# Collective test concluded: NAME_perf").
	OpFromLog = "collective test line"
	// OpFromCommand: a command line in the log that runs the program
	// ("./build/alltoall_perf -b 8 ...", "Running: ... all_gather_perf ...").
	OpFromCommand = "command line"
	// OpFromOption: ParseOptions.Op, by default (`bench parse --op`).
	OpFromOption = "--op"
)

// ParseOptions tunes Parse.
type ParseOptions struct {
	// Op names the operation of every table whose output does not name it, neither by
	// recent nccl-tests' "# Collective test starting: all_reduce_perf" line nor by a
	// command line that runs the program; older nccl-tests name nothing.
	Op Op
	// OpSource says where Op came from, for Result.OpSource: OpFromOption when empty;
	// `bench parse` says "file name" when it took Op from the file's name.
	OpSource string
}

// Parse reads nccl-tests output (what all_reduce_perf and its siblings print to stdout,
// as a terminal, a launcher or a log collector kept it) into one Result per table,
// with Engine "nccl-tests". It understands:
//
//   - the column header of current nccl-tests ("size count type redop root time algbw
//     busbw #wrong …", with -S's timestamp column and -I's per-iteration columns) and
//     of older ones, whose leading columns vary by operation (size count type [redop]
//     [root]) and whose last column of each half is "error", the largest difference
//     from the expected value, kept as Row.MaxError; before 2019 nccl-tests printed its
//     summary lines without the leading '#', and copies of logs from rendered web pages
//     lose it: the lines are read with or without it;
//   - out-of-place and in-place halves: each becomes a Row; a data line with one half
//     only, or a half of four "-" (as WriteTable prints a half not run), gives one Row;
//   - "#wrong" values: a count (printed "%g": 3.35544e+07 too), or N/A (not checked:
//     Wrong stays nil);
//   - the log's own verdict "# Out of bounds values : N OK|FAILED" (Result.OutOfBounds:
//     N is nccl-tests' count of (process, half) checks that found wrong elements, not a
//     count of rows) and "# Avg bus bandwidth : X [OK|FAILED]", X taken as printed
//     into AvgBusBW (the mean of the rows' busbw when a table has no such line);
//   - the operation from "# Collective test starting: NAME_perf", else from a command
//     line in the log that runs NAME_perf, else from opts.Op (Result.OpSource says
//     which); the ranks from the "#  Rank N …" device lines (Ranks is the highest N + 1;
//     when the lines are missing or the list has gaps, as in excerpts, the rank count
//     that maps every printed algbw to the printed busbw by nccl-tests' bus factor, when
//     only one does: Result.RanksInferred);
//   - launcher prefixes (mpirun --tag-output's "[1,0]<stdout>:", srun --label's " 0: ",
//     pdsh's "host: ", MPICH's "[0] ", SkyPilot's "(head, rank=0, pid=N) ", kubectl's
//     "[pod/…] " and timestamps, see stripLauncher): lines are grouped by the process
//     that printed them and the table of the lowest rank that printed one is taken
//     (Result.Copies counts the processes that printed one); several processes that
//     each printed their own copy without a prefix ("Rank 0" listed more than once),
//     interleaved line by line, are read as one table;
//   - a run cut short by nccl-tests' "HOST: Test CUDA|NCCL failure FILE:LINE 'MESSAGE'"
//     (Result.Failure): the rows printed before it are kept, and a run that failed
//     before its header gives a Result without rows;
//   - "# nThread …", "# nccl-tests version …", "# Using devices" as the start of a run.
//
// Time, algbw and busbw are kept as printed, not recomputed. Lines that are neither
// comments nor data (NCCL INFO and MPI messages, "NCCL version …", prose) are skipped; a
// data line (one whose first field is a whole number, after a header) that does not fit
// its header is an error naming the line. Input without any table or failure is an
// error.
func Parse(r io.Reader, opts ParseOptions) ([]Result, error) {
	if opts.OpSource == "" {
		opts.OpSource = OpFromOption
	}
	lp := &logParser{opts: opts, streams: map[string]*stream{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	for sc.Scan() {
		lp.line++
		lp.feed(sc.Text())
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("nccl-tests output, line %d: longer than %d bytes", lp.line+1, MaxLineBytes)
		}
		return nil, fmt.Errorf("read nccl-tests output: %w", err)
	}
	return lp.results()
}

// logParser splits the input into streams, one per launcher label, and collects what
// concerns them all: command lines and failures.
type logParser struct {
	opts    ParseOptions
	line    int
	streams map[string]*stream
	order   []*stream // in the order their first line came
	// The latest command line that runs an nccl-tests program.
	cmdOp      Op
	cmdProgram string
	failures   []*Failure
}

func (lp *logParser) feed(raw string) {
	body, key := stripLauncher(raw)
	if f, ok := parseFailure(body, lp.line); ok {
		lp.failures = append(lp.failures, f)
		return
	}
	body, key = stripHost(body, key)
	if op, prog, ok := commandOp(body); ok {
		lp.cmdOp, lp.cmdProgram = op, prog
	}
	s := lp.streams[key.label]
	if s == nil {
		s = &stream{lp: lp, key: key}
		lp.streams[key.label] = s
		lp.order = append(lp.order, s)
	}
	if s.err == nil {
		if err := s.feed(body); err != nil {
			s.err = fmt.Errorf("nccl-tests output, line %d: %w", lp.line, err)
		}
	}
}

// commandOp finds a command line that runs an nccl-tests program: a line (not a '#'
// comment) with a word naming NAME_perf (a path, a _mpi suffix and quotes allowed) that
// is not the target of a redirection ("> all_reduce_perf.log") and not a cell of a
// table ('|', as nvidia-smi's process list).
func commandOp(body string) (Op, string, bool) {
	t := strings.TrimSpace(body)
	if t == "" || t[0] == '#' || t[0] == '|' || !strings.Contains(t, "_perf") {
		return "", "", false
	}
	words := strings.Fields(t)
	for i, w := range words {
		w = strings.Trim(w, "`'\";(),:\\")
		op, ok := OpFromProgram(w)
		if !ok {
			continue
		}
		if i > 0 {
			switch prev := words[i-1]; prev {
			case ">", ">>", "2>", "&>", "1>", "2>>", "&>>":
				if i-1 > 0 { // a leading '>' quotes the line (Markdown), it redirects nothing
					continue
				}
			}
		}
		if strings.ContainsAny(w, "<>|") {
			continue
		}
		return op, w[strings.LastIndex(w, "/")+1:], true
	}
	return "", "", false
}

// results picks the stream whose tables to report and attaches the failures.
func (lp *logParser) results() ([]Result, error) {
	for _, s := range lp.order {
		s.finish()
	}
	var printed []*stream
	for _, s := range lp.order {
		if len(s.tables) > 0 {
			printed = append(printed, s)
		}
	}
	chosen := pickStream(printed)
	if chosen == nil {
		var started []*stream
		for _, s := range lp.order {
			if len(s.runs) > 0 {
				started = append(started, s)
			}
		}
		chosen = pickStream(started)
	}
	if chosen != nil && chosen.err != nil {
		return nil, chosen.err
	}
	if chosen == nil {
		for _, s := range lp.order {
			if s.err != nil {
				return nil, s.err
			}
		}
	}
	var items []*table
	if chosen != nil {
		items = append(items, chosen.tables...)
	}
	items = lp.attachFailures(chosen, items)
	if len(items) == 0 {
		return nil, errors.New("nccl-tests output: no table found (no \"# size count type … time algbw busbw\" header)")
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].start < items[j].start })
	out := make([]Result, 0, len(items))
	for _, t := range items {
		r := t.res
		if chosen != nil && chosen.key.label != "" {
			r.PrintedBy = chosen.key.label
		}
		if len(printed) > 1 && r.Copies < len(printed) {
			r.Copies = len(printed)
		}
		out = append(out, r)
	}
	return out, nil
}

// pickStream returns rank 0's stream, or the lowest rank's, or the first labelled by a
// host, or the unlabelled one; nil for none.
func pickStream(ss []*stream) *stream {
	var best *stream
	for _, s := range ss {
		if best == nil || rankOrder(s.key) < rankOrder(best.key) {
			best = s
		}
	}
	return best
}

func rankOrder(k streamKey) int {
	if k.rank >= 0 {
		return k.rank
	}
	if k.label != "" {
		return math.MaxInt32 - 1
	}
	return math.MaxInt32
}

// attachFailures gives each failure to the run it ended: the chosen stream's table that
// was open when it was printed, else the latest run there that printed no table (a
// Result without rows), else the last table (a run that failed after its table). The
// first failure of a run is kept; failures with no run at all make one Result.
func (lp *logParser) attachFailures(s *stream, items []*table) []*table {
	var bare *table
	for _, f := range lp.failures {
		var t *table
		if s != nil {
			t = s.failedAt(f.InputLine, lp)
			if t != nil && !containsTable(items, t) {
				items = append(items, t)
			}
		}
		if t == nil {
			if bare == nil {
				bare = &table{start: f.InputLine, res: Result{Op: lp.fallbackOp(), OpSource: lp.fallbackSource(), Rows: []Row{}, Engine: "nccl-tests"}}
				items = append(items, bare)
			}
			t = bare
		}
		if t.res.Failure == nil {
			t.res.Failure = f
		}
	}
	return items
}

// failedAt returns the run of s a failure printed at input line l ended: the table open
// at l; else, when the latest run started before l printed no table, that run's (a
// Result without rows); else the last table before l; nil when s had not started a run.
func (s *stream) failedAt(l int, lp *logParser) *table {
	for _, t := range s.tables {
		if t.header < l && (t.end == 0 || t.end >= l) {
			return t
		}
	}
	var latest *run
	for _, r := range s.runs {
		if r.start <= l {
			latest = r
		}
	}
	if latest == nil {
		return nil
	}
	if latest.table == nil {
		return latest.failedTable(lp)
	}
	if latest.table.header == 0 {
		return latest.table // a failed run's further failures (other processes')
	}
	var last *table
	for _, t := range s.tables {
		if t.header < l {
			last = t
		}
	}
	return last
}

func containsTable(ts []*table, t *table) bool {
	for _, c := range ts {
		if c == t {
			return true
		}
	}
	return false
}

func (lp *logParser) fallbackOp() Op {
	if lp.cmdOp != "" {
		return lp.cmdOp
	}
	return lp.opts.Op
}

func (lp *logParser) fallbackSource() string {
	switch {
	case lp.cmdOp != "":
		return OpFromCommand
	case lp.opts.Op != "":
		return lp.opts.OpSource
	}
	return ""
}

// column is one column of a data line.
type column int

const (
	colSize column = iota
	colCount
	colType
	colRedOp
	colRoot
	colTime
	colAlgBW
	colBusBW
	colWrong // "#wrong": a count or N/A
	colError // older "error": the largest difference from the expected value
)

// The kinds of line that start a run, in the order nccl-tests prints them; a line of a
// kind the current run has already passed starts a new run.
const (
	markVersion = iota + 1 // "# nccl-tests version …"
	markStart              // "# Collective test starting: …"
	markNThread            // "# nThread …"
	markDevices            // "# Using devices", "#  Rank N …"
	markHeader             // the column header
)

// run is one run of an nccl-tests program: what its lines before the header said.
type run struct {
	start    int // input line
	mark     int // the last run-start kind seen
	op       Op
	opSource string
	program  string
	cmdOp    Op // the command line's operation when the run started
	cmdProg  string
	rankSeen map[int]int // rank → how many times it was listed
	copies   int         // the most times one rank was listed
	elided   bool        // "..." after the last "Rank N" line: the list goes on
	table    *table
}

// table is one table being read or read.
type table struct {
	res        Result
	run        *run
	start      int // input line of the run's start, for ordering
	header     int // input line of the header; 0 for a run without a table
	end        int // input line that closed it ("# Avg bus bandwidth", the next run); 0: open to the end
	lead       []column
	halves     []half
	timestamps bool
	avgSeen    bool
	seen       map[rowKey]bool // rows read, when copies interleave
}

// half is the columns of one half of a data line.
type half struct {
	check   column // colWrong or colError
	perIter bool   // -I's i_min i_max i_p99 i_cv% follow
}

func (h half) width() int {
	if h.perIter {
		return 8
	}
	return 4
}

type rowKey struct {
	size, count  int64
	dtype, redop string
	root         int
	inPlace      bool
}

// stream reads the lines of one process.
type stream struct {
	lp     *logParser
	key    streamKey
	err    error
	runs   []*run
	tables []*table
	cur    *table
}

func (s *stream) feed(line string) error {
	trimmed := strings.TrimSpace(line)
	if trimmed == "" {
		return nil
	}
	if isElision(trimmed) {
		// "..." where an excerpt left lines out: after "Rank N" lines, the list of
		// devices goes on beyond the last one shown.
		if n := len(s.runs); n > 0 && s.runs[n-1].table == nil && len(s.runs[n-1].rankSeen) > 0 {
			s.runs[n-1].elided = true
		}
		return nil
	}
	if strings.HasPrefix(trimmed, "#") {
		return s.comment(strings.TrimSpace(trimmed[1:]))
	}
	if isBareComment(trimmed) {
		return s.comment(trimmed)
	}
	if s.cur == nil {
		return nil // before the first header: MPI, NCCL and shell noise
	}
	fields := strings.Fields(trimmed)
	if _, err := strconv.ParseInt(fields[0], 10, 64); err != nil {
		if looksLikeRow(fields) {
			// A size and an element count, but a size that is no byte count: a damaged
			// row, which must not vanish from the table unnoticed.
			return fmt.Errorf("size %q: want a whole number of bytes that fits in 64 bits", fields[0])
		}
		return nil // NCCL INFO/WARN lines and the like
	}
	return s.data(fields)
}

// isElision reports whether a line is only an ellipsis ("...", "…", "# ..."), as
// people write where they cut lines out of a log.
func isElision(t string) bool {
	rest := strings.TrimSpace(strings.TrimLeft(t, "#"))
	return rest == "..." || rest == "…" || rest == "[...]"
}

// isBareComment reports whether a line without '#' is one of nccl-tests' comment lines
// (before 2019 the summary lines had no '#'; copies from rendered pages lose it).
func isBareComment(t string) bool {
	for _, p := range []string{"Collective test starting:", "Collective test concluded:", "nccl-tests version ", "Using devices"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	if bareSummary.MatchString(t) {
		return true
	}
	f := strings.Fields(t)
	switch {
	case isHeader(f):
		return true
	case len(f) >= 4 && f[0] == "nThread" && f[2] == "nGpus":
		return true
	case len(f) >= 4 && f[0] == "Rank" && (f[2] == "Pid" || f[2] == "Group") && isInt(f[1]):
		return true
	}
	return false
}

// bareSummary is a summary line as nccl-tests prints it, without the '#': a number
// after the colon, so that prose mentioning the words is not taken for one.
var bareSummary = regexp.MustCompile(`^(?:Out of bounds values\s*:\s*\d+(?:\s+(?:OK|FAILED))?|Avg bus bandwidth\s*:\s*[-+0-9.eE]+(?:\s+(?:OK|FAILED))?)\s*$`)

func isInt(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}

// looksLikeRow reports whether a line whose first field is not an integer still has a
// data row's shape: a first field starting with a digit and an integer element count
// next to it. NCCL's own log lines ("host:pid:tid [0] NCCL INFO ...") do not.
func looksLikeRow(fields []string) bool {
	if len(fields) < 3 || fields[0][0] < '0' || fields[0][0] > '9' {
		return false
	}
	_, err := strconv.ParseInt(fields[1], 10, 64)
	return err == nil
}

// mark notes a run-start line of kind k and returns the current run, a new one when the
// current run has passed k.
func (s *stream) mark(k int) *run {
	var r *run
	if n := len(s.runs); n > 0 {
		r = s.runs[n-1]
	}
	if r == nil || r.mark >= k {
		s.closeTable()
		r = &run{start: s.lp.line, rankSeen: map[int]int{}, cmdOp: s.lp.cmdOp, cmdProg: s.lp.cmdProgram}
		s.runs = append(s.runs, r)
	}
	r.mark = k
	return r
}

func (s *stream) comment(body string) error {
	switch {
	case strings.HasPrefix(body, "nccl-tests version"):
		s.mark(markVersion)
	case strings.HasPrefix(body, "Collective test starting:"):
		r := s.mark(markStart)
		name := strings.TrimSpace(strings.TrimPrefix(body, "Collective test starting:"))
		if op, ok := OpFromProgram(name); ok {
			r.op, r.opSource, r.program = op, OpFromLog, name
		}
	case strings.HasPrefix(body, "Collective test concluded:"):
		// Names the operation of the table just read, when nothing before it did
		// (copies that kept only the end of a log).
		name := strings.TrimSpace(strings.TrimPrefix(body, "Collective test concluded:"))
		if n := len(s.tables); n > 0 {
			if t := s.tables[n-1]; t.res.Op == "" && t.run == s.runs[len(s.runs)-1] {
				if op, ok := OpFromProgram(name); ok {
					t.setOp(op, OpFromLog, name)
				}
			}
		}
		s.closeTable()
	case strings.HasPrefix(body, "nThread "):
		s.mark(markNThread)
	case strings.HasPrefix(body, "Using devices"):
		s.mark(markDevices)
	case strings.HasPrefix(body, "Rank "):
		f := strings.Fields(body)
		if len(f) < 3 {
			return nil
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 0 {
			return nil
		}
		r := s.currentRun(markDevices)
		r.rankSeen[n]++
		r.elided = false
		if c := r.rankSeen[n]; c > r.copies {
			r.copies = c
		}
	case strings.HasPrefix(body, "Out of bounds values"):
		if s.cur == nil {
			return nil
		}
		_, v, _ := strings.Cut(body, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			return fmt.Errorf("%q: no value", body)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("out of bounds values %q: want a count", f[0])
		}
		if s.cur.res.OutOfBounds == nil {
			ok := n == 0
			if len(f) > 1 {
				ok = f[1] == "OK"
			}
			s.cur.res.OutOfBounds = &OutOfBounds{Count: n, OK: ok}
		}
	case strings.HasPrefix(body, "Avg bus bandwidth"):
		if s.cur == nil {
			return nil
		}
		_, v, _ := strings.Cut(body, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			return fmt.Errorf("%q: no value", body)
		}
		x, err := finite(f[0])
		if err != nil {
			return fmt.Errorf("avg bus bandwidth %q: %w", f[0], err)
		}
		s.cur.res.AvgBusBW, s.cur.avgSeen = x, true
		if len(f) > 1 && (f[1] == "OK" || f[1] == "FAILED") {
			ok := f[1] == "OK"
			s.cur.res.AvgBusBWOK = &ok
		}
		s.cur.end = s.lp.line
		s.closeTable()
	default:
		f := strings.Fields(body)
		if isHeader(f) {
			return s.header(f)
		}
	}
	return nil
}

// currentRun returns the run under way, or starts one at kind k.
func (s *stream) currentRun(k int) *run {
	if n := len(s.runs); n > 0 && s.runs[n-1].table == nil {
		return s.runs[n-1]
	}
	return s.mark(k)
}

// isHeader reports whether the fields are nccl-tests' column-name line.
func isHeader(f []string) bool {
	has := func(name string) bool {
		for _, s := range f {
			if s == name {
				return true
			}
		}
		return false
	}
	return len(f) > 0 && f[0] == "size" && has("algbw") && has("busbw")
}

// header reads the column names: the leading ones up to the first time column, then
// groups of time, algbw, busbw and #wrong (or error), each maybe followed by -I's
// per-iteration columns, and maybe -S's timestamp.
func (s *stream) header(f []string) error {
	i := 0
	var lead []column
	for ; i < len(f) && f[i] != "time" && f[i] != "cputime"; i++ {
		c, ok := map[string]column{"size": colSize, "count": colCount, "type": colType, "redop": colRedOp, "root": colRoot}[f[i]]
		if !ok {
			return fmt.Errorf("header column %q: unknown (want size, count, type, redop, root, then time, algbw, busbw, #wrong)", f[i])
		}
		lead = append(lead, c)
	}
	if len(lead) == 0 || lead[0] != colSize {
		return fmt.Errorf("header %q: want size first", strings.Join(f, " "))
	}
	var halves []half
	timestamps := false
	for i < len(f) {
		if f[i] == "timestamp" && i == len(f)-1 {
			timestamps = true
			break
		}
		if len(f)-i < 4 {
			return fmt.Errorf("header %q: a half needs time, algbw, busbw and #wrong", strings.Join(f, " "))
		}
		g := f[i : i+4]
		if (g[0] != "time" && g[0] != "cputime") || g[1] != "algbw" || g[2] != "busbw" || (g[3] != "#wrong" && g[3] != "wrong" && g[3] != "error") {
			return fmt.Errorf("header columns %q: want time algbw busbw #wrong", strings.Join(g, " "))
		}
		h := half{check: colWrong}
		if g[3] == "error" {
			h.check = colError
		}
		i += 4
		if len(f)-i >= 4 && f[i] == "i_min" && f[i+1] == "i_max" && f[i+2] == "i_p99" && f[i+3] == "i_cv%" {
			h.perIter = true
			i += 4
		}
		halves = append(halves, h)
	}
	if len(halves) == 0 || len(halves) > 2 {
		return fmt.Errorf("header %q: want an out-of-place and an in-place half", strings.Join(f, " "))
	}
	// Copies printed by several processes repeat the header: one table is read.
	if c := s.cur; c != nil && c.run.copies > 1 && sameColumns(c, lead, halves, timestamps) {
		return nil
	}
	r := s.currentRun(markHeader)
	if r.table != nil || r.mark >= markHeader {
		r = s.mark(markHeader)
	}
	r.mark = markHeader
	op, source, program := r.op, r.opSource, r.program
	switch {
	case op != "":
	case r.cmdOp != "":
		op, source, program = r.cmdOp, OpFromCommand, r.cmdProg
	case s.lp.cmdOp != "":
		op, source, program = s.lp.cmdOp, OpFromCommand, s.lp.cmdProgram
	case s.lp.opts.Op != "":
		op, source = s.lp.opts.Op, s.lp.opts.OpSource
	}
	t := &table{run: r, start: r.start, header: s.lp.line, lead: lead, halves: halves, timestamps: timestamps,
		res: Result{Op: op, OpSource: source, Program: program, Rows: []Row{}, Engine: "nccl-tests", Line: s.lp.line}}
	if r.copies > 1 {
		t.seen = map[rowKey]bool{}
	}
	r.table = t
	s.cur = t
	s.tables = append(s.tables, t)
	return nil
}

func sameColumns(t *table, lead []column, halves []half, ts bool) bool {
	if len(t.res.Rows) > 0 || len(t.lead) != len(lead) || len(t.halves) != len(halves) || t.timestamps != ts {
		return false
	}
	for i := range lead {
		if t.lead[i] != lead[i] {
			return false
		}
	}
	for i := range halves {
		if t.halves[i] != halves[i] {
			return false
		}
	}
	return true
}

// data reads one data line into one or two rows.
func (s *stream) data(f []string) error {
	t := s.cur
	width := 0
	for _, h := range t.halves {
		width += h.width()
	}
	want := len(t.lead) + width
	oneHalf := len(t.lead) + t.halves[0].width()
	switch {
	case t.timestamps && len(f) == want+2:
		f = f[:want] // the time of day the row was printed: not kept
	case len(f) == want, len(f) == oneHalf:
	default:
		return fmt.Errorf("%d fields, want %d (%d leading columns and %d halves of time, algbw, busbw, #wrong)", len(f), want, len(t.lead), len(t.halves))
	}
	base := Row{Op: t.res.Op, RedOp: "none", Root: -1}
	for i, c := range t.lead {
		v := f[i]
		var err error
		switch c {
		case colSize:
			base.SizeBytes, err = wholeNumber(v)
		case colCount:
			base.Count, err = wholeNumber(v)
		case colType:
			if v != "-" { // a blank type, as WriteTable prints it
				base.DType = v
			}
		case colRedOp:
			if v != "-" {
				base.RedOp = v
			}
		case colRoot:
			var n int64
			n, err = strconv.ParseInt(v, 10, 32)
			base.Root = int(n)
		}
		if err != nil {
			return fmt.Errorf("%s %q: %w", leadName(c), v, err)
		}
	}
	at := len(t.lead)
	for h := 0; h < len(t.halves) && at < len(f); h++ {
		w := t.halves[h].width()
		vals := f[at : at+4]
		at += w
		row := base
		row.InPlace = h == 1
		if vals[0] == "-" && vals[1] == "-" && vals[2] == "-" && vals[3] == "-" {
			continue // a half not run, as WriteTable prints it
		}
		us, err := finite(vals[0])
		if err != nil || us < 0 {
			return fmt.Errorf("time %q: want microseconds", vals[0])
		}
		row.Time = FromMicros(us)
		if row.AlgBW, err = finite(vals[1]); err != nil {
			return fmt.Errorf("algbw %q: %w", vals[1], err)
		}
		if row.BusBW, err = finite(vals[2]); err != nil {
			return fmt.Errorf("busbw %q: %w", vals[2], err)
		}
		if err := readCheck(&row, t.halves[h].check, vals[3]); err != nil {
			return err
		}
		if t.seen != nil {
			k := rowKey{row.SizeBytes, row.Count, row.DType, row.RedOp, row.Root, row.InPlace}
			if t.seen[k] {
				continue // another process's copy of this row
			}
			t.seen[k] = true
		}
		t.res.Rows = append(t.res.Rows, row)
	}
	return nil
}

// readCheck reads a half's last column: #wrong (a count, "N/A" or a negative number when
// not checked) or the older error (a difference, "N/A", maybe marked with '*').
func readCheck(row *Row, c column, v string) error {
	if v == "N/A" {
		return nil
	}
	x, err := finite(strings.TrimSuffix(v, "*"))
	if err != nil {
		return fmt.Errorf("%s %q: %w", map[column]string{colWrong: "#wrong", colError: "error"}[c], v, err)
	}
	if c == colError {
		row.MaxError = &x
		return nil
	}
	if x < 0 {
		return nil
	}
	if x > math.MaxInt64/2 || x != math.Trunc(x) && x < 1e6 {
		return fmt.Errorf("#wrong %q: want a count of elements", v)
	}
	n := int64(x)
	row.Wrong = &n
	return nil
}

func leadName(c column) string {
	return map[column]string{colSize: "size", colCount: "count", colType: "type", colRedOp: "redop", colRoot: "root"}[c]
}

// closeTable ends the table being read, if any, at the current line.
func (s *stream) closeTable() {
	if s.cur == nil {
		return
	}
	if s.cur.end == 0 {
		s.cur.end = s.lp.line
	}
	s.cur = nil
}

// finish completes every table of the stream: the average when the log printed none,
// the ranks, the copies.
func (s *stream) finish() {
	s.cur = nil // open to the end: a failure anywhere after its header may be its own
	for _, t := range s.tables {
		t.complete()
	}
}

// setOp names the operation of a table read without one.
func (t *table) setOp(op Op, source, program string) {
	t.res.Op, t.res.OpSource, t.res.Program = op, source, program
	for i := range t.res.Rows {
		t.res.Rows[i].Op = op
	}
}

// complete fills in what a table's lines left to the end: the mean busbw when there was
// no "# Avg bus bandwidth" line, the ranks and the copies.
func (t *table) complete() {
	if !t.avgSeen {
		t.res.AvgBusBW = MeanBusBW(t.res.Rows)
	}
	t.res.Ranks, t.res.RanksInferred = t.run.ranks(t.res.Op, t.res.Rows)
	if t.run.copies > 1 {
		t.res.Copies = t.run.copies
	}
}

// failedTable returns the Result of a run that failed before its header.
func (r *run) failedTable(lp *logParser) *table {
	op, source, program := r.op, r.opSource, r.program
	if op == "" {
		switch {
		case r.cmdOp != "":
			op, source, program = r.cmdOp, OpFromCommand, r.cmdProg
		case lp.opts.Op != "":
			op, source = lp.opts.Op, lp.opts.OpSource
		}
	}
	t := &table{run: r, start: r.start, res: Result{Op: op, OpSource: source, Program: program, Rows: []Row{}, Engine: "nccl-tests"}}
	t.res.Ranks, _ = r.ranks(op, nil)
	if r.copies > 1 {
		t.res.Copies = r.copies
	}
	r.table = t
	return t
}

// ranks returns the number of ranks: one more than the highest "Rank N" line; when
// there are none or the list has gaps (an excerpt), the count inferRanks finds in the
// rows, if any (inferred is true then); else, when an ellipsis followed the last line
// listed (the highest rank was cut out), 0.
func (r *run) ranks(op Op, rows []Row) (n int, inferred bool) {
	high := -1
	for k := range r.rankSeen {
		if k > high {
			high = k
		}
	}
	listed := high + 1
	if listed > 0 && len(r.rankSeen) == listed && !r.elided {
		return listed, false
	}
	if m := inferRanks(op, rows, listed); m > 0 && m != listed {
		return m, true
	}
	if r.elided {
		return 0, false // the highest rank was cut out with the rest of the list
	}
	return listed, false
}

// maxInferredRanks bounds the ranks inferRanks may find.
const maxInferredRanks = 1 << 16

// inferRanks returns the number of ranks n ≥ atLeast (and ≥ 1) with which op's bus
// factor (Op.BusFactor, nccl-tests doc/PERFORMANCE.md) turns every printed algbw of at
// least 1 GB/s into the printed busbw, within the printing's rounding; 0 when op's
// factor does not depend on n, no row is large enough, or the rows fit n+1 as well
// (the factor flattens as n grows: 129.05 GB/s at busbw = algbw fits any n above
// 12904), unless n is atLeast itself. The candidates are those the row with the largest
// algbw allows (its busbw/algbw ratio, inverted), so the search is short.
func inferRanks(op Op, rows []Row, atLeast int) int {
	if !op.busFactorDependsOnRanks() {
		return 0
	}
	var big []Row
	var best Row
	for _, r := range rows {
		if r.AlgBW >= 1 {
			big = append(big, r)
			if r.AlgBW > best.AlgBW {
				best = r
			}
		}
	}
	if len(big) == 0 {
		return 0
	}
	fits := func(n int) bool {
		f, err := op.BusFactor(n)
		if err != nil {
			return false
		}
		for _, r := range big {
			if math.Abs(r.AlgBW*f-r.BusBW) > printRounding(r.BusBW)+f*printRounding(r.AlgBW) {
				return false
			}
		}
		return true
	}
	// The factor is c(1 − 1/n): c = 2 for all_reduce, 1 for the others; n = 1/(1 − r/c).
	c := 1.0
	if op == AllReduce {
		c = 2
	}
	ta, tb := printRounding(best.AlgBW), printRounding(best.BusBW)
	lo := (best.BusBW - tb) / (best.AlgBW + ta) / c
	hi := (best.BusBW + tb) / (best.AlgBW - ta) / c
	from := 1.0
	if lo > 0 && lo < 1 {
		from = math.Floor(1 / (1 - lo))
	}
	to := float64(maxInferredRanks)
	if hi < 1 {
		to = math.Min(to, math.Ceil(1/(1-hi)))
	}
	start := max(atLeast, 1, int(from))
	for n, tries := start, 0; n <= int(to) && tries < 1000; n, tries = n+1, tries+1 {
		if fits(n) {
			if n == atLeast || !fits(n+1) {
				return n
			}
			return 0
		}
	}
	return 0
}

// printRounding is half the last printed digit of a bandwidth nccl-tests printed in 6
// characters: two decimals up to 999.99, one up to 9999.9, none above.
func printRounding(v float64) float64 {
	switch {
	case v < 999.995:
		return 0.005
	case v < 9999.95:
		return 0.05
	}
	return 0.5
}

func wholeNumber(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("want a whole number")
	}
	return n, nil
}

// finite parses a decimal number and rejects NaN and infinities (JSON cannot carry them).
func finite(s string) (float64, error) {
	x, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, errors.New("not a number")
	}
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, errors.New("not a finite number")
	}
	return x, nil
}
