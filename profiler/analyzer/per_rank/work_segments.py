"""One rank's work in each profiled step as a short sequence of segments: what the critical path is built from.

A segment is a stretch of work with gaps shorter than ``COALESCE_GAP_US`` inside it: host ops
(``cpu_op``) on CPU traces, compute and memory kernels on GPU traces. Each carries its busy time,
the phase it runs in (diagtrain's ``diagtrain.phase.<name>`` annotations), the phase of the gap
before it, and the outermost operator it starts in. Computed in the worker that reads the rank
(columns only, no loop over events), so the analysis gets a few hundred rows per step, never the
events.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.per_rank.reading import Reading
from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.analyzer.read.dialects import COMM, COMPUTE, CPU, MEMORY, STEP_ANNOTATION, kind_in, step_marks

PHASE_PREFIX = "diagtrain.phase."  # the in-rank step hooks' annotation of each phase
LABEL_CATEGORIES = ("cpu_op", "user_annotation")
COLUMNS = ["rank", "step", "start_us", "end_us", "busy_us", "phase", "gap_phase", "op"]


def rank_segments(events: pd.DataFrame, rank: int, on_gpu: bool, timed: bool = True) -> pd.DataFrame:
    """The rank's work segments per ProfilerStep#N (epoch µs when ``events`` are), in time order."""
    host = (events["stream"] < 0).to_numpy()
    names = events["name"]
    steps_mask = step_marks(events)
    if not steps_mask.any() or (on_gpu and not timed):
        return pd.DataFrame(columns=COLUMNS)
    ts, end = events["ts"].to_numpy(dtype=float), events["end"].to_numpy(dtype=float)
    work = ~host & kind_in(events, COMPUTE, MEMORY) if on_gpu else \
        host & kind_in(events, CPU) & (events["cat"] == "cpu_op").to_numpy()
    seg_s, seg_e, busy, op_rows = _coalesced(events, work)

    step_rows = np.flatnonzero(steps_mask)
    order = np.argsort(ts[step_rows])
    step_rows = step_rows[order]
    step_s, step_e = ts[step_rows], end[step_rows]
    step_no = np.array([int(STEP_ANNOTATION.match(n).group(1)) for n in _names_at(names, step_rows)])
    at = np.searchsorted(step_s, seg_s, side="right") - 1
    inside = (at >= 0) & (seg_s < step_e[np.clip(at, 0, None)])
    seg_s, seg_e, busy, at = seg_s[inside], seg_e[inside], busy[inside], at[inside]
    seg_e = np.minimum(seg_e, step_e[at])  # a segment does not run on past its step's end

    phase_mask = host & _starts_with(names, PHASE_PREFIX)
    phase_at = _labeller(ts[phase_mask], end[phase_mask],
                         [n[len(PHASE_PREFIX):] for n in _names_at(names, np.flatnonzero(phase_mask))])
    if on_gpu:  # the kernel a segment opens with (its own op on CPU is inside an enclosing one)
        op_rows = op_rows[inside]
        op = np.full(len(op_rows), "", dtype=object)
        op[op_rows >= 0] = _names_at(names, op_rows[op_rows >= 0])
    else:  # the operator a segment runs in: ops and user annotations (the profiler's own span is neither)
        rows = np.flatnonzero(host & ~steps_mask & ~phase_mask & ~kind_in(events, COMM)
                              & _category_in(events["cat"], LABEL_CATEGORIES))
        order = iv.outermost_order(rows, ts, events["dur"].to_numpy())
        rows = rows if order is None else rows[order]
        (lab_s, lab_e), first = iv.merge_with_first(ts[rows], end[rows])
        op = _labeller(lab_s, lab_e, _names_at(names, rows[first]))(seg_s)
    del host, steps_mask, phase_mask
    # The gap before a segment starts at the previous segment's end, or at its step's start.
    prev_end = np.concatenate([[-np.inf], seg_e[:-1]])
    new_step = np.concatenate([[True], at[1:] != at[:-1]])
    gap_start = np.where(new_step, step_s[at], prev_end)
    return pd.DataFrame({"rank": rank, "step": step_no[at], "start_us": seg_s, "end_us": seg_e, "busy_us": busy,
                         "phase": phase_at(seg_s), "gap_phase": phase_at(gap_start), "op": op},
                        columns=COLUMNS)


def _coalesced(events: pd.DataFrame, work: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ``work`` events (a mask) coalesced across short gaps, a piece of the trace at a time: each
    segment's start, end, busy time, and the row of the outermost event it opens with (-1 where that
    event takes no time: nothing runs at the segment's start)."""
    ts, end, dur = events["ts"].to_numpy(dtype=float), events["end"].to_numpy(dtype=float), events["dur"].to_numpy()
    busy, segments = iv.RunningUnion(), _Coalescer()
    for rows in iv.pieces(ts, work):
        order = iv.outermost_order(rows, ts, dur)
        rows = rows if order is None else rows[order]
        segments.add(*busy.add(ts[rows], end[rows], rows))
    segments.add(*busy.close())
    return segments.close()


class _Coalescer:
    """Busy intervals, as they become final (disjoint, in order), coalesced across gaps shorter than
    ``reading.coalesce_gap_us``: the segments' starts, ends, busy times and the labels they open with."""

    def __init__(self) -> None:
        self._union = iv.RunningUnion(gap=Reading.active().coalesce_gap_us)
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._held_busy = 0.0  # busy time of the segment the union holds open

    def add(self, busy: iv.Intervals, labels: np.ndarray) -> None:
        s, e = busy
        if not len(s):
            return
        (seg_s, seg_e), opened_by = self._union.add(s, e, np.where(e > s, labels, -1))
        # Each busy interval lies in one of the segments made final now or in the one held open.
        owner = np.searchsorted(np.concatenate([seg_s, self._union.held[0]]), s, side="right") - 1
        sums = np.bincount(owner, weights=e - s, minlength=len(seg_s) + 1)
        sums[0] += self._held_busy  # the segment held before is the first made final, or still held
        self._held_busy = sums[-1]
        self._parts.append((seg_s, seg_e, sums[:-1], opened_by))

    def close(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        (seg_s, seg_e), opened_by = self._union.close()
        self._parts.append((seg_s, seg_e, np.full(len(seg_s), self._held_busy), opened_by))
        return tuple(np.concatenate(column) for column in zip(*self._parts))


def _names_at(names: pd.Series, rows: np.ndarray) -> np.ndarray:
    """The names of the events at ``rows`` as strings, without making a string per event of the trace."""
    if hasattr(names, "cat"):
        codes = names.array.codes[rows]
        return np.asarray(names.cat.categories.astype(str), dtype=object)[codes]
    return names.to_numpy()[rows].astype(str).astype(object)


def _category_in(cats: pd.Series, wanted: tuple[str, ...]) -> np.ndarray:
    """Which events' category is one of ``wanted`` (any case), from the categorical's codes when it is one."""
    if not hasattr(cats, "cat"):
        return cats.astype(str).str.lower().isin(wanted).to_numpy()
    hit = np.asarray(cats.cat.categories.astype(str).str.lower().isin(wanted))
    codes = cats.array.codes
    return np.where(codes >= 0, hit[codes], False)


def _starts_with(names: pd.Series, prefix: str) -> np.ndarray:
    categories = names.cat.categories if hasattr(names, "cat") else None
    if categories is None:
        return names.astype(str).str.startswith(prefix).to_numpy()
    hit = np.asarray(categories.astype(str).str.startswith(prefix))
    codes = names.array.codes
    return np.where(codes >= 0, hit[codes], False)


def _labeller(starts: np.ndarray, ends: np.ndarray, labels: list[str]):
    """A function from times to the label of the (disjoint) interval holding each, ``""`` outside them all."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    names = np.asarray(labels, dtype=object)
    if not iv.in_order(starts):  # merged intervals come in order: no copies for them
        order = np.argsort(starts, kind="stable")
        starts, ends, names = starts[order], ends[order], names[order]

    def label(times: np.ndarray) -> np.ndarray:
        if not len(starts):
            return np.full(len(times), "", dtype=object)
        i = np.clip(np.searchsorted(starts, times, side="right") - 1, 0, None)
        ok = (times >= starts[i]) & (times < ends[i])
        return np.where(ok, names[i], "")
    return label
