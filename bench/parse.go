package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// MaxLineBytes is the longest input line Parse reads.
const MaxLineBytes = 1 << 20

// ParseOptions tunes Parse.
type ParseOptions struct {
	// Op names the operation of every table whose output does not name it. Recent
	// nccl-tests print "# Collective test starting: all_reduce_perf" before each run,
	// and that line wins; older ones name nothing.
	Op Op
}

// Parse reads nccl-tests output (what all_reduce_perf and its siblings print to stdout)
// into one Result per table, with Engine "nccl-tests". It understands:
//
//   - the column header of current nccl-tests ("size count type redop root time algbw
//     busbw #wrong …") and of older ones, whose leading columns vary by operation
//     (size count type [redop] [root]) and whose last column of each half is "error",
//     the largest difference from the expected value, kept as Row.MaxError;
//   - out-of-place and in-place halves: each becomes a Row; a data line with one half
//     only, or a half of four "-" (as WriteTable prints a half not run), gives one Row;
//   - "#wrong" values: a count, or N/A (not checked: Wrong stays nil);
//   - "# Avg bus bandwidth : X", taken as printed into AvgBusBW (the mean of the rows'
//     busbw when a table has no such line);
//   - "# Collective test starting: NAME_perf" for the operation, "#  Rank N …" device
//     lines for the number of ranks, "# nThread …" as the start of a new run.
//
// Time, algbw and busbw are kept as printed, not recomputed. Lines that are neither
// comments nor data (NCCL INFO and MPI messages, "NCCL version …") are skipped; a data
// line (one whose first field is a whole number, after a header) that does not fit its
// header is an error naming the line. Input without any table is an error.
func Parse(r io.Reader, opts ParseOptions) ([]Result, error) {
	p := parser{opts: opts, rankSeen: map[int]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	for sc.Scan() {
		p.line++
		if err := p.feed(sc.Text()); err != nil {
			return nil, fmt.Errorf("nccl-tests output, line %d: %w", p.line, err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("nccl-tests output, line %d: longer than %d bytes", p.line+1, MaxLineBytes)
		}
		return nil, fmt.Errorf("read nccl-tests output: %w", err)
	}
	p.finish()
	if len(p.results) == 0 {
		return nil, errors.New("nccl-tests output: no table found (no \"# size count type … time algbw busbw\" header)")
	}
	return p.results, nil
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

type parser struct {
	opts    ParseOptions
	line    int
	results []Result

	// The table being read; nil before its header.
	cur     *Result
	lead    []column // size … root
	halves  [][]column
	avgSeen bool

	// What the lines before the next header said.
	op       Op
	ranks    int
	rankSeen map[int]bool
}

func (p *parser) feed(line string) error {
	trimmed := strings.TrimSpace(line)
	if trimmed == "" {
		return nil
	}
	if strings.HasPrefix(trimmed, "#") {
		return p.comment(strings.TrimSpace(trimmed[1:]))
	}
	if p.cur == nil {
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
	return p.data(fields)
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

func (p *parser) comment(body string) error {
	switch {
	case strings.HasPrefix(body, "Collective test starting:"):
		p.finish()
		name := strings.TrimSpace(strings.TrimPrefix(body, "Collective test starting:"))
		p.op, _ = OpFromProgram(name)
		p.resetRanks()
	case strings.HasPrefix(body, "nThread "):
		if p.cur != nil {
			p.finish()
			p.op = ""
		}
		p.resetRanks()
	case strings.HasPrefix(body, "Rank "):
		f := strings.Fields(body)
		if len(f) >= 2 {
			if n, err := strconv.Atoi(f[1]); err == nil && !p.rankSeen[n] {
				p.rankSeen[n] = true
				p.ranks++
			}
		}
	case strings.HasPrefix(body, "Avg bus bandwidth"):
		if p.cur == nil {
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
		p.cur.AvgBusBW, p.avgSeen = x, true
	default:
		f := strings.Fields(body)
		if isHeader(f) {
			p.finish()
			return p.header(f)
		}
	}
	return nil
}

func (p *parser) resetRanks() {
	p.ranks = 0
	clear(p.rankSeen)
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
// groups of time, algbw, busbw and #wrong (or error).
func (p *parser) header(f []string) error {
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
	var halves [][]column
	for i < len(f) {
		if len(f)-i < 4 {
			return fmt.Errorf("header %q: a half needs time, algbw, busbw and #wrong", strings.Join(f, " "))
		}
		g := f[i : i+4]
		if (g[0] != "time" && g[0] != "cputime") || g[1] != "algbw" || g[2] != "busbw" || (g[3] != "#wrong" && g[3] != "error") {
			return fmt.Errorf("header columns %q: want time algbw busbw #wrong", strings.Join(g, " "))
		}
		last := colWrong
		if g[3] == "error" {
			last = colError
		}
		halves = append(halves, []column{colTime, colAlgBW, colBusBW, last})
		i += 4
	}
	if len(halves) == 0 || len(halves) > 2 {
		return fmt.Errorf("header %q: want an out-of-place and an in-place half", strings.Join(f, " "))
	}
	op := p.op
	if op == "" {
		op = p.opts.Op
	}
	p.cur = &Result{Op: op, Ranks: p.ranks, Rows: []Row{}, Engine: "nccl-tests"}
	p.lead, p.halves, p.avgSeen = lead, halves, false
	return nil
}

// data reads one data line into one or two rows.
func (p *parser) data(f []string) error {
	want := len(p.lead) + 4*len(p.halves)
	oneHalf := len(p.lead) + 4
	if len(f) != want && len(f) != oneHalf {
		return fmt.Errorf("%d fields, want %d (%d leading columns and %d halves of time, algbw, busbw, #wrong)", len(f), want, len(p.lead), len(p.halves))
	}
	base := Row{Op: p.cur.Op, RedOp: "none", Root: -1}
	for i, c := range p.lead {
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
	for h := 0; len(p.lead)+4*h < len(f); h++ {
		row := base
		row.InPlace = h == 1
		vals := f[len(p.lead)+4*h : len(p.lead)+4*h+4]
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
		if err := readCheck(&row, p.halves[h][3], vals[3]); err != nil {
			return err
		}
		p.cur.Rows = append(p.cur.Rows, row)
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

// finish closes the table being read, if any.
func (p *parser) finish() {
	if p.cur == nil {
		return
	}
	if len(p.cur.Rows) > 0 || p.avgSeen {
		if !p.avgSeen {
			p.cur.AvgBusBW = MeanBusBW(p.cur.Rows)
		}
		p.results = append(p.results, *p.cur)
	}
	p.cur, p.lead, p.halves, p.avgSeen = nil, nil, nil, false
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
