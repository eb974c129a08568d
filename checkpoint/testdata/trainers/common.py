"""What the trainer scripts share: fingerprints of a training state, the report."""
import hashlib
import json
import os

import torch


def fingerprint(*parts):
    """sha256 over tensors and numbers, in order (dicts by sorted key): two states with
    the same fingerprint hold the same values."""
    h = hashlib.sha256()

    def add(x):
        if isinstance(x, torch.Tensor):
            h.update(str(x.dtype).encode())
            h.update(x.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                add(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                add(v)
        else:
            h.update(repr(x).encode())
    for p in parts:
        add(p)
    return h.hexdigest()[:16]


def optimizer_state(opt):
    """The optimizer's per-parameter state (moments, step counts) without param ids; opt
    is an optimizer or its state_dict()."""
    sd = opt if isinstance(opt, dict) else opt.state_dict()
    return [sd["state"][k] for k in sorted(sd["state"])], [
        {k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]


def judge_all(results, cuts, whole, judge):
    """Runs judge(dir) -> {"pick": ..., "loads": {...}} on the tree before the save, each
    cut and the whole save; returns the report's "trees"."""
    trees = [dict(judge(os.path.join(results, "before")), name="before", dir=os.path.join(results, "before"))]
    for c in cuts:
        trees.append(dict(judge(c["dir"]), name="cut-%03d" % c["n"], n=c["n"], event=c["event"], dir=c["dir"]))
    trees.append(dict(judge(whole), name="whole", dir=whole))
    return trees


def write_report(results, **report):
    with open(os.path.join(results, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
