package main

import "flag"

// update rewrites the golden files under testdata/ instead of comparing with them:
// go test ./cmd/gangrun -update.
var update = flag.Bool("update", false, "rewrite golden files under testdata/")
