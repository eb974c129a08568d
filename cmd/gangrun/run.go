package main

import "context"

// runRun is not built yet; its issue replaces this file.
func runRun(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "run", "not built yet")
}
