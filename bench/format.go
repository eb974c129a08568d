package bench

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Format is how results are printed.
type Format int

// The output formats of `gangrun bench`: nccl-tests' table (the default), JSON and CSV.
const (
	// Table prints nccl-tests' columns (src/common.cu): size, count, type, redop, root,
	// then time, algbw, busbw and #wrong for the out-of-place and in-place halves, and
	// the "# Avg bus bandwidth" line.
	Table Format = iota
	// JSON prints one Result object per operation, one per line (JSON Lines), with the
	// fields docs/bench.md lists ("Output formats").
	JSON
	// CSV prints a header and one line per Row (CSVHeader).
	CSV
)

// Write prints results to w in format f.
func Write(w io.Writer, f Format, results []Result) error {
	switch f {
	case JSON:
		return WriteJSON(w, results)
	case CSV:
		return WriteCSV(w, results)
	}
	return WriteTable(w, results)
}

// WriteJSON prints one JSON object per result, each on its own line.
func WriteJSON(w io.Writer, results []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range results {
		if r.Rows == nil {
			r.Rows = []Row{}
		}
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
	}
	return nil
}

// CSVHeader returns the columns WriteCSV prints, one per Row field plus ranks: op,
// ranks, size_bytes, count, dtype, redop, root, in_place, time_us (microseconds),
// algbw_gbps, busbw_gbps (GB/s), wrong (empty when not checked).
func CSVHeader() []string {
	return []string{"op", "ranks", "size_bytes", "count", "dtype", "redop", "root", "in_place",
		"time_us", "algbw_gbps", "busbw_gbps", "wrong"}
}

// WriteCSV prints CSVHeader and one line per row of every result. Unsupported
// operations have no rows and so no lines.
func WriteCSV(w io.Writer, results []Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader()); err != nil {
		return fmt.Errorf("write CSV: %w", err)
	}
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	for _, res := range results {
		for _, r := range res.Rows {
			wrong := ""
			if r.Wrong != nil {
				wrong = strconv.FormatInt(*r.Wrong, 10)
			}
			rec := []string{string(r.Op), strconv.Itoa(res.Ranks), strconv.FormatInt(r.SizeBytes, 10),
				strconv.FormatInt(r.Count, 10), r.DType, r.RedOp, strconv.Itoa(r.Root),
				strconv.FormatBool(r.InPlace), g(Micros(r.Time)), g(r.AlgBW), g(r.BusBW), wrong}
			if err := cw.Write(rec); err != nil {
				return fmt.Errorf("write CSV: %w", err)
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write CSV: %w", err)
	}
	return nil
}

// Column widths of nccl-tests' table (src/common.cu: "%12li  %12li  %8s  %6s  %6i" for
// the line header, "  %7s  %6.2f  %6.2f  %5li" for each half; #wrong is 6 wide here so
// that it lines up under its header).
const (
	leadWidth = 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6 // size … root
	halfWidth = 2 + 7 + 2 + 6 + 2 + 6 + 2 + 6       // time algbw busbw #wrong
)

// WriteTable prints each result as nccl-tests does: a title line naming the operation,
// the three header lines, one line per message size with the out-of-place and in-place
// halves side by side ("-" for a half the engine did not run, N/A for #wrong when not
// checked; parsed output of older nccl-tests keeps its "error" column), the failure that
// cut the run short as the log printed it (after the row it hit), the "# Out of bounds
// values" line (the log's own when parsed, else counted from the rows when anything was
// checked), and the "# Avg bus bandwidth" line (with the log's OK or FAILED), which a
// run that failed before its first row lacks.
func WriteTable(w io.Writer, results []Result) error {
	bw := bufio.NewWriter(w)
	for i, r := range results {
		if i > 0 {
			bw.WriteString("#\n")
		}
		writeTable(bw, r)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

func writeTable(w *bufio.Writer, r Result) {
	fmt.Fprintf(w, "# %s\n", title(r))
	if r.Unsupported != "" {
		fmt.Fprintf(w, "# %s: %s\n", opName(r.Op), r.Unsupported)
		return
	}
	head := [3]string{"#" + strings.Repeat(" ", leadWidth-1) + center("out-of-place", halfWidth) + center("in-place", halfWidth)}
	head[1] = fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root")
	head[2] = fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "")
	check := "#wrong"
	for _, row := range r.Rows {
		if row.MaxError != nil {
			check = "error" // older nccl-tests' column, as parsed
		}
	}
	for range 2 {
		head[1] += fmt.Sprintf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", check)
		head[2] += fmt.Sprintf("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "")
	}
	for _, h := range head {
		w.WriteString(strings.TrimRight(h, " ") + "\n")
	}
	for _, l := range tableLines(r.Rows) {
		fmt.Fprintf(w, "%12d  %12d  %8s  %6s  %6d", l.size, l.count, orDash(l.dtype), orDash(l.redop), l.root)
		for _, h := range [2]*Row{l.out, l.in} {
			if h == nil {
				fmt.Fprintf(w, "  %7s  %6s  %6s  %6s", "-", "-", "-", "-")
				continue
			}
			wrong := "N/A"
			switch {
			case h.Wrong != nil:
				wrong = strconv.FormatInt(*h.Wrong, 10)
			case h.MaxError != nil:
				wrong = fmt.Sprintf("%.0e", *h.MaxError) // older nccl-tests' "%5.0le"
			}
			fmt.Fprintf(w, "  %7s  %6.2f  %6.2f  %6s", FormatMicros(h.Time), h.AlgBW, h.BusBW, wrong)
		}
		w.WriteString("\n")
	}
	if f := r.Failure; f != nil {
		if fr := f.Row; fr != nil {
			root := ""
			if fr.Root != nil {
				root = strconv.Itoa(*fr.Root)
			}
			fmt.Fprintf(w, "%12d  %12d  %8s  %6s  %6s %s\n", fr.SizeBytes, fr.Count, fr.DType, fr.RedOp, root, f.Text)
		} else {
			fmt.Fprintf(w, "%s\n", f.Text)
		}
	}
	switch _, checked := r.Wrong(); {
	case r.OutOfBounds != nil:
		verdict := "OK"
		if r.OutOfBounds.Count > 0 || !r.OutOfBounds.OK {
			verdict = "FAILED"
		}
		fmt.Fprintf(w, "# Out of bounds values : %d %s\n", r.OutOfBounds.Count, verdict)
	case checked:
		failed := wrongHalves(r.Rows)
		verdict := "OK"
		if failed > 0 {
			verdict = "FAILED"
		}
		fmt.Fprintf(w, "# Out of bounds values : %d %s\n", failed, verdict)
	}
	if r.Failure != nil && len(r.Rows) == 0 {
		return // the run printed no row and no average
	}
	fmt.Fprintf(w, "# Avg bus bandwidth    : %s", FormatAvg(r.AvgBusBW))
	if r.AvgBusBWOK != nil {
		if *r.AvgBusBWOK {
			w.WriteString(" OK")
		} else {
			w.WriteString(" FAILED")
		}
	}
	w.WriteString("\n")
}

// FormatAvg prints an average bus bandwidth as nccl-tests does ("%g": six significant
// digits), so a parsed "# Avg bus bandwidth" line prints back as it was.
func FormatAvg(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// FormatMicros prints a time in microseconds for nccl-tests' 7-character time column
// as recent nccl-tests do (2.18: "5686.63", "10427.5", "103605"): as many decimals as
// fit in 7 characters, at most 2. (Older nccl-tests, src/common.cu, printed no decimals
// from 10000 us and one from 100 us; both read back the same.)
func FormatMicros(d time.Duration) string {
	us := Micros(d)
	for decimals := 2; decimals > 0; decimals-- {
		if s := strconv.FormatFloat(us, 'f', decimals, 64); len(s) <= 7 {
			return s
		}
	}
	return strconv.FormatFloat(us, 'f', 0, 64)
}

func opName(op Op) string {
	if op == "" {
		return "operation not named"
	}
	return string(op)
}

// title is the first line of a result's table: "all_reduce: 2 ranks, torch engine,
// backend gloo, device cpu".
func title(r Result) string {
	parts := []string{opName(r.Op) + ":"}
	if r.Ranks > 0 {
		parts = append(parts, fmt.Sprintf("%d ranks", r.Ranks))
	} else {
		parts = append(parts, "ranks not listed")
	}
	s := strings.Join(parts, " ")
	if r.Engine != "" {
		s += ", engine " + r.Engine
	}
	if r.Backend != "" {
		s += ", backend " + r.Backend
	}
	if r.Device != "" {
		s += ", device " + r.Device
	}
	if r.Copies > 1 {
		s += fmt.Sprintf(", %d copies (each process printed one)", r.Copies)
	}
	if r.PrintedBy != "" {
		s += ", printed by " + r.PrintedBy
	}
	return s
}

func center(s string, width int) string {
	pad := width - len(s)
	if pad <= 0 {
		return s
	}
	return strings.Repeat(" ", pad/2) + s + strings.Repeat(" ", pad-pad/2)
}

// tableLine is one printed line: one message size with its two halves.
type tableLine struct {
	size, count  int64
	dtype, redop string
	root         int
	out, in      *Row
}

// tableLines pairs each size's out-of-place and in-place rows: a row joins the line
// before it when that line is for the same size, type, redop and root and lacks the
// row's half (rows come out-of-place first, as nccl-tests and the script time them).
func tableLines(rows []Row) []tableLine {
	var lines []tableLine
	for i := range rows {
		r := &rows[i]
		var l *tableLine
		if n := len(lines); n > 0 {
			c := &lines[n-1]
			if c.size == r.SizeBytes && c.count == r.Count && c.dtype == r.DType && c.redop == r.RedOp && c.root == r.Root &&
				((r.InPlace && c.in == nil) || (!r.InPlace && c.out == nil && c.in == nil)) {
				l = c
			}
		}
		if l == nil {
			lines = append(lines, tableLine{size: r.SizeBytes, count: r.Count, dtype: r.DType, redop: r.RedOp, root: r.Root})
			l = &lines[len(lines)-1]
		}
		if r.InPlace {
			l.in = r
		} else {
			l.out = r
		}
	}
	return lines
}

// orDash is s, or "-" when s is empty: a table cell must never be blank, or the row
// reads back with a column missing.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
