"""The job benchmarks/gpu_check.py runs on a GPU: a plain script (no diagtrain import), under torchrun or alone.

``MODE`` picks what it does:

- ``train``: DDP over NCCL on ``cuda:<local rank>``, data already on the device (so no device work
  happens before a step's forward), and a 1 GiB all-gather a step issued asynchronously (``async_op=True``:
  on NCCL's own stream, where a synchronous one runs on the current stream since torch 2.7) and waited
  for on the device; times its own steps (optimizer step to optimizer step) into
  ``$STEP_TIMES_DIR/rank<r>.json`` with the calls to ``torch.cuda.synchronize`` made while the loop ran
  and the job's own ``torch.cuda.max_memory_allocated()`` at its end.
- ``oom``: as ``train``, then asks for more memory than the GPU has at step ``OOM_STEP``.
- ``gloo_slow``: DDP over gloo, every rank on ``cuda:0``; rank ``SLOW_RANK`` does ``SLOW_MS`` of
  extra device work each step (named by the report as the straggler).
- ``graph``: no process group; PyTorch's whole-network CUDA graph recipe (warm-up steps on a side
  stream, then forward, backward and ``optimizer.step()`` captured in one graph, then replayed): the
  optimizer hooks of `diagtrain run` fire inside the capture. Writes ``$STEP_TIMES_DIR/graph.json``.
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
WARMUP_STEPS = 3  # before a capture: the recipe's warm-up on a side stream
COLL_ELEMENTS = 2**28  # 1 GiB of float32


def mlp(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
              for _ in range(LAYERS)]
    return torch.nn.Sequential(*layers).to(device)


def write(name: str, record: dict) -> None:
    if os.environ.get("STEP_TIMES_DIR"):
        out = Path(os.environ["STEP_TIMES_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(record))


def graph() -> None:
    """Capture forward, backward and the optimizer step in one CUDA graph, then replay it (no process group)."""
    device = torch.device("cuda", 0)
    model = mlp(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    static_input = torch.randn(BATCH, DIM, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            optimizer.zero_grad(set_to_none=True)
            model(static_input).pow(2).mean().backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    captured = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(captured):
        static_loss = model(static_input).pow(2).mean()
        static_loss.backward()
        optimizer.step()
    for _ in range(STEPS):
        static_input.normal_()
        captured.replay()
    torch.cuda.synchronize()
    write("graph.json", {"replays": STEPS, "loss": float(static_loss), "optimizer_steps": WARMUP_STEPS + 1})


def train() -> None:
    dist.init_process_group("gloo" if MODE == "gloo_slow" else "nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", 0 if MODE == "gloo_slow" else int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    model = torch.nn.parallel.DistributedDataParallel(mlp(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(8, BATCH, DIM, device=device)
    slow = torch.randn(2048, 2048, device=device)
    gathered = torch.empty(COLL_ELEMENTS * dist.get_world_size(), device=device) if MODE != "gloo_slow" else None
    shard = torch.ones(COLL_ELEMENTS, device=device) if MODE != "gloo_slow" else None

    syncs = 0
    synchronize = torch.cuda.synchronize

    def counted_synchronize(*args, **kwargs):
        nonlocal syncs
        syncs += 1
        return synchronize(*args, **kwargs)

    torch.cuda.synchronize = counted_synchronize  # what diagtrain's recorder would call, if it did
    times, last = [], time.perf_counter()
    for step in range(1, STEPS + 1):
        loss = model(data[step % len(data)]).pow(2).mean()
        loss.backward()
        if shard is not None:
            dist.all_gather_into_tensor(gathered, shard, async_op=True).wait()  # the device waits, not the host
        if MODE == "gloo_slow" and rank == SLOW_RANK:
            until = time.perf_counter() + SLOW_MS / 1e3
            while time.perf_counter() < until:  # device work the other rank does not have
                slow = (slow @ slow).clamp_(-1, 1)
                synchronize(device)
        if MODE == "oom" and step == OOM_STEP:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=device)  # the provoked out-of-memory
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
    torch.cuda.synchronize = synchronize
    synchronize(device)
    write(f"rank{rank}.json", {"step_ms": times, "synchronize_calls": syncs,
                               "max_memory_allocated": torch.cuda.max_memory_allocated(device)})
    dist.destroy_process_group()


if __name__ == "__main__":
    graph() if MODE == "graph" else train()
