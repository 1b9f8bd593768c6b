"""The held step rows a live window is cut from (run/live_tables.HeldRows) give the table one frame of all the
rows would, deduplicated and sorted: a step recorded again (its last record kept, wherever it was read), ranks read
out of order, a phase only some rows name."""

from __future__ import annotations

import pandas as pd

from diagtrain.profiler.analyzer.read.step_tail import RankSteps
from diagtrain.profiler.analyzer.run.live_tables import HeldRows
from diagtrain.profiler.analyzer.run.tables import step_table


def row(rank: int, step: int, forward: float, **more: float) -> dict:
    return {"rank": rank, "step": step, "start": step * 0.1, "end": step * 0.1 + 0.05, "wall_ms": 50.0,
            "forward_ms": forward, **more}


READS = [
    [row(3, 1, 20.0), row(0, 1, 21.0), row(1, 1, 22.0), row(3, 2, 23.0)],
    [row(0, 2, 24.0), row(1, 2, 25.0, data_ms=3.0), row(3, 1, 90.0)],  # rank 3's step 1 recorded again
    [row(0, 3, 26.0), row(1, 3, 27.0), row(3, 3, 28.0), row(2, 2, 29.0)],  # rank 2 read late
]


def test_a_window_cut_from_the_held_rows_is_one_table_of_their_last_records_by_rank_and_step():
    held = HeldRows()
    for rows in READS:
        held.add(rows)
    every = pd.DataFrame([r for rows in READS for r in rows])
    expected = every[every["step"] <= 2].drop_duplicates(["rank", "step"], keep="last")
    expected = expected.sort_values(["rank", "step"], ignore_index=True)
    found = held.between(0, 2)
    pd.testing.assert_frame_equal(found, expected, check_exact=True)
    assert found.loc[(found["rank"] == 3) & (found["step"] == 1), "forward_ms"].item() == 90.0
    assert found[["rank", "step"]].values.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2], [2, 2], [3, 1], [3, 2]]
    # Of steps 3 on, no row names a data phase: no column of theirs.
    assert "data_ms" not in held.between(2, 3) and "data_ms" in found


def test_a_ranks_held_steps_are_its_last_ones_however_they_come():
    """RankSteps keeps its oldest step and drops the oldest in a heap: the same rows, first and last step, and
    count of steps recorded again as a dict of every row cut to its last ``keep`` steps."""
    held, every, again = RankSteps(0, keep=3), {}, 0
    reads = [{1: {"v": 1}, 2: {"v": 2}}, {3: {"v": 3}, 4: {"v": 4}}, {4: {"v": 40}}, {2: {"v": 20}, 6: {"v": 6}}, {},
             {5: {"v": 5}}, {9: {"v": 9}, 7: {"v": 7}, 8: {"v": 8}}]
    for added in reads:
        again += sum(step in every for step in added)
        every.update(added)
        every = {s: every[s] for s in sorted(every)[-3:]}
        held.take(added)
        assert held.rows == every and (held.first, held.last_step) == (min(every), max(every))
    assert held.found.repeated == again == 2  # steps 4 and 2, read again while held
    assert sorted(held.rows) == [7, 8, 9] and held.rows[9] == {"v": 9}


def test_a_counter_measured_in_some_reads_only_is_the_column_one_table_would_have():
    """Counters none of a read's rows measured are not held (a None each); the window's steps table has them where
    any of its rows measured them, typed and in the order one table of every row would."""
    reads = [[row(0, 1, 20.0, runq_ms=None, page_faults=None), row(1, 1, 21.0, runq_ms=None, page_faults=None)],
             [row(0, 2, 22.0, runq_ms=0.5, page_faults=None), row(1, 2, 23.0, runq_ms=None, page_faults=None)],
             [row(0, 3, 24.0, runq_ms=None, page_faults=None), row(1, 3, 25.0, runq_ms=None, page_faults=None)]]
    held = HeldRows()
    for rows in reads:
        held.add(rows)
    every = pd.DataFrame([r for rows in reads for r in rows])
    found = step_table(held.between(0, 3))
    pd.testing.assert_frame_equal(found, step_table(every), check_exact=True)
    assert "page_faults" not in found and found["runq_ms"].dtype == float and found["runq_ms"].notna().sum() == 1
    assert "runq_ms" not in step_table(held.between(2, 3))  # only step 2 measured it
