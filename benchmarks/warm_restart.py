#!/usr/bin/env python3
"""Kill → first line of the next attempt, warm vs cold restarts (docs/run.md, "Warm restarts").

usage: benchmarks/warm_restart.py GANGRUN PYTHON [N]

One worker imports torch, prints "up ATTEMPT PID" and sleeps. N times (5 by default),
this script waits for that line plus a settle time (so that the standby of the next
attempt has finished importing, as it has in any run whose attempts last longer than
an import), SIGKILLs the worker and times how long the next attempt's "up" line takes
to reach gangrun's stdout. gangrun runs with --restart-backoff 0s, once with warm
restarts (the default) and once with --warm-restarts=false; it prints each run's
samples and their median.
"""
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

SETTLE = 8.0  # seconds after "up" before the kill: the standby's torch import is done

WORKER = """
import os, time
import torch
print("up", os.environ["GANGRUN_ATTEMPT"], os.getpid(), flush=True)
time.sleep(3600)
"""


def measure(gangrun, python, n, warm):
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        cmd = [gangrun, "run", "--nproc-per-node", "1", "--max-restarts", str(n),
               "--restart-backoff", "0s", "--warm-restarts=" + ("true" if warm else "false"),
               "--", python, script]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        samples, killed_at = [], None
        for line in p.stdout:
            if "]: up " not in line:
                continue
            now = time.monotonic()
            attempt, pid = (int(x) for x in line.split("]: up ")[1].split())
            if killed_at is not None:
                samples.append(now - killed_at)
            if len(samples) == n:
                break
            time.sleep(SETTLE)
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
        p.send_signal(signal.SIGTERM)
        p.wait()
        return samples


def main():
    gangrun, python = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    for warm in (True, False):
        s = measure(gangrun, python, n, warm)
        print("%s: median %.0f ms, min %.0f, max %.0f; samples %s" % (
            "warm" if warm else "cold", statistics.median(s) * 1000, min(s) * 1000, max(s) * 1000,
            " ".join("%.0f" % (x * 1000) for x in s)), flush=True)


if __name__ == "__main__":
    main()
