"""Pipeline parallel with torch.distributed.pipelining: one stage per rank, GPipe or 1F1B.

    torchrun --nproc-per-node 2 pipeline.py [--schedule gpipe|1f1b] [--microbatches 4] [--split 6,2]

--split says how many blocks each stage holds (even by default); an uneven split is the fault.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from train_utils import WIDTH, Block, Faults, add_common_args

parser = argparse.ArgumentParser()
add_common_args(parser)
parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--split", default=None, help="blocks per stage, e.g. 6,2")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), int(os.environ["WORLD_SIZE"])
split = [int(n) for n in args.split.split(",")] if args.split else [8 // world] * world
torch.manual_seed(rank)
stage_module = torch.nn.Sequential(*[Block() for _ in range(split[rank])])
stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
schedule_cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
schedule = schedule_cls(stage, n_microbatches=args.microbatches, loss_fn=lambda out, target: (out - target).pow(2).mean())
optimizer = torch.optim.AdamW(stage_module.parameters(), lr=1e-3)
faults = Faults(args, rank)
generator = torch.Generator().manual_seed(0)

for step in range(1, args.steps + 1):
    x, target = torch.randn(args.batch, WIDTH, generator=generator), torch.randn(args.batch, WIDTH, generator=generator)
    faults.before_forward(step)
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        losses = []
        schedule.step(target=target, losses=losses)
        print(f"step {step} loss {torch.stack(losses).mean():.4f}", flush=True)
    else:
        schedule.step()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
