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

import errno
import gzip
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from diagtrain.profiler.rank import trouble
from diagtrain.profiler.rank.counters import COUNTERS, Reading
from diagtrain.profiler.rank.device_clock import MAX_PENDING_STEPS, DeviceClock, cuda_clock, graph_capture
from diagtrain.profiler.rank.device_colls import CollectiveTimes, nccl_dump
from diagtrain.profiler.rank.peak_memory import PeakMemory
from diagtrain.profiler.rank.profile_requests import ProfileRequests
from diagtrain.profiler.run_dir import (
    PROFILE_AUTO,
    PROFILE_NONE,
    PROFILE_STEPS_ENV,
    RUN_DIR_ENV,
    SCHEMA_VERSION,
    STEPS_FILE,
    Heartbeat,
    JsonlAppender,
    rank_dir,
    recorder_entries,
    remove_quietly,
    step_segment_bytes,
)
from diagtrain.profiler.util.step_ranges import StepRange, parse_step_ranges

# At a clean end the device's last steps are waited for this long, polled: the device is rarely more
# than a few steps behind. After an error they are not waited for (the device may never get there).
DEVICE_FLUSH_WAIT_S = 5.0

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
    one. Time spent inside :meth:`phase` blocks is summed per phase name, and so is the time the
    rank was blocked in communication inside each (``phase_comm_ms``). Every record also carries
    the always-on counters of :mod:`~diagtrain.profiler.rank.counters`: ``comm_ms``,
    ``comm_calls``, ``cpu_ms``, ``runq_ms``, ``page_faults``, ``rss_bytes`` and, on a GPU,
    ``gpu_allocated_bytes``, ``gpu_reserved_bytes`` and ``gpu_peak_bytes``. The recorder that
    `diagtrain run` drives from the optimizer hooks (``implicit``) takes its phases from the
    counters too. It never raises into the training loop: a record it cannot write (a full disk)
    or a window it cannot profile is dropped with one warning (see
    :mod:`diagtrain.profiler.rank.trouble`), and training goes on.
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
        # "auto": the windows `diagtrain run` decides while the job runs, read at step boundaries.
        self._requests = ProfileRequests(self.run_dir) if profile_steps == PROFILE_AUTO and self.enabled else None
        if profile_steps in (PROFILE_AUTO, PROFILE_NONE):
            profile_steps = None
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
        self._phase_starts: dict[str, tuple[float, Any, float]] = {}
        self._phase_comm: dict[str, float] = {}
        self.implicit = implicit
        self._first_start = started_at  # time.perf_counter() when step 1 began, if before entering
        self._counted: Reading | None = None  # the counters when the current step began
        self.last_step_ms: float | None = None  # the last recorded step's duration_ms, for a loop's own progress
        self._clock: DeviceClock | None = None  # the device's view of each step, on CUDA
        self._colls: CollectiveTimes | None = None  # NCCL collectives' device times, on CUDA
        self._capturing = lambda: False  # on CUDA: whether a CUDA graph is being captured on the device now

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> "StepRecorder":
        global _explicit_recorders
        if not self.implicit:
            _explicit_recorders += 1
        if self.enabled:
            self.rank = self._rank if self._rank is not None else current_rank()
            self.dir = rank_dir(self.run_dir, self.rank)
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                self._steps = JsonlAppender(self.dir / STEPS_FILE, self._segment_bytes())
                self._heartbeat = Heartbeat(self.dir / "heartbeat")
            except OSError as e:
                trouble.warn(None, "recorder", f"steps are not recorded: cannot write in {self.dir} ({trouble.reason(e)})")
                self.enabled = False
                return self
            self._memory = PeakMemory(self.device)
            self._open_device_view()
            COUNTERS.install()
            COUNTERS.follow_current_thread()  # the training loop's thread, main or not
            if not self.implicit:
                COUNTERS.set_phase_tracking(False)  # the program times its own phases
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
        self._flush_device_view(DEVICE_FLUSH_WAIT_S if exc_type is None else 0.0)
        for close in (self._steps.close, self._heartbeat.close):
            try:
                close()
            except OSError:
                pass  # what could not be written was already warned about

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
        self._phase_starts[name] = (time.perf_counter(), annotation, COUNTERS.comm_s)
        self._work_begins(name)

    def end_phase(self, name: str) -> None:
        """Stop timing ``name`` and add the time to the current step."""
        if not self.enabled or name not in self._phase_starts:
            return
        start, annotation, comm = self._phase_starts.pop(name)
        self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - start
        self._phase_comm[name] = self._phase_comm.get(name, 0.0) + COUNTERS.comm_s - comm
        if annotation is not None:
            annotation.__exit__(None, None, None)

    def step(self, **metrics: Any) -> None:
        """End the current step, writing its record with ``metrics`` (samples, tokens, loss, ...)."""
        if not self.enabled:
            self.step_num += 1
            return
        # No synchronize: the host keeps its lead, and the device's own times come from its events.
        device = self._device_steps()
        colls = self._collectives(lambda times: times.take())  # what the reads since the last record found
        end_wall, end = time.time(), time.perf_counter()
        duration = end - self._step_start
        phases, phase_comm = self._phases, self._phase_comm
        if self.implicit:  # data, forward, backward from the counters; the hooks' own phases win
            counted, counted_comm = COUNTERS.phases.take()
            COUNTERS.step_ended()
            phases, phase_comm = {**counted, **phases}, {**counted_comm, **phase_comm}
        reading = COUNTERS.read()
        counters = reading.since(self._counted) if reading is not None and self._counted is not None else {}
        p2p = COUNTERS.take_p2p()
        samples = COUNTERS.take_samples()
        gpu = self._gpu_memory()
        record = {
            "schema_version": SCHEMA_VERSION,
            "rank": self.rank,
            "step": self.step_num,
            "start": round(end_wall - duration, 6),
            "end": round(end_wall, 6),
            "duration_ms": round(duration * 1e3, 3),
            "phases_ms": {k: round(v * 1e3, 3) for k, v in phases.items()},
            **({"phase_comm_ms": {k: round(phase_comm.get(k, 0.0) * 1e3, 3) for k in phases}}
               if "comm_ms" in counters else {}),
            **counters,
            **({"p2p": p2p} if p2p else {}),
            "peak_mem_bytes": self._memory.read(gpu.get("gpu_peak_bytes")),
            "mem_source": self._memory.source,
            **gpu,
            **device,
            **colls,
            **({"samples": samples} if samples else {}),
            **metrics,
        }
        self.last_step_ms = record["duration_ms"]
        try:
            self._steps.append(record)
            self._heartbeat.write({"step": self.step_num, "time": record["end"], "pid": os.getpid()})
        except OSError as e:
            trouble.warn(self.dir, "steps", f"step records are being lost: cannot write {self.dir / 'steps.jsonl'} "
                         f"({trouble.reason(e)}); training goes on")
        # Between two steps, at the steps every rank reads at: a read of the flight recorder is in neither's time.
        self._collectives(lambda colls: colls.step_ended(self.step_num))
        self._end_profiled_step()
        if self._window is not None and self.step_num >= self._window.last:
            self._stop_profiler()
        self.step_num += 1
        self._begin_step()

    # -- internals -----------------------------------------------------------------------------

    def _segment_bytes(self) -> int:
        """Where steps.jsonl is closed into a segment: $DIAGTRAIN_STEP_SEGMENT_BYTES, the setting where that is bad."""
        try:
            return step_segment_bytes()
        except ValueError as e:
            trouble.warn(self.dir, "segments", f"{e}; steps.jsonl is closed into segments at the default size")
            return step_segment_bytes({})

    def _begin_step(self) -> None:
        self._phases, self._phase_comm = {}, {}
        if self._profiler is None and self._requests is not None:
            self._add_requested_windows()
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
        if self._colls is not None:
            self._colls.step_began(self.step_num, time.time_ns() - int((time.perf_counter() - self._step_start) * 1e9))
        # The implicit recorder starts at step 1's first optimizer step: its counters, like its
        # clock, start when torch was imported.
        self._counted = (COUNTERS.start if self._first_start is not None and self.implicit else None) or COUNTERS.read()
        self._first_start = None

    def _open_device_view(self) -> None:
        """On CUDA: the device clock, and the NCCL collectives' times where torch has an NCCL recorder."""
        if self.device.type != "cuda":
            return
        try:
            capturing = graph_capture(torch.cuda, self.device)
            self._capturing = self._guarded(capturing)
            self._clock = cuda_clock(torch, self.device, capturing=self._capturing)
            dump = nccl_dump(torch)
            self._colls = None if dump is None else CollectiveTimes(dump, recorder_entries(os.environ),
                                                                    capturing=self._capturing)
            if self.implicit:  # the counters see the phases: the first work phase starts the device clock
                COUNTERS.phases.on_enter = self._work_begins
        except Exception as e:  # noqa: BLE001 - the device view is optional; the host's records stay
            self._device_view_failed(e)

    def _guarded(self, capturing: Any) -> Any:
        """``capturing`` that never raises: a check that fails stands the device view down and answers True
        from then on, so that nothing of diagtrain's touches a device whose capture state is not known."""

        def check() -> bool:
            try:
                return bool(capturing())
            except Exception as e:  # noqa: BLE001 - as in _open_device_view
                self._device_view_failed(e)
                self._capturing = lambda: True
                return True

        return check

    def _gpu_memory(self) -> dict[str, Any]:
        """The step record's GPU memory fields: the allocator's statistics read once a step, not while a
        CUDA graph is captured on the device."""
        return {} if self._capturing() else COUNTERS.gpu_memory(self.device)

    def _work_begins(self, phase: str) -> None:
        if self._clock is not None:
            try:
                self._clock.work_begins(phase)
            except Exception as e:  # noqa: BLE001 - as in _open_device_view
                self._device_view_failed(e)

    def _device_steps(self) -> dict[str, Any]:
        """The step's end on the device's clock, and the record's device_steps: the steps completed since the last."""
        if self._clock is None:
            return {}
        try:
            self._clock.step_ended(self.step_num)
            fields = {"device_source": "cuda_events", "device_steps": self._clock.take()}
        except Exception as e:  # noqa: BLE001 - as in _open_device_view
            self._device_view_failed(e)
            return {}
        if self._clock.dropped:
            trouble.warn(self.dir, "device_clock", f"device step times dropped: the device was more than "
                         f"{MAX_PENDING_STEPS} steps behind its host; training goes on")
        return fields

    def _collectives(self, call: Callable[[CollectiveTimes], dict[str, Any] | None]) -> dict[str, Any]:
        """``call(collective times)``: the fields it found for a record; a failure stands them down, said once."""
        if self._colls is None:
            return {}
        try:
            found = dict(call(self._colls) or {})
        except Exception as e:  # noqa: BLE001 - the collectives' times are optional; the steps' stay
            self._colls = None
            trouble.warn(self.dir, "device_colls", f"collectives' device times are not recorded "
                         f"({trouble.reason(e)}); training goes on")
            return {}
        if found.pop("untimed", False):
            trouble.warn(self.dir, "nccl_timing", "NCCL collectives are not timed on the device (a process group "
                         "started with TORCH_NCCL_ENABLE_TIMING off): this rank's waits on the device are unknown")
        if found.get("device_colls_lost"):
            trouble.warn(self.dir, "device_colls_lost", "the flight recorder's ring wrapped between two reads: "
                         "collectives' device times were lost (device_colls_lost); those steps' waits are unknown")
        return found

    def _flush_device_view(self, wait_s: float) -> None:
        """At the end: what is still pending (the steps complete within ``wait_s``), in one line that is not a step."""
        if self._clock is None and self._colls is None:
            return
        colls = self._collectives(lambda times: times.finish(self.step_num))
        try:
            steps = self._clock.flush(wait_s) if self._clock is not None else []
            if self._clock is not None and self._clock.unfinished and wait_s:
                trouble.warn(self.dir, "device_flush", f"the device times of the last {self._clock.unfinished} "
                             f"steps are not recorded: the device had not reached them {wait_s:.0f} s after the end")
            if steps or colls:
                self._steps.append({"schema_version": SCHEMA_VERSION, "rank": self.rank, "kind": "device",
                                    "device_steps": steps, "device_colls": [], **colls})
        except Exception as e:  # noqa: BLE001 - as in _open_device_view; a full disk included
            self._device_view_failed(e)
        self._stand_down_device_view()

    def _device_view_failed(self, error: BaseException) -> None:
        trouble.warn(self.dir, "device_view", f"device times are not recorded ({trouble.reason(error)}); "
                     "training goes on")
        self._stand_down_device_view()

    def _stand_down_device_view(self) -> None:
        self._clock = self._colls = None
        if COUNTERS.phases.on_enter == self._work_begins:
            COUNTERS.phases.on_enter = None

    def _add_requested_windows(self) -> None:
        """Windows the wrapper asked for since the last step; one that has begun already is
        skipped, so that every rank profiles whole windows of the same steps or none."""
        requested = self._requests.poll()
        if requested:
            late = [w for w in requested if w.first < self.step_num <= w.last and w not in self.profile_windows]
            if late:
                print(f"diagtrain: rank {self.rank} saw the profiling request for steps {late[0]} at step "
                      f"{self.step_num}, too late; not profiling it", file=sys.stderr)
            self.profile_windows = sorted(set(self.profile_windows)
                                          | {w for w in requested if w.first >= self.step_num})

    def _end_profiled_step(self) -> None:
        if self._step_annotation is not None:
            self._step_annotation.__exit__(None, None, None)
            self._step_annotation = None

    def _start_profiler(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True,
                                          with_stack=False)
        try:
            profiler.__enter__()
        except Exception as e:  # noqa: BLE001 - another profiler is active, Kineto is unavailable, ...
            window, self._window = self._window, None
            self.profile_windows.remove(window)
            trouble.warn(self.dir, f"window {window}", f"steps {window} are not profiled: the profiler did not start "
                         f"({trouble.reason(e)})")
            return
        self._profiler = profiler

    def _stop_profiler(self, drop_step: int | None = None) -> None:
        profiler, window = self._profiler, self._window
        self._profiler, self._window = None, None
        name = f"trace-rank{self.rank}-steps{window.first}-{window.last}.json.gz"
        # Hidden temp names in the rank's folder; the rename makes the finished file appear whole.
        # Gzipped here, not by torch: torch's own .gz export leaves a temp file in /tmp on failure.
        raw = self.dir / f".tmp-{os.getpid()}-{name.removesuffix('.gz')}"
        packed = self.dir / f".tmp-{os.getpid()}-{name}"
        try:
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(str(raw))
            if not raw.exists():  # Kineto logs a failed write ("Failed to write to log file!") and returns
                raise OSError(errno.ENOSPC, "the profiler could not write it: no space left, or a file-size limit")
            if drop_step is not None:
                _drop_annotation(raw, f"ProfilerStep#{drop_step}")
            with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(packed, self.dir / name)
        except Exception as e:  # noqa: BLE001 - a full disk, a failed export: never the job's problem
            trouble.warn(self.dir, f"window {window}", f"profiled steps {window} dropped: their trace could not be "
                         f"written to {self.dir} ({trouble.reason(e)}); training goes on")
        finally:  # whatever stopped it (a Ctrl-C too), no temp file stays
            for temp in (raw, f"{raw}.tmp", packed):  # raw.tmp: Kineto's own, left when its write fails
                remove_quietly(temp)


def _drop_annotation(path: Path, name: str) -> None:
    """Remove the events called ``name`` from a Chrome trace (JSON), through a temp file and a rename."""
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != name]
    tmp = path.with_name(path.name + ".drop")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(trace, f)
        os.replace(tmp, path)
    finally:
        remove_quietly(tmp)
