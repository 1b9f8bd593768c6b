import pytest

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
