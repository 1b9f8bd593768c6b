"""Step boundaries for programs that know nothing of diagtrain: global optimizer-step hooks.

Armed from the bootstrap before user code runs, without importing torch (that would change the
program's import order and start-up time): a finder on ``sys.meta_path`` waits for ``import
torch`` to finish and then registers torch's global optimizer pre- and post-step hooks.

A step ends when the *lead* optimizer (the first one that steps) finishes ``step()``, so a
program with several optimizers (pipeline stages, GANs) still counts one step per iteration.
Step 1 starts when torch is imported, so it includes start-up. A program that opens its own
:class:`~diagtrain.profiler.instrument.StepRecorder` takes over and these hooks stand down.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from diagtrain.profiler import instrument, state_dump
from diagtrain.profiler.run_dir import rank_dir, write_json_atomic


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once the top-level module ``name`` has been executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            try:
                self.callback(module)
            except Exception as e:  # noqa: BLE001 - never break the user's import
                print(f"diagtrain: step hooks not installed: {type(e).__name__}: {e}", file=sys.stderr)

        spec.loader.exec_module = exec_then_call
        return spec


class _HookRecorder:
    """Drives an implicit StepRecorder from the global optimizer hooks."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.armed_at = time.perf_counter()
        self.recorder: instrument.StepRecorder | None = None
        self.lead: int | None = None
        self.stood_down = False

    def on_torch_imported(self, torch: ModuleType) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(self._pre_step)
        register_optimizer_step_post_hook(self._post_step)
        atexit.register(self.close)
        _add_torch_facts(rank_dir(self.run_dir, self.rank) / "rank.json", torch)

    def _active(self, optimizer: Any) -> bool:
        if self.lead is None and not self.stood_down:
            # The first step: every process group a training loop needs exists by now.
            state_dump.write_process_groups(rank_dir(self.run_dir, self.rank))
        if self.stood_down:
            return False
        if instrument.explicit_recorder_active():
            self._stand_down()
            return False
        if self.lead is None:
            self.lead = id(optimizer)
        return id(optimizer) == self.lead

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._active(optimizer):
            return
        if self.recorder is None:
            import torch

            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_initialized() else None
            if device is not None:
                _add_device(rank_dir(self.run_dir, self.rank) / "rank.json", torch, device)
            self.recorder = instrument.StepRecorder(
                self.run_dir, rank=self.rank, device=device, implicit=True, started_at=self.armed_at
            ).__enter__()
        self.recorder.begin_phase("optimizer")

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.recorder is not None and self._active(optimizer):
            self.recorder.end_phase("optimizer")
            self.recorder.step()

    def _stand_down(self) -> None:
        self.stood_down = True
        self.close()

    def close(self) -> None:
        """Finish the recorder: export an open profiler window, close steps.jsonl."""
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            recorder.__exit__(None, None, None)


def arm(run_dir: Path, rank: int) -> None:
    """Install the optimizer hooks as soon as torch is imported (at once if it already is)."""
    hooks = _HookRecorder(run_dir, rank)
    if "torch" in sys.modules:
        hooks.on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", hooks.on_torch_imported))


def _add_torch_facts(path: Path, torch: ModuleType) -> None:
    _update_json(path, torch=torch.__version__, cuda=torch.version.cuda)


def _add_device(path: Path, torch: ModuleType, device: Any) -> None:
    """The GPU this rank uses, so that NVML samples can be joined to it by UUID."""
    props = torch.cuda.get_device_properties(device)
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    _update_json(path, device=str(device), device_uuid=str(getattr(props, "uuid", "")) or None,
                 device_name=props.name, nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl)


def _update_json(path: Path, **fields: Any) -> None:
    import json

    write_json_atomic(path, {**json.loads(path.read_text()), **fields})
