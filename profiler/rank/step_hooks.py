"""Step boundaries for programs that know nothing of diagtrain: global optimizer-step hooks.

Armed from the bootstrap before user code runs, without importing torch (that would change the
program's import order and start-up time): once the program has imported torch, it registers
torch's global optimizer pre- and post-step hooks and starts the always-on counters
(:mod:`diagtrain.profiler.rank.counters`), whose data, forward and backward phases fill the step
records of a program that has no StepRecorder of its own.

A step ends when the *lead* optimizer (the first one that steps) finishes ``step()``, so a
program with several optimizers (pipeline stages, GANs) still counts one step per iteration. AMP's
GradScaler skips ``optimizer.step()`` when the gradients hold an inf or NaN: the hooks would not see
that iteration end, and it would merge into the next (twice the time: a false slow step). GradScaler's
call is followed instead, and a step it skipped ends there, marked ``optimizer_skipped``.
Step 1 starts when torch is imported, so it includes start-up. A program that opens its own
:class:`~diagtrain.profiler.rank.instrument.StepRecorder` takes over and these hooks stand down.

The hooks may be armed before the process's rank is known (the command's own process, which is a
rank unless it starts the ranks itself): its first optimizer step then asks whether it is one.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from diagtrain.profiler.rank import instrument, state_dump, trouble
from diagtrain.profiler.rank.after_import import call_after_import
from diagtrain.profiler.rank.counters import COUNTERS
from diagtrain.profiler.rank.process_end import at_process_end
from diagtrain.profiler.run_dir import rank_dir, write_json_atomic


class _HookRecorder:
    """Drives an implicit StepRecorder from the global optimizer hooks."""

    def __init__(self, run_dir: Path, claim: Callable[[], int | None]) -> None:
        """``claim()``: this process's rank, asked at its first step while the rank is not known (None: no rank)."""
        self.run_dir, self.claim = run_dir, claim
        self.rank: int | None = None
        self.pid = os.getpid()  # the process the hooks count for (a forked child inherits them)
        self.torch: ModuleType | None = None
        self.torch_imported_at: float | None = None  # Unix seconds: the start-up's imports end here
        self.armed_at = time.perf_counter()
        self.recorder: instrument.StepRecorder | None = None
        self.lead: int | None = None
        self.stood_down = False
        self.post_steps = 0  # optimizer.step() calls finished, of any optimizer: tells a step GradScaler skipped

    def on_torch_imported(self, torch: ModuleType) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(self._pre_step)
        register_optimizer_step_post_hook(self._post_step)
        COUNTERS.install()
        COUNTERS.set_phase_tracking(True)
        at_process_end(self.close)
        self.torch, self.torch_imported_at = torch, time.time()
        if self.rank is not None:
            _add_torch_facts(rank_dir(self.run_dir, self.rank) / "rank.json", torch, self.torch_imported_at)
        scaler = getattr(getattr(getattr(torch, "amp", None), "grad_scaler", None), "GradScaler", None)
        if scaler is not None and hasattr(scaler, "_maybe_opt_step"):  # a torch without it: skipped steps merge, as before
            scaler._maybe_opt_step = follow_skipped_steps(scaler._maybe_opt_step, self)

    def bind(self, rank: int) -> None:
        """Record steps as ``rank`` (its rank.json exists now); a forked child counts from now, not its parent."""
        if os.getpid() != self.pid:
            self.pid, self.armed_at = os.getpid(), time.perf_counter()
            if self.torch is not None:
                COUNTERS.restart_in_child()
                at_process_end(self.close)
        self.rank = rank
        if self.torch is not None:
            _add_torch_facts(rank_dir(self.run_dir, rank) / "rank.json", self.torch, self.torch_imported_at)

    def _folder(self) -> Path | None:
        return None if self.rank is None else rank_dir(self.run_dir, self.rank)

    def _active(self, optimizer: Any) -> bool:
        if self.rank is None and (os.getpid() != self.pid or self.claim() is None):
            self.stood_down = True  # a helper that steps an optimizer (Hogwild), or the launcher of the ranks
        if self.lead is None and not self.stood_down:
            # The first step: every process group a training loop needs exists by now.
            try:
                state_dump.write_process_groups(self._folder())
            except OSError as e:
                trouble.warn(self._folder(), "process_groups",
                             f"process_groups.json not written ({trouble.reason(e)})")
        if self.stood_down:
            return False
        if instrument.explicit_recorder_active():
            self._stand_down()
            return False
        if self.lead is None:
            self.lead = id(optimizer)
        return id(optimizer) == self.lead

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._begin(optimizer)
        except Exception as e:  # noqa: BLE001 - a hook must never fail the user's optimizer.step()
            trouble.warn(self._folder(), "hooks", f"step hook failed ({trouble.reason(e)}); training goes on")

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.post_steps += 1
        try:
            self._end(optimizer)
        except Exception as e:  # noqa: BLE001 - as in _pre_step
            trouble.warn(self._folder(), "hooks", f"step hook failed ({trouble.reason(e)}); training goes on")

    def skipped(self, optimizer: Any) -> None:
        """GradScaler skipped ``optimizer.step()`` (inf or NaN gradients): the iteration ends here all the same."""
        try:
            self._begin(optimizer)
            self._end(optimizer, optimizer_skipped=True)
        except Exception as e:  # noqa: BLE001 - as in _pre_step
            trouble.warn(self._folder(), "hooks", f"step hook failed ({trouble.reason(e)}); training goes on")

    def _begin(self, optimizer: Any) -> None:
        if not self._active(optimizer):
            return
        if self.recorder is None:
            import torch

            device = rank_device(optimizer, COUNTERS.modules())
            if device is not None:
                _add_device(self._folder() / "rank.json", torch, device)
            self.recorder = instrument.StepRecorder(
                self.run_dir, rank=self.rank, device=device, implicit=True, started_at=self.armed_at
            ).__enter__()
        COUNTERS.phase_enter("optimizer")
        self.recorder.begin_phase("optimizer")

    def _end(self, optimizer: Any, **marks: Any) -> None:
        if self.recorder is not None and self._active(optimizer):
            self.recorder.end_phase("optimizer")
            COUNTERS.phase_exit("optimizer")
            self.recorder.step(**marks)

    def _stand_down(self) -> None:
        self.stood_down = True
        self.close()

    def close(self) -> None:
        """Finish the recorder: export an open profiler window, close steps.jsonl."""
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            recorder.__exit__(None, None, None)


def follow_skipped_steps(maybe_step: Callable[..., Any], hooks: _HookRecorder) -> Callable[..., Any]:
    """``GradScaler._maybe_opt_step`` (the one place it calls, or skips, ``optimizer.step()``) that tells
    ``hooks`` of a step it skipped."""

    @functools.wraps(maybe_step)
    def _maybe_opt_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = hooks.post_steps
        result = maybe_step(scaler, optimizer, *args, **kwargs)
        if hooks.post_steps == before:
            hooks.skipped(optimizer)
        return result

    return _maybe_opt_step


def rank_device(optimizer: Any, modules: Iterable[Any]) -> Any:
    """The GPU this rank trains on: its optimizer's first CUDA parameter's device, else its modules' (an
    optimizer that keeps its state on the CPU); None where no parameter is on a GPU.

    Not ``torch.cuda.current_device()``: a script that moves its model with ``.to(rank)`` (PyTorch's DDP
    tutorial) and never calls ``torch.cuda.set_device`` trains on its own GPU while the current device stays 0.
    """
    params = (p for group in getattr(optimizer, "param_groups", ()) for p in group.get("params", ()))
    in_modules = (p for module in modules for p in module.parameters())
    return next((p.device for p in itertools.chain(params, in_modules) if getattr(p, "is_cuda", False)), None)


def arm(run_dir: Path, claim: Callable[[], int | None]) -> _HookRecorder:
    """Install the optimizer hooks as soon as torch is imported (at once if it already is); they record
    once the rank is known (:meth:`_HookRecorder.bind`, or ``claim()`` at the first step)."""
    hooks = _HookRecorder(run_dir, claim)
    call_after_import("torch", hooks.on_torch_imported)
    return hooks


def _add_torch_facts(path: Path, torch: ModuleType, imported_at: float | None) -> None:
    _update_json(path, torch=torch.__version__, cuda=torch.version.cuda, torch_imported_at=imported_at)


def _add_device(path: Path, torch: ModuleType, device: Any) -> None:
    """The GPU this rank uses, so that NVML samples can be joined to it by UUID."""
    props = torch.cuda.get_device_properties(device)
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    _update_json(path, device=str(device), device_uuid=str(getattr(props, "uuid", "")) or None,
                 device_name=props.name, nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl)


def _update_json(path: Path, **fields: Any) -> None:
    import json

    write_json_atomic(path, {**json.loads(path.read_text()), **fields})
