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
from diagtrain.profiler.analyzer.run.live_ledger import (LiveLedger, _Grid, _GridRows, _identical, _merged, _Overlap,
                                                          _Rows)
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


@pytest.mark.parametrize("last", [5, 9])  # a window growing (grids of unlike widths), then one moving on
@pytest.mark.parametrize("change", [{}, {(2, 5): {"cpu_ms": 99.0}}, {(0, 5): {"runq_ms": np.nan}},
                                    {(4, 3): {"end": 0.95}}])
def test_the_steps_changed_as_arrays_of_ranks_by_steps_are_those_compared_row_by_row(change, last):
    live = LiveLedger()
    live.build(window(last - 1))
    now = window(last, change)
    grid = _Grid.of(now.steps)
    assert grid is not None
    found, common = live._changed(now.steps, grid), live._common
    assert (live._overlap is not None) == (last > 8)  # the steps held again as one stretch of each column
    live._steps_grid = None  # row by row, as any table
    assert found == live._changed(now.steps, None)
    assert all(np.array_equal(a, b) for a, b in zip(common, live._common))


def _column(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    """``n`` values of a type, with NaN, -0.0 and None among them."""
    values = rng.choice([0.0, -0.0, np.nan, 1.5, 2.0], size=n)
    if dtype == "object":
        return np.array([None if np.isnan(v) else v for v in values], dtype=object)
    return values.astype(dtype) if dtype.startswith("float") else (np.nan_to_num(values) * 2).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "bool", "object"])
@pytest.mark.parametrize("seed", range(6))
def test_the_overlap_of_two_grids_compares_their_common_cells_as_the_cells_do(seed, dtype):
    rng = np.random.default_rng(seed)
    ranks, width = int(rng.integers(1, 6)), int(rng.integers(2, 7))
    shift = int(rng.integers(1, width))
    was, now = _Grid(np.arange(ranks), np.arange(width)), _Grid(np.arange(ranks), np.arange(shift, shift + width))
    in_was, in_now = np.isin(was.steps, now.steps), np.isin(now.steps, was.steps)
    overlap = _Overlap.of(was, in_was, now, in_now)
    assert np.array_equal(overlap.steps, np.arange(shift, width))
    for _ in range(20):
        a = _column(rng, dtype, ranks * width)
        b = _column(rng, dtype, ranks * width)
        b.reshape(ranks, width)[:, :width - shift] = a.reshape(ranks, width)[:, shift:]  # the steps both hold
        changed = rng.random(ranks * width) < rng.choice([0.0, 0.05, 0.3])
        b[changed] = _column(rng, dtype, int(changed.sum()))
        cells_a, cells_b = was.cells(a, in_was), now.cells(b, in_now)
        assert overlap.identical(a, b) == _identical(cells_a, cells_b)
        unlike = overlap.unlike(a, b)
        if dtype == "object":
            assert unlike is None
        else:
            assert np.array_equal(unlike, (cells_a != cells_b).any(axis=0))


def _ledger_grid(ranks: np.ndarray, steps: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    """A ledger-like frame of every rank's every step, by rank, then step."""
    n = len(ranks) * len(steps)
    return pd.DataFrame({"rank": np.repeat(ranks, len(steps)), "step": np.tile(steps, len(ranks)),
                         "lost_ms": rng.random(n), "waited_for": rng.integers(-1, 5, n),
                         "cause_phase": pd.Series(rng.choice(np.array([None, "forward"], dtype=object), n),
                                                  dtype=object)})


@pytest.mark.parametrize("seed", range(8))
def test_the_rows_of_a_window_moved_on_are_put_together_as_row_by_row(seed):
    rng = np.random.default_rng(seed)
    ranks = np.sort(rng.choice(50, size=int(rng.integers(1, 6)), replace=False))
    width, moved = int(rng.integers(2, 8)), int(rng.integers(0, 3))
    last = _ledger_grid(ranks, np.arange(10, 10 + width), rng)
    again = int(rng.integers(0, 2))  # the last steps recorded again
    changed = set(range(10 + width - again, 10 + width + moved))
    fresh = _ledger_grid(ranks, np.array(sorted(changed), dtype=np.int64), rng)
    now = np.arange(10 + moved, 10 + width + moved)
    rows = _GridRows.of(_Grid.of(last), now, changed, _Grid.of(fresh))
    if not changed or moved + again >= width:
        assert rows is None  # nothing fresh, or nothing stays
        return
    plain = _Rows.of(last, now, changed, fresh)
    built = {}
    for c in last.columns:
        found = rows.gathered(last[c].to_numpy(), fresh[c].to_numpy())
        expected = plain.gathered(last[c].to_numpy(), fresh[c].to_numpy())
        assert found.dtype == expected.dtype and found.tolist() == expected.tolist()
        built[c] = found
    layout = _Grid.of(pd.DataFrame(built))
    assert np.array_equal(rows.layout.ranks, layout.ranks) and np.array_equal(rows.layout.steps, layout.steps)


def test_rows_not_a_run_followed_by_the_fresh_steps_are_not_put_together_as_a_grid():
    rng = np.random.default_rng(0)
    last = _Grid.of(_ledger_grid(np.arange(3), np.arange(1, 9), rng))
    now = np.arange(2, 10)
    assert _GridRows.of(last, now, {9}, _Grid(np.arange(3), np.array([9]))) is not None
    assert _GridRows.of(last, now, {5, 9}, _Grid(np.arange(3), np.array([5, 9]))) is None  # a step amid the rest
    assert _GridRows.of(last, now, {2}, _Grid(np.arange(3), np.array([2]))) is None  # fresh before those that stay
    assert _GridRows.of(last, now, {9}, _Grid(np.arange(4), np.array([9]))) is None  # a rank joined
    assert _GridRows.of(None, now, {9}, _Grid(np.arange(3), np.array([9]))) is None  # the last ledger not a grid


@pytest.mark.parametrize(("values", "only"), [
    (np.array([3, 1, 2, 3, 7]), np.array([3, 7])),
    (np.array([3, 1, 2, 3, 7]), np.array([3, 7], dtype=np.int32)),
    (np.array([3, 1, 2, 3, 7], dtype=np.uint64), np.array([3, 7], dtype=np.uint64)),
    (np.array([3.0, np.nan, 2.0]), np.array([np.nan, 2.0])),
    (np.array([3, None, "a"], dtype=object), np.array([None, 3], dtype=object)),
    (np.array([3, 1]), np.array([], dtype=np.int64)),
])
def test_the_positions_of_some_steps_are_those_isin_finds(values, only):
    expected = np.flatnonzero(pd.Series(values).isin(only).to_numpy())
    assert np.array_equal(job_time.positions_of(pd.Series(values), only), expected)


def test_a_window_whose_ledger_is_not_a_grid_for_a_while_is_the_whole_ledger_and_job():
    """A rank's step without its blocked time has no ledger row: the window's ledger is no grid until it leaves."""
    live = LiveLedger()
    for last in range(8, 20):
        gone = {(2, 10): {"comm_wait_ms": np.nan}} if last < 18 else {}
        t = window(last, gone)
        t.ledger = live.build(t)
        pd.testing.assert_frame_equal(t.ledger, ledger.build(t), check_exact=True)
        pd.testing.assert_frame_equal(live.job_steps(t), job_time.build(t), check_exact=True)
        assert (live._layout is None) == (10 <= last < 18)


@pytest.mark.parametrize("seed", range(6))
def test_the_rows_that_stay_and_the_fresh_ones_merged_are_their_sort(seed):
    rng = np.random.default_rng(seed)
    keys = rng.choice(1000, size=int(rng.integers(1, 200)), replace=False)
    first = int(rng.integers(0, len(keys) + 1))
    keys = np.r_[np.sort(keys[:first]), np.sort(keys[first:]) if seed % 3 else keys[first:]]  # the rest out of order
    assert np.array_equal(_merged(keys, first), stable_order(keys))
