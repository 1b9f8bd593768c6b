"""Device time of each NCCL collective, from ProcessGroupNCCL's flight recorder.

With ``TORCH_NCCL_ENABLE_TIMING=1`` (`diagtrain run` sets it unless the user did) the recorder
times every collective with a pair of CUDA events and keeps ``duration_ms`` in its entries. DDP's
reducer and FSDP issue their collectives from C++, out of Python's sight, so the recorder is the one
place that sees them all. Only entries not yet written are kept. A process group that started with
timing off leaves its completed entries without ``duration_ms``: the rank says so once, and its waits
on the device are unknown (no ``device_colls``), never zero.

When the recorder is read. A read is not cheap: torch serializes its whole ring (up to 20,000
entries) in C++ holding the GIL, and Python decodes it; about 0.4 s on a CPU host
(benchmarks/results/recorder_read.md). At the next collective every peer waits for the rank that
read. Ranks that each read on their own clock would stall the job once per rank: N ranks, N stalls.
So every rank reads at the same steps, and they agree without asking each other (no collective, no
file, no store):

- A rank reads at the end of the steps that are multiples of its interval, a power of two.
- After each read it picks the next interval from the window since the read before (new record ids
  per step, host time per step, what the read cost): the largest power of two at which the ring would
  not wrap (those ids against :data:`RING_MARGIN` of the ring), but no shorter than keeps reads within
  :data:`READ_BUDGET` of the run's time and :data:`MIN_READ_INTERVAL_S` apart, and never so short that
  they cost more than :data:`READ_CEILING`.
- Ranks measure alike (the same steps, step times equal in lockstep, the same collectives in a group),
  so they pick the same interval. Where two differ (a rank on a busier host, a pipeline stage of more
  collectives), the steps of the longer interval are among those of the shorter (multiples of a power
  of two): the ranks that read at a step stall together, and the job pays one stall per read step, not
  one per rank.
- The first reads, while nothing is measured yet, are at every :data:`FIRST_INTERVAL` steps on every
  rank: the ring is nearly empty then, and cheap to read.

Where reading often enough to keep the ring from wrapping would cost more than :data:`READ_CEILING` (a
job of thousands of collectives a second), entries are lost between reads: a gap in their record ids
(or an entry seen in flight and overwritten before it completed) is counted and reported in the next
step record as ``device_colls_lost`` (docs/run-directory.md); the analysis holds those steps' waits as
unknown.

The training thread is held for as short a time as the recorder allows: torch's pickled dump without
stack traces (half the C++ time of its JSON dump, and decoded in C), and only the entries after the
last read's are looked at. Decoding on a helper thread would not shorten it: the two threads share the
GIL, and a training thread that releases it at every CUDA call waits up to the switch interval to get
it back each time (benchmarks/results/recorder_read.md: a GPU-like loop lost 0.17 s of a helper's
0.18 s of decoding).
"""

from __future__ import annotations

import bisect
import json
import math
import pickle
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

# Reading the recorder costs at most this share of the run's wall time by choice (half the 1% overhead
# ceiling of the GPU instrumentation as a whole) ...
READ_BUDGET = 0.005
# ... and never more often than this, however cheap a read was: live figures need no more ...
MIN_READ_INTERVAL_S = 5.0
# ... unless the ring would wrap between reads: then up to this share, past which entries are lost and counted.
READ_CEILING = 0.01
# A read is due before this share of the ring has been written since the last one: room for the rate of
# collectives to rise by a third between two reads.
RING_MARGIN = 0.75
# Steps between reads until two reads have measured the window (every rank alike).
FIRST_INTERVAL = 2
MAX_INTERVAL = 1 << 20  # steps: a run of very short steps and a cheap recorder still reads now and then
# The (group, seq) of collectives already written, kept to skip them in later reads: more than the
# recorder's ring holds (20,000 as `diagtrain run` sets it), so none is written twice.
MAX_SEEN = 50_000


def collective_entries(entries: Iterable[dict[str, Any]], seen: "OrderedDict[tuple[str, int], None]",
                       step_of: Callable[[int], int | None]) -> list[dict[str, Any]]:
    """``device_colls`` entries for the completed, timed collectives in ``entries`` not in ``seen``
    (which they join, oldest forgotten past MAX_SEEN); ``step_of(time_created_ns)`` is the step
    during which the host issued one (None: before the first step, skipped)."""
    out = []
    for e in entries:
        duration, group = e.get("duration_ms"), e.get("process_group")
        if e.get("state") != "completed" or duration is None or e.get("is_p2p") or not group:
            continue  # p2p entries carry no collective sequence number to match ranks by
        key = (str(group[0]), int(e["collective_seq_id"]))
        step = step_of(int(e.get("time_created_ns") or 0))
        if key in seen or step is None:
            continue
        seen[key] = None
        if len(seen) > MAX_SEEN:
            seen.popitem(last=False)
        out.append({"step": step, "group": key[0], "seq": key[1], "op": str(e.get("profiling_name", "")),
                    "ms": round(float(duration), 3)})
    return out


def untimed(entries: Iterable[dict[str, Any]]) -> bool:
    """Whether the recorder retired a completed NCCL collective without its device time: its process group
    started with TORCH_NCCL_ENABLE_TIMING off (an entry completed but not yet retired may still get one)."""
    return any(e.get("state") == "completed" and e.get("retired") and e.get("duration_ms") is None
               and not e.get("is_p2p") and str(e.get("profiling_name", "")).startswith("nccl:") for e in entries)


# -- the shared schedule ---------------------------------------------------------------------------------------


def next_interval(cost_s: float, step_s: float, ids_per_step: float, ring: int) -> int:
    """The steps between two reads, a power of two: no more than keeps ``ring`` from wrapping at ``ids_per_step``,
    no fewer than keeps a read of ``cost_s`` within READ_BUDGET of steps of ``step_s`` and MIN_READ_INTERVAL_S
    apart, and never fewer than keeps it within READ_CEILING."""
    step_s = max(step_s, 1e-9)
    by_budget = _power_at_least(max(cost_s / (READ_BUDGET * step_s), MIN_READ_INTERVAL_S / step_s))
    by_ceiling = _power_at_least(cost_s / (READ_CEILING * step_s))
    by_ring = _power_at_most(ring * RING_MARGIN / ids_per_step) if ids_per_step > 0 else MAX_INTERVAL
    return max(by_ceiling, min(by_budget, by_ring))


def _power_at_least(x: float) -> int:
    return MAX_INTERVAL if x >= MAX_INTERVAL else 1 << max(0, math.ceil(math.log2(max(x, 1.0))))


def _power_at_most(x: float) -> int:
    return MAX_INTERVAL if x >= MAX_INTERVAL else 1 << max(0, math.floor(math.log2(max(x, 1.0))))


class ReadSchedule:
    """The steps at which a rank reads the recorder: the multiples of ``interval`` (see the module's docstring)."""

    def __init__(self, ring: int) -> None:
        """``ring``: the recorder's size in entries (TORCH_FR_BUFFER_SIZE)."""
        self.ring = ring
        self.interval = FIRST_INTERVAL
        self._last: tuple[int, float, int] | None = None  # (step, host time, newest record id) at the last read

    def due(self, step: int) -> bool:
        """Whether the recorder is read at the end of ``step``."""
        return step % self.interval == 0

    def measured(self, step: int, at: float, newest_id: int | None, cost_s: float) -> None:
        """A read at the end of ``step`` (host time ``at``, seconds) found record ids up to ``newest_id`` and cost
        ``cost_s``: the window since the read before sets the next interval."""
        last = self._last
        if newest_id is None:
            return
        self._last = (step, at, newest_id)
        if last is None or step <= last[0]:
            return
        steps = step - last[0]
        self.interval = next_interval(cost_s, (at - last[1]) / steps, max(newest_id - last[2], 0) / steps, self.ring)


# -- entries lost between reads ---------------------------------------------------------------------------------


class LostEntries:
    """Entries the ring overwrote before a read saw them complete: a gap in the record ids since the last read,
    or an entry seen in flight that is gone."""

    def __init__(self) -> None:
        self._newest: tuple[int, int] | None = None  # (record id, created ns) of the newest entry read
        self._in_flight: dict[int, int] = {}  # record id -> created ns, of entries read before they completed

    def first_unread(self) -> int:
        """The lowest record id a read has more to learn from: an entry still in flight, else the first not read."""
        return min([*self._in_flight, self._newest[0] + 1 if self._newest is not None else 0])

    def read(self, entries: list[dict[str, Any]], step_of: Callable[[int], int | None]) -> dict[str, int] | None:
        """``entries`` (one dump, oldest first) against the reads before: ``{"first_step", "last_step",
        "entries"}`` of what was lost in between (steps during which the host issued it), or None."""
        ids = [(int(e["record_id"]), int(e.get("time_created_ns") or 0)) for e in entries if "record_id" in e]
        if not ids:
            return None
        (first, first_ns), newest = ids[0], self._newest
        if newest is not None and ids[-1][0] < newest[0]:
            newest, self._in_flight = None, {}  # the recorder was reset: its ids start again
        gone = {i: ns for i, ns in self._in_flight.items() if i < first}
        never_read = max(first - newest[0] - 1, 0) if newest is not None else 0
        self._newest = ids[-1]
        self._in_flight = {int(e["record_id"]): int(e.get("time_created_ns") or 0) for e in entries
                           if "record_id" in e and not _final(e)}
        if not gone and not never_read:
            return None
        since = min([*gone.values(), *([newest[1]] if never_read else [])])
        first_step, last_step = step_of(since), step_of(first_ns)
        if last_step is None:
            return None  # lost before the first step: nothing of a step's
        return {"first_step": first_step if first_step is not None else last_step, "last_step": last_step,
                "entries": never_read + len(gone)}


def _final(entry: dict[str, Any]) -> bool:
    """An entry a later read has nothing more to learn from: completed and timed or retired, or point-to-point."""
    return bool(entry.get("is_p2p")) or (entry.get("state") == "completed"
                                         and (entry.get("duration_ms") is not None or entry.get("retired") is not False))


# -- the reads ---------------------------------------------------------------------------------------------------


def _never() -> bool:
    return False


class CollectiveTimes:
    """Reads the NCCL flight recorder at the steps every rank shares, turning its new timed entries into
    ``device_colls`` and the entries it lost into ``device_colls_lost``."""

    def __init__(self, dump: Callable[[], dict[str, Any]], ring: int, capturing: Callable[[], bool] = _never,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """``dump()``: the recorder's dump, decoded; ``ring``: its size; ``capturing()``: a CUDA graph is being
        captured (the dump queries CUDA events, which would break it)."""
        self._dump, self._capturing, self._clock = dump, capturing, clock
        self.schedule = ReadSchedule(ring)
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._lost = LostEntries()
        self._steps: list[int] = []
        self._starts: list[int] = []  # each step's host start in Unix ns, ascending
        self._found: dict[str, Any] = {}  # what the reads since the last take() found

    def step_began(self, step: int, start_ns: int) -> None:
        """The host began ``step`` at ``start_ns``; steps older than the recorder can hold are forgotten."""
        self._steps.append(step)
        self._starts.append(start_ns)
        if len(self._steps) > MAX_SEEN:
            del self._steps[: MAX_SEEN // 2], self._starts[: MAX_SEEN // 2]

    def step_ended(self, step: int) -> None:
        """At the end of ``step``: a read when the shared schedule says so, never while a graph is captured."""
        if self.schedule.due(step) and not self._capturing():
            self._read(step)

    def take(self) -> dict[str, Any]:
        """What the reads since the last call found, for the next step record: ``device_colls`` and
        ``device_colls_lost`` (each where there is some), and ``untimed``."""
        found, self._found = self._found, {}
        return {"untimed": False, **found}

    def finish(self, step: int) -> dict[str, Any]:
        """At the end of the run: a last read (unless a graph is being captured), and what is not taken yet."""
        if not self._capturing():
            self._read(step)
        return self.take()

    def _read(self, step: int) -> None:
        at = self._clock()
        entries = self._dump().get("entries") or []
        new = self._unread(entries)
        colls = collective_entries(new, self._seen, self._step_of)
        lost = self._lost.read(new, self._step_of)
        newest = _record_id(entries[-1]) if entries else None
        self.schedule.measured(step, at, newest if newest is not None and newest >= 0 else None, self._clock() - at)
        found = self._found
        found["untimed"] = found.get("untimed", False) or untimed(new)
        if colls:
            found.setdefault("device_colls", []).extend(colls)
        if lost:
            found.setdefault("device_colls_lost", []).append(lost)

    def _unread(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries a read has something to learn from: those from the first one not final at the last read on
        (all of them where the recorder gives no record ids, or was reset since)."""
        if not entries or "record_id" not in entries[-1]:
            return entries
        start = self._lost.first_unread()
        if _record_id(entries[-1]) < start - 1:
            return entries  # reset since: its ids start again
        return entries[bisect.bisect_left(entries, start, key=_record_id):]

    def _step_of(self, created_ns: int) -> int | None:
        i = bisect.bisect_right(self._starts, created_ns)
        return self._steps[i - 1] if i else None


def _record_id(entry: dict[str, Any]) -> int:
    return int(entry.get("record_id", -1))


def nccl_dump(torch: Any) -> Callable[[], dict[str, Any]] | None:
    """ProcessGroupNCCL's own recorder, decoded (completed collectives included; no stack traces, whose symbols
    cost most of a dump), None on a build without NCCL. Its pickled dump where torch has one: half the C++ time of
    the JSON one, and decoded in C."""
    c10d = torch._C._distributed_c10d
    pickled, as_json = getattr(c10d, "_dump_nccl_trace", None), getattr(c10d, "_dump_nccl_trace_json", None)
    if pickled is not None:
        # torch's own bytes, made in this process a moment ago: nothing from outside is unpickled.
        return lambda: pickle.loads(pickled(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    if as_json is not None:
        return lambda: json.loads(as_json(True, False))  # includeCollectives, onlyActive
    return None
