"""The device's own clock of each step: CUDA events at step boundaries, read back once complete.

On NCCL the host runs ahead of its GPU (a collective returns once queued), so host step times say
little about what the device did or waited for. An event recorded on the current stream completes
when the device reaches it; ``elapsed_time`` between two completed events is device time. Events are
polled with ``query()`` a step or two later and never waited for, so the host keeps its lead.

A step's start event is recorded when the host begins the step's first work (its first phase other
than ``data``), else it is the previous step's end event: the time between the previous end and this
start is the device idle waiting for its host (data, a checkpoint, Python). A step record carries
the steps completed since the last one as ``device_steps`` (see docs/run-directory.md).

While the program captures a CUDA graph on the rank's device (PyTorch's whole-network capture runs
``optimizer.step()`` inside the capture, so the step hooks fire then), nothing here touches CUDA: an
event recorded, or one queried, during a capture invalidates it and the job fails. The steps of that
time are left untimed, and the pending ones are taken once the capture has ended.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

# A device this many steps behind its host is not waited for: the oldest step's events are dropped
# (and counted), so that memory stays bounded; no real job queues more than a few steps ahead.
MAX_PENDING_STEPS = 64
# Phases in which the host prepares work rather than issuing it to the device.
HOST_PHASES = frozenset({"data"})
# At the end of the run the pending steps are polled this often, for a bounded time: never a
# synchronize, which would hang the process's exit behind a collective whose peer is gone.
FLUSH_POLL_S = 0.001


class Event(Protocol):
    """What the clock needs of a recorded CUDA event (``torch.cuda.Event``), or of a recorded value."""

    def query(self) -> bool: ...

    def elapsed_time(self, end: Any) -> float: ...


@dataclass
class _Step:
    step: int
    before: Event  # the previous step's end: where the device's idle before this step begins
    start: Event
    end: Event


def _never() -> bool:
    return False


class DeviceClock:
    """Device step times and idle from events made by ``record_event()``; never blocks, waits a bounded time
    in :meth:`flush`, and while ``capturing()`` (a CUDA graph is being captured) records and queries nothing."""

    def __init__(self, record_event: Callable[[], Event], max_pending: int = MAX_PENDING_STEPS,
                 sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.monotonic,
                 capturing: Callable[[], bool] = _never) -> None:
        self._record_event, self._sleep, self._now, self._capturing = record_event, sleep, now, capturing
        self._pending: deque[_Step] = deque()
        self._max_pending = max_pending
        self._last_end: Event | None = self._record()  # the run's start, before step 1
        self._work: Event | None = None  # where the open step's first work began
        self.dropped = 0  # steps whose events were given up because the device was too far behind
        self.unfinished = 0  # steps the device had not completed when the run's end stopped waiting

    def work_begins(self, phase: str) -> None:
        """The host enters ``phase``: the open step's first work phase starts its device clock."""
        if self._work is None and phase not in HOST_PHASES:
            self._work = self._record()

    def step_ended(self, step: int) -> None:
        """The host ended ``step``: record its end on the stream and keep it pending."""
        end = self._record()
        if end is not None and self._last_end is not None:  # else a step with no event at one end: untimed
            self._pending.append(_Step(step, self._last_end, self._work or self._last_end, end))
        self._last_end, self._work = end, None
        if len(self._pending) > self._max_pending:
            self._pending.popleft()
            self.dropped += 1

    def _record(self) -> Event | None:
        """An event on the stream now; None while a graph is captured (that step is left untimed)."""
        return None if self._capturing() else self._record_event()

    def take(self) -> list[dict[str, Any]]:
        """The steps whose events have completed, oldest first, as ``device_steps`` entries; none while a
        graph is captured (they stay pending until it ends)."""
        done: list[dict[str, Any]] = []
        if self._capturing():
            return done
        while self._pending and all(e.query() for e in (self._pending[0].start, self._pending[0].end)):
            s = self._pending.popleft()
            done.append({"step": s.step, "step_ms": round(s.start.elapsed_time(s.end), 3),
                         "idle_before_ms": round(max(s.before.elapsed_time(s.start), 0.0), 3)})
        return done

    def flush(self, wait_s: float) -> list[dict[str, Any]]:
        """At the end of the run: the pending steps that complete within ``wait_s``, polled, never
        synchronized; those still pending then are given up (``unfinished``)."""
        done, deadline = self.take(), self._now() + wait_s
        while self._pending and self._now() < deadline and not self._capturing():
            self._sleep(FLUSH_POLL_S)
            done += self.take()
        self.unfinished = len(self._pending)
        self._pending.clear()
        return done


def cuda_clock(torch: Any, device: Any, capturing: Callable[[], bool]) -> DeviceClock:
    """A clock on ``device``'s current stream (the stream the training loop issues its work on), idle while
    ``capturing()``."""

    def record() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event

    return DeviceClock(record, capturing=capturing)


def graph_capture(cuda: Any, device: Any) -> Callable[[], bool]:
    """Whether a CUDA graph is being captured now on ``device``'s current stream, or on the current device's
    (a capture makes its stream and device current in the capturing thread: the training loop's, where the
    step hooks run). The device is switched to ask only where it is not the current one."""

    def capturing() -> bool:
        if cuda.is_current_stream_capturing():
            return True
        index = getattr(device, "index", None)
        if index is None or index == cuda.current_device():
            return False
        with cuda.device(index):
            return bool(cuda.is_current_stream_capturing())

    return capturing
