package main

import "context"

// runHostlist is not built yet; its issue replaces this file.
func runHostlist(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "hostlist", "not built yet")
}
