import pytest
from hypothesis import given, settings, strategies as st

from diagtrain.profiler.util.step_ranges import StepRange, parse_step_range, parse_step_ranges


def test_parses_ranges_and_single_steps():
    assert parse_step_range("5-8") == StepRange(5, 8)
    assert parse_step_range(" 3 ") == StepRange(3, 3)
    assert 8 in StepRange(5, 8) and 9 not in StepRange(5, 8) and 4 not in StepRange(5, 8)


def test_several_ranges_sorted_and_overlaps_refused():
    assert parse_step_ranges(["10-12", "2-3"]) == [StepRange(2, 3), StepRange(10, 12)]
    assert parse_step_ranges("2-3,10") == [StepRange(2, 3), StepRange(10, 10)]
    with pytest.raises(ValueError, match="overlap"):
        parse_step_ranges(["2-5", "5-6"])


@pytest.mark.parametrize("text,why", [("5-3", "ends before"), ("0-2", "count from 1"), ("a-b", "not a step range"), ("", "not a step range")])
def test_bad_ranges_say_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_step_range(text)


def test_a_long_list_of_steps_reads_as_a_summary_in_a_sentence():
    from diagtrain.profiler.util.text import ranges

    assert ranges([3, 4, 5, 9]) == "3-5, 9"
    assert ranges(range(1, 24, 2)) == "1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23"  # 12 parts: whole
    assert ranges(range(5, 1_000_001, 4)) == "5, 9, ..., 999997 (every 4, 249999 in all)"
    uneven = [1, 2, 3, *range(5, 30, 2), 100, 101]
    assert ranges(uneven) == "1-3, 5, 7, 9, 11, 13, 15, 17, 19, 21, ... (3 more), 29, 100-101"
    blips = sorted({int(x) for x in range(7, 500_000, 97)} | set(range(500_000, 1_000_000)))
    assert len(ranges(blips)) < 120


def reference_ranges(numbers, most):
    """ranges as a loop over the numbers (its first form): the reference of the vectorized one."""
    numbers = sorted(set(int(n) for n in numbers))
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    if len(parts) <= most:
        return ", ".join(parts)
    gaps = {b - a for a, b in zip(numbers, numbers[1:])}
    if len(gaps) == 1:
        return f"{numbers[0]}, {numbers[1]}, ..., {numbers[-1]} (every {gaps.pop()}, {len(numbers)} in all)"
    shown = most - 2
    return ", ".join(parts[:shown]) + f", ... ({len(parts) - most} more), " + ", ".join(parts[-2:])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-3, 60), max_size=40), st.integers(2, 6), st.sampled_from(["list", "set", "array", "series"]))
def test_ranges_say_what_the_loop_over_the_numbers_says(numbers, most, kind):
    import numpy as np
    import pandas as pd

    from diagtrain.profiler.util.text import ranges

    given_as = {"list": numbers, "set": set(numbers), "array": np.array(numbers, dtype=np.int64),
                "series": pd.Series(numbers, dtype=np.int64)}[kind]
    assert ranges(given_as, most) == reference_ranges(numbers, most)
