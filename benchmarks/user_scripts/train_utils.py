"""What the plain training scripts beside this file share, as a user's train.py shares its utils.

The model block, and the faults people really have, switched on from the command line:
`add_fault_args` on the argument parser, then `Faults` hooks at the places a real fault sits
(before forward, at the logging all-reduce). Plain torch: nothing here imports diagtrain.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time

import torch
import torch.distributed as dist

WIDTH = 256


class Block(torch.nn.Module):
    """A residual GELU MLP, four times wider inside; the unit every script stacks."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Steps, batch, and the fault options every script takes; no fault given is the clean twin."""
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps before each forward")
    parser.add_argument("--slow-ms", type=float, default=60.0)
    parser.add_argument("--hold-rank", type=int, default=-1, help="this rank keeps extra tensors alive")
    parser.add_argument("--hold-mb", type=int, default=300)
    parser.add_argument("--hang-rank", type=int, default=-1, help="this rank blocks forever at --hang-step")
    parser.add_argument("--hang-step", type=int, default=5)
    parser.add_argument("--crash-rank", type=int, default=-1, help="this rank raises in the loop")
    parser.add_argument("--crash-step", type=int, default=5)
    parser.add_argument("--churn-rank", type=int, default=-1,
                        help="this rank's malloc hands every buffer over 4 KiB back to the kernel (no fault: same work)")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc malloc.h)
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's largest on 64-bit: buffers up to this come from the heap
KEEP_BYTES = 1 << 30  # free memory at the heap's top is kept up to this, not handed back


class Faults:
    """What the command line asked for, applied by the training loop at its usual places."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args, self.rank = args, rank
        self.held: list[torch.Tensor] = []
        if rank == args.hold_rank:
            # A cache or a list of activations kept "for debugging": touched so that it is resident.
            self.held.append(torch.ones(args.hold_mb * 2**20 // 4))
        if rank == args.churn_rank:
            # What glibc's moving mmap threshold does to one rank of a clean job now and then, made
            # certain: every large buffer is a fresh mapping, its pages faulted in again each step.
            libc = ctypes.CDLL(None)
            libc.mallopt(M_MMAP_THRESHOLD, 4096)
            libc.mallopt(M_TRIM_THRESHOLD, 0)
        elif args.churn_rank >= 0:
            # ... and its peers made certain not to: left alone, glibc's moving threshold sometimes puts a
            # peer in the same state (CI saw rank 0 fault as often as the churning rank), and the case is
            # one rank that churns beside ranks that keep their memory.
            libc = ctypes.CDLL(None)
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
            libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)

    def before_forward(self, step: int) -> None:
        """A slow rank (a noisy neighbour, a slower CPU), a rank that raises, one that blocks."""
        if self.rank == self.args.crash_rank and step == self.args.crash_step:
            raise RuntimeError(f"bad sample on rank {self.rank} at step {step}")
        if self.rank == self.args.hang_rank and step == self.args.hang_step:
            threading.Event().wait()  # a read from a dead file system, a lock nobody releases
        if self.rank == self.args.slow_rank:
            time.sleep(self.args.slow_ms / 1e3)


def finish_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, step: int, group=None) -> None:
    """Backward, optimizer step, and the usual averaged loss printed by rank 0."""
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    value = loss.detach().clone()
    dist.all_reduce(value, group=group)
    if dist.get_rank() == 0:
        print(f"step {step} loss {float(value) / dist.get_world_size(group):.4f}", flush=True)
