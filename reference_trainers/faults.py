"""Fault injection: what each ``--inject`` spec (fault_specs.py) does inside a rank.

Every injected fault is ground truth for the analyzer: rank 0 writes the parsed list to
``injected.json`` in the run directory before training starts.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from diagtrain.reference_trainers.fault_specs import FaultSpec


class FaultInjector:
    """Applies the faults that target this rank; every method is a no-op when none does."""

    def __init__(self, faults: list[FaultSpec], rank: int, forward_calls_per_step: int) -> None:
        self.faults = [f for f in faults if f.rank == rank]
        self.forward_calls_per_step = forward_calls_per_step
        self.step = 1
        self._held: torch.Tensor | None = None

    def _get(self, kind: str) -> FaultSpec | None:
        return next((f for f in self.faults if f.kind == kind and f.active(self.step)), None)

    def hold_memory(self, device: torch.device) -> None:
        """mem_imbalance: allocate and keep ``mb`` MiB, touched so that it is resident."""
        fault = next((f for f in self.faults if f.kind == "mem_imbalance"), None)
        if fault is not None:
            self._held = torch.ones(int(fault.params["mb"] * 2**20) // 4, device=device)

    def data_delay(self) -> None:
        """dataloader_stall: sleep in the data phase every ``every`` steps; stuck: never return;
        crash: raise."""
        if any(f.kind == "stuck" and f.step == self.step for f in self.faults):
            _stuck_in_user_code()
        if any(f.kind == "crash" and f.step == self.step for f in self.faults):
            raise RuntimeError(f"injected crash at step {self.step}")
        fault = self._get("dataloader_stall")
        if fault is not None and self.step % int(fault.params.get("every", 1)) == 0:
            time.sleep(fault.params["ms"] / 1e3)

    def skips_metrics_collective(self) -> bool:
        """hang: this rank does not enter the step's metrics all-reduce (a conditional collective)."""
        return any(f.kind == "hang" and f.step == self.step for f in self.faults)

    def slow_forward(self, modules: list[nn.Module]) -> None:
        """straggler: make every forward call of ``modules`` slower by ``ms`` per step or ``factor``."""
        if not any(f.kind == "straggler" for f in self.faults):
            return
        for module in modules:
            module.register_forward_pre_hook(self._forward_start)
            module.register_forward_hook(self._forward_end)

    def _forward_start(self, module: nn.Module, args: Any) -> None:
        module._diagtrain_fwd_start = time.perf_counter()

    def _forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        fault = self._get("straggler")
        if fault is None:
            return
        if "ms" in fault.params:
            delay = fault.params["ms"] / 1e3 / self.forward_calls_per_step
        else:
            delay = (time.perf_counter() - module._diagtrain_fwd_start) * (fault.params["factor"] - 1)
        time.sleep(delay)

    def slow_collectives(self, ddp_model: nn.Module | None) -> None:
        """slow_comm: sleep ``ms`` before each collective this rank issues."""
        if not any(f.kind == "slow_comm" for f in self.faults):
            return
        for module, names in _collective_entry_points():
            for name in names:
                if hasattr(module, name):
                    setattr(module, name, self._delayed(getattr(module, name)))
        if ddp_model is not None:
            # DDP's reducer issues its all-reduces from C++; a comm hook is the way in.
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            def hook(state, bucket):
                self._comm_delay()
                return default_hooks.allreduce_hook(state, bucket)

            # DDP inspects these annotations; postponed (string) annotations would not match.
            hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                                    "return": torch.futures.Future[torch.Tensor]}
            ddp_model.register_comm_hook(None, hook)

    def _comm_delay(self) -> None:
        fault = self._get("slow_comm")
        if fault is not None:
            time.sleep(fault.params["ms"] / 1e3)

    def _delayed(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._comm_delay()
            return fn(*args, **kwargs)

        return wrapper


def _stuck_in_user_code() -> None:
    """The `stuck` fault: user code that never returns (a deadlock, an endless retry loop)."""
    while True:
        time.sleep(1)


def _collective_entry_points() -> list[tuple[Any, tuple[str, ...]]]:
    """The Python-level functions that FSDP2, DTensor and pipelining call to communicate."""
    import torch.distributed._functional_collectives as funcol

    c10d = (
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
        "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
        "all_to_all_single", "batch_isend_irecv", "send", "recv", "barrier",
    )
    functional = (
        "all_reduce", "all_gather_tensor", "all_gather_single", "reduce_scatter_tensor",
        "reduce_scatter_single", "all_to_all_single", "broadcast",
    )
    return [(dist, c10d), (funcol, functional)]
