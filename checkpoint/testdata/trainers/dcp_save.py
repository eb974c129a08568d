"""torch.distributed.checkpoint (torch 2.x) saves a tiny model's and AdamW optimizer's state
on CPU after steps 4 and 8 into step-4 and step-8, as torchtitan names them, with
dcp.async_save (MODE async: the save runs in DCP's background thread, the trainer waits
for its future before the next one) or dcp.save (MODE sync); the second save is cut at
every write event (cutsave.py). Each tree is then judged by torch itself: whether
dcp.load of each step-N directory restores the state saved there. DCP has no "latest" of
its own (the caller names the directory), so pick is null.

Usage: python dcp_save.py RESULTS MODE
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
results, mode = os.path.abspath(sys.argv[1]), sys.argv[2]
out = os.path.join(results, "out")
os.makedirs(out)
import cutsave  # noqa: E402
cutsave.install(out)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import common  # noqa: E402

torch.set_num_threads(1)


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def state(model, opt, step):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def save(sd, path):
    if mode == "async":
        dcp.async_save(sd, checkpoint_id=path).result()
    else:
        dcp.save(sd, checkpoint_id=path)


model, opt = make(0)
# Train a step first so the optimizer holds its moments (load needs the same structure).
saved = {}
cuts = whole = None
for step in range(1, 9):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 4 == 0:
        name = "step-%d" % step
        path = os.path.join(out, name)
        saved[name] = common.fingerprint(dict(model.state_dict()), common.optimizer_state(opt), step)
        if step == 8:
            cuts, whole = cutsave.fork_cuts(lambda: save(state(model, opt, step), path), out, results)
        save(state(model, opt, step), path)


def judge(root):
    loads = {}
    for name in sorted(os.listdir(root)):
        m, o = make(1)
        # One step, so the fresh optimizer has the state dict's structure to load into.
        m(torch.randn(4, 8)).pow(2).mean().backward()
        o.step()
        sd = state(m, o, 0)
        try:
            dcp.load(sd, checkpoint_id=os.path.join(root, name))
            m.load_state_dict(sd["model"])
            o.load_state_dict(sd["optim"])
            got = common.fingerprint(dict(m.state_dict()), common.optimizer_state(o), sd["step"])
            loads[name] = "ok" if got == saved[name] else "loads, but not the state saved there"
        except BaseException as e:  # noqa: BLE001: torch's CheckpointException is a BaseException
            loads[name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    return {"pick": None, "loads": loads}


common.write_report(results, library="torch %s (dcp.%s)" % (torch.__version__, "async_save" if mode == "async" else "save"),
                    older="step-4", newer="step-8", trees=common.judge_all(results, cuts, whole, judge))
print("ok")
