"""One rank's timeline: compute, communication, memory and idle spans, as the dashboard draws them.

A span is the union of the events of one kind (nested host ops and overlapping kernels become one
span), so a lane never draws an op over another; it is named after the outermost event that
opens it. Idle spans are the gaps with nothing running: between the first and the last kernel of
a trace on GPU (HTA's idle), inside each profiled step on CPU. The kinds follow the time
breakdown: kernels on GPU traces, host ops on CPU traces. Call it once per trace file: the time
between two profiled windows is not idle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.analyzer.per_rank.breakdown import host_categories
from diagtrain.profiler.analyzer.read.dialects import COMM, COMPUTE, MEMORY, kind_in, step_marks

IDLE = "idle"
SPAN_KINDS = (COMPUTE, COMM, MEMORY, IDLE)


def spans(events: pd.DataFrame, on_gpu: bool, offset_us: int = 0) -> pd.DataFrame:
    """The spans of one trace's events as one table (see :func:`span_pieces`)."""
    return pd.concat(list(span_pieces(events, on_gpu, offset_us)), ignore_index=True)


def span_pieces(events: pd.DataFrame, on_gpu: bool, offset_us: int = 0) -> Iterator[pd.DataFrame]:
    """The spans of one trace's events, a piece of the trace at a time (to be written as they come):
    start_us, end_us (``offset_us`` later than the events: the trace's epoch offset), kind, name;
    within a kind, every piece's spans start after the pieces' before it."""
    ts, end, dur = events["ts"].to_numpy(), events["end"].to_numpy(), events["dur"].to_numpy()
    names = events["name"].cat
    categories = names.categories if IDLE in names.categories else names.categories.append(pd.Index([IDLE]))
    frame = _Framer(pd.CategoricalDtype(categories), offset_us)  # one dictionary for every kind, checked once
    codes = events["name"].array.codes
    idle_code = np.array([categories.get_loc(IDLE)], dtype=codes.dtype)
    unions = [iv.RunningUnion() for _ in (COMPUTE, COMM, MEMORY)]
    busy, gaps = iv.RunningUnion(), _Gaps(events, on_gpu)
    selected, kinds_of = _active(events, on_gpu)

    def merged(rows: np.ndarray) -> pd.DataFrame:  # a function: a piece's arrays are gone once its spans are made
        rows, kinds = kinds_of(rows)
        # Outermost first among events that start together, so a span takes the enclosing op's name.
        order = iv.outermost_order(rows, ts, dur)
        if order is not None:
            rows, kinds = rows[order], kinds[order]
        starts, ends, opened_by = ts[rows], end[rows], codes[rows]
        of_kind = [u.add(starts[mask], ends[mask], opened_by[mask])
                   for u, mask in ((u, kinds == k) for k, u in enumerate(unions))]
        return frame(of_kind, gaps.add(busy.add(starts, ends)[0]), idle_code)

    for rows in iv.pieces(ts, selected):
        yield merged(rows)
    yield frame([u.close() for u in unions], gaps.close(busy.close()[0]), idle_code)


class _Framer:
    """Spans of every kind, as merged by the running unions, into one table of a piece."""

    def __init__(self, names: pd.CategoricalDtype, offset_us: int) -> None:
        self.names, self.offset_us = names, offset_us

    def __call__(self, merged: list[tuple[iv.Intervals, np.ndarray]], idle: iv.Intervals,
                 idle_code: np.ndarray) -> pd.DataFrame:
        parts = [*merged, (idle, np.repeat(idle_code, len(idle[0])))]
        starts = np.concatenate([p[0][0] for p in parts]) + self.offset_us
        ends = np.concatenate([p[0][1] for p in parts]) + self.offset_us
        kinds = np.repeat(np.arange(len(parts), dtype=np.int8), [len(p[1]) for p in parts])
        codes = np.concatenate([p[1] for p in parts])
        return pd.DataFrame({"start_us": starts, "end_us": ends,
                             "kind": pd.Categorical.from_codes(kinds, dtype=_SPAN_KINDS),
                             "name": pd.Categorical.from_codes(codes, dtype=self.names)}, copy=False)


_SPAN_KINDS = pd.CategoricalDtype(SPAN_KINDS)


def _active(events: pd.DataFrame, on_gpu: bool) -> tuple[np.ndarray, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]]:
    """Which events may count as work (a mask), and a function from some of their rows to those that do
    (kernels on GPU, compute and communication host ops on CPU) and the kind each is drawn as (its
    index in ``SPAN_KINDS``)."""
    stream = events["stream"].to_numpy()
    if on_gpu:
        to_span = np.array([SPAN_KINDS.index(k) if k in SPAN_KINDS else -1 for k in events["kind"].cat.categories],
                           dtype=np.int8)
        kind_codes = events["kind"].array.codes
        return (stream >= 0) & kind_in(events, COMPUTE, COMM, MEMORY), lambda rows: (rows, to_span[kind_codes[rows]])

    def host_work(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        is_compute, is_comm = host_categories(events, rows)
        work = is_compute | is_comm
        # On CPU every op is "cpu" in the trace's kinds; name the two the breakdown counts.
        return rows[work], np.where(is_comm[work], SPAN_KINDS.index(COMM), SPAN_KINDS.index(COMPUTE)).astype(np.int8)
    return stream < 0, host_work


class _Gaps:
    """Idle spans from the busy intervals as they become final: on GPU the gaps between them (from the
    first to the last kernel: HTA's idle), on CPU the gaps inside each step, once all are known."""

    def __init__(self, events: pd.DataFrame, on_gpu: bool) -> None:
        self.events, self.on_gpu = events, on_gpu
        self.last_end: float | None = None
        self.held: list[iv.Intervals] = []  # CPU: every busy interval, for the steps' gaps at the end

    def add(self, busy: iv.Intervals) -> iv.Intervals:
        """The idle spans final after these busy intervals (the next in time order)."""
        if not self.on_gpu:
            self.held.append(busy)
            return np.empty(0), np.empty(0)
        s, e = busy
        if not len(s):
            return s, e
        gap_starts = np.concatenate([[self.last_end if self.last_end is not None else s[0]], e[:-1]])
        self.last_end = e[-1]
        keep = s > gap_starts
        return gap_starts[keep], s[keep]

    def close(self, busy: iv.Intervals) -> iv.Intervals:
        """The idle spans left once the last busy intervals are known."""
        gaps = self.add(busy)
        if self.on_gpu:
            return gaps
        whole = (np.concatenate([b[0] for b in self.held]), np.concatenate([b[1] for b in self.held]))
        self.held = []
        return _step_gaps(self.events, whole)


def _step_gaps(events: pd.DataFrame, busy: iv.Intervals) -> iv.Intervals:
    """Gaps in ``busy`` (all of a CPU trace's busy time) inside each step, or the whole trace without steps."""
    if not len(busy[0]):
        return np.empty(0), np.empty(0)
    marks = events[step_marks(events)]
    windows = list(zip(marks["ts"], marks["end"])) or [(events["ts"].min(), events["end"].max())]
    starts, ends = [np.empty(0)], [np.empty(0)]
    for lo, hi in windows:
        s, e = iv.clip(busy, lo, hi)
        gap_starts, gap_ends = np.concatenate([[lo], e]), np.concatenate([s, [hi]])  # gap i: busy i-1 → busy i
        keep = gap_ends > gap_starts
        starts.append(gap_starts[keep])
        ends.append(gap_ends[keep])
    if len(starts) == 2:
        return starts[1], ends[1]  # one window: its gaps as they are
    return np.concatenate(starts), np.concatenate(ends)
