"""dataloader_stall: steps where a rank waits for its next batch far longer than usual.

The wait is the step's data phase: recorded by the job's StepRecorder or the always-on counters
(time in a DataLoader iterator's ``__next__``), else read from the profiler's own DataLoader spans
(``enumerate(DataLoader)#..__next__``) in the profiled steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady_columns, time_range
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


@section("dataloader_stall")
class DataloaderStall:
    """When a rank's wait for its next batch is long enough, and often enough, to be a stall."""

    stall_factor: float = setting(3.0, "a data phase this many times the run's typical one is a stall...")
    # Data workers starved by a busy host hand batches over a few ms late (18 ms against 3 ms in a
    # clean run with workers on a crowded 2-core machine here).
    min_stall_ms: float = setting(20.0, "...and at least this long: a busy host makes batches a few ms late")
    min_stall_share: float = setting(0.05, "...and this share of the median step, so that it costs the step something")
    min_steps: int = setting(2, "a single slow batch (a cold cache) is not worth a finding")
    shared_share: float = setting(0.8, "stalls every rank has in this share of its stalled steps are the job's "
                                  "wait for its input: no rank waits for another there")


SETTINGS = (DataloaderStall, Steady)


def detect(tables: Tables) -> list[Candidate]:
    """Ranks whose data phase stands far above the run's typical one in several steps."""
    s = DataloaderStall.active()
    steps = steady_columns(tables.steps, ("rank", "step", "start", "end", "wall_ms", "data_ms"))
    if "data_ms" not in steps or steps["data_ms"].isna().all():
        return []
    typical = float(steps["data_ms"].median())
    threshold = max(s.stall_factor * typical, s.min_stall_ms, s.min_stall_share * float(steps["wall_ms"].median()))
    stalls = steps[steps["data_ms"] >= threshold]
    by_rank = {int(rank): rows for rank, rows in stalls.groupby("rank") if len(rows) >= s.min_steps}
    shared = _shared(steps, stalls, by_rank, s)
    if shared is not None:
        return [_finding(shared, sorted(by_rank), typical, threshold, steps)]
    return [_finding(rows, [rank], typical, threshold, steps) for rank, rows in by_rank.items()]


def _shared(steps: pd.DataFrame, stalls: pd.DataFrame, by_rank: dict[int, pd.DataFrame],
            s: DataloaderStall) -> pd.DataFrame | None:
    """The stalls, where every rank stalls in the same steps (``shared_share`` of each rank's); else None."""
    if len(by_rank) < 2 and isinstance(steps["rank"].dtype, np.dtype) and steps["rank"].dtype.kind in "iu":
        return None  # not every one of two ranks or more stalls, told without reading 8,192 ranks one by one (2 ms)
    ranks = set(int(r) for r in steps["rank"].unique())
    if len(ranks) < 2 or set(by_rank) != ranks:
        return None
    everyone = stalls.groupby("step")["rank"].nunique()
    common = set(everyone[everyone == len(ranks)].index)
    if not all(rows["step"].isin(common).mean() >= s.shared_share for rows in by_rank.values()):
        return None
    return stalls[stalls["step"].isin(common)]


def _finding(rows: pd.DataFrame, ranks: list[int], typical: float, threshold: float, steps: pd.DataFrame) -> Candidate:
    """One finding of the stalls in ``rows``: one rank's, its peers waiting for it; or every rank's at once."""
    stalled = sorted(int(step) for step in rows["step"].unique())
    every = _period(stalled)
    per_stall = float(rows["data_ms"].median())
    # Per step: one rank's stalls, or the job's (each step's median over its ranks: they wait together).
    lost = (rows["data_ms"] - typical).sum() if len(ranks) == 1 else \
        (rows.groupby("step")["data_ms"].median() - typical).sum()
    return Candidate(
        kind="dataloader_stall", ranks=ranks, steps=stalled,
        time_range=time_range(rows),
        facts={"stall_ms": per_stall, "every": every, "typical_ms": typical,
               "lost_ms_per_step": float(lost / steps["step"].nunique())},
        metrics={"observed_ms": per_stall, "expected_ms": typical, "threshold_ms": threshold, "period_steps": every,
                 "source": "phases", "time_source": "host"},  # the host's data phase; priced on the device where timed
        evidence=[{"type": "steps", "rank": int(rank), "step": int(step), "data_ms": round(float(d), 3)}
                  for rank, step, d in zip(rows["rank"], rows["step"], rows["data_ms"])][:20],
    )


def _period(steps: list[int]) -> int | None:
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    return gaps.pop() if len(gaps) == 1 and len(steps) >= 2 else None
