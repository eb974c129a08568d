// Package docs holds gangrun's manual: one Markdown page per noun (run, checkpoints,
// topology, cluster, jobs, accounting, several nodes, bench, hostlists, testing, limits). It has no
// code; its test checks that every relative link in the README, benchmarks/README.md
// and these pages leads to a file that exists and, with a #fragment, to a heading (or
// an explicit anchor) that the target page has, as GitHub renders it.
package docs
