package main

import "context"

// runTopo is not built yet; its issue replaces this file.
func runTopo(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "topo", "not built yet")
}
