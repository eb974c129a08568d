// Package bench embeds the collective benchmark script, scripts/bench/collectives.py,
// so that `gangrun bench nccl` can run it without the source tree: the binary writes it
// to a temporary directory and launches it under the gang's interpreter.
package bench

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/bench"
)

// ScriptName is the file name Write gives the script.
const ScriptName = "collectives.py"

//go:embed collectives.py
var script string

// Source returns the script's text.
func Source() string { return script }

// Write writes the script into dir as ScriptName (mode 0644) and returns its path.
func Write(dir string) (string, error) {
	path := filepath.Join(dir, ScriptName)
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		return "", fmt.Errorf("write the benchmark script: %w", err)
	}
	return path, nil
}

// Args returns the script's arguments (after its path) for plan p on backend ("gloo"
// or "nccl"): rank 0 writes the results to out (bench.DecodeScript reads them) and,
// when progress is not "", one JSON line per step to progress (bench.ParseStep).
func Args(p bench.Plan, backend, out, progress string) []string {
	ops := make([]string, len(p.Ops))
	for i, op := range p.Ops {
		ops[i] = string(op)
	}
	check := "0"
	if p.Check {
		check = "1"
	}
	args := []string{"--ops", strings.Join(ops, ","),
		"--min-bytes", strconv.FormatInt(p.MinBytes, 10), "--max-bytes", strconv.FormatInt(p.MaxBytes, 10),
		"--step-factor", strconv.Itoa(p.StepFactor), "--warmup", strconv.Itoa(p.Warmup),
		"--iters", strconv.Itoa(p.Iters), "--dtype", p.DType, "--backend", backend,
		"--check", check, "--out", out}
	if progress != "" {
		args = append(args, "--progress", progress)
	}
	return args
}
