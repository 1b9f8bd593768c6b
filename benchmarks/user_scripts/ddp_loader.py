"""DDP with a DistributedSampler and a real DataLoader (optionally with worker processes).

    torchrun --nproc-per-node 2 ddp_loader.py [--workers 2] [--slow-rank 1] [--batch-rank 1]
        [--slow-item-rank 1 --slow-item-every 3] [--hook-delay-rank 1] [--hold-rank 1] ...
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from train_utils import WIDTH, Block, Faults, add_common_args, finish_step

parser = argparse.ArgumentParser()
add_common_args(parser)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--batch-rank", type=int, default=-1, help="this rank's loader uses a larger batch")
parser.add_argument("--batch-scale", type=int, default=4)
parser.add_argument("--slow-item-rank", type=int, default=-1, help="some items are slow to read on this rank")
parser.add_argument("--slow-item-every", type=int, default=3)
parser.add_argument("--slow-item-ms", type=float, default=240.0)
parser.add_argument("--hook-delay-rank", type=int, default=-1, help="this rank's DDP comm hook waits first")
parser.add_argument("--hook-delay-ms", type=float, default=30.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class Samples(Dataset):
    """Deterministic samples; on one rank every few batches hold items that are slow to read."""

    def __init__(self, n: int, batch: int) -> None:
        self.n, self.batch = n, batch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        # Unshuffled DistributedSampler: rank r's k-th batch holds items (k*batch + j)*world + r.
        if rank == args.slow_item_rank and (i // world // self.batch) % args.slow_item_every == 0:
            time.sleep(args.slow_item_ms / 1e3 / self.batch)  # a cold read, a large image to decode
        return torch.randn(WIDTH, generator=g), torch.randn(1, generator=g)


batch = args.batch * (args.batch_scale if rank == args.batch_rank else 1)
data = Samples(args.batch * args.batch_scale * world * (args.steps + 2), batch)
loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, shuffle=False),
                    num_workers=args.workers, persistent_workers=args.workers > 0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, 4 * WIDTH), torch.nn.GELU(),
    torch.nn.Linear(4 * WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, 1)), bucket_cap_mb=1)
if rank == args.hook_delay_rank:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def delayed_allreduce(state, bucket):
        time.sleep(args.hook_delay_ms / 1e3)  # e.g. a compression hook doing its work on the CPU
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, delayed_allreduce)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
faults = Faults(args, rank)

step = 0
for x, y in loader:
    step += 1
    if step > args.steps:
        break
    faults.before_forward(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    finish_step(loss, optimizer, step)
dist.destroy_process_group()
