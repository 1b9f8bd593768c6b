"""2D parallelism: tensor parallel inside pairs of ranks, FSDP2 across the pairs (one DeviceMesh).

    torchrun --nproc-per-node 4 tp_fsdp_2d.py [--slow-rank 2] ...
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from train_utils import WIDTH, Block, Faults, add_common_args, finish_step

parser = argparse.ArgumentParser()
add_common_args(parser)
parser.add_argument("--tp", type=int, default=2)
args = parser.parse_args()

world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
torch.manual_seed(0)


model = torch.nn.Sequential(*[Block() for _ in range(4)])
for block in model:
    parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
faults = Faults(args, rank)
# Ranks of one TP pair share a batch; the pairs get different ones.
generator = torch.Generator().manual_seed(mesh["dp"].get_local_rank())

for step in range(1, args.steps + 1):
    x = torch.randn(args.batch, WIDTH, generator=generator)
    faults.before_forward(step)
    loss = model(x).pow(2).mean()
    finish_step(loss, optimizer, step)
dist.destroy_process_group()
