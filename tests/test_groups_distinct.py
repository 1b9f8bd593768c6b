"""util/groups.py's grouping in C against the Python it replaced at 1,024 ranks (issue 53): a dict keyed by
each row's values (distinct_rows), groupby's cumcount (nth_in_group), and util/collector.py's freeze."""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from diagtrain.profiler.util.collector import held_objects_spared
from diagtrain.profiler.util.groups import distinct_rows, nth_in_group

NAME = st.sampled_from(["a", "b", "mesh_dp", "0:0-1023"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NAME, st.integers(0, 3)), max_size=40))
def test_distinct_rows_is_a_dict_keyed_by_the_rows_values(rows):
    names = pd.Series([n for n, _ in rows], dtype="str")
    numbers = np.array([k for _, k in rows], dtype=np.int64)
    codes, firsts = distinct_rows(names, numbers)
    seen: dict[tuple, int] = {}
    expected = [seen.setdefault(row, len(seen)) for row in rows]
    assert codes.tolist() == expected
    assert firsts.tolist() == [rows.index(row) for row in seen]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NAME, NAME), max_size=40))
def test_nth_in_group_is_groupbys_cumcount(rows):
    frame = pd.DataFrame(rows, columns=["pg", "op"]).astype("str")
    expected = frame.groupby(["pg", "op"]).cumcount().to_numpy()
    np.testing.assert_array_equal(nth_in_group(frame["pg"], frame["op"]), expected)


def test_missing_values_are_one_value_of_their_own():
    codes, firsts = distinct_rows(pd.Series(["x", None, np.nan, "x"], dtype=object))
    assert codes.tolist() == [0, 1, 1, 0] and firsts.tolist() == [0, 1]


def test_held_objects_are_spared_within_and_handed_back_after():
    with held_objects_spared() as held:
        held()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
