"""accelerate's Accelerator.save_state with ProjectConfiguration(automatic_checkpoint_naming=
True) saves a tiny model, its AdamW optimizer and LR scheduler on CPU after steps 4 and 8
(checkpoints/checkpoint_0, checkpoint_1: model.safetensors, optimizer.bin,
scheduler.bin, random_states_0.pkl); its second save is cut at every write event
(cutsave.py). Each tree is then judged by accelerate itself: which directory load_state()
picks with automatic naming, and, for every checkpoint_N, whether load_state(that
directory) restores the model, optimizer, scheduler, step and RNG state saved there.

With LIMIT, ProjectConfiguration(total_limit=LIMIT): save_state removes the oldest
checkpoints (shutil.rmtree) before it writes the new one, and those removals are cut too.

Usage: python accelerate_state.py RESULTS [LIMIT]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
results = os.path.abspath(sys.argv[1])
limit = int(sys.argv[2]) if len(sys.argv) > 2 else None
out = os.path.join(results, "out")
os.makedirs(out)
import cutsave  # noqa: E402
cutsave.install(out)

import torch  # noqa: E402
import accelerate  # noqa: E402
import accelerate.accelerator  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import ProjectConfiguration  # noqa: E402

import common  # noqa: E402

torch.set_num_threads(1)


def make(project_dir, seed):
    torch.manual_seed(seed)
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=project_dir,
                                                                    automatic_checkpoint_naming=True,
                                                                    total_limit=limit))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    return acc, model, opt, sched


def state_fingerprint(acc, model, opt, sched):
    return common.fingerprint(dict(model.state_dict()), common.optimizer_state(opt), sched.state_dict(),
                              acc.step, torch.get_rng_state())


acc, model, opt, sched = make(out, 0)
saved = {}
cuts = whole = None
for step in range(1, 9):
    with acc.accumulate(model):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
    if step % 4 == 0:
        name = "checkpoint_%d" % acc.save_iteration
        saved[name] = state_fingerprint(acc, model, opt, sched)
        if step == 8:
            iteration = acc.project_configuration.iteration
            cuts, whole = cutsave.fork_cuts(lambda: acc.save_state(), out, results)
            acc.project_configuration.iteration = iteration
        acc.save_state()


class Picked(Exception):
    pass


real_load = accelerate.accelerator.load_accelerator_state


def judge(root):
    def record(input_dir, *args, **kwargs):
        raise Picked(os.path.basename(input_dir))
    accelerate.accelerator.load_accelerator_state = record
    try:
        make(root, 1)[0].load_state()
        pick = None
    except Picked as p:
        pick = str(p)
    except Exception as e:  # noqa: BLE001: no checkpoint to pick
        pick = None
        print("load_state() picks nothing in %s: %r" % (root, e), file=sys.stderr)
    finally:
        accelerate.accelerator.load_accelerator_state = real_load
    loads = {}
    ckdir = os.path.join(root, "checkpoints")
    for name in sorted(os.listdir(ckdir)):
        a, m, o, s = make(root, 1)
        try:
            a.load_state(os.path.join(ckdir, name))
            loads[name] = "ok" if state_fingerprint(a, m, o, s) == saved[name] else \
                "loads, but not the state saved (a missing file is skipped, or a default kept)"
        except Exception as e:  # noqa: BLE001: the loader's failure is the verdict
            loads[name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    return {"pick": pick, "loads": loads}


common.write_report(results, library="accelerate " + accelerate.__version__, subdir="checkpoints",
                    older="checkpoint_0", newer="checkpoint_1", trees=common.judge_all(results, cuts, whole, judge))
print("ok")
