// Package bench holds collective benchmark results with nccl-tests' figures: the
// formulas (algbw, busbw), results timed by the bundled PyTorch script or nccl-tests,
// a parser for nccl-tests output as launchers and log collectors keep it (prefixes,
// per-rank copies, the log's own verdict, runs cut by a CUDA or NCCL failure), the
// table, JSON and CSV printers, and the pairwise
// fabric sweep that names the slow node or link.
//
// Definitions follow nccl-tests' doc/PERFORMANCE.md (github.com/NVIDIA/nccl-tests):
// algbw = S / t, where S is the size column's bytes and t the mean time of one
// operation; busbw = algbw × 2(n−1)/n for all_reduce, × (n−1)/n for all_gather,
// reduce_scatter and alltoall, × 1 for broadcast, with n ranks; GB = 1e9 bytes.
// "Avg bus bandwidth" is the mean busbw over every timed half (src/common.cu).
package bench
