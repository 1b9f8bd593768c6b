"""The job benchmarks/gpu_check.py runs on a GPU: a plain script (no diagtrain import), under torchrun.

``MODE`` picks what it does:

- ``train``: DDP over NCCL on ``cuda:<local rank>``, data already on the device (so no device work
  happens before a step's forward), and a 1 GiB all-gather a step (NCCL on one rank copies it: a
  collective long enough to time against the trace within 5%); times its own steps (optimizer step to optimizer step) into
  ``$STEP_TIMES_DIR/rank<r>.json`` with the calls to ``torch.cuda.synchronize`` made while the
  loop ran and the job's own ``torch.cuda.max_memory_allocated()`` at its end.
- ``oom``: as ``train``, then asks for more memory than the GPU has at step ``OOM_STEP``.
- ``gloo_slow``: DDP over gloo, every rank on ``cuda:0``; rank ``SLOW_RANK`` does ``SLOW_MS`` of
  extra device work each step (named by the report as the straggler).
"""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

MODE = os.environ.get("MODE", "train")
STEPS, DIM, LAYERS = int(os.environ.get("STEPS", "120")), int(os.environ.get("DIM", "2048")), int(os.environ.get("LAYERS", "8"))
BATCH = 4096  # rows a step: with DIM 2048 and 8 layers, about 0.1 s of device work a step on one GPU
OOM_STEP, SLOW_RANK, SLOW_MS = 5, 1, float(os.environ.get("SLOW_MS", "30"))

dist.init_process_group("gloo" if MODE == "gloo_slow" else "nccl")
rank = dist.get_rank()
device = torch.device("cuda", 0 if MODE == "gloo_slow" else int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(device)
torch.manual_seed(0)
layers = [torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
          for _ in range(LAYERS)]
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers).to(device))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = torch.randn(8, BATCH, DIM, device=device)
slow = torch.randn(2048, 2048, device=device)
COLL_ELEMENTS = 2**28  # 1 GiB of float32
gathered = torch.empty(COLL_ELEMENTS * dist.get_world_size(), device=device) if MODE != "gloo_slow" else None
shard = torch.ones(COLL_ELEMENTS, device=device) if MODE != "gloo_slow" else None

syncs = 0
_synchronize = torch.cuda.synchronize


def counted_synchronize(*args, **kwargs):
    global syncs
    syncs += 1
    return _synchronize(*args, **kwargs)


torch.cuda.synchronize = counted_synchronize  # what diagtrain's recorder would call, if it did
times, last = [], time.perf_counter()
for step in range(1, STEPS + 1):
    x = data[step % len(data)]
    loss = model(x).pow(2).mean()
    loss.backward()
    if shard is not None:
        dist.all_gather_into_tensor(gathered, shard)
    if MODE == "gloo_slow" and rank == SLOW_RANK:
        until = time.perf_counter() + SLOW_MS / 1e3
        while time.perf_counter() < until:  # device work the other rank does not have
            slow = (slow @ slow).clamp_(-1, 1)
            _synchronize(device)
    if MODE == "oom" and step == OOM_STEP:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=device)  # the provoked out-of-memory
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    now = time.perf_counter()
    times.append((now - last) * 1e3)
    last = now
torch.cuda.synchronize = _synchronize
_synchronize(device)
if os.environ.get("STEP_TIMES_DIR"):
    out = Path(os.environ["STEP_TIMES_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({
        "step_ms": times, "synchronize_calls": syncs, "max_memory_allocated": torch.cuda.max_memory_allocated(device)}))
dist.destroy_process_group()
