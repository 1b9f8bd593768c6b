"""How far apart two clean runs of one job land on one machine: the between-run noise a change must exceed.

Each run is reduced to its *pace* per metric (:func:`pace`: the quick quartile of its steps). With
k >= 2 baseline runs the spread of their paces
is measured on a log scale (timings vary by factors: a busy host makes every step ~x1.3, not +30 ms)
and NEW's pace is judged against a one-sided Student-t *prediction interval* for one more run:

    log(new) > mean(log base) + t(1 - alpha, k - 1) * sd(log base) * sqrt(1 + 1/k)

Why this test and not a permutation or rank test over runs: with the 2-5 baseline runs a CI can
afford, a rank test of one new run against k baseline runs can never reach a p-value below
1/(k + 1) (0.25 with 3 runs), so it could never fail a build. The t interval uses what few runs
tell (their spread) and pays for knowing it poorly through the heavy tails of t with k - 1 degrees
of freedom (4.30 with 3 runs at the default alpha). A metric's spread is taken as at least the median spread of
the job's timing metrics (:func:`shared_spread`): a partial pooling, since the machine's noise moves
them all and three runs can agree on one metric by luck. The step-level statistics (Mann-Whitney, bootstrap) stay as
evidence: they see the noise between steps of one run, never between runs.

With one baseline run the between-run spread is unknown: a change counts only beyond
``one_run_ceiling`` (``one_run_ceiling_memory`` for memory), the largest ratio clean runs of one job were
seen to differ by, with margin. Every number here is a setting (compare/thresholds.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from diagtrain.profiler.compare.thresholds import CompareSettings
from diagtrain.profiler.util import stats

@dataclass
class NoiseBand:
    """The range of ratios new/base one more clean run may take, from k baseline runs' paces."""

    runs: int
    center: float  # the baseline's typical pace (geometric mean of the runs' paces)
    low: float  # ratio to ``center`` below which NEW is lower than noise explains
    high: float  # ratio to ``center`` above which NEW is higher than noise explains
    spread: float  # the runs' paces' relative spread (sd of their logs, as a ratio - 1)
    measured: bool  # False: one run, the band is the one-run ceiling, not measured

    def position(self, value: float) -> str:
        """``above``, ``below`` or ``inside`` the band."""
        ratio = value / self.center if self.center > 0 else math.nan
        if math.isnan(ratio):
            return "inside"
        return "above" if ratio > self.high else "below" if ratio < self.low else "inside"

def pace(samples: list[float] | np.ndarray, higher_is_better: bool = False, load_bound: bool = True) -> float:
    """A run's value of one metric from its steps: the quick quartile (``pace_quantile``) for what a busy host
    slows, from the high side for a throughput; the median for what it does not (memory). NaN without steps."""
    values = np.asarray(samples, float)
    return float(np.percentile(values, pace_quantile(higher_is_better, load_bound))) if len(values) else math.nan

def pace_quantile(higher_is_better: bool = False, load_bound: bool = True) -> float:
    """The percentile of a run's steps :func:`pace` takes."""
    if not load_bound:
        return 50.0
    quantile = CompareSettings.active().pace_quantile
    return 100.0 - quantile if higher_is_better else float(quantile)

def t_quantile(df: int) -> float:
    """The one-sided 1 - ``between_runs_alpha`` quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("t needs at least one degree of freedom")
    return stats.t_quantile(1 - CompareSettings.active().between_runs_alpha, df)

def runs_needed(ratio: float, most: int = 50) -> int | None:
    """The fewest baseline runs whose band could place a change of ``ratio`` outside it, were their paces as
    close as the smallest spread the band takes (``min_spread_pct``): a lower bound; None past ``most`` or for
    no change."""
    change = abs(math.log(ratio)) if ratio > 0 and math.isfinite(ratio) else 0.0
    spread = CompareSettings.active().min_log_spread
    return next((k for k in range(2, most + 1) if t_quantile(k - 1) * spread * math.sqrt(1 + 1 / k) < change), None)


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
    return float(np.median(spreads)) if spreads else CompareSettings.active().min_log_spread

def band(run_paces: list[float], ceiling: float | None = None, floor: float | None = None) -> NoiseBand:
    """The noise band of one metric from the paces of the baseline's runs (all > 0); ``ceiling``
    is the band of a single run, ``floor`` the smallest spread taken (see :func:`shared_spread`); the
    settings' where not given."""
    s = CompareSettings.active()
    ceiling = s.one_run_ceiling if ceiling is None else ceiling
    floor = s.min_log_spread if floor is None else floor
    values = np.asarray([v for v in run_paces if v > 0 and math.isfinite(v)], float)
    if len(values) == 0:
        return NoiseBand(0, math.nan, math.nan, math.nan, math.nan, False)
    logs = np.log(values)
    center = typical(list(values))
    if len(values) == 1:
        return NoiseBand(1, center, 1 / ceiling, ceiling, math.nan, False)
    sd = max(float(logs.std(ddof=1)), floor, s.min_log_spread)
    half = t_quantile(len(values) - 1) * sd * math.sqrt(1 + 1 / len(values))
    return NoiseBand(len(values), center, math.exp(-half), math.exp(half), math.exp(sd) - 1, True)
