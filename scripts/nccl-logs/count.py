#!/usr/bin/env python3
"""Count the collected nccl-tests logs that `gangrun bench parse` reads exactly.

Usage: count.py GANGRUN DIR   (DIR: bench/testdata/nccl-tests/real)

For each entry of DIR/expect.json it runs `GANGRUN bench parse --json FILE` and
`GANGRUN bench parse FILE`, and counts the logs whose exit status, number of tables,
operation, ranks, number of timed halves, average busbw (as printed, or the mean of the
rows when the log printed none) and, where the log printed one, the table's
"# Out of bounds values : N" all match. docs/bench.md gives the figures: 5 of 37 with
gangrun at 5555c3d, 37 of 37 after.
"""
import json, subprocess, sys, os
binary, d = sys.argv[1], sys.argv[2]
E = json.load(open(os.path.join(d, "expect.json")))
good = 0
for e in E:
    f = os.path.join(d, e["file"])
    j = subprocess.run([binary, "bench", "parse", "--json", f], capture_output=True, text=True)
    tb = subprocess.run([binary, "bench", "parse", f], capture_output=True, text=True)
    why = []
    if j.returncode != e["exit"]: why.append(f"exit {j.returncode} want {e['exit']}")
    res = [json.loads(l) for l in j.stdout.splitlines() if l.strip()]
    if len(res) != len(e["results"]): why.append(f"{len(res)} results want {len(e['results'])}: {j.stderr.strip()[:90]}")
    else:
        oobs = [l for l in tb.stdout.splitlines() if "Out of bounds values" in l]
        for i, (g, w) in enumerate(zip(res, e["results"])):
            if g["op"] != w["op"]: why.append(f"op {g['op']!r} want {w['op']!r}")
            if g["ranks"] != w["ranks"]: why.append(f"ranks {g['ranks']} want {w['ranks']}")
            if len(g["rows"]) != w["rows"]: why.append(f"rows {len(g['rows'])} want {w['rows']}")
            avg = w["avg"]
            if avg is None:
                avg = sum(r["busbw_gbps"] for r in g["rows"]) / len(g["rows"]) if g["rows"] else 0
            if abs(g["avg_busbw_gbps"] - avg) > 1e-9: why.append(f"avg {g['avg_busbw_gbps']} want {avg}")
            if w["oob"] is not None and not any(f"Out of bounds values : {w['oob']} " in l for l in oobs):
                why.append(f"table's out-of-bounds line {oobs} want {w['oob']}")
    ok = not why
    good += ok
    print(("OK  " if ok else "BAD ") + e["file"] + ("" if ok else ": " + "; ".join(why)))
print(f"{good} of {len(E)} parse exactly with the right exit status")
