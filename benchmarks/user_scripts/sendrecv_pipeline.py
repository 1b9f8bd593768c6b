"""A two-stage pipeline written by hand: activations go forward with send/recv, gradients come back.

    torchrun --nproc-per-node 2 sendrecv_pipeline.py [--microbatches 4] [--split 6,2]

GPipe order: all microbatches forward, then all backward. --split is the blocks per stage.
"""

import argparse

import torch
import torch.distributed as dist

from train_utils import WIDTH, Block, Faults, add_common_args

parser = argparse.ArgumentParser()
add_common_args(parser)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--split", default="4,4", help="blocks on stage 0 and stage 1")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
assert dist.get_world_size() == 2, "two stages, one rank each"
blocks = [int(n) for n in args.split.split(",")]
torch.manual_seed(rank)
stage = torch.nn.Sequential(*[Block() for _ in range(blocks[rank])])
optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-3)
faults = Faults(args, rank)
generator = torch.Generator().manual_seed(0)
micro = args.batch // args.microbatches

for step in range(1, args.steps + 1):
    x, target = torch.randn(args.batch, WIDTH, generator=generator), torch.randn(args.batch, WIDTH, generator=generator)
    faults.before_forward(step)
    outputs, inputs, losses = [], [], []
    for i in range(args.microbatches):
        if rank == 0:
            out = stage(x[i * micro:(i + 1) * micro])
            dist.send(out.detach(), dst=1)
            outputs.append(out)
        else:
            act = torch.empty(micro, WIDTH)
            dist.recv(act, src=0)
            act.requires_grad_()
            loss = (stage(act) - target[i * micro:(i + 1) * micro]).pow(2).mean() / args.microbatches
            inputs.append(act)
            losses.append(loss)
    for i in range(args.microbatches):
        if rank == 0:
            grad = torch.empty(micro, WIDTH)
            dist.recv(grad, src=1)
            outputs[i].backward(grad)
        else:
            losses[i].backward()
            dist.send(inputs[i].grad, dst=0)
    optimizer.step()
    optimizer.zero_grad()
    if rank == 1:
        print(f"step {step} loss {sum(float(l) for l in losses):.4f}", flush=True)
dist.destroy_process_group()
