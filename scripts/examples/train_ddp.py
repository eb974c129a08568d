#!/usr/bin/env python3
"""A small DistributedDataParallel trainer for gangrun's demo and end-to-end tests.

It trains a two-layer MLP on synthetic data with torch.distributed (gloo on CPU, nccl on
GPU), reads the environment torchrun gives its workers (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), and runs unchanged under torchrun or `gangrun run`. It runs on
torch 1.13 and 2.x.

Checkpoints: every --ckpt-every steps rank 0 writes CKPT_DIR/step-N the safe way: into a
temporary directory, renamed into place, then marked complete with a `.complete` file
(the marker gangrun looks for). CKPT_DIR is --ckpt-dir, else GANGRUN_CHECKPOINT_DIR.

Resume: from --resume PATH (what `gangrun run --resume-arg --resume` appends), else from
GANGRUN_RESUME_FROM. Prints "resumed from step N".

Failure injection: --fail-at-step N makes the last rank fail at step N on the first
attempt only (GANGRUN_ATTEMPT, else TORCHELASTIC_RESTART_COUNT, is 0), so a restarted
gang gets past it: it raises RuntimeError (recorded in TORCHELASTIC_ERROR_FILE by
torch's @record), or exits with --fail-exit-code when that is given.

Fencing: before it writes a checkpoint, rank 0 reads gangrun's fence file
(CKPT_DIR/.gangrun/fence, written before every attempt starts). If it names another job
or attempt than this worker's GANGRUN_JOB_ID and GANGRUN_ATTEMPT, a newer attempt owns
the directory (this worker's node lost contact with the coordinator and the gang
re-formed without it): it writes nothing and raises.

Pre-emption: on SIGUSR1 the gang writes a checkpoint at the next step and goes on; on
SIGTERM it writes one and exits with 143. All ranks agree on the step through an
all-reduce, so they stop together.

Output, one line each, for people and for tests:
  "resumed from step N"   "checkpoint step N"   "finished at step N"
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

_STOP = {"signal": 0}


def _on_signal(signum, _frame):
    _STOP["signal"] = signum


def say(msg):
    """Prints one line in a single write(2), so lines from ranks that share a pipe (the
    workers of a wrapped torchrun) never interleave. print() writes the text and the
    newline separately when stdout is unbuffered (PYTHONUNBUFFERED=1)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--ckpt-every", type=int, default=20, help="checkpoint every K steps")
    p.add_argument("--ckpt-dir", default=None, help="default: GANGRUN_CHECKPOINT_DIR")
    p.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    p.add_argument("--fail-at-step", type=int, default=-1,
                   help="the last rank raises at this step on the first attempt")
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that fails (default: last)")
    p.add_argument("--fail-exit-code", type=int, default=None,
                   help="exit with this code at --fail-at-step instead of raising")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="legacy torch.distributed.launch argument (LOCAL_RANK is used otherwise)")
    return p.parse_args()


def superseded(ckpt_dir):
    """Returns who owns ckpt_dir when gangrun's fence names another attempt than this
    worker's, else None (also when there is no fence: not run by gangrun)."""
    job, attempt = os.environ.get("GANGRUN_JOB_ID"), os.environ.get("GANGRUN_ATTEMPT")
    if not job or attempt is None:
        return None
    try:
        with open(os.path.join(ckpt_dir, ".gangrun", "fence")) as f:
            fence = json.load(f)
    except (OSError, ValueError):
        return None
    if fence.get("job") != job or str(fence.get("attempt")) != attempt:
        return "job %s attempt %s" % (fence.get("job"), fence.get("attempt"))
    return None


def save_checkpoint(ckpt_dir, step, model, opt):
    """Writes ckpt_dir/step-N atomically: temp dir, rename, then the .complete marker."""
    owner = superseded(ckpt_dir)
    if owner:
        raise RuntimeError("superseded: %s now owns %s; not writing step %d" % (owner, ckpt_dir, step))
    final = os.path.join(ckpt_dir, "step-%d" % step)
    tmp = os.path.join(ckpt_dir, ".tmp-step-%d-%d" % (step, os.getpid()))
    if os.path.exists(final):
        return final
    os.makedirs(tmp, exist_ok=True)
    torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict()},
               os.path.join(tmp, "state.pt"))
    os.rename(tmp, final)
    with open(os.path.join(final, ".complete"), "w") as f:
        f.write("%d\n" % step)
    return final


@record
def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    # Under a wrapped torchrun, TORCHELASTIC_RESTART_COUNT is torchrun's own (always 0):
    # gangrun's attempt number is what says "first attempt".
    attempt = int(os.environ.get("GANGRUN_ATTEMPT", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    dist.init_process_group(backend=backend)  # env:// — MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE

    signal.signal(signal.SIGUSR1, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    ckpt_dir = args.ckpt_dir or os.environ.get("GANGRUN_CHECKPOINT_DIR")
    resume = args.resume or os.environ.get("GANGRUN_RESUME_FROM")
    start = 0
    if resume:
        state = torch.load(os.path.join(resume, "state.pt"), map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["step"])
        say("resumed from step %d" % start)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None)
    if rank == 0:
        say("training: world size %d, backend %s, steps %d..%d, attempt %s"
            % (world, backend, start, args.steps, os.environ.get("GANGRUN_ATTEMPT", "?")))

    fail_rank = args.fail_rank if args.fail_rank >= 0 else world - 1
    loss = torch.tensor(0.0)
    step = start
    while step < args.steps:
        step += 1
        if step == args.fail_at_step and rank == fail_rank and attempt == 0:
            if args.fail_exit_code is not None:
                say("injected exit %d at step %d" % (args.fail_exit_code, step))
                sys.stderr.flush()
                # os._exit, not sys.exit: interpreter shutdown with gloo's threads still
                # running can abort (std::terminate → SIGABRT) instead of exiting with
                # the code asked for.
                os._exit(args.fail_exit_code)
            raise RuntimeError("injected failure at step %d (--fail-at-step)" % step)
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(args.batch, 16, generator=g).to(device)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if args.step_time > 0:
            time.sleep(args.step_time)

        stop = torch.tensor([float(_STOP["signal"])], device=device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        stop_sig = int(stop.item())
        due = ckpt_dir and (step % args.ckpt_every == 0 or stop_sig)
        if due:
            if rank == 0:
                os.makedirs(ckpt_dir, exist_ok=True)
                path = save_checkpoint(ckpt_dir, step, model, opt)
                say("checkpoint step %d %s" % (step, path))
            dist.barrier()
        if stop_sig == signal.SIGTERM:
            if rank == 0:
                say("stopping at step %d on SIGTERM" % step)
            dist.destroy_process_group()
            leave(128 + signal.SIGTERM)
        if stop_sig == signal.SIGUSR1:
            _STOP["signal"] = 0
    if rank == 0:
        say("finished at step %d loss %.4f" % (step, loss.item()))
    dist.barrier()
    dist.destroy_process_group()
    leave(0)


def leave(code):
    """Exit with code without the interpreter's shutdown. torch 2.x's gloo can still
    have threads running after destroy_process_group(); tearing the interpreter down
    under them aborts now and then ("terminate called without an active exception",
    SIGABRT) after the work is done, and the launcher rightly counts that as a failure
    (seen once in 2026-12 CI on torch 2.15: pytorch/pytorch#179291 is the same crash
    without destroy_process_group)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
