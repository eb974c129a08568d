package main

import (
	"fmt"

	"github.com/gangrun/gangrun/bench"
	"github.com/gangrun/gangrun/bench/runner"
)

// printSweep prints what runner.RunPairwise returned and returns the exit code. Node
// rank 0 prints the node × node matrix and the diagnosis on stdout, then the failed
// pairs, if any, on stderr (exit 1); every other node prints one line on stderr with
// its own pairs' figures (exit 1, and nothing more, when one of them failed).
func printSweep(e *env, format bench.Format, sw *runner.Sweep, err error) int {
	if sw == nil {
		return benchExit(e, err)
	}
	if sw.NodeRank != 0 {
		fmt.Fprintf(e.stderr, "gangrun %s: %s\n", benchCmd, sw.Fabric.NodeSummary(sw.NodeRank))
		if err != nil {
			return exitFailure
		}
		return exitOK
	}
	if err := bench.WriteFabric(e.stdout, format, sw.Op, sw.Fabric, *sw.Diagnosis); err != nil {
		return failErr(e, benchCmd, err)
	}
	return benchExit(e, err)
}
