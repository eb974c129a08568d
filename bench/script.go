package bench

import (
	"encoding/json"
	"fmt"
	"io"
)

// ScriptFormat is the "format" the bundled script (scripts/bench/collectives.py) writes
// in its results file; DecodeScript accepts only this one.
const ScriptFormat = "gangrun-bench-script/1"

// scriptOutput is what rank 0 of the bundled script writes: raw times, sizes and counts;
// the bandwidths are computed here so that nccl-tests' formulas live in one place.
type scriptOutput struct {
	Format       string `json:"format"`
	TorchVersion string `json:"torch_version"`
	Backend      string `json:"backend"`
	WorldSize    int    `json:"world_size"`
	Device       string `json:"device"`
	Results      []struct {
		Op          Op     `json:"op"`
		Unsupported string `json:"unsupported"`
		Rows        []struct {
			Op        Op      `json:"op"`
			SizeBytes int64   `json:"size_bytes"`
			Count     int64   `json:"count"`
			DType     string  `json:"dtype"`
			RedOp     string  `json:"redop"`
			Root      int     `json:"root"`
			InPlace   bool    `json:"in_place"`
			TimeUS    float64 `json:"time_us"`
			Wrong     *int64  `json:"wrong"`
		} `json:"rows"`
	} `json:"results"`
}

// DecodeScript reads the bundled script's results file and returns one Result per
// operation, with algbw, busbw and the average computed by nccl-tests' formulas
// (NewRow, MeanBusBW) and Engine "torch". Each row's size and count must agree with
// Op.Geometry for its dtype and the world size: a mismatch means the script and this
// package disagree on what was timed, and is an error.
func DecodeScript(r io.Reader) ([]Result, error) {
	var out scriptOutput
	dec := json.NewDecoder(r)
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("benchmark script results: %w", err)
	}
	if out.Format != ScriptFormat {
		return nil, fmt.Errorf("benchmark script results: format %q, want %q", out.Format, ScriptFormat)
	}
	if out.WorldSize < 1 {
		return nil, fmt.Errorf("benchmark script results: world size %d", out.WorldSize)
	}
	results := make([]Result, 0, len(out.Results))
	for _, sr := range out.Results {
		res := Result{Op: sr.Op, Ranks: out.WorldSize, Rows: []Row{}, Engine: "torch",
			Backend: out.Backend, Device: out.Device, Unsupported: sr.Unsupported}
		for _, x := range sr.Rows {
			if x.Op != sr.Op {
				return nil, fmt.Errorf("benchmark script results: %s row in the %s result", x.Op, sr.Op)
			}
			if err := checkGeometry(x.Op, x.DType, x.SizeBytes, x.Count, out.WorldSize); err != nil {
				return nil, fmt.Errorf("benchmark script results: %w", err)
			}
			row, err := NewRow(x.Op, out.WorldSize, x.SizeBytes, x.Count, x.DType, x.RedOp, x.Root,
				x.InPlace, FromMicros(x.TimeUS), x.Wrong)
			if err != nil {
				return nil, fmt.Errorf("benchmark script results: %w", err)
			}
			res.Rows = append(res.Rows, row)
		}
		res.AvgBusBW = MeanBusBW(res.Rows)
		results = append(results, res)
	}
	return results, nil
}

// checkGeometry verifies that size and count are what nccl-tests would time for op.
func checkGeometry(op Op, dtype string, size, count int64, ranks int) error {
	_, elem, err := ParseDType(dtype)
	if err != nil {
		return fmt.Errorf("%s row: %w", op, err)
	}
	if _, err := op.BusFactor(ranks); err != nil {
		return err
	}
	// Geometry of the reported size must give back the same size and count.
	gotBytes, gotCount := op.Geometry(size, elem, ranks)
	if gotBytes != size || gotCount != count {
		return fmt.Errorf("%s row of %d bytes, %d elements of %s on %d ranks: want %d elements", op, size, count, dtype, ranks, gotCount)
	}
	return nil
}
