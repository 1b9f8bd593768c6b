"""Interval arithmetic on numpy arrays: union, length, intersection. No Python loops over events."""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]  # (starts, ends), sorted and disjoint after merge()


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of possibly overlapping intervals, as sorted disjoint intervals."""
    merged, _ = merge_with_first(starts, ends)
    return merged


def merge_with_first(starts: np.ndarray, ends: np.ndarray, gap: float = 0.0) -> tuple[Intervals, np.ndarray]:
    """The union, and for each merged interval the index of the input interval that opens it.

    Ties in start keep the input order, so inputs sorted by (start, longest first) name each
    merged interval after its outermost interval. Intervals less than ``gap`` apart merge too.
    """
    if len(starts) == 0:
        return (np.empty(0), np.empty(0)), np.empty(0, dtype=np.int64)
    s, e = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    # Events come sorted by start from their table: no order to take, nor copies in it.
    order = None if in_order(s) else np.argsort(s, kind="stable")
    if order is not None:
        s, e = s[order], e[order]
    running_end = np.maximum.accumulate(e)
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > (running_end[:-1] + gap if gap else running_end[:-1])
    firsts = np.flatnonzero(new_group)
    return (s[new_group], np.maximum.reduceat(e, firsts)), firsts if order is None else order[firsts]


def in_order(values: np.ndarray) -> bool:
    """Whether ``values`` never decrease (events from a table sorted by start, merged intervals)."""
    return bool((values[1:] >= values[:-1]).all())


def outermost_order(rows: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray | None:
    """The order that puts events ``rows`` in time order, the longest first among those that start
    together (so that merging names each interval after its outermost event); None where they already
    are in time order with no two starting together (kernels, mostly): no sort, and no copies."""
    starts = ts[rows]
    if (starts[1:] > starts[:-1]).all():
        return None
    return np.lexsort((-dur[rows], starts))


def length(iv: Intervals) -> float:
    """Total length of disjoint intervals."""
    return float((iv[1] - iv[0]).sum())


def intersection_length(a: Intervals, b: Intervals) -> float:
    """Length of the overlap of two sets of disjoint intervals."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    # Each interval of a overlaps b by b's length covered up to its end, less that up to its start:
    # a few arrays the size of a, where a sweep over every boundary of both took a dozen.
    return float((_covered_until(b, a[1]) - _covered_until(b, a[0])).sum())


def _covered_until(iv: Intervals, times: np.ndarray) -> np.ndarray:
    """For each of ``times``, the length of the disjoint intervals ``iv`` before it."""
    starts, ends = iv
    before = np.concatenate([[0.0], np.cumsum(ends - starts)])  # before[i]: length of intervals 0..i-1
    i = np.searchsorted(starts, times, side="right")  # intervals that start at or before each time
    last = np.maximum(i - 1, 0)  # the last of them may still be open at the time
    return np.where(i > 0, before[last] + np.minimum(times, ends[last]) - starts[last], 0.0)


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """The parts of ``iv`` inside [lo, hi]."""
    if not len(iv[0]) or (lo <= iv[0][0] and iv[1][-1] <= hi):
        return iv  # all inside (a GPU trace's busy time in its own extent): no copies
    s, e = np.clip(iv[0], lo, hi), np.clip(iv[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]
