# A checkpointable submitit job requeued by its own USR2 handling, as submitit's
# docs/checkpointing.md (https://github.com/facebookincubator/submitit/blob/main/docs/checkpointing.md)
# describes it: a callable subclassing submitit.helpers.Checkpointable, whose state is
# pickled again when Slurm's --signal=USR2@DELAY (submitit's sbatch line, DELAY its
# slurm_signal_delay_s) reaches the task before the time limit; submitit's handler then
# runs `scontrol requeue ID` and the job runs again from that state.
import os
import time

import submitit


class Counter(submitit.helpers.Checkpointable):
    def __init__(self):
        self.count = 0
        self.runs = 0

    def __call__(self, target):
        self.runs += 1
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        print("run", self.runs, "from count", self.count, "SLURM_RESTART_COUNT", restarts, flush=True)
        while self.count < target:
            self.count += 1
            # The first run is slow enough for the signal to come before it ends; the
            # requeued one, resumed from the checkpoint, is not.
            time.sleep(1.0 if self.runs == 1 else 0.01)
        return {"count": self.count, "runs": self.runs, "restarts": restarts}


executor = submitit.AutoExecutor(folder="log_ckpt")
# 3 minutes, and USR2 150 s before their end: 30 s after each start.
executor.update_parameters(timeout_min=3, slurm_partition="gpu", gpus_per_node=1, slurm_signal_delay_s=150)
job = executor.submit(Counter(), 400)
print("job_id", job.job_id, flush=True)
print("result", job.result(), flush=True)
print("stderr", repr(job.stderr()))
