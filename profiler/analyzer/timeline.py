"""One rank's timeline: compute, communication, memory and idle spans, as the dashboard draws them.

A span is the union of the events of one kind (nested host ops and overlapping kernels become one
span), so a lane never draws an op over another; it is named after the outermost event that
opens it. Idle spans are the gaps with nothing running: between the first and the last kernel of
a trace on GPU (HTA's idle), inside each profiled step on CPU. The kinds follow the time
breakdown: kernels on GPU traces, host ops on CPU traces. Call it once per trace file: the time
between two profiled windows is not idle.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer import intervals as iv
from diagtrain.profiler.analyzer.breakdown import host_categories
from diagtrain.profiler.analyzer.dialects import COMM, COMPUTE, MEMORY, STEP_ANNOTATION, kind_in, name_matches

IDLE = "idle"
SPAN_KINDS = (COMPUTE, COMM, MEMORY, IDLE)


def spans(events: pd.DataFrame, on_gpu: bool, offset_us: int = 0) -> pd.DataFrame:
    """The spans of one trace's events: start_us, end_us (``offset_us`` later than the events: the
    trace's epoch offset), kind, name; sorted by start within a kind."""
    rows, kinds = _active(events, on_gpu)
    # Outermost first among events that start together, so a span takes the enclosing op's name.
    order = iv.outermost_order(rows, events["ts"].to_numpy(), events["dur"].to_numpy())
    if order is not None:
        rows, kinds = rows[order], kinds[order]
    del order
    starts, ends = events["ts"].to_numpy()[rows], events["end"].to_numpy()[rows]
    names = events["name"].cat
    categories = names.categories if IDLE in names.categories else names.categories.append(pd.Index([IDLE]))
    dictionary = pd.CategoricalDtype(categories)  # one dictionary for every kind, checked once
    codes = names.codes.to_numpy()[rows]
    codes_dtype = codes.dtype
    del rows
    parts: dict[str, list[np.ndarray]] = {"start_us": [], "end_us": [], "kind": [], "name": []}

    def add(kind: str, s: np.ndarray, e: np.ndarray, name_codes: np.ndarray) -> None:
        kind_codes = np.full(len(s), SPAN_KINDS.index(kind), dtype=np.int8)
        for column, values in zip(parts, (s, e, kind_codes, name_codes)):
            parts[column].append(values)

    for kind in (COMPUTE, COMM, MEMORY):
        mask = kinds == SPAN_KINDS.index(kind)
        (s, e), first = iv.merge_with_first(starts[mask], ends[mask])
        add(kind, s, e, codes[mask][first])
    del codes, kinds
    idle_s, idle_e = _idle(events, iv.merge(starts, ends), on_gpu)
    add(IDLE, idle_s, idle_e, np.full(len(idle_s), categories.get_loc(IDLE), dtype=codes_dtype))
    return _frame(parts, dictionary, offset_us)


_SPAN_KINDS = pd.CategoricalDtype(SPAN_KINDS)


def _frame(parts: dict[str, list[np.ndarray]], names: pd.CategoricalDtype, offset_us: int) -> pd.DataFrame:
    """The spans' columns, joined a column at a time (the pieces of one let go before the next), the
    times moved by ``offset_us`` in place (merged first, in the trace's own finer time)."""
    columns = {}
    for column, pieces in parts.items():
        columns[column] = np.concatenate(pieces)
        pieces.clear()
    columns["start_us"] += offset_us
    columns["end_us"] += offset_us
    return pd.DataFrame({"start_us": columns["start_us"], "end_us": columns["end_us"],
                         "kind": pd.Categorical.from_codes(columns["kind"], dtype=_SPAN_KINDS),
                         "name": pd.Categorical.from_codes(columns["name"], dtype=names)}, copy=False)


def _active(events: pd.DataFrame, on_gpu: bool) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the events that count as work (kernels on GPU, compute and communication host
    ops on CPU), and the kind each is drawn as (its index in ``SPAN_KINDS``)."""
    if on_gpu:
        rows = np.flatnonzero((events["stream"] >= 0).to_numpy() & kind_in(events, COMPUTE, COMM, MEMORY))
        to_span = np.array([SPAN_KINDS.index(k) if k in SPAN_KINDS else -1 for k in events["kind"].cat.categories],
                           dtype=np.int8)
        return rows, to_span[events["kind"].cat.codes.to_numpy()[rows]]
    host = np.flatnonzero((events["stream"] < 0).to_numpy())
    is_compute, is_comm = host_categories(events[["kind", "cat"]].iloc[host])
    work = is_compute | is_comm
    # On CPU every op is "cpu" in the trace's kinds; name the two the breakdown counts.
    return host[work], np.where(is_comm[work], SPAN_KINDS.index(COMM), SPAN_KINDS.index(COMPUTE)).astype(np.int8)


def _idle(events: pd.DataFrame, busy: iv.Intervals, on_gpu: bool) -> iv.Intervals:
    """Gaps in ``busy``: from the first to the last kernel on GPU, inside each step on CPU."""
    if on_gpu or not len(busy[0]):
        windows = [(busy[0][0], busy[1][-1])] if len(busy[0]) else []
    else:
        host = events[(events["stream"] < 0).to_numpy()]
        marks = host[name_matches(host["name"], STEP_ANNOTATION)]
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
