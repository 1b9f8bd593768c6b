"""Rows grouped by a key as plain position arrays: what ``DataFrame.groupby`` gives, without a frame per
group. A loop that only reads a few numbers from each group spent most of its time building the
groups' frames (issue 39: live judgement of 64 ranks)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``: the distinct values, sorted (NaN last). By a hash table, then a sort of the distinct
    ones only: numpy 2.4's own np.unique took 0.4 s for a million step numbers, this 0.03 s."""
    return np.sort(pd.unique(np.asarray(values)))


def positions_by(keys: np.ndarray) -> list[tuple[object, np.ndarray]]:
    """Each distinct key (ascending, as ``groupby`` sorts them) with the positions of its rows, in row
    order. NaN keys are left out, as ``groupby`` leaves them out."""
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")  # stable: a group's rows stay in row order
    ordered = keys[order]
    if ordered.dtype.kind == "f":
        known = ~np.isnan(ordered)  # sorted last
        order, ordered = order[known], ordered[known]
    if len(order) == 0:
        return []
    bounds = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    return [(ordered[start], order[start:end]) for start, end in zip(np.r_[0, bounds], np.r_[bounds, len(order)])]


def distinct_rows(*columns: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Per row, which distinct combination of the ``columns``' values it holds (codes 0, 1, ... in the order
    of their first rows), and the first row of each combination: what a dict keyed by each row's values
    finds, by hash tables in C instead of a tuple built and hashed per row. Missing values (None, NaN)
    are one value."""
    codes = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    for column in columns:
        own, distinct = pd.factorize(column, use_na_sentinel=False)
        codes = pd.factorize(codes * max(len(distinct), 1) + own)[0]  # below rows x values: no overflow
    return codes, np.unique(codes, return_index=True)[1]


def nth_in_group(*columns: Sequence) -> np.ndarray:
    """Per row, how many rows before it hold the same values in ``columns`` (0, 1, ...): ``groupby(...).cumcount()``
    of columns without missing values, without its per-call cost (0.9 ms, on each rank's few hundred
    collectives)."""
    codes = distinct_rows(*columns)[0]
    order = np.argsort(codes, kind="stable")  # a group's rows together, in row order
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(codes) else np.zeros(0, dtype=int)
    nth = np.empty(len(codes), dtype=np.int64)
    nth[order] = np.arange(len(codes)) - np.repeat(starts, np.diff(np.r_[starts, len(codes)]))
    return nth


def median_of_others(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """For each element, ``np.median`` of the other elements of its group, to the bit (NaN where one
    of them is NaN, and for an element alone in its group), without a median per element.

    Sorted within its group, an element's others are the sorted values with its own position left
    out: their middle one (or two) sit at fixed positions, shifted by one past the element's own."""
    g = _Sorted(values, groups)
    own = np.arange(len(g.values)) - g.start  # the element's position in its sorted group
    others = g.size - 1
    low, high = (others - 1) // 2, others // 2
    found = g.middle(low + (low >= own), high + (high >= own), others >= 1)
    return g.back(np.where(g.nans - np.isnan(g.values) > 0, np.nan, found))


def median_by(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """For each element, ``np.median`` of its group (itself included), to the bit (NaN where the group
    holds a NaN)."""
    g = _Sorted(values, groups)
    found = g.middle((g.size - 1) // 2, g.size // 2, g.size >= 1)
    return g.back(np.where(g.nans > 0, np.nan, found))


class _Sorted:
    """Values sorted within their groups (NaN last), and per sorted element its group's start and size
    and how many NaN the group holds."""

    def __init__(self, values: np.ndarray, groups: np.ndarray) -> None:
        values, groups = np.asarray(values, dtype=float), np.asarray(groups)
        self.order = np.lexsort((values, groups))
        self.values, cells = values[self.order], groups[self.order]
        n = len(values)
        starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]]) if n else np.zeros(0, dtype=int)
        sizes = np.diff(np.r_[starts, n]).astype(int)
        self.start, self.size = np.repeat(starts, sizes), np.repeat(sizes, sizes)
        self.nans = np.repeat(np.add.reduceat(np.isnan(self.values).astype(int), starts) if n else np.zeros(0), sizes)

    def middle(self, low: np.ndarray, high: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """np.median's middle of the positions ``low`` and ``high`` in each group: the value where they
        are one, else the mean of the two, ``(a + b) / 2`` as np.mean of two computes it; NaN where
        not ``valid``."""
        a = self.values[np.where(valid, self.start + low, 0)]
        b = self.values[np.where(valid, self.start + high, 0)]
        return np.where(valid, np.where(low == high, a, (a + b) / 2), np.nan)

    def back(self, sorted_values: np.ndarray) -> np.ndarray:
        """Per-element results in the original order."""
        out = np.empty(len(sorted_values))
        out[self.order] = sorted_values
        return out
