"""DeepSpeed's engine.save_checkpoint saves a tiny model with ZeRO stage STAGE on CPU
(DS_ACCELERATOR=cpu, one process, gloo) after steps 4 and 8 (global_step4,
global_step8, and `latest` naming the tag); the second save is cut at every write event
(cutsave.py). Each tree is then judged by DeepSpeed itself: the tag its
load_checkpoint(DIR) reads from `latest`, and, for every global_stepN, whether
load_checkpoint(DIR, tag) restores the module, optimizer and global step saved there.

The children the cuts fork inherit the parent's gloo process group without its threads,
so in them dist.barrier and dist.all_reduce, identities for one process, return at once.

Usage: python deepspeed_ckpt.py RESULTS STAGE
"""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
results, stage = os.path.abspath(sys.argv[1]), int(sys.argv[2])
out = os.path.join(results, "out")
os.makedirs(out)
import cutsave  # noqa: E402
cutsave.install(out)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  LOCAL_WORLD_SIZE="1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import deepspeed  # noqa: E402
import deepspeed.comm as dscomm  # noqa: E402

import common  # noqa: E402

torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")
CONFIG = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage}, "steps_per_print": 10**6}


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=CONFIG)
    return engine


def state_fingerprint(engine):
    sd = engine.optimizer.state_dict()
    return common.fingerprint(dict(engine.module.state_dict()), common.optimizer_state(sd)
                              if "state" in sd else sd, engine.global_steps)


def one_process_collectives():
    dscomm.barrier = lambda *a, **k: None
    dscomm.all_reduce = lambda tensor, *a, **k: None
    torch.distributed.barrier = lambda *a, **k: None
    torch.distributed.all_reduce = lambda tensor, *a, **k: None


engine = make(0)
saved = {}
cuts = whole = None
for step in range(1, 9):
    loss = engine(torch.randn(4, 8)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    if step % 4 == 0:
        saved["global_step%d" % step] = state_fingerprint(engine)
        if step == 8:
            cuts, whole = cutsave.fork_cuts(lambda: engine.save_checkpoint(out), out, results,
                                            in_child=one_process_collectives)
        engine.save_checkpoint(out)

fresh = make(1)


def judge(root):
    latest = os.path.join(root, "latest")
    pick = open(latest).read().strip() if os.path.isfile(latest) else None
    loads = {}
    for name in sorted(os.listdir(root)):
        if not name.startswith("global_step"):
            continue
        e = make(1)
        try:
            path, _ = e.load_checkpoint(root, tag=name)
            if path is None:
                raise RuntimeError("load_checkpoint returned no path")
            loads[name] = "ok" if state_fingerprint(e) == saved[name] else "loads, but not the state saved there"
        except Exception as ex:  # noqa: BLE001: the loader's failure is the verdict
            loads[name] = "%s: %s" % (type(ex).__name__, str(ex).splitlines()[0][:200] if str(ex) else "")
    return {"pick": pick, "loads": loads}


common.write_report(results, library="deepspeed %s (ZeRO stage %d, CPU)" % (deepspeed.__version__, stage),
                    older="global_step4", newer="global_step8", trees=common.judge_all(results, cuts, whole, judge))
print("ok")
