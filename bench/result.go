package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Row is one timed half of one message size: nccl-tests prints an out-of-place and an
// in-place half on each line, and each half is a Row here. Its JSON fields are those of
// docs/bench.md ("Output formats"), plus root and wrong.
type Row struct {
	// Op is the operation timed.
	Op Op `json:"op"`
	// SizeBytes is the buffer size nccl-tests' size column shows, the S of algbw = S/t
	// (Op.Geometry).
	SizeBytes int64 `json:"size_bytes"`
	// Count is nccl-tests' count column: elements per rank for all_gather,
	// reduce_scatter and alltoall, elements of the buffer otherwise.
	Count int64 `json:"count"`
	// DType is the element type by nccl-tests' name: float, half, bfloat16, ...
	DType string `json:"dtype"`
	// RedOp is the reduction ("sum") or "none" for operations that do not reduce.
	RedOp string `json:"redop"`
	// Root is the root rank of rooted operations (broadcast), -1 for the others.
	Root int `json:"root"`
	// InPlace is true for the in-place half (the output buffer is the input).
	InPlace bool `json:"in_place"`
	// Time is the mean time of one operation; JSON time_us in microseconds.
	Time time.Duration `json:"-"`
	// AlgBW and BusBW are the algorithm and bus bandwidths in GB/s (1e9 bytes/s).
	AlgBW float64 `json:"algbw_gbps"`
	BusBW float64 `json:"busbw_gbps"`
	// Wrong is the number of wrong elements the data check found over all ranks
	// (nccl-tests' #wrong column); nil when the half was not checked (N/A).
	Wrong *int64 `json:"wrong"`
	// MaxError is older nccl-tests' "error" column (before #wrong): the largest
	// difference between a result and its expected value; nil when not given.
	MaxError *float64 `json:"max_error,omitempty"`
}

// rowJSON is Row on the wire: Time as time_us.
type rowJSON struct {
	Op        Op       `json:"op"`
	SizeBytes int64    `json:"size_bytes"`
	Count     int64    `json:"count"`
	DType     string   `json:"dtype"`
	RedOp     string   `json:"redop"`
	Root      int      `json:"root"`
	InPlace   bool     `json:"in_place"`
	TimeUS    float64  `json:"time_us"`
	AlgBW     float64  `json:"algbw_gbps"`
	BusBW     float64  `json:"busbw_gbps"`
	Wrong     *int64   `json:"wrong"`
	MaxError  *float64 `json:"max_error,omitempty"`
}

// MarshalJSON writes the row with its time as time_us (microseconds).
func (r Row) MarshalJSON() ([]byte, error) {
	return json.Marshal(rowJSON{r.Op, r.SizeBytes, r.Count, r.DType, r.RedOp, r.Root, r.InPlace,
		Micros(r.Time), r.AlgBW, r.BusBW, r.Wrong, r.MaxError})
}

// UnmarshalJSON reads a row written by MarshalJSON.
func (r *Row) UnmarshalJSON(b []byte) error {
	var j rowJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Row{j.Op, j.SizeBytes, j.Count, j.DType, j.RedOp, j.Root, j.InPlace, FromMicros(j.TimeUS), j.AlgBW, j.BusBW, j.Wrong, j.MaxError}
	return nil
}

// Micros returns d in microseconds.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// FromMicros converts microseconds to a Duration, rounded to the nanosecond.
func FromMicros(us float64) time.Duration {
	return time.Duration(math.Round(us * float64(time.Microsecond)))
}

// NewRow returns the row of one timed half with algbw and busbw computed by nccl-tests'
// formulas for ranks ranks (AlgBW, BusBW). It fails for an unknown op, fewer than one
// rank or a non-positive time.
func NewRow(op Op, ranks int, sizeBytes, count int64, dtype, redop string, root int, inPlace bool, t time.Duration, wrong *int64) (Row, error) {
	if t <= 0 {
		return Row{}, fmt.Errorf("%s at %d bytes: time %s: want a positive time", op, sizeBytes, t)
	}
	alg := AlgBW(sizeBytes, t)
	bus, err := BusBW(op, ranks, alg)
	if err != nil {
		return Row{}, err
	}
	return Row{Op: op, SizeBytes: sizeBytes, Count: count, DType: dtype, RedOp: redop, Root: root,
		InPlace: inPlace, Time: t, AlgBW: alg, BusBW: bus, Wrong: wrong}, nil
}

// Result is one operation's sweep over message sizes on one set of ranks. Its JSON
// fields are those of docs/bench.md ("Output formats"): op, ranks, rows,
// avg_busbw_gbps; the others are added where known.
type Result struct {
	// Op is the operation; "" when parsed nccl-tests output did not say which.
	Op Op `json:"op"`
	// Ranks is the number of ranks (world size); 0 when parsed output did not list them.
	Ranks int `json:"ranks"`
	// Rows holds the timed halves in the order they ran: for each size, out-of-place
	// then in-place.
	Rows []Row `json:"rows"`
	// AvgBusBW is nccl-tests' "Avg bus bandwidth" in GB/s: the mean busbw over every
	// row (nccl-tests src/common.cu averages bw over all timed halves). For parsed
	// output it is the value the file printed.
	AvgBusBW float64 `json:"avg_busbw_gbps"`
	// Engine is what timed it: "torch" (the bundled script) or "nccl-tests" (its
	// binaries, run or parsed).
	Engine string `json:"engine,omitempty"`
	// Backend is the torch.distributed backend, gloo or nccl; empty for nccl-tests.
	Backend string `json:"backend,omitempty"`
	// Device names what ran it: "cpu" or the GPU's name, when known.
	Device string `json:"device,omitempty"`
	// Unsupported says why the operation did not run ("not supported by backend
	// gloo (...)"); Rows is empty then.
	Unsupported string `json:"unsupported,omitempty"`

	// The fields below are set by Parse, from what the log says.

	// OutOfBounds is the log's own verdict, "# Out of bounds values : N OK|FAILED";
	// nil when the log printed none (gangrun's own runs: Row.Wrong says it).
	OutOfBounds *OutOfBounds `json:"out_of_bounds,omitempty"`
	// AvgBusBWOK is the log's verdict on the average busbw, printed after it when
	// NCCL_TESTS_MIN_BW was set ("# Avg bus bandwidth : 12.3 FAILED"); nil otherwise.
	AvgBusBWOK *bool `json:"avg_busbw_ok,omitempty"`
	// Failure is the CUDA or NCCL failure that ended the run, as the log printed it; the
	// rows before it are in Rows. nil for a run that was not cut short.
	Failure *Failure `json:"failure,omitempty"`
	// OpSource says where Op came from: OpFromLog, OpFromCommand, OpFromOption, or the
	// caller's ParseOptions.OpSource; "" when Op is "".
	OpSource string `json:"op_source,omitempty"`
	// Program is the nccl-tests program the log names for the table
	// ("all_reduce_perf_mpi"), when it names one.
	Program string `json:"program,omitempty"`
	// RanksInferred is true when Ranks was not listed by the log's "Rank N" lines but
	// found from the rows' algbw and busbw (Parse).
	RanksInferred bool `json:"ranks_inferred,omitempty"`
	// Copies is how many processes printed this table, when more than one did (each
	// process of an nccl-tests built without MPI prints its own); the one kept is the
	// lowest rank's.
	Copies int `json:"copies,omitempty"`
	// PrintedBy is the launcher label of the process whose table this is ("[1,0]" for
	// mpirun --tag-output, "0" for srun --label, a host for pdsh); "" without one.
	PrintedBy string `json:"printed_by,omitempty"`
	// Line is the input line of the table's column header (1 = first); 0 for a run that
	// failed before its header.
	Line int `json:"line,omitempty"`
}

// OutOfBounds is nccl-tests' data check verdict (src/util.cu writeResultFooter, and
// its -J JSON's "out_of_bounds"): Count is the number of checks that found wrong
// elements, one per process and half (and iteration, with -c N), summed over processes,
// so it is not the number of rows; OK is its "OK" (Count 0) or "FAILED".
type OutOfBounds struct {
	Count int64 `json:"count"`
	OK    bool  `json:"okay"`
}

// Verdict says whether the run failed by its own account, and why, in one line: the
// CUDA or NCCL failure that cut it short, the log's "# Out of bounds values : N FAILED"
// or "# Avg bus bandwidth : X FAILED", or, without the log's verdict, rows with wrong
// elements. ok is true when none applies.
func (r *Result) Verdict() (ok bool, why string) {
	switch {
	case r.Failure != nil:
		return false, fmt.Sprintf("the run failed %s: %s", r.Failure.Describe(r.Rows), r.Failure.Text)
	case r.OutOfBounds != nil && (r.OutOfBounds.Count > 0 || !r.OutOfBounds.OK):
		return false, fmt.Sprintf("the log's own data check failed: # Out of bounds values : %d FAILED", r.OutOfBounds.Count)
	case r.AvgBusBWOK != nil && !*r.AvgBusBWOK:
		return false, fmt.Sprintf("the log's own bandwidth check failed: # Avg bus bandwidth : %s FAILED (below NCCL_TESTS_MIN_BW)", FormatAvg(r.AvgBusBW))
	case r.OutOfBounds == nil:
		if n := wrongHalves(r.Rows); n > 0 {
			return false, fmt.Sprintf("%d timed halves had wrong elements (the #wrong column)", n)
		}
	}
	return true, ""
}

func wrongHalves(rows []Row) int {
	n := 0
	for _, row := range rows {
		if row.Wrong != nil && *row.Wrong > 0 {
			n++
		}
	}
	return n
}

// MeanBusBW returns the mean busbw over rows, as nccl-tests computes "Avg bus
// bandwidth"; 0 when there are no rows.
func MeanBusBW(rows []Row) float64 {
	if len(rows) == 0 {
		return 0
	}
	var sum float64
	for _, r := range rows {
		sum += r.BusBW
	}
	return sum / float64(len(rows))
}

// Wrong returns the total of the rows' wrong elements and whether any row was checked.
func (r *Result) Wrong() (total int64, checked bool) {
	for _, row := range r.Rows {
		if row.Wrong != nil {
			total += *row.Wrong
			checked = true
		}
	}
	return total, checked
}

// PeakBusBW returns the figure a pairwise sweep compares: the highest busbw among the
// rows of the largest message size (large messages measure bandwidth, small ones
// latency). ok is false when there are no rows.
func (r *Result) PeakBusBW() (busbw float64, ok bool) {
	var size int64 = -1
	for _, row := range r.Rows {
		switch {
		case row.SizeBytes > size:
			size, busbw = row.SizeBytes, row.BusBW
		case row.SizeBytes == size:
			busbw = math.Max(busbw, row.BusBW)
		}
	}
	return busbw, size >= 0
}
