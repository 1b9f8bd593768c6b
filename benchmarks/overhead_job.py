"""A plain DDP training script for the overhead benchmark: no diagtrain import, a DataLoader, a small
transformer encoder (dozens of module calls per step), AdamW. Run under torchrun.

It times its own steps (optimizer step to optimizer step) and writes them, per rank, to
``$STEP_TIMES_DIR/rank<r>.json``, so the same numbers exist with and without `diagtrain run`.
"""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

STEPS, DIM, LAYERS, SEQ, BATCH = int(os.environ.get("STEPS", "60")), 256, 4, 64, 8

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=4 * DIM, batch_first=True)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = TensorDataset(torch.randn(STEPS * BATCH * world, SEQ, DIM))
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
times, last = [], time.perf_counter()
for (x,) in loader:
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    now = time.perf_counter()
    times.append((now - last) * 1e3)
    last = now
out = Path(os.environ["STEP_TIMES_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{rank}.json").write_text(json.dumps(times))
dist.destroy_process_group()
