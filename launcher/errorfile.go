package launcher

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/userfile"
)

// ErrorReport is what a worker wrote to its TORCHELASTIC_ERROR_FILE through torch's
// @record decorator (torch/distributed/elastic/multiprocessing/errors/error_handler.py,
// record_exception):
//
//	{"message": {"message": "RuntimeError: boom",
//	             "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}
//
// The newer form where "message" is a plain string is read too.
type ErrorReport struct {
	// Message is the exception, "Type: text".
	Message string
	// Traceback is the Python traceback as formatted by the worker ("" when absent).
	Traceback string
	// Time is when the worker recorded the error; zero when absent.
	Time time.Time
}

// maxErrorFileBytes bounds how much of a worker's error file is read, in bytes (16 MiB);
// a traceback is a few KiB.
const maxErrorFileBytes = 16 << 20

// ReadErrorFile reads a worker's error file. ok is false when the file is missing,
// empty, not a regular file (a named pipe the worker made there is never opened for a
// blocking read), over 16 MiB or not in torch's format.
func ReadErrorFile(path string) (r ErrorReport, ok bool) {
	data, err := userfile.ReadFile(path, maxErrorFileBytes)
	if err != nil || len(data) == 0 {
		return ErrorReport{}, false
	}
	var raw struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(data, &raw) != nil || len(raw.Message) == 0 {
		return ErrorReport{}, false
	}
	var s string
	if json.Unmarshal(raw.Message, &s) == nil {
		return ErrorReport{Message: s}, s != ""
	}
	var m struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
			Timestamp   string `json:"timestamp"`
		} `json:"extraInfo"`
	}
	if json.Unmarshal(raw.Message, &m) != nil || m.Message == "" {
		return ErrorReport{}, false
	}
	r = ErrorReport{Message: m.Message, Traceback: strings.TrimRight(m.ExtraInfo.PyCallstack, "\n")}
	if sec, err := strconv.ParseInt(m.ExtraInfo.Timestamp, 10, 64); err == nil {
		r.Time = time.Unix(sec, 0)
	}
	return r, true
}

// FirstLine returns the first line of the message, for one-line reports.
func (r ErrorReport) FirstLine() string {
	line, _, _ := strings.Cut(r.Message, "\n")
	return strings.TrimSpace(line)
}
