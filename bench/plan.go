package bench

import (
	"fmt"
	"strconv"
)

// Defaults of `gangrun bench nccl`. Warmup and Iters are nccl-tests' own defaults (-w 5,
// -n 20); the sizes, in bytes, sweep 1 KiB to 64 MiB by doubling; the element type is
// nccl-tests' default, float (float32).
const (
	DefaultMinBytes   = 1 << 10
	DefaultMaxBytes   = 64 << 20
	DefaultStepFactor = 2
	DefaultWarmup     = 5
	DefaultIters      = 20
	DefaultDType      = "float"
)

// MaxIters bounds --iters and --warmup: a million iterations of the largest size is
// hours; more is a typo.
const MaxIters = 1000000

// Plan is what a benchmark run times: which operations, at which message sizes, how many
// times, on which element type.
type Plan struct {
	// Ops are the operations, run in this order.
	Ops []Op
	// MinBytes, MaxBytes and StepFactor give the message sizes (Sizes).
	MinBytes, MaxBytes int64
	StepFactor         int
	// Warmup untimed iterations precede Iters timed ones at every size.
	Warmup, Iters int
	// DType is the element type by nccl-tests' name (ParseDType).
	DType string
	// Check runs one more iteration on known data and counts wrong elements.
	Check bool
}

// Validate reports the first bad field as a one-line error naming its flag and value.
func (p Plan) Validate() error {
	if len(p.Ops) == 0 {
		return fmt.Errorf("--op: no operation given")
	}
	for _, op := range p.Ops {
		if !isCollective(op) {
			return fmt.Errorf("--op %q: not a collective", string(op))
		}
	}
	if _, err := p.Sizes(); err != nil {
		return err
	}
	if p.Warmup < 0 || p.Warmup > MaxIters {
		return fmt.Errorf("--warmup %d: want 0 to %d", p.Warmup, MaxIters)
	}
	if p.Iters < 1 || p.Iters > MaxIters {
		return fmt.Errorf("--iters %d: want 1 to %d", p.Iters, MaxIters)
	}
	if _, _, err := ParseDType(p.DType); err != nil {
		return err
	}
	return nil
}

// Sizes returns the plan's message sizes in bytes (the package function Sizes).
func (p Plan) Sizes() ([]int64, error) { return Sizes(p.MinBytes, p.MaxBytes, p.StepFactor) }

// NCCLTestsArgs returns the command line of the nccl-tests binary for op on gpus GPUs
// in one process (nccl-tests' README, "Arguments": -b, -e, -f, -w, -n, -g, -d, -c).
func (p Plan) NCCLTestsArgs(op Op, gpus int) []string {
	check := "0"
	if p.Check {
		check = "1"
	}
	itoa := strconv.Itoa
	return []string{op.Program(),
		"-b", strconv.FormatInt(p.MinBytes, 10), "-e", strconv.FormatInt(p.MaxBytes, 10),
		"-f", itoa(p.StepFactor), "-w", itoa(p.Warmup), "-n", itoa(p.Iters),
		"-g", itoa(gpus), "-d", p.DType, "-c", check}
}
