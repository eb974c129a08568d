package slurm

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/job"
)

// field is one column of a format: its letter (or -O name), width and alignment.
type field struct {
	key   string // the % letter, or the -O field's lower-case name
	lit   string // literal text (key "")
	width int    // 0: as wide as the value
	right bool   // '.': right-justified
	// suffix is written after the column (-O's FIELD:WIDTH, a space between columns).
	suffix string
}

// maxFieldWidth bounds a field's width in -o and -O formats: a wider field is refused
// (every line is built in memory: a width of 2^31 took 18 GB).
const maxFieldWidth = 65535

// parseFormat reads a Slurm %-format ("%.18i %.9P %j"): % [.] [-] [width] letter,
// and literal text between; "%%" is a percent sign. known lists the letters the
// command has; another is an error in the command's words.
func parseFormat(format string, known map[string]string) ([]field, error) {
	var out []field
	var lit strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			lit.WriteByte(c)
			continue
		}
		if i+1 < len(format) && format[i+1] == '%' {
			lit.WriteByte('%')
			i++
			continue
		}
		if lit.Len() > 0 {
			out = append(out, field{lit: lit.String()})
			lit.Reset()
		}
		f := field{}
		i++
		if i < len(format) && format[i] == '.' {
			f.right = true
			i++
		}
		if i < len(format) && format[i] == '-' {
			i++
		}
		for i < len(format) && format[i] >= '0' && format[i] <= '9' {
			f.width = f.width*10 + int(format[i]-'0')
			if f.width > maxFieldWidth {
				return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid format specification: a field's width is at most %d", maxFieldWidth), Code: 1}
			}
			i++
		}
		if i >= len(format) {
			return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid format specification: %s", format), Code: 1}
		}
		f.key = string(format[i])
		if _, ok := known[f.key]; !ok {
			return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid job format specification: %c", format[i]), Code: 1}
		}
		out = append(out, f)
	}
	if lit.Len() > 0 {
		out = append(out, field{lit: lit.String()})
	}
	return out, nil
}

// parseFields reads a -O/--Format list ("JobID,Name:30,State:.10|"): each field a name
// (any case) with an optional :[.][WIDTH][SUFFIX], default width 20, left-justified,
// nothing between columns but a SUFFIX given (squeue(1) and sinfo(1), --Format). known
// maps lower-case names to their header; an unknown name is an error.
func parseFields(list string, known map[string]string) ([]field, error) {
	fields, bad := parseFieldsLenient(list, known)
	if len(bad) > 0 {
		return nil, &UsageError{Msg: fmt.Sprintf("error: Invalid format specification: %s", bad[0]), Code: 1}
	}
	return fields, nil
}

// parseFieldsLenient is parseFields that leaves out the unknown names and returns them,
// as squeue does (it names each, prints the rest and exits 0).
func parseFieldsLenient(list string, known map[string]string) (out []field, bad []string) {
	for _, item := range strings.Split(list, ",") {
		name, w, _ := strings.Cut(item, ":")
		f := field{key: strings.ToLower(name), width: 20}
		if _, ok := known[f.key]; !ok {
			bad = append(bad, name)
			continue
		}
		if strings.HasPrefix(w, ".") {
			f.right, w = true, w[1:]
		}
		digits := 0
		for digits < len(w) && w[digits] >= '0' && w[digits] <= '9' {
			digits++
		}
		if digits > 0 {
			var err error
			if f.width, err = strconv.Atoi(w[:digits]); err != nil || f.width > maxFieldWidth {
				bad = append(bad, item)
				continue
			}
		}
		f.suffix = w[digits:]
		out = append(out, f)
	}
	return out, bad
}

// render writes one line of fields, values giving each field's text.
func render(fields []field, value func(key string) string) string {
	var b strings.Builder
	for _, f := range fields {
		if f.key == "" {
			b.WriteString(f.lit)
			continue
		}
		b.WriteString(pad(value(f.key), f.width, f.right))
		b.WriteString(f.suffix)
	}
	return b.String()
}

// pad fits s to width as Slurm's commands do: cut to width when longer, padded with
// spaces on the left (right-justified) or right otherwise; width 0 leaves s.
func pad(s string, width int, right bool) string {
	if width <= 0 {
		return s
	}
	if len(s) > width {
		return s[:width]
	}
	if right {
		return strings.Repeat(" ", width-len(s)) + s
	}
	return s + strings.Repeat(" ", width-len(s))
}

// stateCodes are squeue's compact job state codes (squeue(1), JOB STATE CODES).
var stateCodes = map[job.Status]string{
	job.Pending: "PD", job.Running: "R", job.Completing: "CG", job.Completed: "CD", job.Failed: "F",
	job.Cancelled: "CA", job.Timeout: "TO", job.NodeFail: "NF", job.Preempted: "PR", job.Requeued: "RQ",
	job.OutOfMemory: "OOM",
}

// stateCode is st's compact code.
func stateCode(st job.Status) string {
	if c, ok := stateCodes[st]; ok {
		return c
	}
	return string(st)
}

// parseState reads a state given to -t/--states: a name or a compact code, any case.
func parseState(s string) (job.Status, bool) {
	up := strings.ToUpper(s)
	for st, c := range stateCodes {
		if up == string(st) || up == c {
			return st, true
		}
	}
	return "", false
}

// slurmDuration writes d as squeue's TIME and TIME_LIMIT (secs2time_str): "M:SS",
// "H:MM:SS" or "D-HH:MM:SS".
func slurmDuration(d time.Duration) string {
	s := int64(d / time.Second)
	if s < 0 {
		s = 0
	}
	days, h, m, sec := s/86400, s/3600%24, s/60%60, s%60
	switch {
	case days > 0:
		return fmt.Sprintf("%d-%02d:%02d:%02d", days, h, m, sec)
	case h > 0:
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}

// slurmTime writes t as Slurm's commands write times: 2026-12-04T05:36:09 (local
// time); "Unknown" for none.
func slurmTime(t time.Time) string {
	if t.IsZero() {
		return "Unknown"
	}
	return t.Local().Format("2006-01-02T15:04:05")
}

// exitCode writes a job's exit code as scontrol and sacct do, EXIT:SIGNAL: "3:0",
// "0:9" for a job killed by SIGKILL (the record keeps 128+N and says "signal" in its
// reason).
func exitCode(code int, reason string) string {
	if strings.HasPrefix(reason, "OutOfMemory") {
		return "0:125" // Slurm's for an OOM kill: the signal field holds 125
	}
	if code > 128 && code <= 128+64 && strings.Contains(reason, "signal") {
		return fmt.Sprintf("0:%d", code-128)
	}
	return fmt.Sprintf("%d:0", code)
}

// splitList splits a comma-separated option value, blank items dropped.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
