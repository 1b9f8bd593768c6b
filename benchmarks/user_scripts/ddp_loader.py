"""DDP with a DistributedSampler and a real DataLoader (optionally with worker processes).

    torchrun --nproc-per-node 2 ddp_loader.py [--workers 2] [--slow-rank 1] [--batch-rank 1]
        [--slow-item-rank 1 --slow-item-every 3] [--hook-delay-rank 1] [--hold-rank 1] [--leak-rank 1] ...
        [--slow-loader-rank 1 --slow-loader-ms 2] [--checkpoint-rank 0|all --checkpoint-every 4 --checkpoint-mb 64]
        [--transform-ms 3] [--skip-rank 1 --skip-step 5] [--break-rank 1 --break-step 8]
        [--extra-collective-rank 0 --extra-collective-step 5]
"""

import argparse
import os
import tempfile
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
parser.add_argument("--leak-rank", type=int, default=-1,
                    help="this rank keeps every step's loss with its graph in a list (losses.append(loss)), and "
                         "--leak-mb of outputs with it: memory that grows step after step")
parser.add_argument("--leak-mb", type=int, default=16,
                    help="MiB kept each step on --leak-rank (predictions gathered for an end-of-epoch metric)")
parser.add_argument("--slow-loader-rank", type=int, default=-1,
                    help="every item is slow to read on this rank, in every step (a slow disk, heavy decoding)")
parser.add_argument("--slow-loader-ms", type=float, default=2.0,
                    help="each item's extra read time on --slow-loader-rank (x --batch items a step)")
parser.add_argument("--checkpoint-rank", default="-1",
                    help="this rank ('all': every rank) saves model and optimizer state to disk (fsynced) every "
                         "--checkpoint-every steps")
parser.add_argument("--checkpoint-every", type=int, default=4)
parser.add_argument("--checkpoint-mb", type=int, default=0,
                    help="an extra blob of this many MiB in each checkpoint (the tiny model's state alone saves in ms)")
parser.add_argument("--transform-ms", type=float, default=0.0,
                    help="every rank's CPU time per item in its transform (decoding, augmentation): in the main "
                         "process unless --workers, so that with 0 workers every rank waits for its input")
parser.add_argument("--skip-rank", type=int, default=-1,
                    help="this rank skips one batch at --skip-step (a data-quality guard: `continue` before backward): "
                         "from then on it is one gradient all-reduce ahead of its peers")
parser.add_argument("--skip-step", type=int, default=5)
parser.add_argument("--break-rank", type=int, default=-1,
                    help="this rank leaves the training loop after --break-step (uneven data, a `break` on one rank)")
parser.add_argument("--break-step", type=int, default=8)
parser.add_argument("--extra-collective-rank", type=int, default=-1,
                    help="this rank all-reduces a metric of its own at --extra-collective-step: one collective its "
                         "peers never make")
parser.add_argument("--extra-collective-step", type=int, default=5)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


def _spin(seconds: float) -> None:
    """CPU work for ``seconds`` (a transform in pure Python: decoding, augmentation)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


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
        if rank == args.slow_loader_rank:
            time.sleep(args.slow_loader_ms / 1e3)  # every read slow: a network file system, a costly transform
        if args.transform_ms:
            _spin(args.transform_ms / 1e3)  # a heavy per-sample transform, on the CPU
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
checkpoint_path = None
if args.checkpoint_rank in ("all", str(rank)):
    # One file, overwritten by every save (as a "latest" checkpoint is); on disk, not in page cache alone.
    handle, checkpoint_path = tempfile.mkstemp(prefix=f"ckpt-rank{rank}-", suffix=".pt")
    os.close(handle)
    # --checkpoint-mb: the rest of a larger model's state, written from one small buffer so that the
    # rank holds no more memory than its peers (that would be another fault, extra memory).
    chunk = os.urandom(2**20)


def save_checkpoint() -> None:
    """What a training loop does every few steps on one rank: torch.save the state, then fsync it."""
    with open(checkpoint_path, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, f)
        for _ in range(args.checkpoint_mb):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


leaked = []  # --leak-rank: what the loop keeps from every step
step = 0
for x, y in loader:
    step += 1
    if step > args.steps or (rank == args.break_rank and step > args.break_step):
        break
    if rank == args.skip_rank and step == args.skip_step:
        continue  # "a bad batch": skipped on this rank alone, so its collectives run one ahead from here
    if rank == args.extra_collective_rank and step == args.extra_collective_step:
        dist.all_reduce(torch.ones(1))  # a metric only this rank reports
    faults.before_forward(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if rank == args.leak_rank:
        # The classic leak: the loss itself instead of loss.item(), and with it outputs kept for a metric.
        leaked.append((loss, torch.full((args.leak_mb * 2**20 // 4,), float(step))))
    finish_step(loss, optimizer, step)
    if checkpoint_path and step % args.checkpoint_every == 0:
        save_checkpoint()
if checkpoint_path:
    os.unlink(checkpoint_path)
dist.destroy_process_group()
