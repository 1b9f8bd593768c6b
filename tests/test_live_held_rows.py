"""The held step rows a live window is cut from (run/live_tables.HeldRows) give the table one frame of all the
rows would, deduplicated and sorted: a step recorded again (its last record kept, wherever it was read), ranks read
out of order, a phase only some rows name."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read.step_tail import RankSteps
from diagtrain.profiler.analyzer.run import live_tables
from diagtrain.profiler.analyzer.run.live_tables import HeldRows, _merged as merged
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


def _moving_reads(seed: int) -> list[list[dict]]:
    """Reads of a window moving a step at a time, with what cuts a window afresh among them: a step recorded again,
    a rank read late, a rank ahead, a phase first named, a counter measured in some reads only."""
    rng = np.random.default_rng(seed)
    reads = [[row(r, s, 20.0 + r + s) for s in range(1, 6) for r in range(4)]]
    for step in range(6, 30):
        read = [row(r, step, float(rng.integers(100))) for r in range(4) if not (r == 2 and step % 7 == 0)]
        if step % 7 == 1:
            read.append(row(2, step - 1, 1.0))  # rank 2 read late
        if step % 5 == 0:
            read.append(row(1, step - 2, 99.0))  # a step recorded again
        if step % 6 == 0:
            read.append(row(3, step + 1, 5.0))  # ahead of the others
        if step in (12, 13):
            read = [{**r, "data_ms": 1.0} for r in read]  # a phase in these reads only
        if step in (20, 21):
            read = [{**r, "runq_ms": float(rng.integers(3)) if rng.random() < 0.5 else None} for r in read]
        reads.append(read)
    return reads


def test_a_window_moved_on_is_the_one_cut_afresh_whatever_was_read_meanwhile(monkeypatch):
    """The last window's rows merged with the next steps' (HeldRows._moved) are the table cut from every held row:
    a window reused only while no row of its steps was read again, nor let go (trim)."""
    merges = []
    monkeypatch.setattr(live_tables, "_merged", lambda *a: merges.append(1) or merged(*a))
    for seed in range(3):
        held = HeldRows()
        for read in _moving_reads(seed):
            held.add(read)
            last = max(r["step"] for r in read if r["rank"] == 0)
            held.trim(last - 8)
            found = held.between(last - 4, last)
            pd.testing.assert_frame_equal(found, held._ordered(last - 4, last), check_exact=True)
            assert held.between(last - 4, last) is found  # read again, nothing new: the same table
    assert len(merges) > 15  # the window was merged, not only cut afresh


def test_a_step_of_the_last_window_read_again_cuts_the_next_afresh():
    held = HeldRows()
    held.add([row(r, s, 20.0) for s in (1, 2, 3) for r in range(2)])
    held.between(0, 3)
    held.add([row(0, 4, 1.0), row(1, 4, 1.0)])
    assert held._last is not None  # steps after the window's: it is merged with them
    held.add([row(1, 3, 77.0)])  # rank 1's step 3 recorded again
    assert held._last is None
    assert held.between(1, 4).loc[lambda t: (t["rank"] == 1) & (t["step"] == 3), "forward_ms"].item() == 77.0
    assert held._last is not None
    held.trim(5)  # the rows it holds let go
    assert held._last is None
