package main

import "context"

// runCkpt is not built yet; its issue replaces this file.
func runCkpt(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "ckpt", "not built yet")
}
