# submitit's own example, from its README
# (https://github.com/facebookincubator/submitit/blob/main/README.md, "An example is
# worth a thousand words"), run once with AutoExecutor and once with SlurmExecutor.
# Changed for gangrun's test cluster only where the README says to set them for your
# cluster: the partition ("gpu"), and one GPU a node (gangrun places GPU jobs); the
# SlurmExecutor run also sets its memory.
import sys
import time

import submitit


def add(a, b):
    return a + b


for kind in ("auto", "slurm"):
    if kind == "auto":
        # executor is the submission interface (logs are dumped in the folder)
        executor = submitit.AutoExecutor(folder="log_test")
        # set timeout in min, and partition for running the job
        executor.update_parameters(timeout_min=1, slurm_partition="gpu", gpus_per_node=1)
    else:
        executor = submitit.SlurmExecutor(folder="log_test_slurm")
        # and submitit's memory parameter, which it writes as --mem=1GB
        executor.update_parameters(time=1, partition="gpu", gpus_per_node=1, mem="1GB")
    job = executor.submit(add, 5, 7)  # will compute add(5, 7)
    print(kind, "job_id", job.job_id)  # ID of your job

    output = job.result()  # waits for completion and returns output
    assert output == 12  # 5 + 7 = 12...  your addition was computed in the cluster
    # The test's own line: the job's state as sacct says it, once its end is recorded
    # (COMPLETING while the batch step's end is still being written, as on Slurm).
    state, deadline = job.watcher.get_state(job.job_id, mode="force"), time.time() + 60
    while state == "COMPLETING" and time.time() < deadline:
        time.sleep(0.5)
        state = job.watcher.get_state(job.job_id, mode="force")
    print(kind, "result", output, "state", state)
    print(kind, "stdout", repr(job.stdout()))
    sys.stdout.flush()
