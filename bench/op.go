package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Op is a benchmarked operation, named as gangrun's --op flag and JSON name it (the
// nccl-tests binary is Op + "_perf", except DeviceCopy, which nccl-tests lacks).
type Op string

// The collectives of `gangrun bench nccl --op`, and the device copy the bundled script
// times on GPUs.
const (
	AllReduce     Op = "all_reduce"
	AllGather     Op = "all_gather"
	ReduceScatter Op = "reduce_scatter"
	AllToAll      Op = "alltoall"
	Broadcast     Op = "broadcast"
	// DeviceCopy is not a collective: a device-to-device copy on one GPU
	// (tensor.copy_), whose algbw and busbw are both bytes copied / time.
	DeviceCopy Op = "device_copy"
)

// The other programs of nccl-tests (src/*.cu), known to `bench parse` so that their
// logs name their operation; `bench nccl --op` does not run them.
const (
	Reduce    Op = "reduce"
	Gather    Op = "gather"
	Scatter   Op = "scatter"
	SendRecv  Op = "sendrecv"
	HyperCube Op = "hypercube"
	AllToAllV Op = "alltoallv"
)

// NCCLTestsOps lists every operation an nccl-tests program (NAME_perf) times: the
// Collectives and the others.
func NCCLTestsOps() []Op {
	return append(Collectives(), Reduce, Gather, Scatter, SendRecv, HyperCube, AllToAllV)
}

// Collectives lists the operations --op accepts, in the order they are documented.
func Collectives() []Op {
	return []Op{AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast}
}

// isCollective reports whether op is one of Collectives (what `bench nccl` runs).
func isCollective(op Op) bool {
	for _, c := range Collectives() {
		if c == op {
			return true
		}
	}
	return false
}

// ParseOps parses a comma list of collectives ("all_reduce,all_gather"). Blanks around
// names are ignored, a name given twice counts once, and the aliases all_to_all and
// allreduce-style names without the underscore are accepted. Errors name the bad entry.
func ParseOps(s string) ([]Op, error) {
	var ops []Op
	seen := map[Op]bool{}
	for _, f := range strings.Split(s, ",") {
		name := strings.ToLower(strings.TrimSpace(f))
		if name == "" {
			continue
		}
		op, ok := opByName(name)
		if !ok {
			return nil, fmt.Errorf("--op %q: unknown operation %q (want a comma list of %s)", s, name, opList())
		}
		if !seen[op] {
			seen[op] = true
			ops = append(ops, op)
		}
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("--op %q: no operation given (want a comma list of %s)", s, opList())
	}
	return ops, nil
}

// opByName resolves a lower-case --op entry, aliases included.
func opByName(name string) (Op, bool) {
	switch name {
	case "all_reduce", "allreduce":
		return AllReduce, true
	case "all_gather", "allgather":
		return AllGather, true
	case "reduce_scatter", "reducescatter":
		return ReduceScatter, true
	case "alltoall", "all_to_all":
		return AllToAll, true
	case "broadcast":
		return Broadcast, true
	}
	return "", false
}

func opList() string {
	names := make([]string, 0, 5)
	for _, op := range Collectives() {
		names = append(names, string(op))
	}
	return strings.Join(names, ", ")
}

// OpFromProgram returns the operation an nccl-tests program runs, from its name or path
// ("all_reduce_perf", "./build/alltoall_perf", "all_gather_perf_mpi", "sendrecv_perf");
// ok is false for other names.
func OpFromProgram(name string) (Op, bool) {
	base := name[strings.LastIndex(name, "/")+1:]
	stem, _, found := strings.Cut(base, "_perf")
	if !found {
		return "", false
	}
	for _, op := range NCCLTestsOps() {
		if stem == string(op) {
			return op, true
		}
	}
	return "", false
}

// Program is the nccl-tests binary that runs op: "all_reduce_perf" for AllReduce.
func (o Op) Program() string { return string(o) + "_perf" }

// Reduces reports whether the operation combines values (redop "sum" in its rows).
func (o Op) Reduces() bool { return o == AllReduce || o == ReduceScatter }

// PerRank reports whether nccl-tests counts the operation's elements per rank: for
// all_gather, reduce_scatter, alltoall, gather and scatter the count column is
// count/ranks elements and the size column the whole buffer of count/ranks × ranks
// elements (nccl-tests src/all_gather.cu, reduce_scatter.cu, alltoall.cu, gather.cu,
// scatter.cu: getCollByteCount).
func (o Op) PerRank() bool {
	return o == AllGather || o == ReduceScatter || o == AllToAll || o == Gather || o == Scatter
}

// BusFactor is the correction busbw = algbw × factor from nccl-tests' doc/PERFORMANCE.md
// ("Summary") and each program's GetBw (src/*.cu), for ranks ≥ 1:
//
//	all_reduce                                                2(n−1)/n
//	all_gather, reduce_scatter, alltoall, gather, scatter, alltoallv  (n−1)/n
//	broadcast, reduce, sendrecv, hypercube                    1
//
// DeviceCopy, not a collective, gets 1. An unknown op returns an error.
func (o Op) BusFactor(ranks int) (float64, error) {
	if ranks < 1 {
		return 0, fmt.Errorf("bus bandwidth of %s: %d ranks: want at least 1", o, ranks)
	}
	n := float64(ranks)
	switch o {
	case AllReduce:
		return 2 * (n - 1) / n, nil
	case AllGather, ReduceScatter, AllToAll, Gather, Scatter, AllToAllV:
		return (n - 1) / n, nil
	case Broadcast, DeviceCopy, Reduce, SendRecv, HyperCube:
		return 1, nil
	}
	return 0, fmt.Errorf("bus bandwidth of %q: unknown operation", string(o))
}

// busFactorDependsOnRanks reports whether BusFactor varies with the number of ranks.
func (o Op) busFactorDependsOnRanks() bool {
	switch o {
	case AllReduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter, AllToAllV:
		return true
	}
	return false
}

// Geometry returns the bytes and element count nccl-tests times for a requested message
// size (nccl-tests src/common.cu setupArgs and each op's getCollByteCount): count =
// size/elemSize elements; for PerRank ops each rank holds count/ranks of them and the
// bytes are (count/ranks) × ranks × elemSize. The bytes are what algbw divides by time.
func (o Op) Geometry(size, elemSize int64, ranks int) (bytes, count int64) {
	if elemSize < 1 || ranks < 1 {
		return 0, 0
	}
	count = size / elemSize
	if o.PerRank() {
		per := count / int64(ranks)
		return per * int64(ranks) * elemSize, per
	}
	return count * elemSize, count
}

// GB is the unit of every bandwidth here: 1e9 bytes, as nccl-tests prints GB/s.
const GB = 1e9

// AlgBW is the algorithm bandwidth in GB/s: bytes / time (nccl-tests doc/PERFORMANCE.md,
// "algbw = S/t"). It is 0 for a non-positive time.
func AlgBW(bytes int64, t time.Duration) float64 {
	if t <= 0 {
		return 0
	}
	return float64(bytes) / t.Seconds() / GB
}

// BusBW is the bus bandwidth in GB/s: algbw × op's BusFactor for ranks.
func BusBW(op Op, ranks int, algbw float64) (float64, error) {
	f, err := op.BusFactor(ranks)
	if err != nil {
		return 0, err
	}
	return algbw * f, nil
}

// ParseDType returns nccl-tests' name for a --dtype value and its element size in
// bytes. nccl-tests' names (src/common.cu, test_typenames) are what the "type" column
// and the JSON "dtype" field hold; torch's names are accepted as aliases: float32 for
// float, float16 for half, float64 for double.
func ParseDType(s string) (name string, size int64, err error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "float", "float32":
		return "float", 4, nil
	case "half", "float16":
		return "half", 2, nil
	case "bfloat16":
		return "bfloat16", 2, nil
	case "double", "float64":
		return "double", 8, nil
	case "int8":
		return "int8", 1, nil
	case "uint8":
		return "uint8", 1, nil
	case "int32":
		return "int32", 4, nil
	case "int64":
		return "int64", 8, nil
	}
	return "", 0, fmt.Errorf("--dtype %q: want float (float32), half (float16), bfloat16, double (float64), int8, uint8, int32 or int64", s)
}

// ParseSize parses a message size in bytes: a whole number with an optional binary
// suffix K, M, G or T (also KiB, MiB, GiB, TiB; any case), so 1K = 1024 and 64M =
// 67108864, as nccl-tests' -b/-e parse them (src/common.cu, parsesize). Errors name the
// bad value.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	shift := 0
	lower := strings.ToLower(t)
	for _, suf := range []struct {
		s     string
		shift int
	}{{"kib", 10}, {"mib", 20}, {"gib", 30}, {"tib", 40}, {"k", 10}, {"m", 20}, {"g", 30}, {"t", 40}} {
		if strings.HasSuffix(lower, suf.s) {
			t, shift = t[:len(t)-len(suf.s)], suf.shift
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes with an optional K, M, G or T suffix (binary: 1K = 1024)", s)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n << shift, nil
}

// FormatSize writes bytes with the largest binary suffix that divides it: 1024 → "1K",
// 67108864 → "64M", 1000 → "1000".
func FormatSize(b int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}} {
		if b != 0 && b%(1<<u.shift) == 0 {
			return strconv.FormatInt(b>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(b, 10)
}

// MaxSizes bounds how many message sizes one sweep may have.
const MaxSizes = 64

// Sizes returns the message sizes of a sweep: min, min×factor, min×factor², … up to and
// including max (nccl-tests' -b, -e, -f). It needs 1 ≤ min ≤ max and factor ≥ 2.
func Sizes(min, max int64, factor int) ([]int64, error) {
	switch {
	case min < 1:
		return nil, fmt.Errorf("--min-bytes %d: want at least 1", min)
	case max < min:
		return nil, fmt.Errorf("--max-bytes %d is below --min-bytes %d", max, min)
	case factor < 2:
		return nil, fmt.Errorf("--step-factor %d: want at least 2", factor)
	}
	var out []int64
	for s := min; s <= max; {
		out = append(out, s)
		if s > max/int64(factor) {
			break
		}
		s *= int64(factor)
	}
	return out, nil
}
