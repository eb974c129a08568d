#!/usr/bin/env bash
# The GPU check: what only a real GPU machine can show about gangrun. (The project's copy of
# ../shared/gpu-check.sh, with the checks of the features since: step 3b.) Run it there, from the
# project's root, once per lent machine, with a gangrun built on the development machine:
#
#   here:   make build && mkdir -p gpu-carry && cp bin/gangrun gpu-carry/ && cp ../shared/gpu-check.sh gpu-carry/
#           (gpu-carry/ must be git-ignored; name it in the device tool's carry list)
#   there:  bash gpu-carry/gpu-check.sh gpu-carry      (writes everything under $OUT, or ./gpu-out)
#
# Each step is bounded in time and goes on when one fails; the log says what each showed.
# Adapt it in the project (scripts/) as features land; record what it showed in
# benchmarks/README.md ("On a GPU machine") and in the closing note.
set -u
B=${1:-gpu-carry}; G=$(cd "$B" && pwd)/gangrun; O=${OUT:-$PWD/gpu-out}; mkdir -p "$O"
exec > >(tee "$O/gpu-check.log") 2>&1
PY=$(command -v python3)
step() { echo; echo "=== $1"; shift; timeout "${T:-120}" "$@"; echo "--- exit $?"; }
step "machine" sh -c 'nvidia-smi; nvidia-smi -L; uname -r; '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())"'
nvidia-smi topo -m >"$O/nvidia-smi-topo.txt" 2>&1; nvidia-smi -q -x >"$O/nvidia-smi-q.xml" 2>&1
step "gangrun version" "$G" version
# 1. topology and health from NVML, beside nvidia-smi's own view
step "topo" "$G" topo
step "topo --json" sh -c "'$G' topo --json > '$O/topo.json' && head -c 3000 '$O/topo.json'"
step "topo --nccl-env" "$G" topo --nccl-env
step "topo vs nvidia-smi (GPU names, UUIDs, bus ids, memory)" "$PY" - "$O/topo.json" "$O/nvidia-smi-q.xml" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
t = json.load(open(sys.argv[1])); q = ET.parse(sys.argv[2]).getroot()
ours = {g.get("uuid"): g for g in t.get("gpus", [])}
for g in q.findall("gpu"):
    uuid = g.findtext("uuid"); name = g.findtext("product_name"); bus = g.get("id")
    mine = ours.get(uuid)
    print("nvidia-smi:", uuid, name, bus, "| gangrun:", None if mine is None else {k: mine.get(k) for k in ("index", "name", "pci_bus_id", "memory_bytes", "mig_mode")})
print("gangrun GPUs:", len(ours), "nvidia-smi GPUs:", len(q.findall("gpu")))
PYEOF
# 2. NCCL through gangrun's collective benchmark on this GPU (one rank: NCCL's init and its
#    table; busbw is 0 by definition with one rank, algbw is the device copy rate)
step "bench nccl (nccl backend, 1 GPU)" "$G" bench nccl --backend nccl --nproc-per-node 1 --op all_reduce,all_gather,broadcast --max-bytes 1G
# 3. a torch DDP job on the nccl backend under gangrun run: one failure, a warm restart
#    (standbys import torch before CUDA is initialised; the worker initialises CUDA after the fork)
cat >"$O/ddp_nccl.py" <<'PYEOF'
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("nccl"); r = dist.get_rank(); torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
ck = os.environ.get("GANGRUN_CHECKPOINT_DIR"); start = 0
if os.environ.get("GANGRUN_RESUME_FROM"):
    start = torch.load(os.path.join(os.environ["GANGRUN_RESUME_FROM"], "s.pt"))["step"]
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4096, 4096).cuda())
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(start, 300):
    x = torch.randn(64, 4096, device="cuda"); loss = m(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    done = step + 1
    if r == 0 and done % 50 == 0:
        d = os.path.join(ck, f"step-{done}"); os.makedirs(d + ".tmp", exist_ok=True)
        torch.save({"step": done}, os.path.join(d + ".tmp", "s.pt")); os.rename(d + ".tmp", d); open(os.path.join(d, ".complete"), "w").close()
    if done == 120 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        os._exit(3)
torch.cuda.synchronize(); print("rank", r, "done from", start, "cuda", torch.cuda.get_device_name(), flush=True)
PYEOF
rm -rf "$O/ck"; mkdir -p "$O/ck"
T=300 step "run: DDP nccl, fail at 120, resume (warm)" "$G" run --nproc-per-node 1 --checkpoint-dir "$O/ck" --log-dir "$O/run-logs" -- "$PY" "$O/ddp_nccl.py"
# 3b. the standby's default imports (launcher.DefaultWarmImports: torch, then torch._dynamo)
#     on a CUDA torch: no CUDA context and no extra thread, so standbys are still forked; and
#     what torch 2.x's DDP constructor costs a process that has not imported torch._dynamo
step "standby imports on a CUDA torch" "$PY" -c '
import threading, time, sys
t = time.time(); import torch; t1 = time.time(); import torch._dynamo; t2 = time.time()
print("import torch %.2f s, torch._dynamo %.2f s, threads %d, cuda initialised %s" % (t1 - t, t2 - t1, threading.active_count(), torch.cuda.is_initialized()))'
step "DDP constructor, torch._dynamo not imported before" "$PY" -c '
import sys, time, torch, torch.distributed as d
d.init_process_group("nccl", init_method="tcp://127.0.0.1:29611", rank=0, world_size=1); torch.cuda.set_device(0)
n = len(sys.modules); t = time.time(); torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda())
print(torch.__version__, "DDP(): %.2f s, %d modules imported" % (time.time() - t, len(sys.modules) - n)); d.destroy_process_group()'
step "run: the attempts, warm or cold (from step 3's log)" sh -c "grep -rh 'workers started\|standbys\|fork' '$O/run-logs' 2>/dev/null | head -20; grep -h 'workers started' '$O/gpu-check.log' | head"
# 4. GPU metrics as an agent exports them need a Consul, which does not travel here (too big
#    to carry); what NVML reports is in topo --json above, nvidia-smi's in nvidia-smi-q.xml.
# 5. containers: if gangrun run takes --container-image, a CUDA job in a container of this
#    machine's own root filesystem (the host's /usr mounted), GPUs through CDI if a spec exists
if "$G" run --help 2>&1 | grep -q -- --container-image; then
  ls /etc/cdi /var/run/cdi 2>/dev/null
  step "container: nvidia-smi inside" "$G" run --nproc-per-node 1 --container-image / --container-mounts /usr:/usr:ro -- nvidia-smi -L
fi
echo; echo "=== done: $O"
