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
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, dtype=np.float64)[order], np.asarray(ends, dtype=np.float64)[order]
    running_end = np.maximum.accumulate(e)
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > running_end[:-1] + gap
    firsts = np.flatnonzero(new_group)
    return (s[new_group], np.maximum.reduceat(e, firsts)), order[firsts]


def length(iv: Intervals) -> float:
    """Total length of disjoint intervals."""
    return float((iv[1] - iv[0]).sum())


def intersection_length(a: Intervals, b: Intervals) -> float:
    """Length of the overlap of two sets of disjoint intervals."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    # Sweep over all boundaries: +1/-1 for a, +2/-2 for b; overlap where the sum is 3.
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    deltas = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), 2 * np.ones(len(b[0])), -2 * np.ones(len(b[1]))])
    order = np.lexsort((deltas, times))  # at equal times, ends (negative) first
    times, level = times[order], np.cumsum(deltas[order])
    return float(np.diff(times)[level[:-1] == 3].sum())


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """The parts of ``iv`` inside [lo, hi]."""
    s, e = np.clip(iv[0], lo, hi), np.clip(iv[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]
