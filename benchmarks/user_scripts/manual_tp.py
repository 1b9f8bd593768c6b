"""Tensor parallel written by hand: each rank holds a slice of every layer's output features and
the slices are put back together with all_gather (autograd-aware, torch.distributed.nn).

    torchrun --nproc-per-node 2 manual_tp.py [--slow-rank 1] ...
"""

import argparse

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from train_utils import WIDTH, Faults, add_common_args, finish_step

parser = argparse.ArgumentParser()
add_common_args(parser)
parser.add_argument("--layers", type=int, default=6)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)


class ColumnParallelLinear(torch.nn.Module):
    """This rank's out_features / world columns; the full output is gathered from every rank."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.local = torch.nn.Linear(width, width // world)

    def forward(self, x):
        return torch.cat(dist_fn.all_gather(torch.nn.functional.gelu(self.local(x))), dim=-1)


model = torch.nn.Sequential(*[ColumnParallelLinear(WIDTH) for _ in range(args.layers)])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
faults = Faults(args, rank)
generator = torch.Generator().manual_seed(0)  # the same batch on every rank

for step in range(1, args.steps + 1):
    x = torch.randn(args.batch * 8, WIDTH, generator=generator)
    faults.before_forward(step)
    loss = model(x).pow(2).mean()
    finish_step(loss, optimizer, step)
dist.destroy_process_group()
