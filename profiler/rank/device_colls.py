"""Device time of each NCCL collective, from ProcessGroupNCCL's flight recorder.

With ``TORCH_NCCL_ENABLE_TIMING=1`` (`diagtrain run` sets it unless the user did) the recorder
times every collective with a pair of CUDA events and keeps ``duration_ms`` in its entries. DDP's
reducer and FSDP issue their collectives from C++, out of Python's sight, so the recorder is the one
place that sees them all. Reading it is not cheap: torch serializes its whole ring buffer (up to
``TORCH_FR_BUFFER_SIZE`` entries, 0.25-0.5 s for 20,000 measured on a CPU host), so it is read at
step boundaries no more often than keeps that cost within :data:`READ_BUDGET` of the run's time, and
only entries not yet written are kept. A collective the ring overwrote between two reads is lost;
the flight_recorder.json dump at the end still holds the last ones.
"""

from __future__ import annotations

import bisect
import json
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

# Reading the recorder costs at most this share of the run's wall time (half the 1% overhead
# ceiling of the GPU instrumentation as a whole) ...
READ_BUDGET = 0.005
# ... and never more often than this, however cheap a read was: live figures need no more.
MIN_READ_INTERVAL_S = 5.0
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


class CollectiveTimes:
    """Reads the NCCL flight recorder now and then, turning its new timed entries into ``device_colls``."""

    def __init__(self, dump: Callable[[], bytes | str], clock: Callable[[], float] | None = None,
                 capturing: Callable[[], bool] = lambda: False) -> None:
        """``capturing()``: a CUDA graph is being captured; the dump queries CUDA events, which would break it."""
        self._dump, self._clock, self._capturing = dump, clock or time.perf_counter, capturing
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._next_read = self._clock() + MIN_READ_INTERVAL_S
        self._steps: list[int] = []
        self._starts: list[int] = []  # each step's host start in Unix ns, ascending

    def step_began(self, step: int, start_ns: int) -> None:
        """The host began ``step`` at ``start_ns``; steps older than the recorder can hold are forgotten."""
        self._steps.append(step)
        self._starts.append(start_ns)
        if len(self._steps) > MAX_SEEN:
            del self._steps[: MAX_SEEN // 2], self._starts[: MAX_SEEN // 2]

    def take(self, force: bool = False) -> list[dict[str, Any]]:
        """New collectives' device times, when a read is due (or ``force``: at the end of the run); none while
        a graph is captured (a read due then is made at the first step after)."""
        now = self._clock()
        if (not force and now < self._next_read) or self._capturing():
            return []
        raw = self._dump()
        entries = json.loads(raw if isinstance(raw, str) else raw.decode()).get("entries") or []
        colls = collective_entries(entries, self._seen, self._step_of)
        spent = self._clock() - now
        self._next_read = self._clock() + max(MIN_READ_INTERVAL_S, spent / READ_BUDGET)
        return colls

    def _step_of(self, created_ns: int) -> int | None:
        i = bisect.bisect_right(self._starts, created_ns)
        return self._steps[i - 1] if i else None


def nccl_dump(torch: Any) -> Callable[[], bytes] | None:
    """ProcessGroupNCCL's own recorder as JSON (completed collectives included), None on a build without NCCL."""
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return None
    return lambda: dump(True, False)  # includeCollectives, onlyActive
