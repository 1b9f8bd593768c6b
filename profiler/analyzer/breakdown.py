"""Where each rank's time goes: compute, communication (exposed or overlapped), idle.

GPU traces use Holistic Trace Analysis's definitions, so the numbers can be checked against it:
over the span from the first to the last kernel, idle = no kernel running on any stream, compute =
union of non-communication, non-memory kernels, non-compute = the rest; overlap = share of the
communication kernels' time during which a compute kernel also runs. Like HTA, kernels launched
in the last profiled step are left out (that step is usually cut short by the profiler).

CPU traces (gloo) have no kernels: the same categories come from host ops, with ``gloo:*`` and
``c10d::*`` spans as communication and the other operators as compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer import intervals as iv
from diagtrain.profiler.analyzer.dialects import COMM, COMPUTE, CPU, STEP_ANNOTATION, name_matches


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
    stream, ts = events["stream"].to_numpy(), events["ts"].to_numpy()
    device, host = stream >= 0, stream < 0
    steps = host & name_matches(events["name"], STEP_ANNOTATION)
    if steps.sum() < 2:
        return device
    correlation = events["correlation"].to_numpy()
    launched = correlation[host & (correlation >= 0) & (ts < ts[steps].max())]
    highest = int(correlation.max())
    if not len(launched) or highest > DENSE_IDS * len(correlation):
        return device & np.isin(correlation, launched)
    # Correlation ids count up from 0: a table of them is a byte an id, where isin makes a whole
    # int64 copy of every event's id.
    table = np.zeros(highest + 1, dtype=bool)
    table[launched] = True
    kept = device & (correlation >= 0)
    kept[kept] = table[correlation[kept]]
    return kept


def gpu_breakdown(events: pd.DataFrame) -> Breakdown:
    """HTA's temporal breakdown and comm/compute overlap for one rank's GPU events."""
    rows = _kernel_rows(events)
    # Three columns of the kernels, not a table of them: a third of a GPU trace's events.
    ts, end = events["ts"].to_numpy()[rows], events["end"].to_numpy()[rows]
    kind = events["kind"].cat.codes.to_numpy()[rows]
    kinds = list(events["kind"].cat.categories)
    # HTA rounds fractional timestamps inward (start up, end down) before merging.
    starts = np.ceil(ts, out=ts) if ts.dtype.kind == "f" else ts  # in place: the gathers are copies
    ends = np.floor(end, out=end) if end.dtype.kind == "f" else end
    del ts, end
    is_compute, is_comm = kind == kinds.index(COMPUTE), kind == kinds.index(COMM)
    busy = iv.merge(starts, ends)
    compute = iv.merge(starts[is_compute], ends[is_compute])
    comm = iv.merge(starts[is_comm], ends[is_comm])
    return _breakdown(busy, compute, comm, window=(busy[0][0], busy[1][-1]) if len(busy[0]) else (0.0, 0.0))


def gpu_breakdown_in(events: pd.DataFrame, window: tuple[float, float]) -> Breakdown:
    """The GPU categories within ``window`` (one step): kernels clipped to it."""
    return Windows(events, on_gpu=True).breakdown(window)


def cpu_breakdown(events: pd.DataFrame, window: tuple[float, float]) -> Breakdown:
    """The same categories from host ops within ``window`` (start, end µs), for gloo/CPU runs."""
    return Windows(events, on_gpu=False).breakdown(window)


class Windows:
    """A rank's kernels (GPU) or host ops (CPU), taken once, broken down for any window (a step)."""

    def __init__(self, events: pd.DataFrame, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        if on_gpu:
            rows = (events["stream"] >= 0).to_numpy()
            kind = events["kind"][rows]
            self.is_compute, self.is_comm = (kind == COMPUTE).to_numpy(), (kind == COMM).to_numpy()
        else:
            rows = (events["stream"] < 0).to_numpy()
            self.is_compute, self.is_comm = host_categories(events.loc[rows, ["kind", "cat"]])
        self.starts, self.ends = events["ts"].to_numpy()[rows], events["end"].to_numpy()[rows]

    def breakdown(self, window: tuple[float, float], overlapping_only: bool = False) -> Breakdown:
        """Compute, communication and idle within ``window``, of all events or of those overlapping it."""
        starts, ends, is_compute, is_comm = self.starts, self.ends, self.is_compute, self.is_comm
        if overlapping_only:
            inside = (starts < window[1]) & (ends > window[0])
            starts, ends, is_compute, is_comm = starts[inside], ends[inside], is_compute[inside], is_comm[inside]
        compute = iv.clip(iv.merge(starts[is_compute], ends[is_compute]), *window)
        comm = iv.clip(iv.merge(starts[is_comm], ends[is_comm]), *window)
        if self.on_gpu:  # every device event is busy time: copies and waits too
            busy = iv.clip(iv.merge(starts, ends), *window)
        else:
            busy = iv.merge(np.concatenate([compute[0], comm[0]]), np.concatenate([compute[1], comm[1]]))
        return _breakdown(busy, compute, comm, window)


def host_categories(host: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the host ops that are compute and communication on a CPU (gloo) rank."""
    # Collectives appear as cpu_op or user_annotation depending on the version; compute is ops.
    is_comm = (host["kind"] == COMM).to_numpy()
    is_compute = ((host["kind"] == CPU) & (host["cat"] == "cpu_op")).to_numpy()
    return is_compute, is_comm


def _breakdown(busy: iv.Intervals, compute: iv.Intervals, comm: iv.Intervals, window: tuple[float, float]) -> Breakdown:
    total = max(window[1] - window[0], 0.0)
    busy_us, compute_us, comm_us = iv.length(busy), iv.length(compute), iv.length(comm)
    overlapped = iv.intersection_length(comm, compute)
    idle = max(total - busy_us, 0.0)
    return Breakdown(
        total_us=total, idle_us=idle, compute_us=compute_us,
        non_compute_us=max(total - compute_us - idle, 0.0),
        comm_us=comm_us, exposed_comm_us=comm_us - overlapped,
        overlap_pct=100 * overlapped / comm_us if comm_us else math.nan,
    )
