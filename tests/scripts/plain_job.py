"""A user's training script that knows nothing of diagtrain, with the faults users really have.

Run under torchrun. Environment knobs for the tests:
  MODE            ddp (a DataLoader with DistributedSampler), fsdp (FSDP2 fully_shard) or pp
                  (torch.distributed.pipelining, GPipe, one stage per rank)
  STEPS           optimizer steps (default 8)
  STEP_MS         every rank sleeps this long per step (default 0): a steadier step time
  SLEEP_RANK, SLEEP_MS        that rank sleeps SLEEP_MS before its forward every step (a straggler)
  SLOW_DATA_RANK, SLOW_DATA_MS, SLOW_EVERY
                  on that rank, the dataset's first item of every SLOW_EVERY-th batch takes
                  SLOW_DATA_MS (a data stall)
  SLOW_FROM, SLOW_FROM_MS     from that step on, every rank sleeps SLOW_FROM_MS more per step
  HURRY_FILE      once this file exists, no rank sleeps any more: a test that has seen what it waited
                  for lets the job's remaining steps run at full speed
"""

import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

BATCH = 8
env = os.environ.get
MODE, STEPS = env("MODE", "ddp"), int(env("STEPS", "8"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class Samples(Dataset):
    """Random regression samples; on SLOW_DATA_RANK, every SLOW_EVERY-th batch is slow to read."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0
        self.slow = rank == int(env("SLOW_DATA_RANK", "-1"))
        self.every = int(env("SLOW_EVERY", "1"))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        batch, item = divmod(self.reads, BATCH)
        self.reads += 1
        if self.slow and item == 0 and (batch + 1) % self.every == 0:
            time.sleep(float(env("SLOW_DATA_MS", "0")) / 1e3)
        return torch.randn(32), torch.randn(32)


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))


def pause(step: int) -> None:
    """What makes this rank's step slower: the fault knobs."""
    if env("HURRY_FILE") and os.path.exists(env("HURRY_FILE")):
        return
    ms = float(env("STEP_MS", "0"))
    if rank == int(env("SLEEP_RANK", "-1")):
        ms += float(env("SLEEP_MS", "0"))
    if step >= int(env("SLOW_FROM", "1000000")):
        ms += float(env("SLOW_FROM_MS", "0"))
    time.sleep(ms / 1e3)


if MODE == "pp":
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    model = mlp()
    stage = PipelineStage(model, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
else:
    if MODE == "fsdp":
        from torch.distributed.fsdp import fully_shard

        model = torch.nn.Sequential(mlp(), mlp())
        for block in model:
            fully_shard(block)
        model = fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(mlp())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = Samples(BATCH * STEPS * world)
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
for step, (x, y) in enumerate(loader, start=1):
    pause(step)
    if MODE == "pp":
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
    else:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
