package main

import "context"

func runNodes(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "nodes", "not built yet")
}
func runAlloc(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "alloc", "not built yet")
}
func runQueue(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "queue", "not built yet")
}
func runShow(_ context.Context, e *env, _ []string) int { return usageErr(e, "show", "not built yet") }
func runCancel(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "cancel", "not built yet")
}
func runDrain(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "drain", "not built yet")
}
func runResume(_ context.Context, e *env, _ []string) int {
	return usageErr(e, "resume", "not built yet")
}
