"""The live ledger's array forms hold to the bit what the pandas forms they replaced gave: the job's step parts (a
named aggregation, group medians, merges), the CPU floor's sums (one key, not two), the run's noise (a median per
rank), and the steps a window changed (compared as (ranks, steps) arrays where each rank has every step), on tables
in rank-then-step order and not, with rows and times missing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from test_live_ledger import window

from diagtrain.profiler.analyzer.judge.assessments import ledger_price
from diagtrain.profiler.analyzer.run import job_time, ledger
from diagtrain.profiler.analyzer.run.live_ledger import LiveLedger, _Grid, _merged
from diagtrain.profiler.util.groups import stable_order
from diagtrain.profiler.util.stats import MAD_TO_SIGMA


def _reference_parts(t, gaps_of: pd.DataFrame) -> pd.DataFrame:
    """job_time.step_parts as pandas gave it (the group medians, the named aggregation, the merges)."""
    frame = t.ledger.merge(gaps_of, on=["rank", "step"], how="left")
    steps = t.steps
    out = pd.DataFrame(index=frame.index)
    totals = {c: np.zeros(len(frame)) for c in ("compute", "data", "other")}
    for part in [p for p in dict.fromkeys([*t.phases, ledger.OUTSIDE]) if ledger.work_column(p) in frame]:
        work, excess = frame[ledger.work_column(part)].to_numpy(), frame[ledger.excess_column(part)].to_numpy()
        own = np.clip(np.nan_to_num(work - excess), 0.0, None)
        out[f"part_{part}_ms"] = own
        totals[job_time.part_category(part)] += own
    for c, values in totals.items():
        out[f"{c}_ms"] = values
    gap, exported = frame["gap_ms"].fillna(0.0).to_numpy(), frame["exported"].fillna(False).to_numpy(dtype=bool)
    out["between_ms"], out["profiler_ms"] = np.where(exported, 0.0, gap), np.where(exported, gap, 0.0)
    typical = out.groupby(frame["step"].to_numpy()).median()
    codes, numbers = pd.factorize(frame["step"].to_numpy())
    lost = pd.Series(job_time._lost_by_step(frame["lost_ms"].to_numpy(), codes, len(numbers)), index=numbers).sort_index()
    spans = steps.groupby("step").agg(start=("start", "min"), end=("end", "max"), ranks=("rank", "nunique"))
    spans = spans.loc[spans.index.isin(typical.index)].dropna(subset=["start", "end"])
    return typical.reindex(spans.index).fillna(0.0).assign(imbalance_ms=lost.reindex(spans.index).fillna(0.0),
                                                           start=spans["start"], end=spans["end"], ranks=spans["ranks"])


def _shuffled(t, seed: int):
    """``t`` with its steps' rows in another order, one row's start unknown, and a step whose every end is."""
    rng = np.random.default_rng(seed)
    steps = t.steps.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    steps.loc[int(rng.integers(len(steps))), "start"] = np.nan
    steps.loc[steps["step"] == steps["step"].iloc[0], "end"] = np.nan
    return replace(t, steps=steps)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_the_step_parts_are_those_of_the_pandas_aggregation(seed):
    t = window(9)
    t = t if seed is None else _shuffled(t, seed)
    t.ledger = ledger.build(t)
    gaps_of = job_time.gaps(t.steps)
    found, expected = job_time.step_parts(t, gaps_of), _reference_parts(t, gaps_of)
    pd.testing.assert_frame_equal(found, expected, check_exact=True)
    only = np.array(sorted(t.steps["step"].unique())[-2:])
    kept = t.steps["step"].isin(only).to_numpy()
    cut = replace(t, steps=t.steps[kept], ledger=t.ledger[t.ledger["step"].isin(only)])
    pd.testing.assert_frame_equal(job_time.step_parts(t, gaps_of, only), _reference_parts(cut, gaps_of[kept]),
                                  check_exact=True)


def test_the_cpu_floor_is_the_sum_by_step_and_host_to_the_bit():
    rng = np.random.default_rng(5)
    rank, step = np.repeat(np.arange(40), 6), np.tile(np.arange(3, 9), 40)
    t = replace(window(8), rank_hosts={r: f"node-{r % 7}" for r in range(40)}, telemetry=None,
                hosts=[{"name": f"node-{h}", "cpus": 1 + h % 3} for h in range(7)])
    columns = {"rank": rank, "step": step, "cpu_ms": rng.random(240) * 1e3 / 7, "lost_ms": rng.random(240) - 0.5,
               "cpu_excess_ms": rng.random(240) / 3}
    found = ledger._cpu_floor(columns, t)
    cores = np.array([1 + (r % 7) % 3 for r in rank], dtype=float)
    work = columns["cpu_ms"] - np.where(columns["lost_ms"] > 0, columns["cpu_excess_ms"], 0.0)
    expected = pd.Series(work / cores).groupby([step, rank % 7]).transform("sum").groupby(step).transform("max")
    assert found.tobytes() == expected.to_numpy().tobytes()


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3], [5, 9, 40, 41, 100]])
def test_the_noise_is_the_median_of_each_ranks_spread(ranks):
    rng = np.random.default_rng(len(ranks))
    rank = np.repeat(ranks, 7)
    frame = pd.DataFrame({"rank": rank, "running_ms": rng.random(len(rank)) * 50})
    frame = frame.drop(index=[3, 11]).reset_index(drop=True)  # ranks of unequal counts too
    spread = [MAD_TO_SIGMA * np.median(np.abs(g - np.median(g))) for _, g in frame.groupby("rank")["running_ms"]]
    assert ledger_price.noise_ms(frame) == float(pd.Series(spread).median())


@pytest.mark.parametrize("change", [{}, {(2, 5): {"cpu_ms": 99.0}}, {(0, 8): {"runq_ms": np.nan}},
                                    {(4, 3): {"end": 0.95}}])
def test_the_steps_changed_as_arrays_of_ranks_by_steps_are_those_compared_row_by_row(monkeypatch, change):
    live = LiveLedger()
    live.build(window(8))
    now = window(9, change)
    assert _Grid.of(now.steps) is not None
    kept = (live._steps, live._ledger, live._shared)
    found, common = live._changed(now.steps), live._common
    live._steps, live._ledger, live._shared = kept
    monkeypatch.setattr(_Grid, "of", classmethod(lambda cls, table: None))  # row by row, as any table
    assert found == live._changed(now.steps)
    assert all(np.array_equal(a, b) for a, b in zip(common, live._common))


@pytest.mark.parametrize("seed", range(6))
def test_the_rows_that_stay_and_the_fresh_ones_merged_are_their_sort(seed):
    rng = np.random.default_rng(seed)
    keys = rng.choice(1000, size=int(rng.integers(1, 200)), replace=False)
    first = int(rng.integers(0, len(keys) + 1))
    keys = np.r_[np.sort(keys[:first]), np.sort(keys[first:]) if seed % 3 else keys[first:]]  # the rest out of order
    assert np.array_equal(_merged(keys, first), stable_order(keys))
