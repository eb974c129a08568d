#!/usr/bin/env python3
"""Goodput under repeated failures: gangrun (warm restarts on, and off) against torchrun,
in one run, on the same trainer and the same seeded kill schedule.

The job: 2 nodes × 2 workers on this machine, DDP (gloo, CPU) steps of about 50 ms,
a checkpoint every 100 steps (benchmarks/goodput_trainer.py). Every EVERY seconds, for
DURATION seconds, one worker chosen by a seeded random generator is SIGKILLed. Then:

  ETTR (effective training time ratio) = newest step reached × failure-free step time
                                         ÷ wall time
  lost per failure = (wall time − newest step × step time) ÷ failures
  kill → first step = from each kill to the next attempt's first step

gangrun: two `gangrun run --coordinator consul://... --nnodes 2 --nproc-per-node 2
--max-restarts 1000 --checkpoint-dir DIR` (defaults otherwise) through a Consul dev
agent started here. torchrun: two `torchrun --nnodes 2 --nproc_per_node 2 --rdzv_backend
c10d --max_restarts 1000 --monitor_interval 0.1` (Debian's torch 1.13 through the test
shim cmd/gangrun/testdata/bin/torchrun; torch 1.13 takes the underscore spellings); the
trainer finds its newest checkpoint itself.

Usage: make build && /usr/bin/python3 benchmarks/goodput.py [DURATION] [EVERY] [SEED]
(defaults 120, 20, 1); KEEP_WORK=1 keeps the work directory (logs, progress files);
GANGRUN_BIN, GANGRUN_CONSUL and GOODPUT_MODES (a comma list of
warm, warm0 — warm restarts with --warm-delay 0s —, cold, torchrun, torchrun2, ft_launcher)
override; GOODPUT_PYTHON is the trainer's interpreter for every mode (default Debian's
torch 1.13; scripts/install-torch2.sh prints torch 2.x's). torchrun2: that interpreter's
own torchrun (`python -m torch.distributed.run`, the hyphen spellings, otherwise as
torchrun above); ft_launcher: NVIDIA's (nvidia-resiliency-ext 0.4.1, scripts/install-nvrx.sh)
with the same options and its defaults, plus --ignore-missing-fault-tol-cfg (the trainer
does not call its heartbeat API: failures are seen as worker exits, as torchrun sees them);
GOODPUT_FLAGS adds flags to every gangrun run (for experiments); GOODPUT_JITTER=1 moves
each kill to a seeded uniformly random time within EVERY/2 of its place (the same times
for every mode). A kill due while no trainer runs falls on the next to start.

Why the jitter: with kills exactly every 20 s, four times the checkpoint interval (100
steps of 50 ms), every attempt that restarts within 5 s keeps exactly three checkpoints
before its kill, so ETTR comes out near 75 % whatever the restart takes between 0 and
5 s (and near 50 % for 5-10 s). Jittered kills fall at random points of the checkpoint
cycle, and ETTR then follows the restart time.
"""
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The trainer's interpreter: Debian's torch 1.13, or GOODPUT_PYTHON (torch 2.x:
# scripts/install-torch2.sh prints its path), the same for every mode of a run.
PY = os.environ.get("GOODPUT_PYTHON", "/usr/bin/python3")


_TAKEN = set()


def free_port():
    """A port free now, below the kernel's ephemeral range (32768 up), where no client
    socket takes it meanwhile (a port the kernel picks for bind(0) comes from that
    range, and the Consul agent once failed on one: "address already in use")."""
    rng = random.Random()
    while True:
        port = rng.randrange(10000, 20000)
        if port in _TAKEN:
            continue
        try:
            for host in ("127.0.0.1", "0.0.0.0"):
                s = socket.socket()
                try:
                    s.bind((host, port))
                finally:
                    s.close()
        except OSError:
            continue
        _TAKEN.add(port)
        return port


def marked(mark):
    """Pids whose environment holds mark (every launcher, agent and worker of a mode)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % p, "rb") as f:
                if mark.encode() in f.read().split(b"\0"):
                    out.append(int(p))
        except OSError:
            pass
    return out


def trainers(progress):
    """The live trainer workers: the pids the ranks wrote when they started."""
    out = []
    d, base = os.path.dirname(progress), os.path.basename(progress) + ".pid-"
    for name in os.listdir(d):
        if not name.startswith(base):
            continue
        try:
            with open(os.path.join(d, name)) as f:
                pid = int(f.read())
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError):
            continue
        if state != "Z":
            out.append(pid)
    return sorted(out)


def run_mode(mode, consul_addr, work, duration, every, seed):
    mark = "GOODPUT_MARK=%s-%s" % (mode, os.path.basename(work))
    ckpt = os.path.join(work, "ckpt")
    progress = os.path.join(work, "progress")
    os.makedirs(ckpt)
    trainer = [PY, os.path.join(ROOT, "benchmarks", "goodput_trainer.py"), "--ckpt-dir", ckpt, "--progress", progress]
    env = dict(os.environ)
    env[mark.split("=")[0]] = mark.split("=", 1)[1]
    env.pop("PYTHONPATH", None)
    procs = []
    if mode in ("torchrun", "torchrun2", "ft_launcher"):
        port = free_port()
        if mode == "torchrun":
            # Debian's torch 1.13 through the test shim, which takes the underscore spellings.
            launcher = [os.path.join(ROOT, "cmd", "gangrun", "testdata", "bin", "torchrun")]
            opts = ["--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    "127.0.0.1:%d" % port, "--rdzv_id", "goodput", "--max_restarts", "1000", "--monitor_interval", "0.1"]
        else:
            if mode == "torchrun2":
                # torch 2.x's own torchrun, beside the trainer's interpreter.
                launcher = [PY, "-m", "torch.distributed.run"]
            else:
                # NVIDIA's ft_launcher (scripts/install-nvrx.sh), its documented defaults.
                launcher = subprocess.check_output([os.path.join(ROOT, "scripts", "install-nvrx.sh")], text=True).split()
            opts = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    "127.0.0.1:%d" % port, "--rdzv-id", "goodput", "--max-restarts", "1000", "--monitor-interval", "0.1"]
            if mode == "ft_launcher":
                # The trainer does not call the rank monitor's heartbeat API: failures
                # are noticed by the workers' exit, as torchrun's are.
                opts.append("--ignore-missing-fault-tol-cfg")
        for node in ("a", "b"):
            cmd = launcher + opts + trainer[1:]
            procs.append(subprocess.Popen(cmd, env=env, stdout=open(os.path.join(work, "node-%s.log" % node), "w"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
    else:
        gangrun = os.environ.get("GANGRUN_BIN", os.path.join(ROOT, "bin", "gangrun"))
        job = "goodput-%s-%d" % (mode, os.getpid())
        for node in ("a", "b"):
            cmd = [gangrun, "run", "--coordinator", "consul://" + consul_addr, "--job-id", job, "--node-name", "node-" + node,
                   "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1000", "--checkpoint-dir", ckpt]
            if mode == "cold":
                cmd.append("--warm-restarts=false")
            elif mode == "warm0":
                cmd.append("--warm-delay=0s")  # the standbys start with the workers
            cmd += os.environ.get("GOODPUT_FLAGS", "").split()
            procs.append(subprocess.Popen(cmd + ["--"] + trainer, env=env,
                                          stdout=open(os.path.join(work, "node-%s.log" % node), "w"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
    start = time.time()
    rng = random.Random(seed)
    jitter = random.Random(seed + 1000) if os.environ.get("GOODPUT_JITTER") else None
    kills = []
    for k in range(1, int(duration // every) + 1):
        when = start + k * every
        if jitter:
            when += jitter.uniform(-every / 2, every / 2)
        if when >= start + duration:
            break
        time.sleep(max(when - time.time(), 0))
        # A kill due while no trainer runs (the gang restarting) falls on the next one
        # to start, so that every mode gets the same number of failures.
        live = trainers(progress)
        while not live and time.time() < start + duration:
            time.sleep(0.05)
            live = trainers(progress)
        if live:
            victim = rng.choice(live)
            try:
                os.kill(victim, signal.SIGKILL)
                kills.append(time.time())
            except ProcessLookupError:
                pass
    time.sleep(max(start + duration - time.time(), 0))
    wall = time.time() - start
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 20
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    lines = []
    if os.path.exists(progress):
        with open(progress) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    lines.append((int(parts[0]), float(parts[1]), parts[2] == "1"))
    lines = [l for l in lines if l[1] <= start + duration]
    if not lines:
        return {"mode": mode, "error": "no step reached (see %s)" % work}
    deltas = [b[1] - a[1] for a, b in zip(lines, lines[1:]) if b[0] == a[0] + 1 and not b[2]]
    step_time = statistics.median(deltas)
    newest = max(l[0] for l in lines)
    useful = newest * step_time
    firsts = [l[1] for l in lines if l[2]]
    to_first = []
    for k in kills:
        after = [t for t in firsts if t > k]
        if after:
            to_first.append(after[0] - k)
    return {"mode": mode, "wall": wall, "newest": newest, "step_time": step_time, "ettr": useful / wall,
            "kills": len(kills), "lost_per_failure": (wall - useful) / max(len(kills), 1),
            "to_first": to_first}


def main():
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 120
    every = float(sys.argv[2]) if len(sys.argv) > 2 else 20
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    modes = os.environ.get("GOODPUT_MODES", "warm,cold,torchrun").split(",")
    consul = os.environ.get("GANGRUN_CONSUL", os.path.join(ROOT, ".tools", "bin", "consul"))
    base = tempfile.mkdtemp(prefix="goodput-")
    http = free_port()
    ports = [free_port() for _ in range(3)]
    cp = subprocess.Popen([consul, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
                           "-http-port", str(http), "-server-port", str(ports[0]), "-serf-lan-port", str(ports[1]),
                           "-serf-wan-port", str(ports[2]), "-dns-port", "-1", "-grpc-port", "-1",
                           "-hcl", "ports { grpc_tls = -1 }", "-log-level", "warn"],
                          stdout=open(os.path.join(base, "consul.log"), "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                if b"127.0.0.1" in urllib.request.urlopen("http://127.0.0.1:%d/v1/status/leader" % http, timeout=1).read():
                    break
            except OSError:
                pass
            if cp.poll() is not None:
                break
            time.sleep(0.1)
        else:
            cp.kill()
        if cp.poll() is not None:
            sys.exit("goodput: the Consul agent did not start; its log: %s" % os.path.join(base, "consul.log"))
        print("python: %s; machine: %d cores; %gs per mode, a worker SIGKILLed every %gs%s (seed %d); 2 nodes x 2 workers, ~50 ms steps, checkpoint every 100"
              % (PY, os.cpu_count(), duration, every, " +- %gs (jitter)" % (every / 2) if os.environ.get("GOODPUT_JITTER") else "", seed))
        results = []
        for mode in modes:
            work = os.path.join(base, mode)
            os.makedirs(work)
            r = run_mode(mode, "127.0.0.1:%d" % http, work, duration, every, seed)
            results.append(r)
            if "error" in r:
                print("%-9s %s" % (mode, r["error"]))
                continue
            tf = r["to_first"]
            print("%-9s ETTR %5.1f %%  newest step %5d  step %.1f ms  failures %d  lost/failure %5.1f s  kill->first step: median %s s  (%s)"
                  % (mode, 100 * r["ettr"], r["newest"], 1000 * r["step_time"], r["kills"], r["lost_per_failure"],
                     "%.2f" % statistics.median(tf) if tf else "-", " ".join("%.2f" % t for t in tf)))
        byname = {r["mode"]: r for r in results if "error" not in r}
        for peer in ("torchrun", "torchrun2", "ft_launcher"):
            if peer in byname:
                for m in ("warm", "warm0", "cold"):
                    if m in byname:
                        print("gangrun %s / %s ETTR: %.2fx" % (m, peer, byname[m]["ettr"] / byname[peer]["ettr"]))
    finally:
        cp.terminate()
        cp.wait()
        if os.environ.get("KEEP_WORK"):
            print("kept", base)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
