"""In-rank instrumentation: step boundaries, phase times, peak memory, heartbeat, profiler windows.

Usage in a training loop (the reference trainers do exactly this)::

    with StepRecorder() as rec:
        for batch in loader:
            with rec.phase("forward"):
                loss = model(batch)
            ...
            rec.step(samples=len(batch), loss=loss.item())

The recorder writes into ``$DIAGTRAIN_RUN_DIR/ranks/<rank>/``. Without a run directory it does
nothing, so a script keeps working outside diagtrain.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from diagtrain.profiler.memory import PeakMemory
from diagtrain.profiler.run_dir import (
    RUN_DIR_ENV,
    SCHEMA_VERSION,
    Heartbeat,
    JsonlAppender,
    rank_dir,
)
from diagtrain.profiler.step_ranges import PROFILE_STEPS_ENV, StepRange, parse_step_ranges


# Set while a recorder the program created itself is open; the optimizer-hook recorder that
# `diagtrain run` installs then stands down, so steps are never counted twice.
_explicit_recorders = 0


def explicit_recorder_active() -> bool:
    """Whether the program drives a StepRecorder itself."""
    return _explicit_recorders > 0


def current_rank() -> int:
    """This process's global rank: from torch.distributed once initialized, else ``$RANK``, else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


class StepRecorder:
    """Records one line per training step to ``steps.jsonl`` and profiles the steps asked for.

    A step runs from the previous :meth:`step` call (or from entering the recorder) to the next
    one. Time spent inside :meth:`phase` blocks is summed per phase name.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike | None = None,
        *,
        rank: int | None = None,
        profile_steps: list[StepRange] | str | None = None,
        device: torch.device | None = None,
        first_step: int = 1,
        implicit: bool = False,
        started_at: float | None = None,
    ) -> None:
        run_dir = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
        self.enabled = bool(run_dir)
        self.run_dir = Path(run_dir) if run_dir else None
        self._rank = rank
        if profile_steps is None:
            profile_steps = os.environ.get(PROFILE_STEPS_ENV)
        if isinstance(profile_steps, str) or profile_steps is None:
            profile_steps = parse_step_ranges(profile_steps)
        self.profile_windows: list[StepRange] = list(profile_steps)
        self.device = device or torch.device("cpu")
        self.step_num = first_step
        self._phases: dict[str, float] = {}
        self._step_start = 0.0
        self._profiler: torch.profiler.profile | None = None
        self._window: StepRange | None = None
        self._step_annotation: Any = None
        self._phase_starts: dict[str, tuple[float, Any]] = {}
        self.implicit = implicit
        self._first_start = started_at  # time.perf_counter() when step 1 began, if before entering

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> "StepRecorder":
        global _explicit_recorders
        if not self.implicit:
            _explicit_recorders += 1
        if self.enabled:
            self.rank = self._rank if self._rank is not None else current_rank()
            self.dir = rank_dir(self.run_dir, self.rank)
            self.dir.mkdir(parents=True, exist_ok=True)
            self._steps = JsonlAppender(self.dir / "steps.jsonl")
            self._heartbeat = Heartbeat(self.dir / "heartbeat")
            self._memory = PeakMemory(self.device)
            self._begin_step()
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        global _explicit_recorders
        if not self.implicit:
            _explicit_recorders -= 1
        if not self.enabled:
            return
        # A window cut short (error, or fewer steps than asked) is still exported: it is often
        # the most interesting trace of the run. After a clean end the open step is only the
        # tail after the last step() call, not a step, so its annotation is dropped.
        unfinished = self.step_num if exc_type is None and self._step_annotation is not None else None
        self._end_profiled_step()
        if self._profiler is not None:
            self._stop_profiler(drop_step=unfinished)
        self._steps.close()
        self._heartbeat.close()

    # -- the API a training loop calls ---------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase of the current step (data, forward, backward, optimizer, ...)."""
        self.begin_phase(name)
        try:
            yield
        finally:
            self.end_phase(name)

    def begin_phase(self, name: str) -> None:
        """Start timing ``name``; for code where a ``with`` block does not fit (hooks)."""
        if not self.enabled:
            return
        annotation = None
        if self._profiler is not None:
            annotation = torch.profiler.record_function(f"diagtrain.phase.{name}")
            annotation.__enter__()
        self._phase_starts[name] = (time.perf_counter(), annotation)

    def end_phase(self, name: str) -> None:
        """Stop timing ``name`` and add the time to the current step."""
        if not self.enabled or name not in self._phase_starts:
            return
        start, annotation = self._phase_starts.pop(name)
        self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - start
        if annotation is not None:
            annotation.__exit__(None, None, None)

    def step(self, **metrics: Any) -> None:
        """End the current step, writing its record with ``metrics`` (samples, tokens, loss, ...)."""
        if not self.enabled:
            self.step_num += 1
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a step ends when its kernels end
        end_wall, end = time.time(), time.perf_counter()
        duration = end - self._step_start
        record = {
            "schema_version": SCHEMA_VERSION,
            "rank": self.rank,
            "step": self.step_num,
            "start": round(end_wall - duration, 6),
            "end": round(end_wall, 6),
            "duration_ms": round(duration * 1e3, 3),
            "phases_ms": {k: round(v * 1e3, 3) for k, v in self._phases.items()},
            "peak_mem_bytes": self._memory.read(),
            "mem_source": self._memory.source,
            **metrics,
        }
        self._steps.append(record)
        self._heartbeat.write({"step": self.step_num, "time": record["end"], "pid": os.getpid()})
        self._end_profiled_step()
        if self._window is not None and self.step_num >= self._window.last:
            self._stop_profiler()
        self.step_num += 1
        self._begin_step()

    # -- internals -----------------------------------------------------------------------------

    def _begin_step(self) -> None:
        self._phases = {}
        if self._profiler is None:
            self._window = next((w for w in self.profile_windows if self.step_num in w), None)
            if self._window is not None:
                self._start_profiler()
        if self._profiler is not None:
            # The same annotation torch.profiler's schedule emits, so HTA and Perfetto find steps.
            self._step_annotation = torch.profiler.record_function(f"ProfilerStep#{self.step_num}")
            self._step_annotation.__enter__()
        self._memory.reset()
        self._step_start = self._first_start or time.perf_counter()
        self._first_start = None

    def _end_profiled_step(self) -> None:
        if self._step_annotation is not None:
            self._step_annotation.__exit__(None, None, None)
            self._step_annotation = None

    def _start_profiler(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True, with_stack=False
        )
        self._profiler.__enter__()

    def _stop_profiler(self, drop_step: int | None = None) -> None:
        profiler, window = self._profiler, self._window
        self._profiler, self._window = None, None
        profiler.__exit__(None, None, None)
        name = f"trace-rank{self.rank}-steps{window.first}-{window.last}.json.gz"
        # export_chrome_trace gzips when the name ends in .gz; the hidden temp name keeps that
        # suffix, and the rename makes the finished file appear whole.
        tmp = self.dir / f".tmp-{os.getpid()}-{name}"
        profiler.export_chrome_trace(str(tmp))
        if drop_step is not None:
            _drop_annotation(tmp, f"ProfilerStep#{drop_step}")
        os.replace(tmp, self.dir / name)


def _drop_annotation(path: Path, name: str) -> None:
    """Remove the events called ``name`` from a gzipped Chrome trace, in place."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != name]
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
