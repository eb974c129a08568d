"""Lightning's Trainer with ModelCheckpoint(every_n_train_steps=4, save_top_k=-1,
save_last=True) saves a tiny LightningModule on CPU after steps 4 and 8
(epoch=0-step=4.ckpt, epoch=0-step=8.ckpt and last.ckpt, each through Lightning's
_atomic_save); the second save (ModelCheckpoint.on_train_batch_end at step 8) is cut at
every write event (cutsave.py). Each tree is then judged by Lightning itself: which file
fit(ckpt_path="last") resolves to, and, for every *.ckpt, whether the strategy's
load_checkpoint reads back the model, optimizer and global step saved there.

With LAST "link", save_last="link": last.ckpt is a symbolic link to the newest file,
removed and made again at each save (ModelCheckpoint._link_checkpoint).

Usage: python lightning_ckpt.py RESULTS [LAST]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
results = os.path.abspath(sys.argv[1])
save_last = "link" if len(sys.argv) > 2 and sys.argv[2] == "link" else True
out = os.path.join(results, "out")
os.makedirs(out)
import cutsave  # noqa: E402
cutsave.install(out)

import torch  # noqa: E402
import lightning  # noqa: E402
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.trainer.states import TrainerFn  # noqa: E402

import common  # noqa: E402

torch.set_num_threads(1)


class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=4)


def trainer(dirpath, max_steps):
    cb = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=4, save_top_k=-1, save_last=save_last)
    return Trainer(max_steps=max_steps, callbacks=[cb], accelerator="cpu", devices=1, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


saved = {}
real_batch_end = ModelCheckpoint.on_train_batch_end


def on_train_batch_end(self, trainer, pl_module, *args, **kwargs):
    step = trainer.global_step
    if step % 4 == 0:
        saved[step] = common.fingerprint(dict(pl_module.state_dict()),
                                         common.optimizer_state(trainer.optimizers[0]), step)
        if step == 8:
            saved["cuts"] = cutsave.fork_cuts(lambda: real_batch_end(self, trainer, pl_module, *args, **kwargs),
                                              out, results)
    return real_batch_end(self, trainer, pl_module, *args, **kwargs)


ModelCheckpoint.on_train_batch_end = on_train_batch_end
torch.manual_seed(0)
trainer(out, 8).fit(Tiny())
cuts, whole = saved.pop("cuts")


def judge(root):
    t = trainer(root, 8)
    t.strategy.connect(Tiny())
    try:
        pick = t._checkpoint_connector._parse_ckpt_path(TrainerFn.FITTING, "last", model_provided=True,
                                                        model_connected=True)
    except Exception as e:  # noqa: BLE001
        pick = None
        print("ckpt_path='last' resolves to nothing in %s: %r" % (root, e), file=sys.stderr)
    loads, steps = {}, {}
    for name in sorted(os.listdir(root)):
        try:
            ck = t.strategy.load_checkpoint(os.path.join(root, name))
            step = ck["global_step"]
            got = common.fingerprint(dict(ck["state_dict"]), common.optimizer_state(ck["optimizer_states"][0]), step)
            loads[name] = "ok" if got == saved.get(step) else "loads, but not a state saved at step %d" % step
            steps[name] = step
        except Exception as e:  # noqa: BLE001: the loader's failure is the verdict
            loads[name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    return {"pick": os.path.basename(pick) if pick else None, "loads": loads, "steps": steps}


common.write_report(results, library="lightning " + lightning.__version__, older="epoch=0-step=4.ckpt",
                    newer="epoch=0-step=8.ckpt", trees=common.judge_all(results, cuts, whole, judge))
print("ok")
