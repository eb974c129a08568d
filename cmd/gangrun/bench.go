package main

import "context"

// runBench is not built yet; its issue replaces this file.
func runBench(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "bench", "not built yet")
}
