"""groups.Groups' answers per group are numpy's and pandas' own, to the bit, whatever the groups' shape: groups of one
size (a (groups, size) array sorted along its rows) or not (a sort by value, then group), codes in order (a steps
table's ranks), cycling 0 .. n - 1 (its steps) or shuffled, NaN and infinities, ties, empty groups; and the straggler
detector's per-rank medians (_usual) are pandas' groupby medians that skip NaN."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from diagtrain.profiler.analyzer.judge.detectors.straggler import _usual
from diagtrain.profiler.util.groups import Groups, median_by, ranked
from diagtrain.profiler.util.stats import MAD_TO_SIGMA

# Few distinct values: ties are the hard case; NaN skipped by pandas, not by np.median.
VALUE = st.sampled_from([0.0, 1.0, 2.0, 2.5, 5.0, 20.0, 60.0, np.inf, -np.inf, np.nan])


@st.composite
def grouped(draw) -> tuple[np.ndarray, np.ndarray, int]:
    """Group codes and values: equal groups by rank then step (cycling codes) or by group, or groups of any size
    shuffled; maybe some groups without rows."""
    n = draw(st.integers(1, 6))
    shape = draw(st.sampled_from(["cycles", "in_order", "shuffled", "unequal"]))
    if shape == "unequal":
        codes = np.array(draw(st.lists(st.integers(0, n - 1), max_size=40)), dtype=np.int64)
    else:
        size = draw(st.integers(1, 7))
        codes = np.tile(np.arange(n), size) if shape == "cycles" else np.repeat(np.arange(n), size)
        if shape == "shuffled":
            codes = codes[np.random.default_rng(draw(st.integers(0, 2**16))).permutation(len(codes))]
    values = np.array(draw(st.lists(VALUE, min_size=len(codes), max_size=len(codes))), dtype=float)
    return codes, values, n + draw(st.integers(0, 2))  # groups past the last code: empty


def per_group(codes: np.ndarray, values: np.ndarray, n: int, answer) -> np.ndarray:
    """``answer`` of each group's values, NaN for an empty group."""
    return np.array([answer(values[codes == g]) if (codes == g).any() else np.nan for g in range(n)])


@settings(max_examples=400, deadline=None)
@given(grouped(), st.data())
def test_groups_are_numpys_and_pandas_answers(case, data):
    codes, values, n = case
    groups = Groups(codes, n)
    np.testing.assert_array_equal(groups.median(values), per_group(codes, values, n, np.median))
    skipped = pd.Series(values).groupby(codes).median().reindex(range(n)).to_numpy()
    np.testing.assert_array_equal(groups.median(values, skip_nan=True), skipped)
    top, low = np.full(n, -np.inf), np.full(n, np.inf)
    with np.errstate(invalid="ignore"):
        np.maximum.at(top, codes, values)
        np.minimum.at(low, codes, values)
        np.testing.assert_array_equal(groups.maximum(values), top)
        np.testing.assert_array_equal(groups.minimum(values), low)
    chosen = np.array(data.draw(st.lists(st.booleans(), min_size=len(codes), max_size=len(codes))), dtype=bool)
    first = np.full(n, len(codes))
    np.minimum.at(first, codes[chosen], np.flatnonzero(chosen))
    np.testing.assert_array_equal(groups.first(chosen), first)
    # The chosen rows' groups, from the same gathering.
    part = groups.within(chosen)
    np.testing.assert_array_equal(part.sizes, np.bincount(codes[chosen], minlength=n))
    np.testing.assert_array_equal(part.median(values), per_group(codes[chosen], values[chosen], n, np.median))
    np.testing.assert_array_equal(part.within(~np.isnan(values)).median(values),
                                  per_group(codes[chosen & ~np.isnan(values)], values[chosen & ~np.isnan(values)],
                                            n, np.median))


@settings(max_examples=300, deadline=None)
@given(grouped(), st.integers(-3, 1000))
def test_median_by_and_ranked_are_numpys(case, offset):
    codes, values, _ = case
    keys = codes * 3 + offset
    np.testing.assert_array_equal(median_by(values, keys), np.array([np.median(values[keys == k]) for k in keys]))
    found, at = ranked(keys)
    expected_found, expected_at = np.unique(keys, return_inverse=True)
    np.testing.assert_array_equal(found, expected_found)
    np.testing.assert_array_equal(at, expected_at)


def pandas_usual(quantities: pd.DataFrame, min_steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """straggler._usual as it was: pandas' groupby median per rank (NaN skipped) and of the deviations from it."""
    values = quantities.drop(columns=["step", "rank"])
    by_rank = values.groupby(quantities["rank"])
    usual = by_rank.median()
    at = usual.index.get_indexer(quantities["rank"])
    noise = pd.DataFrame({label: MAD_TO_SIGMA * (values[label] - usual[label].to_numpy()[at]).abs()
                          .groupby(quantities["rank"]).median() for label in values.columns}, columns=values.columns)
    return usual, noise.where(by_rank.count() >= min_steps)


@settings(max_examples=300, deadline=None)
@given(grouped(), st.data())
def test_usual_is_pandas_groupby_median(case, data):
    codes, values, _ = case
    ranks = codes * 2 + 1  # ranks with gaps
    other = np.array(data.draw(st.lists(VALUE, min_size=len(codes), max_size=len(codes))), dtype=float)
    quantities = pd.DataFrame({"rank": ranks, "step": np.arange(len(codes)), "a": values, "b": other})
    found, at = ranked(ranks)
    by_rank = Groups(at, len(found))
    expected_usual, expected_noise = pandas_usual(quantities, 3)
    for label in ("a", "b"):  # a quantity at a time, per rank in ascending order
        usual, noise = _usual(quantities[label].to_numpy(dtype=float), by_rank, 3)
        for got, expected in ((usual, expected_usual[label]), (noise, expected_noise[label])):
            pd.testing.assert_series_equal(pd.Series(got, index=expected.index, name=label), expected, check_exact=True)
