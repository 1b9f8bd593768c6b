"""Ranks that disagree on a collective's size: rank 1 all-reduces twice as many elements."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
dist.all_reduce(torch.ones(4 if rank == 0 else 8))
dist.destroy_process_group()
