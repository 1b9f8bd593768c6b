"""Interval arithmetic on numpy arrays: union, length, intersection. No Python loops over events.

A trace's events can also be taken a piece at a time (:func:`pieces`, :class:`RunningUnion`): the
union of millions of kernels is then built from pieces of ``PIECE_EVENTS``, so a stage's temporaries
are a piece's worth, not several copies of every event (issue 18: a worker's peak memory).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]  # (starts, ends), sorted and disjoint after merge()
# Events a piece: its temporaries are ~10 MiB (the spans' Arrow and Parquet buffers the most), and
# numpy's per-call overhead still nothing (~120 pieces at 16M events).
PIECE_EVENTS = 1 << 17


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
    # A piece at a time: the comparison's mask of a whole trace's starts was a byte an event.
    return all(bool((values[p.start + 1:p.stop + 1] >= values[p]).all())  # value i + 1 against value i
               for p in slices(len(values) - 1))


def slices(n: int) -> list[slice]:
    """``range(n)`` as consecutive slices of at most PIECE_EVENTS: a table's rows a piece at a time."""
    return [slice(lo, min(lo + PIECE_EVENTS, n)) for lo in range(0, n, PIECE_EVENTS)]


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


def covered(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [``lo``, ``hi``], the length of the disjoint intervals ``iv`` inside it."""
    if len(iv[0]) == 0:
        return np.zeros(len(lo))
    return _covered_until(iv, hi) - _covered_until(iv, lo)


def pieces(ts: np.ndarray, selected: np.ndarray, size: int | None = None) -> Iterator[np.ndarray]:
    """The positions of the ``selected`` events (a mask) in order of start ``ts``, a piece of at most
    ``size`` (``PIECE_EVENTS``) events of the table at a time; events that start together are never
    split between pieces."""
    size = size or PIECE_EVENTS
    order = None if in_order(ts) else np.argsort(ts, kind="stable")  # several windows joined out of order
    at_sorted = ts if order is None else None
    lo = 0
    while lo < len(ts):
        hi = min(lo + size, len(ts))
        if order is None:
            if hi < len(ts) and ts[hi] == ts[hi - 1]:
                hi = int(np.searchsorted(at_sorted, ts[hi - 1], side="right"))
            rows = np.flatnonzero(selected[lo:hi]) + lo
        else:
            while hi < len(ts) and ts[order[hi]] == ts[order[hi - 1]]:
                hi += 1
            rows = order[lo:hi]
            rows = rows[selected[rows]]
        yield rows
        lo = hi


class RunningUnion:
    """:func:`merge_with_first` of intervals that come in pieces, each sorted by start and starting no
    earlier than the pieces before it. Each piece gives back the merged intervals that no later piece
    can reach, :meth:`close` the last one: joined, they are :func:`merge_with_first` of all, with
    ``ids`` (row numbers, names) in place of the positions of the opening intervals."""

    def __init__(self, gap: float = 0.0) -> None:
        self.gap = gap
        self._open: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the last merged interval, length 1

    def add(self, starts: np.ndarray, ends: np.ndarray, ids: np.ndarray | None = None) -> tuple[Intervals, np.ndarray]:
        """Merge the next piece; the merged intervals now final, and the ids of their opening intervals."""
        if ids is None:
            ids = np.zeros(len(starts), dtype=np.int8)
        if not len(starts):
            return (starts[:0], ends[:0]), ids[:0]
        if self._open is not None:
            starts, ends, ids = (np.concatenate([held, new]) for held, new in zip(self._open, (starts, ends, ids)))
        (s, e), first = merge_with_first(starts, ends, self.gap)
        opened_by = ids[first]
        self._open = (s[-1:], e[-1:], opened_by[-1:])
        return (s[:-1], e[:-1]), opened_by[:-1]

    @property
    def held(self) -> Intervals:
        """The merged interval held back for the next piece (none before the first)."""
        return (np.empty(0), np.empty(0)) if self._open is None else self._open[:2]

    def close(self) -> tuple[Intervals, np.ndarray]:
        """The last merged interval (none if nothing was added)."""
        if self._open is None:
            return (np.empty(0), np.empty(0)), np.empty(0, dtype=np.int64)
        s, e, opened_by = self._open
        self._open = None
        return (s, e), opened_by


def overlapping(starts: np.ndarray, ends: np.ndarray, windows: Intervals) -> np.ndarray:
    """Which pieces [start, end) overlap one of ``windows`` (any order; a step's windows, say): one search, not a
    pass per window."""
    lo, hi = merge(np.asarray(windows[0], dtype=float), np.asarray(windows[1], dtype=float))
    ends = np.asarray(ends, dtype=float)
    before = np.searchsorted(lo, ends, side="left") - 1  # the last window that starts before the piece ends
    return (before >= 0) & (hi[np.clip(before, 0, None)] > np.asarray(starts, dtype=float)) if len(lo) else \
        np.zeros(len(ends), dtype=bool)


def within(points: np.ndarray, windows: Intervals) -> np.ndarray:
    """Which points fall inside one of ``windows`` [lo, hi) (any order)."""
    lo, hi = merge(np.asarray(windows[0], dtype=float), np.asarray(windows[1], dtype=float))
    points = np.asarray(points, dtype=float)
    at = np.searchsorted(lo, points, side="right") - 1  # the last window that starts at or before the point
    return (at >= 0) & (hi[np.clip(at, 0, None)] > points) if len(lo) else np.zeros(len(points), dtype=bool)
