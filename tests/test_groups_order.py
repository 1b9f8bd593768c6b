"""groups.stable_order is np.argsort(kind="stable") for any keys (radix passes for integers that span less than
2**32, numpy's own sort else), and the grouped medians stay numpy's with group codes past 16 bits."""

from __future__ import annotations

import numpy as np
import pytest

from diagtrain.profiler.util.groups import median_by, median_of_others, stable_order


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.uint64, np.int8, float, bool])
@pytest.mark.parametrize("span", [1, 7, 2**16 - 1, 2**16 + 3, 2**31, 2**40])
def test_stable_order_is_numpys_stable_argsort(dtype, span):
    rng = np.random.default_rng(span)
    if dtype in (np.int8, bool, np.uint16) and span > 100:
        span = 100 if dtype is not bool else 1
    offset = 0 if dtype in (np.uint16, np.uint64, bool) else -span // 2
    keys = (rng.integers(0, span + 1, 5000) + offset).astype(dtype)
    np.testing.assert_array_equal(stable_order(keys), np.argsort(keys, kind="stable"))


def test_medians_by_group_codes_past_sixteen_bits():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 3 * 2**16, 20000) * 7  # many small groups, codes spanning more than 2**16
    values = rng.choice([0.0, 1.0, 2.5, np.nan], len(groups), p=[0.4, 0.3, 0.29, 0.01])
    by = {g: values[groups == g] for g in np.unique(groups)}
    expected_by = np.array([np.median(by[g]) for g in groups])
    np.testing.assert_array_equal(median_by(values, groups), expected_by)
    others = np.empty(len(groups))
    for g, rows in ((g, np.flatnonzero(groups == g)) for g in by):
        for i, row in enumerate(rows):
            others[row] = np.median(np.delete(values[rows], i)) if len(rows) > 1 else np.nan
    np.testing.assert_array_equal(median_of_others(values, groups), others)
