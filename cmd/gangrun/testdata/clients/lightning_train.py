# A Lightning Trainer under Slurm with SLURMEnvironment's auto-requeue, as Lightning's
# "Run on an on-prem cluster (advanced)" page shows it
# (https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html, "Wall time
# auto-resubmit"): Trainer(plugins=[SLURMEnvironment(requeue_signal=signal.SIGUSR1)])
# and the job's `#SBATCH --signal=SIGUSR1@90`. On the signal, Lightning saves
# hpc_ckpt_N.ckpt in default_root_dir and runs `scontrol requeue $SLURM_JOB_ID`; the
# requeued job's fit resumes from that checkpoint by itself.
import os
import signal
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch.utils.data import DataLoader, TensorDataset

STEPS = 300


class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if os.environ.get("SLURM_RESTART_COUNT") is None:
            time.sleep(0.5)  # the first run is still training when the signal comes
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_start(self):
        print("train start at global_step", self.trainer.global_step,
              "SLURM_RESTART_COUNT", os.environ.get("SLURM_RESTART_COUNT"), flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = Trainer(accelerator="cpu", devices=1, num_nodes=1, max_steps=STEPS, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=os.getcwd(),
                  plugins=[SLURMEnvironment(requeue_signal=signal.SIGUSR1)])
trainer.fit(Model(), DataLoader(data, batch_size=4))
print("fit done at global_step", trainer.global_step, flush=True)
