"""input_bound: every rank waits for its own input, a share of every step: the job is bound by its data loading.

The ranks' ledger sees a rank whose data wait stands above its peers' (dataloader_stall); a job whose every
rank waits alike is nobody's excess there. The job's ledger (run/job_time.py) holds the data wait the ranks
share, step by step.
"""

from __future__ import annotations

import numpy as np

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady_job_steps, time_range
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


@section("input_bound")
class InputBound:
    """When the data wait every rank shares makes the job bound by its input."""

    min_share: float = setting(0.15, "the ranks' shared data wait at this share of a step or more: a loader that keeps "
                               "up hands a batch over in a few per cent of it")
    min_ms: float = setting(2.0, "... and at least this long: a batch handed over from a prefetch queue takes ~1 ms")
    every_step_share: float = setting(0.6, "... in this share of the steady steps: a wait in a few steps is a stall, "
                                      "not a bound (dataloader_stall, periodic_stall)")
    min_rank_share: float = setting(0.5, "... on at least this share of the ranks (each rank's own data wait)")


SETTINGS = (InputBound, Steady)


def detect(tables: Tables) -> list[Candidate]:
    """One finding when the ranks' shared data wait is a good share of most steady steps."""
    s = InputBound.active()
    steps = steady_job_steps(tables)
    if steps.empty or not steps["data_ms"].gt(0).any():
        return []
    data = steps["data_ms"].to_numpy()
    bound = (data >= s.min_share * steps["time_ms"].to_numpy()) & (data >= s.min_ms)
    if bound.sum() < s.every_step_share * len(steps):
        return []
    waiting = _ranks_waiting(tables, steps["step"], s)
    if len(waiting) < s.min_rank_share * tables.steps["rank"].nunique():
        return []
    per_step, step_ms = float(np.median(data)), float(steps["time_ms"].median())
    return [Candidate(
        kind="input_bound", ranks=sorted(waiting), steps=[int(x) for x in steps["step"]],
        time_range=time_range(steps),
        facts={"data_ms": per_step, "step_ms": step_ms, "steps_bound": int(bound.sum()), "steady_steps": len(steps)},
        metrics={"data_ms_per_step": per_step, "step_ms": step_ms, "share_of_step": per_step / step_ms,
                 "threshold_share": s.min_share, "steps_bound": int(bound.sum()), "ranks_waiting": len(waiting),
                 "lost_ms": float(data.sum()), "pattern": "every step", "period_steps": 1,
                 "category": job_time.DATA, "source": "job_ledger"},
        evidence=[{"type": "job_steps", "step": int(st), "data_ms": round(float(d), 3), "step_ms": round(float(w), 3)}
                  for st, d, w in steps[["step", "data_ms", "time_ms"]].head(20).itertuples(index=False)],
    )]


def _ranks_waiting(tables: Tables, steps, s: InputBound) -> list[int]:
    """The ranks whose own median data wait (their host's, on a GPU too) over ``steps`` is at least the bound's
    share of their step."""
    rows = tables.steps[tables.steps["step"].isin(steps)]
    if "data_ms" not in rows:
        return []
    by_rank = rows.groupby("rank").agg(data=("data_ms", "median"), wall=("wall_ms", "median"))
    return [int(r) for r in by_rank.index[(by_rank["data"] >= s.min_share * by_rank["wall"])]]
