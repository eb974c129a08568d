# dask-jobqueue's documented example (https://jobqueue.dask.org/en/latest/index.html,
# "Example", and https://jobqueue.dask.org/en/latest/clusters-example-deployments.html):
# a SLURMCluster, cluster.scale(jobs=2), a Client computing a sum on its workers.
# Changed for gangrun's test cluster where the docs say to set them for your cluster:
# the queue (partition "gpu"), a small worker (1 core, 1 GB), no account. With
# argument "gpu", each job also asks one GPU (job_extra_directives), for a gangrun that
# places GPU jobs only.
import sys
import time

from dask.distributed import Client
from dask_jobqueue import SLURMCluster

extra = ["--gres=gpu:1"] if sys.argv[1:] == ["gpu"] else []
cluster = SLURMCluster(cores=1, processes=1, memory="1GB", queue="gpu", walltime="00:10:00",
                       job_extra_directives=extra, interface=None, scheduler_options={"host": "127.0.0.1"})
print(cluster.job_script(), flush=True)
cluster.scale(jobs=2)  # ask for 2 jobs
client = Client(cluster)
client.wait_for_workers(2, timeout=240)
print("workers", len(client.scheduler_info()["workers"]), flush=True)

futures = client.map(lambda x: x * x, range(10))
total = client.submit(sum, futures)
print("sum", total.result(), flush=True)

client.close()
cluster.close()
print("closed", flush=True)
