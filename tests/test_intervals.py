"""Interval arithmetic shared by the export and the notebook API (profiler/util/intervals.py)."""

from __future__ import annotations

import numpy as np

from diagtrain.profiler.util import intervals as iv


def test_pieces_overlapping_and_points_within_windows_given_in_any_order():
    windows = (np.array([10.0, 0.0]), np.array([20.0, 5.0]))
    pieces = np.array([[4, 6], [5, 7], [19, 25], [20, 30], [8, 9], [-3, 0]], dtype=float)
    assert iv.overlapping(pieces[:, 0], pieces[:, 1], windows).tolist() == [True, False, True, False, False, False]
    assert iv.within(np.array([0, 5, 10, 19.9, 20, 7]), windows).tolist() == [True, False, True, True, False, False]
    assert not iv.overlapping(np.array([1.0]), np.array([2.0]), (np.empty(0), np.empty(0))).any()
