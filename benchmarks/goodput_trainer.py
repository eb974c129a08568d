#!/usr/bin/env python3
"""The trainer of benchmarks/goodput.py: DDP (gloo, CPU) steps of about --step-time
seconds, a checkpoint every --ckpt-every steps, resumed from the newest complete one.

It runs unchanged under gangrun and torchrun: it resumes from GANGRUN_RESUME_FROM when
gangrun gives it, else it looks for the newest complete checkpoint itself (what a
torchrun user writes). Rank 0 appends "STEP UNIXTIME ATTEMPT-START" lines to --progress:
one per step, so the driver knows the newest step reached, when each attempt took its
first step, and the failure-free step time.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def newest_complete(ckpt_dir):
    best = -1
    for name in os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []:
        if name.startswith("step-") and os.path.exists(os.path.join(ckpt_dir, name, ".complete")):
            try:
                best = max(best, int(name[5:]))
            except ValueError:
                pass
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--progress", required=True)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.05)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # The driver picks its victims here: a warm-started worker's command line is its
    # standby's, not this script's.
    with open(args.progress + ".pid-%d" % rank, "w") as f:
        f.write("%d\n" % os.getpid())
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    resume = os.environ.get("GANGRUN_RESUME_FROM", "")
    if resume:
        start = int(os.path.basename(resume.rstrip("/"))[5:])
    else:
        start = max(newest_complete(args.ckpt_dir), 0)
    if start > 0:
        state = torch.load(os.path.join(args.ckpt_dir, "step-%d" % start, "model.pt"))
        model.module.load_state_dict(state)

    first = True
    step = start
    while True:
        t0 = time.time()
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        rest = args.step_time - (time.time() - t0)
        if rest > 0:
            time.sleep(rest)
        if rank == 0:
            with open(args.progress, "a") as f:
                f.write("%d %.3f %d\n" % (step, time.time(), 1 if first else 0))
            if step % args.ckpt_every == 0:
                d = os.path.join(args.ckpt_dir, "step-%d" % step)
                tmp = d + ".tmp"
                os.makedirs(tmp, exist_ok=True)
                torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
                os.rename(tmp, d)
                open(os.path.join(d, ".complete"), "w").close()
        first = False


if __name__ == "__main__":
    main()
