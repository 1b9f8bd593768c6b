"""How far apart two clean runs of one job land on one machine: the between-run noise a change must exceed.

Each run is reduced to its *pace* per metric (:func:`pace`: the quick quartile of its steps). With
k >= 2 baseline runs the spread of their paces
is measured on a log scale (timings vary by factors: a busy host makes every step ~x1.3, not +30 ms)
and NEW's pace is judged against a one-sided Student-t *prediction interval* for one more run:

    log(new) > mean(log base) + t(1 - ALPHA, k - 1) * sd(log base) * sqrt(1 + 1/k)

Why this test and not a permutation or rank test over runs: with the 2-5 baseline runs a CI can
afford, a rank test of one new run against k baseline runs can never reach a p-value below
1/(k + 1) (0.25 with 3 runs), so it could never fail a build. The t interval uses what few runs
tell (their spread) and pays for knowing it poorly through the heavy tails of t with k - 1 degrees
of freedom (4.30 with 3 runs at ALPHA). A metric's spread is taken as at least the median spread of
the job's timing metrics (:func:`shared_spread`): a partial pooling, since the machine's noise moves
them all and three runs can agree on one metric by luck. The step-level statistics (Mann-Whitney, bootstrap) stay as
evidence: they see the noise between steps of one run, never between runs.

With one baseline run the between-run spread is unknown: a change counts only beyond
ONE_RUN_CEILING (ONE_RUN_CEILING_MEMORY for memory), the largest ratio clean runs of one job were
seen to differ by, with margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The textbook 95% prediction interval for one more run (2.5% in each tail): a clean run lands above
# it once in 40 comparisons of one metric; a busier host, the usual cause, is caught apart (machine.py).
# At 1% (t = 6.96 with 3 runs) a 3x slowdown of a phase stayed inside the band beside two CPU hogs.
ALPHA = 0.025
# One-sided t quantiles at 1 - ALPHA by degrees of freedom (k - 1). Standard tables; scipy is no
# dependency of diagtrain. Between entries the next lower df is used (a wider, safer interval).
T_QUANTILES = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
               10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}
# Clean runs of one job on a busy 2-core host had median step times of 89, 139, 147 and 158 ms
# (x1.8 apart); one run cannot know its spread, so only a change beyond x2.5 is called from one run.
ONE_RUN_CEILING = 2.5
# Beside other jobs a phase of a few ms can grow x3 between clean runs (a preemption costs a whole
# time slice: rank 1's 7 ms "metrics" phase took 26 ms in the next run). From one run a phase or
# collective must also grow by this share of a step: clean runs' step times differed by up to ~20%.
ONE_RUN_STEP_SHARE = 0.25
# From several runs too, a phase or collective must grow by this share of a step to fail a build:
# a preemption costs a few-ms phase a whole time slice (2 ms -> 5 ms between clean runs of a 100 ms
# step, beyond three runs' band); a change under 5% of a step is the step time's to show, not a phase's.
MATERIAL_STEP_SHARE = 0.05
# Peak memory of clean runs of one job differed by up to 9% here (491-536 MiB, allocator and RSS
# timing); it does not follow the host's load, so its one-run ceiling is lower, with margin.
ONE_RUN_CEILING_MEMORY = 1.5
# The spread of k runs' paces is never taken as smaller than this (log scale, ~2%): quartiles of a
# few dozen steps are not known better, and identical paces would make any change "significant".
MIN_LOG_SPREAD = math.log(1.02)
# A run's pace is the quartile of its steps that other work leaves alone, not their median: a busy host
# only ever adds time, and to a stretch of a run (clean runs here had steps 7-22 of 30 a third slower,
# their medians +25%), while a code change moves every step. 250 comparisons of a clean run against 3 of
# 12 others: 15 false regressions on medians, 3 on the quartile; a +30 ms straggler on one rank's
# 45 ms forward was caught against 39 of 40 baselines, 27 on medians. A slowdown of a quarter of the
# steps or fewer is the findings' to show (time lost per cause), not the gate's.
PACE_QUANTILE = 25
RECOMMENDED_RUNS = 3  # the fewest runs whose t interval (4.30 sd; 12.7 with 2 runs) is narrow enough to be useful


@dataclass
class NoiseBand:
    """The range of ratios new/base one more clean run may take, from k baseline runs' paces."""

    runs: int
    center: float  # the baseline's typical pace (geometric mean of the runs' paces)
    low: float  # ratio to ``center`` below which NEW is lower than noise explains
    high: float  # ratio to ``center`` above which NEW is higher than noise explains
    spread: float  # the runs' paces' relative spread (sd of their logs, as a ratio - 1)
    measured: bool  # False: one run, the band is ONE_RUN_CEILING, not measured

    def position(self, value: float) -> str:
        """``above``, ``below`` or ``inside`` the band."""
        ratio = value / self.center if self.center > 0 else math.nan
        if math.isnan(ratio):
            return "inside"
        return "above" if ratio > self.high else "below" if ratio < self.low else "inside"


def pace(samples: list[float] | np.ndarray, higher_is_better: bool = False, load_bound: bool = True) -> float:
    """A run's value of one metric from its steps: the quick quartile (PACE_QUANTILE) for what a busy host
    slows, from the high side for a throughput; the median for what it does not (memory). NaN without steps."""
    values = np.asarray(samples, float)
    return float(np.percentile(values, pace_quantile(higher_is_better, load_bound))) if len(values) else math.nan


def pace_quantile(higher_is_better: bool = False, load_bound: bool = True) -> float:
    """The percentile of a run's steps :func:`pace` takes."""
    if not load_bound:
        return 50.0
    return 100.0 - PACE_QUANTILE if higher_is_better else float(PACE_QUANTILE)


def t_quantile(df: int) -> float:
    """The one-sided 1 - ALPHA quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("t needs at least one degree of freedom")
    return T_QUANTILES[max(d for d in T_QUANTILES if d <= df)]


def typical(values: list[float]) -> float:
    """The geometric mean of the positive values (NaN without any): a typical run's pace."""
    logs = np.log([v for v in values if v > 0 and math.isfinite(v)])
    return float(np.exp(logs.mean())) if len(logs) else math.nan


def log_spread(run_paces: list[float]) -> float | None:
    """The sample standard deviation of the logs of the positive run paces (None below two)."""
    logs = np.log([v for v in run_paces if v > 0 and math.isfinite(v)])
    return float(logs.std(ddof=1)) if len(logs) >= 2 else None


def shared_spread(metrics: list[list[float]]) -> float:
    """The median spread over a job's timing metrics (each a list of run paces): the machine's noise,
    which every timing metric of the job shares. Three runs that happen to agree on one metric within
    2% say little about it (seen here: optimizer 9.8, 9.5, 9.5 ms, then 11.4 ms in the next clean run)."""
    spreads = [s for m in metrics if (s := log_spread(m)) is not None]
    return float(np.median(spreads)) if spreads else MIN_LOG_SPREAD


def band(run_paces: list[float], ceiling: float = ONE_RUN_CEILING, floor: float = MIN_LOG_SPREAD) -> NoiseBand:
    """The noise band of one metric from the paces of the baseline's runs (all > 0); ``ceiling``
    is the band of a single run, ``floor`` the smallest spread taken (see :func:`shared_spread`)."""
    values = np.asarray([v for v in run_paces if v > 0 and math.isfinite(v)], float)
    if len(values) == 0:
        return NoiseBand(0, math.nan, math.nan, math.nan, math.nan, False)
    logs = np.log(values)
    center = typical(list(values))
    if len(values) == 1:
        return NoiseBand(1, center, 1 / ceiling, ceiling, math.nan, False)
    sd = max(float(logs.std(ddof=1)), floor, MIN_LOG_SPREAD)
    half = t_quantile(len(values) - 1) * sd * math.sqrt(1 + 1 / len(values))
    return NoiseBand(len(values), center, math.exp(-half), math.exp(half), math.exp(sd) - 1, True)
