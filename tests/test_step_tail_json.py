"""The live readers' JSON lines (read/step_tail.json_value, msgspec's decoder with json's as the fallback) read as
json.loads reads them: NaN, integers past 64 bits, lone surrogates, repeated keys; what json refuses is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from diagtrain.profiler.analyzer.read.step_tail import json_value

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=12)


@pytest.mark.parametrize("line", ['{"a": NaN, "b": -Infinity}', "[1e400]", "123456789012345678901234567890",
                                  '"\\ud800"', '{"a": 1, "a": 2}', "[-0, 0.1, 1E5]", " [1] "])
def test_a_line_reads_as_json_reads_it(line):
    assert repr(json_value(line)) == repr(json.loads(line))


@pytest.mark.parametrize("line", ["{", "[1,]", "nope", "[1] x", ""])
def test_what_json_refuses_is_refused(line):
    with pytest.raises(ValueError):
        json_value(line)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_any_record_written_by_json_reads_back_the_same(value):
    line = json.dumps(value)
    assert repr(json_value(line)) == repr(json.loads(line))
