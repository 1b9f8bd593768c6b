"""FSDP2 (fully_shard per block and at the root) with bf16 mixed precision, fp32 gradient reduction.

    torchrun --nproc-per-node 2 fsdp2_mp.py [--slow-rank 1] [--hold-rank 1] ...
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from train_utils import WIDTH, Block, Faults, add_common_args, finish_step

parser = argparse.ArgumentParser()
add_common_args(parser)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


model = torch.nn.Sequential(*[Block() for _ in range(4)], torch.nn.Linear(WIDTH, 1))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for block in model[:4]:
    fully_shard(block, mp_policy=policy)
fully_shard(model, mp_policy=policy)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
faults = Faults(args, rank)
generator = torch.Generator().manual_seed(rank)

for step in range(1, args.steps + 1):
    x, y = torch.randn(args.batch, WIDTH, generator=generator), torch.randn(args.batch, 1, generator=generator)
    faults.before_forward(step)
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    finish_step(loss, optimizer, step)
dist.destroy_process_group()
