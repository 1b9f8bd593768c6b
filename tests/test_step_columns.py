"""Step records read as columns (read/step_columns.py) give exactly what the per-line reader gives: the
reference below is the reader as it was before (one dict per line, through run_files.add_step), kept here."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagtrain.profiler.analyzer.read import step_cache, step_columns
from diagtrain.profiler.util.bounded_read import MAX_LINES_BYTES
from diagtrain.profiler.analyzer.read.run_files import StepFile, add_last_step, add_step
from diagtrain.profiler.analyzer.read.step_cache import read_steps
from diagtrain.profiler.util.bounded_read import read_lines

FIXTURES = Path(__file__).parent / "fixtures" / "recorded_runs"


def per_line(path: Path, rank: int) -> tuple[StepFile, pd.DataFrame]:
    """The reader before columns: every line through add_step, the file's last line through add_last_step."""
    found, by_step, previous = StepFile(), {}, None
    for number, line in enumerate(read_lines(path, MAX_LINES_BYTES), 1):
        if previous is not None:
            add_step(found, by_step, *previous, rank)
        previous = (number, line)
    if previous is not None:
        add_last_step(found, by_step, *previous, rank)
    return found, pd.DataFrame(list(by_step.values()))


def unknowns_alike(table: pd.DataFrame) -> pd.DataFrame:
    """None and NaN both as unknown, and a column of unknowns as no column: a dict per row tells a counter
    recorded as null from one not recorded, and a column from none; the analysis never does."""
    table = table.dropna(axis="columns", how="all")
    return table.astype({c: float for c in table.columns if table[c].dtype == object
                         and table[c].map(lambda v: v is None or isinstance(v, (int, float))).all()})


def assert_same_as_per_line(path: Path, rank: int = 0) -> None:
    found, (reference, table) = read_steps(path, rank), per_line(path, rank)
    if table.empty:
        assert found.table.empty
    else:
        pd.testing.assert_frame_equal(unknowns_alike(found.table), unknowns_alike(table), check_like=True)
    assert found.phases == reference.phases
    assert (found.lines, found.repeated, found.p2p, found.device) == (reference.lines, reference.repeated,
                                                                      reference.p2p, reference.device)
    assert (found.bad_lines, found.impossible) == (reference.bad_lines, reference.impossible)


@pytest.mark.parametrize("run", ["compare-clean1", "early-exit", "leak"])
def test_a_real_runs_records_are_read_as_columns_to_the_per_line_result(run, tmp_path):
    path = FIXTURES / run / "ranks" / "0" / "steps.jsonl"
    assert step_columns.read_block(path.read_bytes(), 0) is not None  # plain records: no line read on its own
    assert_same_as_per_line(path)


def test_a_block_with_a_line_the_columns_cannot_decide_is_read_line_by_line():
    good = json.dumps({"rank": 0, "step": 1, "start": 1.0, "end": 2.0, "duration_ms": 1.0}) + "\n"
    assert step_columns.read_block(good.encode(), 0) is not None
    for odd in ['{"rank": 0, "step": 2, "start": 1.0, "end": 2.0, "duration_ms": -1}',  # impossible
                '{"rank": 1, "step": 2, "start": 1.0, "end": 2.0, "duration_ms": 1}',  # another rank's
                '{"rank": 0, "step": 2, "start": 1.0, "end": 2.0, "duration_ms": 1, "phases_ms": {"a": null}}',
                '{"rank": 0, "step": 2, "start": 1.0, "end": 2.0, "duration_ms": 1}{"rank": 0}',  # two on a line
                '{"rank": 0, "step": 2.0, "start": 1.0, "end": 2.0, "duration_ms": 1}', "not json"]:
        assert step_columns.read_block((good + odd + "\n").encode(), 0) is None, odd


NUMBERS = st.one_of(st.integers(-3, 10**6), st.floats(-1.0, 1e5), st.sampled_from([math.nan, math.inf, 1e30, 2**64]))
ODD = st.one_of(NUMBERS, st.none(), st.booleans(), st.just("7"))
PHASES = st.dictionaries(st.sampled_from(["data", "forward", "backward", "cpu", "wall"]),
                         st.one_of(st.floats(0, 500), st.integers(0, 500), ODD.filter(lambda _: True)), max_size=4)
COUNTERS = ["comm_ms", "comm_calls", "cpu_ms", "runq_ms", "page_faults", "rss_bytes", "peak_mem_bytes", "samples",
            "gpu_peak_since", "loss", "mem_source"]


@st.composite
def record(draw: st.DrawFn) -> dict:
    """A step record, mostly plain, sometimes with what a corrupt or odd file holds."""
    plain = draw(st.booleans())
    start = draw(st.floats(1e9, 2e9) if plain else st.one_of(st.floats(1e9, 2e9), ODD))
    r = {"rank": 0 if plain else draw(st.sampled_from([0, 0, 1, True, "0"])),
         "step": draw(st.integers(0, 12) if plain else st.one_of(st.integers(0, 12), st.floats(0, 3), st.just(-1))),
         "start": start, "end": start + 0.1 if plain or (isinstance(start, float) and draw(st.booleans())) else draw(ODD),
         "duration_ms": draw(st.floats(0, 1e3) if plain else st.one_of(st.floats(0, 1e3), ODD))}
    if draw(st.booleans()):
        r["phases_ms"] = draw(st.dictionaries(st.sampled_from(["data", "forward", "backward"]), st.floats(0, 300),
                                              max_size=3) if plain else PHASES)
    if draw(st.booleans()):
        r["phase_comm_ms"] = draw(st.dictionaries(st.sampled_from(["data", "backward"]), NUMBERS, max_size=2))
    for name in draw(st.lists(st.sampled_from(COUNTERS), max_size=5, unique=True)):
        r[name] = draw(st.sampled_from(["step", "start", "x"]) if name == "gpu_peak_since" else
                       st.floats(0, 1e3) if plain else ODD)
    return r


LINES = st.one_of(record().map(lambda r: json.dumps(r, allow_nan=True)), st.sampled_from(["", "  ", "not json", "[1]"]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=st.lists(LINES, min_size=1, max_size=30), block=st.integers(60, 2000), cut=st.booleans())
def test_any_records_read_in_any_blocks_are_the_per_line_result(lines, block, cut):
    """Blocks of ``block`` bytes: some read as columns, some line by line, the results joined."""
    text = "\n".join(lines) + ("" if cut else "\n")
    read_bytes, step_cache.READ_BYTES = step_cache.READ_BYTES, block
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "steps.jsonl"
            path.write_text(text)
            assert_same_as_per_line(path)
    finally:
        step_cache.READ_BYTES = read_bytes
