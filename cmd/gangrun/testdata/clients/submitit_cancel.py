# A submitit job cancelled while it runs: job.cancel() runs `scancel ID`
# (submitit's SlurmJob._cancel_command), as a user of submitit's README
# (https://github.com/facebookincubator/submitit/blob/main/README.md) cancels one.
import time

import submitit


def sleep_long(path):
    open(path, "w").write("started\n")
    time.sleep(600)
    return "not cancelled"


executor = submitit.AutoExecutor(folder="log_cancel")
executor.update_parameters(timeout_min=10, slurm_partition="gpu", gpus_per_node=1)
job = executor.submit(sleep_long, "started.txt")
print("job_id", job.job_id)
deadline = time.time() + 240
while not __import__("os").path.exists("started.txt"):
    assert time.time() < deadline, "the task did not start: %s" % job.state
    time.sleep(0.5)
print("state before cancel", job.watcher.get_state(job.job_id, mode="force"))
job.cancel(check=True)
while job.watcher.get_state(job.job_id, mode="force") in ("RUNNING", "PENDING", "COMPLETING"):
    assert time.time() < deadline, "not cancelled: %s" % job.state
    time.sleep(1)
print("state after cancel", job.state)
try:
    job.result()
    print("result: no error")
except Exception as e:  # submitit raises UncompletedJobError for a job with no result
    print("result raised", type(e).__name__)
