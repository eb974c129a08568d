#!/usr/bin/python3
"""torch's own c10d rendezvous, timed the way BenchmarkRendezvous times gangrun's.

N processes each create torch.distributed.elastic's DynamicRendezvousHandler with the
c10d backend (the one torchrun uses with --rdzv-backend c10d), min = max = N; process 0
hosts the TCPStore. The first N-1 join, then, once they wait inside the rendezvous, the
last joins; the figure is the time from the last join to every process holding its
rendezvous (next_rendezvous() returned). Each process imports torch before the clock
starts. Median of ROUNDS runs (default 5).

That figure is dominated by torch's own pacing, not by the store: a node waiting in the
rendezvous polls the store once a second (dynamic_rendezvous.py, `_delay(seconds=1)` on
every SYNC action in torch 1.13), and a node's first round starts with a random 0-0.3 s
delay (`_delay(seconds=(0, 0.3))`). So the script also prints the last joiner's own time
(from its join to its own next_rendezvous() returning), which no poll delays: the
fairest like-for-like figure torch's c10d rendezvous can give.

Usage: /usr/bin/python3 benchmarks/rdzv_c10d.py N [ROUNDS]
"""

import multiprocessing as mp
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(i, n, port, run_id, start, out):
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    params = RendezvousParameters(backend="c10d", endpoint="127.0.0.1:%d" % port, run_id=run_id,
                                  min_nodes=n, max_nodes=n, is_host=(i == 0), last_call_timeout=1)
    backend, store = create_backend(params)
    handler = create_handler(store, backend, params)
    start.wait()  # every process has imported torch and built its handler
    if i == n - 1:
        time.sleep(2.0)  # the others are inside the rendezvous by now
    t0 = time.time()
    handler.next_rendezvous()
    out.put((i, t0, time.time()))
    time.sleep(1.0)  # keep the store up until everyone has read it


def one_round(n):
    port = free_port()
    run_id = "bench%d" % port
    start = mp.Barrier(n)
    out = mp.Queue()
    procs = [mp.Process(target=node, args=(i, n, port, run_id, start, out)) for i in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in range(n)]
    for p in procs:
        p.join()
    last_join, last_done = [(t0, t1) for i, t0, t1 in got if i == n - 1][0]
    return max(t1 for _, _, t1 in got) - last_join, last_done - last_join


def main():
    n = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    results = [one_round(n) for _ in range(rounds)]
    times = [every for every, _ in results]
    own = [last for _, last in results]
    import torch
    print("torch %s c10d rendezvous, %d nodes: median %.1f ms (min %.1f, max %.1f, n=%d)"
          % (torch.__version__, n, 1000 * statistics.median(times), 1000 * min(times), 1000 * max(times), rounds))
    print("  the last joiner's own rendezvous: median %.1f ms (min %.1f, max %.1f)"
          % (1000 * statistics.median(own), 1000 * min(own), 1000 * max(own)))


if __name__ == "__main__":
    main()
