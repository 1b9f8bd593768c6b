"""The straggler detector compares every step at once (issue 62: a loop over the steps cost 4 s of a run
of 2 x 100,000 steps); what it finds is what the loop over steps (tests/straggler_reference.py) finds, to
the bit: data stalls that take a rank out of its step, time blocked in collectives, profiled steps, device
timings, NaN and ties included."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from diagtrain.profiler.analyzer.judge.detectors.straggler import SLOW_COLUMNS, Straggler, _excess
from straggler_reference import excess as reference_excess

PHASES = ["data", "forward", "backward"]
# Few distinct values: ties (which rank is the top, which median) are the hard cases; a few large ones
# stand out beyond any threshold.
VALUE = st.sampled_from([0.0, 1.0, 2.0, 2.5, 5.0, 20.0, 21.0, 60.0, 80.0])
MAYBE_NAN = st.one_of(VALUE, VALUE, VALUE, st.just(np.nan))


@st.composite
def step_tables(draw) -> pd.DataFrame:
    """Step records of a few ranks: rows missing, counters NaN, some steps profiled (trace columns), and
    maybe device timings on some rows."""
    ranks, steps = draw(st.integers(1, 5)), draw(st.integers(1, 8))
    kept = [(r, s) for s in range(1, steps + 1) for r in range(ranks) if draw(st.booleans()) or draw(st.booleans())]
    n = len(kept)

    def column(values=MAYBE_NAN) -> list[float]:
        return draw(st.lists(values, min_size=n, max_size=n))
    table = pd.DataFrame({"rank": [r for r, _ in kept], "step": [s for _, s in kept]}, dtype=np.int64)
    table["wall_ms"] = column(VALUE)
    for phase in PHASES:
        table[f"{phase}_ms"] = column()
        table[f"{phase}_comm_wait_ms"] = column()
    table["comm_wait_ms"] = column()
    profiled = set(draw(st.lists(st.integers(1, max(steps, 1)), max_size=3)))
    table["profiled"] = table["step"].isin(profiled)
    if draw(st.booleans()):  # traced: operators' time where profiled
        for name in ("comm_ms", "idle_ms", "compute_ms"):
            table[name] = np.where(table["profiled"], column(), np.nan)
    if draw(st.booleans()):  # some rows timed on their device
        table["time_source"] = np.where(draw(st.lists(st.booleans(), min_size=n, max_size=n)), "device", "host")
        for name in ("device_step_ms", "device_comm_wait_ms", "device_idle_ms"):
            table[name] = column()
    return table


def assert_same(steps: pd.DataFrame, threshold: float) -> pd.DataFrame:
    s = Straggler()
    slow, (ranks, of_steps), _ = _excess(steps, PHASES, threshold, 20.0, s)
    expected, (expected_ranks, expected_steps) = reference_excess(steps, PHASES, threshold, 20.0, s)
    assert list(slow.columns) == SLOW_COLUMNS
    if len(expected):
        pd.testing.assert_frame_equal(slow, expected, check_exact=True)
    else:
        assert slow.empty
    np.testing.assert_array_equal(ranks, expected_ranks)
    np.testing.assert_array_equal(of_steps, expected_steps)
    return slow


@settings(max_examples=150, deadline=None)
@given(step_tables(), st.sampled_from([0.0, 1.0, 5.0]))
def test_every_step_at_once_finds_what_the_loop_over_steps_finds(steps, threshold):
    assert_same(steps, threshold)


def test_a_data_stall_takes_its_rank_out_of_the_step():
    """A worked case, so that both implementations being wrong alike would show. Step 1: rank 2 stalls for
    data (the others wait in their forward); the rest of the step is compared without it, where rank 1's
    backward stands out. Step 2: rank 0's forward stands out, but it was blocked in collectives there (it waited),
    so its backward, not its forward, is what is found. Step 3: nobody stands out."""
    steps = pd.DataFrame({
        "rank": [0, 1, 2, 3] * 3, "step": [1] * 4 + [2] * 4 + [3] * 4,
        "wall_ms": [100.0] * 12,
        "data_ms": [1.0, 1.0, 60.0, 1.0] + [1.0] * 8,
        "data_comm_wait_ms": [0.0] * 12,
        "forward_ms": [60.0, 60.0, 1.0, 60.0] + [80.0, 20.0, 20.0, 20.0] + [20.0] * 4,
        "forward_comm_wait_ms": [59.0, 59.0, 0.0, 59.0] + [60.0, 0.0, 0.0, 0.0] + [0.0] * 4,
        "backward_ms": [20.0, 60.0, 20.0, 20.0] + [60.0, 20.0, 20.0, 20.0] + [20.0] * 4,
        "backward_comm_wait_ms": [0.0] * 12,
    })
    slow = assert_same(steps, 5.0)
    # A data stall is the dataloader_stall detector's finding: it takes its rank out, and is not kept.
    assert slow[["rank", "step", "phase"]].values.tolist() == [[1, 1, "backward phase"], [0, 2, "backward phase"]]
    assert slow["excess_ms"].tolist() == [40.0, 40.0]
