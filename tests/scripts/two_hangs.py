"""Two independent hangs (issue 51): two data-parallel groups of two ranks; at step 4 rank 1 and rank 3 each stop
(a sleep), one in each group, and their peers wait for them in their group's all-reduce."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(minutes=10))  # longer than any hang timeout it is run with
rank = dist.get_rank()
groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
mine = groups[rank // 2]
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 9):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    if step == 4 and rank in (1, 3):
        time.sleep(3600)  # frozen: the hang watchdog stops the job
    for p in model.parameters():
        dist.all_reduce(p.grad, group=mine)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
