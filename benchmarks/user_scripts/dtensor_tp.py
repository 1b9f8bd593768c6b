"""Tensor parallel with DTensor: parallelize_module, Megatron-style column-then-row linears.

    torchrun --nproc-per-node 2 dtensor_tp.py [--slow-rank 1] ...
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from train_utils import WIDTH, Block, Faults, add_common_args, finish_step

parser = argparse.ArgumentParser()
add_common_args(parser)
args = parser.parse_args()

mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
rank = dist.get_rank()
torch.manual_seed(0)


model = torch.nn.Sequential(*[Block() for _ in range(4)])
for block in model:
    parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
faults = Faults(args, rank)
generator = torch.Generator().manual_seed(0)  # every TP rank sees the same batch

for step in range(1, args.steps + 1):
    x = torch.randn(args.batch, WIDTH, generator=generator)
    faults.before_forward(step)
    loss = model(x).pow(2).mean()
    finish_step(loss, optimizer, step)
dist.destroy_process_group()
