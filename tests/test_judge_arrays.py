"""The ledger's price and the data-stall detector read with numpy where the pandas forms they replaced cost a live
judgement of 8,192 ranks milliseconds: the run's noise (a median per row of a (ranks, steps) array), the job's time
(the first rows' job times), the ranks but one, and whether every rank stalls. Held to those forms, to the bit, on
ledgers in rank-then-step order and not, with values missing, infinite, or of other types."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diagtrain.profiler.analyzer.judge.assessments import ledger_price
from diagtrain.profiler.analyzer.judge.detectors import dataloader_stall
from diagtrain.profiler.util.stats import MAD_TO_SIGMA


def random_ledger(seed: int) -> pd.DataFrame:
    """Ranks by steps, mostly in rank-then-step order with as many steps each (a live window's ledger), now and then
    shuffled, a row short, ranks out of order; running and job times now and then missing or infinite."""
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 30)), int(rng.integers(1, 12))
    rank_ids = np.sort(rng.choice(1000, ranks, replace=False)) if seed % 3 else np.arange(ranks)
    frame = pd.DataFrame({"rank": np.repeat(rank_ids, steps), "step": np.tile(np.arange(5, 5 + steps), ranks),
                          "running_ms": rng.random(ranks * steps) * 50,
                          "job_ms": (rng.random(steps) * 80)[np.tile(np.arange(steps), ranks)]})
    if seed % 2:  # ranks that tell the step's time apart: the first one's counts
        frame["job_ms"] += rng.random(len(frame))
    for column, share in (("running_ms", 0.05), ("job_ms", 0.2)):
        frame.loc[rng.random(len(frame)) < share, column] = np.nan
    if seed % 7 == 0:
        frame.loc[rng.random(len(frame)) < 0.05, "running_ms"] = np.inf
    if seed % 4 == 1:
        frame = frame.drop(index=int(rng.integers(0, len(frame)))).reset_index(drop=True)
    if seed % 5 == 2:
        frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    if seed % 6 == 3:
        frame["rank"] = frame["rank"].to_numpy()[::-1]  # ranks in descending order
    if seed % 9 == 4:
        frame["job_ms"] = frame["job_ms"].fillna(0).astype(np.int64)
    if seed % 11 == 5:
        frame["step"] = frame["step"].astype(float)
    return frame


def same(a: float, b: float) -> bool:
    """The same float, NaN included."""
    return np.float64(a).tobytes() == np.float64(b).tobytes()


@pytest.mark.parametrize("seed", range(80))
def test_the_noise_is_the_median_of_each_ranks_spread(seed: int) -> None:
    frame = random_ledger(seed)
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as both forms give it
        spread = [MAD_TO_SIGMA * np.median(np.abs(g.to_numpy() - np.median(g.to_numpy())))
                  for _, g in frame.groupby("rank")["running_ms"]]
        assert same(ledger_price.noise_ms(frame), float(pd.Series(spread).median()))


@pytest.mark.parametrize("seed", range(80))
def test_the_jobs_time_is_the_sum_of_each_steps_first_job_time(seed: int) -> None:
    frame = random_ledger(seed)
    if seed % 8 == 6:
        frame.loc[frame["rank"] == frame["rank"].iloc[0], "job_ms"] = np.nan  # the first rank's times missing
    steps = ledger_price.distinct(frame["step"])
    assert same(ledger_price._job_ms(frame, steps), float(frame.groupby("step")["job_ms"].first().sum()))


@pytest.mark.parametrize("ranks", [np.array([3, 1, 2, 1]), np.array([5, 0, 9], dtype=np.uint16),
                                   np.array([2.0, 7.0, 4.0]), np.array([4, 2], dtype=object), np.array([], dtype=int)])
def test_the_others_are_the_ranks_but_one_in_order(ranks: np.ndarray) -> None:
    for rank in [2, 4, 9]:
        others = ledger_price._others(ranks, rank)
        assert others == sorted(int(r) for r in ranks if r != rank)
        assert all(type(r) is int for r in others)


@pytest.mark.parametrize("seed", range(40))
def test_the_shared_stalls_are_those_every_rank_has(seed: int) -> None:
    """Few ranks stalling, or every one, in the same steps or not: the stalls the job shares as the plain form
    finds them (a set of every rank read one by one)."""
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 6)), int(rng.integers(2, 8))
    frame = pd.DataFrame({"rank": np.repeat(np.arange(ranks), steps), "step": np.tile(np.arange(steps), ranks),
                          "data_ms": rng.random(ranks * steps) * 10})
    stalled = rng.random(ranks * steps) < (0.9 if seed % 2 else 0.2)
    if seed % 3 == 0:
        stalled |= frame["step"].to_numpy() % 2 == 0  # every rank in the same steps
    frame.loc[stalled, "data_ms"] = 100.0
    stalls = frame[frame["data_ms"] >= 50]
    s = dataloader_stall.DataloaderStall.active()
    by_rank = {int(rank): rows for rank, rows in stalls.groupby("rank") if len(rows) >= s.min_steps}
    found = dataloader_stall._shared(frame, stalls, by_rank, s)
    expected = _plain_shared(frame, stalls, by_rank, s)
    assert (found is None and expected is None) or found.equals(expected)


def _plain_shared(steps: pd.DataFrame, stalls: pd.DataFrame, by_rank: dict[int, pd.DataFrame],
                  s: dataloader_stall.DataloaderStall) -> pd.DataFrame | None:
    """dataloader_stall._shared as it was: every rank read one by one."""
    ranks = set(int(r) for r in steps["rank"].unique())
    if len(ranks) < 2 or set(by_rank) != ranks:
        return None
    everyone = stalls.groupby("step")["rank"].nunique()
    common = set(everyone[everyone == len(ranks)].index)
    if not all(rows["step"].isin(common).mean() >= s.shared_share for rows in by_rank.values()):
        return None
    return stalls[stalls["step"].isin(common)]
