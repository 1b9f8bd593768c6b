"""Where each rank's time goes: compute, communication (exposed or overlapped), idle.

GPU traces use Holistic Trace Analysis's definitions, so the numbers can be checked against it:
over the span from the first to the last kernel, idle = no kernel running on any stream, compute =
union of non-communication, non-memory kernels, non-compute = the rest; overlap = share of the
communication kernels' time during which a compute kernel also runs. Like HTA, kernels launched
in the last profiled step are left out (that step is usually cut short by the profiler), where
the trace has two steps or more.

CPU traces (gloo) have no kernels: the same categories come from host ops, with ``gloo:*`` and
``c10d::*`` spans as communication and the other operators as compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.analyzer.read.dialects import COMM, COMPUTE, CPU, STEP_ANNOTATION, name_matches


@dataclass
class Breakdown:
    """Time of one rank (or one step of a rank), in microseconds."""

    total_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    comm_us: float
    exposed_comm_us: float
    overlap_pct: float  # share of communication time overlapped with compute, 0-100

    @property
    def overlapped_comm_us(self) -> float:
        return self.comm_us - self.exposed_comm_us


DENSE_IDS = 4  # correlation ids up to this many times the events are looked up in a table (else isin)


def gpu_kernels(events: pd.DataFrame) -> pd.DataFrame:
    """GPU events whose launch happened before the last ProfilerStep began (HTA's filter)."""
    return events[_kernel_rows(events)]


def _kernel_rows(events: pd.DataFrame) -> np.ndarray:
    """Which of ``events`` :func:`gpu_kernels` keeps."""
    ts = events["ts"].to_numpy()
    device = events["stream"].to_numpy() >= 0
    parts = iv.slices(len(ts))
    starts, steps = _step_starts(events, device)
    # HTA leaves the last step's kernels out only where the trace names two steps or more: a single
    # ProfilerStep#N (newer Kineto writes it on the host and on the device) is kept whole.
    if steps < 2:
        return device
    last_step = starts.max()
    correlation = events["correlation"].to_numpy()
    highest = int(correlation.max())

    def launched(p: slice) -> np.ndarray:  # the ids of the host events before the last step in piece p
        return correlation[p][~device[p] & (correlation[p] >= 0) & (ts[p] < last_step)]
    if highest > DENSE_IDS * len(correlation):
        return device & np.isin(correlation, np.concatenate([launched(p) for p in parts]))
    # Correlation ids count up from 0: a table of them is a byte an id, where isin makes a whole
    # int64 copy of every event's id.
    table = np.zeros(highest + 1, dtype=bool)
    for p in parts:
        table[launched(p)] = True
    for p in parts:
        kept, ids = device[p], correlation[p]  # views: device becomes the kept events
        kept &= ids >= 0
        kept[kept] = table[ids[kept]]
    return device


def _step_starts(events: pd.DataFrame, device: np.ndarray) -> tuple[np.ndarray, int]:
    """The starts of the ProfilerStep#N annotations off the device, and how many distinct steps they
    name. As in HTA, a step's device-side copy counts: the last step begins at the later of the two."""
    ts, names = events["ts"].to_numpy(), events["name"]
    starts, steps = [np.empty(0)], set()
    # A piece of the trace at a time: whole-trace masks and gathers of the ids were 7 bytes an event.
    for p in iv.slices(len(ts)):
        marked = ~device[p] & name_matches(names.iloc[p], STEP_ANNOTATION)
        starts.append(ts[p][marked])
        steps.update(names.iloc[p][marked].astype(str))
    return np.concatenate(starts), len(steps)


def gpu_breakdown(events: pd.DataFrame) -> Breakdown:
    """HTA's temporal breakdown and comm/compute overlap for one rank's GPU events."""
    ts, end = events["ts"].to_numpy(), events["end"].to_numpy()
    is_compute, is_comm = _is_kind(events, COMPUTE), _is_kind(events, COMM)
    tally = _UnionLengths()
    for rows in iv.pieces(ts, _kernel_rows(events)):
        starts, ends = ts[rows], end[rows]
        if starts.dtype.kind == "f":  # HTA rounds fractional timestamps inward (start up, end down) before merging
            np.ceil(starts, out=starts)  # in place: the gathers are copies
            np.floor(ends, out=ends)
        tally.add(starts, ends, is_compute(rows), is_comm(rows))
    tally.close()
    return tally.breakdown(0, tally.extent)


def gpu_breakdown_in(events: pd.DataFrame, window: tuple[float, float]) -> Breakdown:
    """The GPU categories within ``window`` (one step): kernels clipped to it."""
    return breakdowns(events, True, [window])[0]


def cpu_breakdown(events: pd.DataFrame, window: tuple[float, float]) -> Breakdown:
    """The same categories from host ops within ``window`` (start, end µs), for gloo/CPU runs."""
    return breakdowns(events, False, [window])[0]


def breakdowns(events: pd.DataFrame, on_gpu: bool, windows: list[tuple[float, float]]) -> list[Breakdown]:
    """Compute, communication and idle within each of ``windows`` (steps): of a rank's kernels (GPU)
    or host ops (CPU), a piece of the trace at a time."""
    bounds = np.array(windows, dtype=np.float64).reshape(-1, 2)
    ts, end = events["ts"].to_numpy(), events["end"].to_numpy()
    tally = _UnionLengths(bounds[:, 0], bounds[:, 1])
    if on_gpu:
        is_compute, is_comm = _is_kind(events, COMPUTE), _is_kind(events, COMM)
        for rows in iv.pieces(ts, (events["stream"] >= 0).to_numpy()):
            tally.add(ts[rows], end[rows], is_compute(rows), is_comm(rows), busy=None)  # copies and waits are busy too
    else:
        for rows in iv.pieces(ts, (events["stream"] < 0).to_numpy()):
            compute, comm = host_categories(events, rows)
            tally.add(ts[rows], end[rows], compute, comm, busy=compute | comm)
    tally.close()
    return [tally.breakdown(i, (lo, hi)) for i, (lo, hi) in enumerate(bounds)]


def _is_kind(events: pd.DataFrame, kind: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function from rows to whether each of those events is of ``kind``, read from the kind codes."""
    categories = events["kind"].cat.categories
    code = categories.get_loc(kind) if kind in categories else -2  # -1 is a missing kind
    codes = events["kind"].array.codes
    return lambda rows: codes[rows] == code


class _UnionLengths:
    """The length of the union of busy, compute, communication, and compute-or-communication
    intervals, in all or within each window (``lo``, ``hi``), given a piece at a time in order of start.
    The overlap of communication with compute is then compute + communication - either."""

    def __init__(self, lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> None:
        self._unions = [iv.RunningUnion() for _ in range(4)]
        self._windows = None if lo is None else (lo, hi)
        self.lengths = np.zeros((4, 1 if lo is None else len(lo)))
        self.extent = (math.inf, -math.inf)  # of the busy intervals: HTA's window is first to last kernel

    def add(self, starts: np.ndarray, ends: np.ndarray, is_compute: np.ndarray, is_comm: np.ndarray,
            busy: np.ndarray | None = None) -> None:
        """The next piece's intervals, and which of them count as each category (busy: all by default)."""
        for i, rows in enumerate((busy, is_compute, is_comm, is_compute | is_comm)):
            merged, _ = self._unions[i].add(starts, ends) if rows is None else self._unions[i].add(starts[rows], ends[rows])
            self._count(i, merged)

    def close(self) -> None:
        """Count the intervals still open after the last piece."""
        for i, union in enumerate(self._unions):
            self._count(i, union.close()[0])

    def _count(self, i: int, merged: iv.Intervals) -> None:
        if not len(merged[0]):
            return
        if i == 0:
            self.extent = (min(self.extent[0], merged[0][0]), max(self.extent[1], merged[1][-1]))
        self.lengths[i] += iv.length(merged) if self._windows is None else iv.covered(merged, *self._windows)

    def breakdown(self, i: int, window: tuple[float, float]) -> Breakdown:
        """The categories of window ``i`` (the only one when in all), over ``window`` (start, end)."""
        if window[0] > window[1]:
            window = (0.0, 0.0)  # nothing busy at all
        busy_us, compute_us, comm_us, either_us = map(float, self.lengths[:, i])
        total = max(window[1] - window[0], 0.0)
        idle = max(total - busy_us, 0.0)
        overlapped = max(compute_us + comm_us - either_us, 0.0)
        return Breakdown(
            total_us=total, idle_us=idle, compute_us=compute_us,
            non_compute_us=max(total - compute_us - idle, 0.0),
            comm_us=comm_us, exposed_comm_us=comm_us - overlapped,
            overlap_pct=100 * overlapped / comm_us if comm_us else math.nan,
        )


def host_categories(events: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the host ops at ``rows`` that are compute and communication on a CPU (gloo) rank."""
    kind, cat = events["kind"].iloc[rows], events["cat"].iloc[rows]
    # Collectives appear as cpu_op or user_annotation depending on the version; compute is ops.
    is_comm = (kind == COMM).to_numpy()
    is_compute = ((kind == CPU) & (cat == "cpu_op")).to_numpy()
    return is_compute, is_comm
