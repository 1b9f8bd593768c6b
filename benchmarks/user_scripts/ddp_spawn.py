"""DDP started the way PyTorch's DDP tutorial starts it: no launcher, torch.multiprocessing.spawn.

    python ddp_spawn.py [--nproc 2] [--slow-rank 1 --slow-ms 80] [--start-method spawn|fork]

The script sets MASTER_ADDR and MASTER_PORT itself and hands each process its rank and the world size
(``init_process_group(rank=..., world_size=...)``); nothing in the ranks' environment says who they
are. ``--start-method fork`` starts them with multiprocessing.Process instead.
"""

import argparse
import multiprocessing
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from train_utils import Block, Faults, WIDTH, add_common_args, finish_step


def train(rank: int, args: argparse.Namespace) -> None:
    """One rank: join the group, then the usual loop over random batches."""
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(Block(), Block()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    faults = Faults(args, rank)
    for step in range(1, args.steps + 1):
        faults.before_forward(step)
        x = torch.randn(args.batch, WIDTH)
        finish_step(model(x).pow(2).mean(), optimizer, step)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_with_processes(args: argparse.Namespace) -> None:
    """multiprocessing.Process per rank (fork), joined; a failed rank fails the script."""
    processes = [multiprocessing.get_context("fork").Process(target=train, args=(rank, args))
                 for rank in range(args.nproc)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    if any(p.exitcode for p in processes):
        raise SystemExit(f"ranks exited with {[p.exitcode for p in processes]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_common_args(parser)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--start-method", choices=("spawn", "fork"), default="spawn")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if args.start_method == "spawn":
        mp.spawn(train, args=(args,), nprocs=args.nproc)
    else:
        start_with_processes(args)
