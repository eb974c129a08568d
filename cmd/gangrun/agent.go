package main

import "context"

// runAgent is not built yet; its issue replaces this file.
func runAgent(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "agent", "not built yet")
}
