#!/usr/bin/env python3
"""Time torch.distributed collectives the way nccl-tests does; gangrun bench nccl runs it.

Every rank runs this script with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK), as `gangrun bench nccl` and `gangrun run` provide it. It works
with torch 1.13 and 2.x, on CPU with the gloo backend and on GPUs with nccl.

For each operation and message size it:
  * sizes the buffers by nccl-tests' rules (src/*.cu, getCollByteCount): the size is the
    whole buffer in bytes; all_gather, reduce_scatter and alltoall move count =
    size / elem / ranks elements per rank, so the size is count * elem * ranks;
  * runs --warmup untimed iterations, then a barrier (and cuda synchronize on GPU),
    then --iters timed iterations, then a synchronize: the time is the mean per
    iteration, averaged over the ranks (nccl-tests' default, -a 1);
  * with --check, runs the operation once more on known data and counts the wrong
    elements over all ranks (nccl-tests' #wrong column).

Only what torch can do honestly is timed: all_reduce and broadcast work in place
(torch has no out-of-place form); all_gather and reduce_scatter run out of place and in
place (the input is the rank's slice of the output, as NCCL defines in-place);
alltoall runs out of place only. An operation the backend lacks (gloo in torch 1.13 has
no reduce_scatter) is reported as unsupported, not emulated.

On GPUs it also times a device-to-device copy (tensor.copy_ on one GPU) at each size:
op "device_copy", bytes copied / time, not a collective.

Bandwidths are not computed here: rank 0 writes times, sizes and counts as JSON to
--out, and gangrun applies nccl-tests' formulas (doc/PERFORMANCE.md). With --progress,
rank 0 appends one JSON line per step to that file before running the step.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

FORMAT = "gangrun-bench-script/1"

# nccl-tests' type names, which gangrun prints, and torch's dtypes.
DTYPES = {
    "float": torch.float32,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "double": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")
# Ops whose count is per rank (nccl-tests: count / nranks elements each).
PER_RANK = ("all_gather", "reduce_scatter", "alltoall")
REDUCING = ("all_reduce", "reduce_scatter")
ROOT = 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", required=True, help="comma list of " + ",".join(OPS))
    p.add_argument("--min-bytes", type=int, required=True)
    p.add_argument("--max-bytes", type=int, required=True)
    p.add_argument("--step-factor", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--dtype", default="float", choices=sorted(DTYPES))
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--check", type=int, default=1, choices=(0, 1))
    p.add_argument("--device-copy", type=int, default=1, choices=(0, 1))
    p.add_argument("--out", required=True, help="rank 0 writes the results here (JSON)")
    p.add_argument("--progress", default="", help="rank 0 appends one JSON line per step")
    a = p.parse_args(argv)
    a.ops = [o for o in a.ops.split(",") if o]
    for o in a.ops:
        if o not in OPS:
            p.error("--ops: unknown operation %r (want %s)" % (o, ", ".join(OPS)))
    if a.min_bytes < 1 or a.max_bytes < a.min_bytes or a.step_factor < 2:
        p.error("want 1 <= --min-bytes <= --max-bytes and --step-factor >= 2")
    if a.iters < 1 or a.warmup < 0:
        p.error("want --iters >= 1 and --warmup >= 0")
    return a


def sizes(a):
    s = a.min_bytes
    while s <= a.max_bytes:
        yield s
        s *= a.step_factor


def geometry(op, size, elem, n):
    """(bytes, count) for a requested size, by nccl-tests' getCollByteCount rules."""
    count = size // elem
    if op in PER_RANK:
        per = count // n
        return per * n * elem, per
    return count * elem, count


class Bench:
    def __init__(self, a):
        self.a = a
        self.rank = dist.get_rank()
        self.n = dist.get_world_size()
        self.dtype = DTYPES[a.dtype]
        self.elem = torch.tensor([], dtype=self.dtype).element_size()
        if a.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.progress = None
        self.bytes_done = 0
        self.bytes_total = 0
        if self.rank == 0 and a.progress:
            self.progress = open(a.progress, "a", buffering=1)

    # -- helpers -----------------------------------------------------------------

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def zeros(self, count):
        return torch.zeros(count, dtype=self.dtype, device=self.device)

    def full(self, count, value):
        return torch.full((count,), value, dtype=self.dtype, device=self.device)

    def mean_over_ranks(self, value):
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.n

    def sum_over_ranks(self, value):
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return int(t.item())

    def step(self, op, size, in_place, index, total):
        """Report the step about to run; bytes_before/bytes_total weigh the steps by
        message size so that gangrun can estimate the time left."""
        if self.progress is not None:
            self.progress.write(json.dumps({
                "op": op, "size_bytes": size, "in_place": in_place, "step": index,
                "steps": total, "bytes_before": self.bytes_done, "bytes_total": self.bytes_total,
            }) + "\n")
        self.bytes_done += size

    # -- operations ----------------------------------------------------------------
    #
    # make(op, count, in_place) returns (run, fill, expect): run() performs the
    # collective once; fill() loads the check pattern; expect() returns the tensor
    # holding the result and the expected values of it on this rank.

    def make(self, op, count, in_place):
        n, r = self.n, self.rank
        if op == "all_reduce":
            buf = self.zeros(count)

            def fill():
                buf.fill_(1)
            return (lambda: dist.all_reduce(buf)), fill, lambda: (buf, self.full(count, n))
        if op == "broadcast":
            buf = self.zeros(count)

            def fill():
                buf.fill_(1 if r == ROOT else 0)
            return (lambda: dist.broadcast(buf, ROOT)), fill, lambda: (buf, self.full(count, 1))
        if op == "all_gather":
            out = self.zeros(count * n)
            chunks = list(out.chunk(n))
            inp = chunks[r] if in_place else self.zeros(count)
            if self.device.type == "cuda" and hasattr(dist, "all_gather_into_tensor"):
                run = lambda: dist.all_gather_into_tensor(out, inp)
            else:
                run = lambda: dist.all_gather(chunks, inp)

            def fill():
                out.zero_()
                inp.fill_(r % 100 + 1)
            expected = torch.cat([self.full(count, j % 100 + 1) for j in range(n)])
            return run, fill, lambda: (out, expected)
        if op == "reduce_scatter":
            inp = self.zeros(count * n)
            out = inp.chunk(n)[r] if in_place else self.zeros(count)
            if hasattr(dist, "reduce_scatter_tensor"):
                run = lambda: dist.reduce_scatter_tensor(out, inp)
            else:
                run = lambda: dist.reduce_scatter(out, list(inp.chunk(n)))

            def fill():
                inp.fill_(1)
            return run, fill, lambda: (out, self.full(count, n))
        if op == "alltoall":
            inp = self.zeros(count * n)
            out = self.zeros(count * n)

            def fill():
                inp.fill_(r % 100 + 1)
                out.zero_()
            expected = torch.cat([self.full(count, j % 100 + 1) for j in range(n)])
            return (lambda: dist.all_to_all_single(out, inp)), fill, lambda: (out, expected)
        raise ValueError(op)

    def places(self, op):
        """The halves torch can time honestly: False is out-of-place, True in-place."""
        if op in ("all_reduce", "broadcast"):
            return [True]
        if op == "alltoall":
            return [False]
        return [False, True]

    def unsupported(self, op):
        """A reason the backend cannot run op, found by running it once on 1 element
        per rank; None when it can. Every rank gets the same answer."""
        try:
            for in_place in self.places(op):
                run, _, _ = self.make(op, 1, in_place)
                run()
            self.sync()
        except RuntimeError as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "not support" in msg.lower():
                return "not supported by backend %s (torch %s: %s)" % (
                    self.a.backend, torch.__version__, msg)
            raise
        return None

    def time_op(self, run):
        for _ in range(self.a.warmup):
            run()
        self.sync()
        dist.barrier()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(self.a.iters):
            run()
        self.sync()
        return (time.perf_counter() - t0) / self.a.iters

    def check(self, run, fill, expect):
        fill()
        self.sync()
        dist.barrier()
        run()
        self.sync()
        got, want = expect()
        wrong = int((got != want).sum().item())
        return self.sum_over_ranks(wrong)

    def collective(self, op, index, total):
        reason = self.unsupported(op)
        if reason is not None:
            places = len(self.places(op))
            self.bytes_done += places * sum(sizes(self.a))
            return {"op": op, "unsupported": reason, "rows": []}, index + places * len(list(sizes(self.a)))
        rows = []
        for size in sizes(self.a):
            nbytes, count = geometry(op, size, self.elem, self.n)
            for in_place in self.places(op):
                index += 1
                self.step(op, nbytes, in_place, index, total)
                if count == 0:
                    continue
                run, fill, expect = self.make(op, count, in_place)
                sec = self.mean_over_ranks(self.time_op(run))
                wrong = self.check(run, fill, expect) if self.a.check else None
                rows.append({"op": op, "size_bytes": nbytes, "count": count,
                             "dtype": self.a.dtype,
                             "redop": "sum" if op in REDUCING else "none",
                             "root": ROOT if op == "broadcast" else -1,
                             "in_place": in_place, "time_us": sec * 1e6, "wrong": wrong})
        return {"op": op, "rows": rows}, index

    def device_copy(self, index, total):
        """Device-to-device copy bandwidth on this rank's GPU: bytes copied / time."""
        rows = []
        for size in sizes(self.a):
            index += 1
            self.step("device_copy", size, False, index, total)
            src = torch.zeros(size, dtype=torch.uint8, device=self.device)
            dst = torch.empty_like(src)
            for _ in range(self.a.warmup):
                dst.copy_(src)
            self.sync()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.a.iters):
                dst.copy_(src)
            end.record()
            end.synchronize()
            sec = self.mean_over_ranks(start.elapsed_time(end) / 1e3 / self.a.iters)
            rows.append({"op": "device_copy", "size_bytes": size, "count": size,
                         "dtype": "uint8", "redop": "none", "root": -1, "in_place": False,
                         "time_us": sec * 1e6, "wrong": None})
        return {"op": "device_copy", "rows": rows}, index

    def run(self):
        nsizes = len(list(sizes(self.a)))
        total = sum(nsizes * len(self.places(op)) for op in self.a.ops)
        self.bytes_total = sum(sizes(self.a)) * sum(len(self.places(op)) for op in self.a.ops)
        copy = self.a.device_copy and self.device.type == "cuda"
        if copy:
            total += nsizes
            self.bytes_total += sum(sizes(self.a))
        results, index = [], 0
        for op in self.a.ops:
            res, index = self.collective(op, index, total)
            results.append(res)
        if copy:
            res, index = self.device_copy(index, total)
            results.append(res)
        device = "cpu"
        if self.device.type == "cuda":
            device = torch.cuda.get_device_name(self.device)
        return {"format": FORMAT, "torch_version": torch.__version__,
                "backend": self.a.backend, "world_size": self.n, "device": device,
                "results": results}


def main(argv):
    a = parse_args(argv)
    if a.backend == "nccl":
        if not torch.cuda.is_available():
            sys.exit("collectives.py: --backend nccl needs CUDA GPUs, and torch sees none")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=a.backend, init_method="env://")
    try:
        out = Bench(a).run()
        if dist.get_rank() == 0:
            tmp = a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(out, f)
            os.replace(tmp, a.out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
