package bench

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Failure is a run of an nccl-tests program that stopped on an error, as its output
// says: nccl-tests' CUDACHECK and NCCLCHECK (src/common.h) print
//
//	HOST: Test CUDA failure FILE:LINE 'MESSAGE'
//	HOST: Test NCCL failure FILE:LINE 'MESSAGE'
//
// (older versions "Cuda failure FILE:LINE 'MESSAGE'" without the host), then a
// " .. HOST pid N: Test failure FILE:LINE" line for each caller, and exit. When the
// failure struck while a row was being timed, the row's leading columns (size, count,
// type, redop, root) are already on the line, before the host.
type Failure struct {
	// Text is the failure as the log printed it, from the host on: "node0: Test CUDA
	// failure common.cu:389 'an illegal memory access was encountered'".
	Text string `json:"text"`
	// Host is the host that printed it ("" when the line names none).
	Host string `json:"host,omitempty"`
	// Kind is "CUDA" or "NCCL": which call failed.
	Kind string `json:"kind"`
	// File and Line are nccl-tests' source position ("common.cu", 389).
	File string `json:"file"`
	Line int    `json:"line"`
	// Message is the error string of CUDA or NCCL, as quoted.
	Message string `json:"message"`
	// InputLine is the line of the parsed input the failure was on (1 = first).
	InputLine int `json:"input_line"`
	// Row is the row being timed when it failed, when the line began with its leading
	// columns; nil otherwise (then the failure came between rows, or before the first).
	Row *FailedRow `json:"row,omitempty"`
}

// FailedRow is the leading columns of the row a failure cut short: what nccl-tests had
// printed of it (size, count, type, redop, root) before the failure.
type FailedRow struct {
	SizeBytes int64  `json:"size_bytes"`
	Count     int64  `json:"count"`
	DType     string `json:"dtype,omitempty"`
	RedOp     string `json:"redop,omitempty"`
	Root      *int   `json:"root,omitempty"`
	// Text is the columns as printed, single-spaced: "2097152 32768 float none -1".
	Text string `json:"text"`
}

// failureLine matches the failure lines of nccl-tests' src/common.h (CUDACHECK,
// NCCLCHECK): "[HOST: ]Test CUDA failure FILE:LINE 'MESSAGE'", and the older
// "Cuda failure FILE:LINE 'MESSAGE'" (2017). NCCL's own "NCCL WARN Cuda failure 1
// 'invalid argument'" has no FILE:LINE and does not match.
var failureLine = regexp.MustCompile(`(?:^|\s)(?:(\S+): )?(?:Test )?(CUDA|Cuda|NCCL) failure ([\w./-]+\.(?:cu|cc|cpp|c|h)):(\d+) '(.*)'\s*$`)

// parseFailure reads a failure line (launcher prefixes already stripped); ok is false
// for any other line.
func parseFailure(body string, inputLine int) (*Failure, bool) {
	loc := failureLine.FindStringSubmatchIndex(body)
	if loc == nil {
		return nil, false
	}
	sub := func(i int) string {
		if loc[2*i] < 0 {
			return ""
		}
		return body[loc[2*i]:loc[2*i+1]]
	}
	n, err := strconv.Atoi(sub(4))
	if err != nil {
		return nil, false
	}
	start := loc[0]
	if start < len(body) && (body[start] == ' ' || body[start] == '\t') {
		start++
	}
	f := &Failure{
		Text: strings.TrimSpace(body[start:]), Host: sub(1), Kind: strings.ToUpper(sub(2)),
		File: sub(3), Line: n, Message: sub(5), InputLine: inputLine,
	}
	f.Row = failedRow(strings.Fields(body[:start]))
	return f, true
}

// failedRow reads the leading columns printed before a failure on the same line:
// size and count (whole numbers), then type, redop and root as far as printed. It
// returns nil when there is no such row.
func failedRow(f []string) *FailedRow {
	if len(f) < 2 || len(f) > 5 {
		return nil
	}
	size, err1 := strconv.ParseInt(f[0], 10, 64)
	count, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || size < 0 || count < 0 {
		return nil
	}
	r := &FailedRow{SizeBytes: size, Count: count, Text: strings.Join(f, " ")}
	if len(f) > 2 {
		r.DType = f[2]
	}
	if len(f) > 3 {
		r.RedOp = f[3]
	}
	if len(f) > 4 {
		if root, err := strconv.Atoi(f[4]); err == nil {
			r.Root = &root
		}
	}
	return r
}

// Describe says where the run stopped, for a one-line report: "at size 2097152 (row
// \"2097152 32768 float none -1\")", "after size 1048576" or "before its first row".
func (f *Failure) Describe(rows []Row) string {
	switch {
	case f.Row != nil:
		return fmt.Sprintf("at size %d (row %q)", f.Row.SizeBytes, f.Row.Text)
	case len(rows) > 0:
		return fmt.Sprintf("after size %d", rows[len(rows)-1].SizeBytes)
	}
	return "before its first row"
}
