# A checkpointable submitit job pre-empted with submitit's own test helper,
# job._interrupt(): `scancel ID --signal SIGTERM` (which submitit's handler bypasses)
# and `scancel ID --signal USR2`, on which the handler pickles the callable's state and
# runs `scontrol requeue ID` (submitit/slurm/slurm.py SlurmJob._interrupt,
# https://github.com/facebookincubator/submitit/blob/main/docs/checkpointing.md). The
# requeued job resumes from that state.
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
        if self.runs == 1:
            open("started.txt", "w").write("started\n")
        while self.count < target:
            self.count += 1
            # The first run would take 10 minutes: only the interrupt ends it.
            time.sleep(1.0 if self.runs == 1 else 0.01)
        return {"count": self.count, "runs": self.runs, "restarts": restarts}


executor = submitit.AutoExecutor(folder="log_interrupt")
executor.update_parameters(timeout_min=20, slurm_partition="gpu", gpus_per_node=1)
job = executor.submit(Counter(), 600)
print("job_id", job.job_id, flush=True)
deadline = time.time() + 240
while not os.path.exists("started.txt"):
    assert time.time() < deadline, "the task did not start: %s" % job.state
    time.sleep(0.5)
time.sleep(2)  # past the handlers' setup
print("state before interrupt", job.watcher.get_state(job.job_id, mode="force"), flush=True)
job._interrupt()
print("result", job.result(), flush=True)
