"""A user's DDP script that knows nothing of diagtrain (run under torchrun or plain python).

Environment knobs for the tests: STEPS, STEP_SLEEP (seconds per step), FAIL_RANK and FAIL_STEP
(that rank raises at that step), PAUSE_RANK, PAUSE_STEP and PAUSE_S (that rank sleeps before that
step's work, while its peers wait in the step's all-reduce), EXIT_CODE (exit with it at the end),
TEARDOWN_CRASH_RANK (that rank's process calls C++'s std::terminate while Python shuts down, after
the script ended: what gloo's threads do when a process group outlives the script; with
TEARDOWN_SILENT=1 it is killed there instead, saying nothing).
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
rank = dist.get_rank() if distributed else 0
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
if distributed:
    model = DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
fail_rank, fail_step = int(os.environ.get("FAIL_RANK", -1)), int(os.environ.get("FAIL_STEP", 0))
pause_rank, pause_step = int(os.environ.get("PAUSE_RANK", -1)), int(os.environ.get("PAUSE_STEP", 0))
for step in range(1, int(os.environ.get("STEPS", "6")) + 1):
    if rank == fail_rank and step == fail_step:
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")
    if rank == pause_rank and step == pause_step:
        time.sleep(float(os.environ.get("PAUSE_S", "0")))
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
print(f"user script: rank {rank} finished; NCCL_DEBUG_FILE={os.environ.get('NCCL_DEBUG_FILE')} "
      f"TORCH_FR_BUFFER_SIZE={os.environ.get('TORCH_FR_BUFFER_SIZE')}", flush=True)
print(f"user script: rank {rank} says goodbye on stderr", file=sys.stderr, flush=True)
if distributed:
    dist.destroy_process_group()


class TerminateAtTeardown:
    """Aborts through libstdc++ when the interpreter's teardown frees it (a global: after atexit)."""

    def __init__(self) -> None:
        import ctypes
        import signal

        silent = os.environ.get("TEARDOWN_SILENT") == "1"
        # std::terminate(), or SIGKILL; bound now: modules are half torn down when __del__ runs.
        self.die = (lambda: os.kill(os.getpid(), signal.SIGKILL)) if silent else ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev

    def __del__(self) -> None:
        self.die()


if rank == int(os.environ.get("TEARDOWN_CRASH_RANK", -1)):
    freed_last = TerminateAtTeardown()
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
