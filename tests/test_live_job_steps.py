"""A live window's job steps, built again only for the steps whose ledger rows or gaps changed
(run/live_ledger.LiveLedger.job_steps), are the frame job_time.build gives for the whole window: as the window
moves on (its first step loses the gap from the step before), when a step is recorded again, when a profiled
window ends (the step after it is the trace's export, its rows unchanged), and when every step is built again."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from test_live_ledger import RANKS, WINDOW, window

from diagtrain.profiler.analyzer.run import job_time, live_ledger
from diagtrain.profiler.analyzer.run.live_ledger import LiveLedger
from diagtrain.profiler.analyzer.run.structure import Structure
from diagtrain.profiler.analyzer.run.tables import Tables


@pytest.fixture
def parted(monkeypatch) -> list[int]:
    """The number of steps each job_time.step_parts call was given (all of them: the window's)."""
    sizes: list[int] = []
    step_parts = job_time.step_parts

    def counted(t: Tables, gaps: pd.DataFrame, only: np.ndarray | None = None) -> pd.DataFrame:
        sizes.append(t.steps["step"].nunique() if only is None else len(only))
        return step_parts(t, gaps, only)

    monkeypatch.setattr(live_ledger.job_time, "step_parts", counted)
    return sizes


def judged(live: LiveLedger, t: Tables, parted: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The live job steps of ``t``, and job_time.build's of the same tables (``parted``: the live one's calls only)."""
    t.ledger = live.build(t)
    expected = job_time.build(t)
    parted.clear()
    return live.job_steps(t), expected


def test_a_moving_window_builds_its_new_and_first_steps_and_gives_the_whole_job(parted):
    live = LiveLedger()
    for last in range(WINDOW, WINDOW + 5):
        t = window(last)
        found, expected = judged(live, t, parted)
        pd.testing.assert_frame_equal(found, expected, check_exact=True)
        # The first window whole; then its new step, and its first (its ranks' steps before it left the window).
        assert parted == ([WINDOW] if last == WINDOW else [2])
    # 10 ms between a rank's steps, none before the window's first: kept from when it was not first, it would be.
    assert expected["between_ms"].iloc[0] == 0 and (expected["between_ms"].iloc[1:] > 9).all()
    assert (expected["imbalance_ms"] > 0).all()  # rank 1's slow forward, from the ranks' ledger


def test_a_step_recorded_again_is_built_again(parted):
    live = LiveLedger()
    judged(live, window(WINDOW), parted)
    found, expected = judged(live, window(WINDOW + 1, changed={(4, 5): {"forward_ms": 90.0, "end": 0.6}}),
                             parted)
    pd.testing.assert_frame_equal(found, expected, check_exact=True)
    assert parted == [4]  # the new step, the first, step 5, and step 6 (rank 4's gap before it, step 5's end moved)


def profiled_window(last: int, profiled: tuple[int, ...] = ()) -> Tables:
    """:func:`window` with the steps ``profiled`` marked as such on every rank."""
    t = window(last)
    t.steps["profiled"] = t.steps["step"].isin(profiled)
    return t


def test_the_step_after_a_profiled_window_is_its_export_though_its_rows_did_not_change(parted):
    live = LiveLedger()
    judged(live, profiled_window(WINDOW), parted)
    found, expected = judged(live, profiled_window(WINDOW + 1, profiled=(5,)), parted)
    pd.testing.assert_frame_equal(found, expected, check_exact=True)
    assert parted == [4]  # the new step, the first, step 5 (now profiled) and step 6 (now the trace's export)
    after = expected.set_index("step").loc[6]
    assert after["profiler_ms"] > 9 and after["between_ms"] == 0


def test_a_change_every_step_shares_builds_the_whole_window(parted):
    live = LiveLedger()
    judged(live, window(WINDOW), parted)
    found, expected = judged(live, window(WINDOW + 1, structure=Structure(stages={r: r % 2 for r in range(RANKS)})),
                             parted)
    pd.testing.assert_frame_equal(found, expected, check_exact=True)
    assert parted == [WINDOW]


def test_the_gaps_of_a_table_by_rank_and_step_are_those_of_the_same_rows_in_any_order():
    t = profiled_window(WINDOW, profiled=(3, 4))
    t.steps["start"] += np.where(t.steps["rank"] == 2, 0.004, 0.0)  # rank 2 starts its steps 4 ms later
    shuffled = t.steps.sample(frac=1.0, random_state=0)
    fast, any_order = job_time.gaps(t.steps), job_time.gaps(shuffled)
    pd.testing.assert_frame_equal(fast, any_order.set_index(shuffled.index).loc[t.steps.index].reset_index(drop=True),
                                  check_exact=True)
    row = fast[(fast["rank"] == 2) & (fast["step"] == 5)].iloc[0]
    assert row["gap_ms"] == pytest.approx(14.0) and row["exported"]  # after the profiled window's last step
