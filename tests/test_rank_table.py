"""report.json's ``ranks`` table (tables.rank_table), built as arrays where nothing is missing: the same values and
types as the rows it was once built of."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run.tables import Tables, rank_table


def tables(steps: list[dict], **more) -> Tables:
    return Tables(steps=pd.DataFrame(steps), ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[], **more)


def test_ranks_with_steps_and_none_traced() -> None:
    t = tables([{"rank": r, "step": s, "wall_ms": 10.0 * (r + 1) + s, "profiled": s == 2}
                for r in (0, 1) for s in (1, 2, 3)])
    ranks = rank_table(t, [])
    assert ranks["rank"].tolist() == [0, 1] and ranks["steps"].tolist() == [3, 3]
    assert ranks["step_time_median_us"].tolist() == [12_000.0, 22_000.0]
    assert ranks["profiled_steps"].tolist() == [1, 1]
    # nothing traced, no memory, no parameters: columns of None, as a frame of rows holding None types them
    for column in ("compute_us", "idle_us", "comm_comp_overlap_pct", "window_us", "peak_mem_bytes", "parameters",
                   "model_state_bytes"):
        assert ranks[column].dtype == object and ranks[column].isna().all(), column
    assert ranks["steps"].dtype == np.int64 and ranks["step_time_median_us"].dtype == np.float64


def test_a_rank_known_only_from_its_dump_has_no_step_time() -> None:
    t = tables([{"rank": 0, "step": 1, "wall_ms": 5.0, "peak_mem_bytes": 2.0**30}], dumps={2: {}},
               parameters={0: 1000, 2: 1000})
    ranks = rank_table(t, [])
    assert ranks["rank"].tolist() == [0, 2] and ranks["steps"].tolist() == [1, 0]
    assert ranks["step_time_median_us"].iloc[0] == 5000.0 and np.isnan(ranks["step_time_median_us"].iloc[1])
    assert ranks["peak_mem_bytes"].iloc[0] == 2**30 and pd.isna(ranks["peak_mem_bytes"].iloc[1])
    assert ranks["parameters"].tolist() == [1000, 1000] and ranks["model_state_bytes"].iloc[0] > 0


def test_only_dumps_leave_every_step_time_unknown() -> None:
    ranks = rank_table(tables([], dumps={1: {}, 3: {}}), [])
    assert ranks["rank"].tolist() == [1, 3] and ranks["steps"].tolist() == [0, 0]
    assert ranks["step_time_median_us"].dtype == object and ranks["step_time_median_us"].isna().all()
