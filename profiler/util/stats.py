"""Statistics for telling a real change from noise: Mann-Whitney U, a bootstrap of medians."""

from __future__ import annotations

import math

import numpy as np

BOOTSTRAP_RESAMPLES = 2000  # enough for a stable 95% interval; cheap for a few hundred steps
SEED = 0  # the same inputs always give the same interval (CI must be reproducible)
MAD_TO_SIGMA = 1.4826  # median absolute deviation of a normal distribution, in standard deviations


def median_known(values: np.ndarray) -> float:
    """The median of the values that are not NaN (NaN if none is), the number pandas' ``Series.median``
    gives (np.nanmedian of the known values, which is np.median of them) without building a Series."""
    known = values[~np.isnan(values)]
    return float(np.median(known)) if len(known) else math.nan


def mann_whitney_greater(new: np.ndarray, base: np.ndarray) -> float:
    """One-sided p-value that ``new`` tends to be larger than ``base`` (normal approximation, ties corrected)."""
    new, base = np.asarray(new, float), np.asarray(base, float)
    n1, n2 = len(new), len(base)
    if n1 == 0 or n2 == 0:
        return math.nan
    combined = np.concatenate([new, base])
    ranks = _ranks(combined)
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    _, counts = np.unique(combined, return_counts=True)
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - (counts**3 - counts).sum() / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 0.5
    z = (u - mean - 0.5) / math.sqrt(variance)  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def bootstrap_ratio_of_medians(new: np.ndarray, base: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """A ``level`` percentile interval for median(new) / median(base)."""
    new, base = np.asarray(new, float), np.asarray(base, float)
    if len(new) == 0 or len(base) == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(SEED)
    new_medians = np.median(rng.choice(new, (BOOTSTRAP_RESAMPLES, len(new))), axis=1)
    base_medians = np.median(rng.choice(base, (BOOTSTRAP_RESAMPLES, len(base))), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = new_medians / base_medians
    ratios[~np.isfinite(ratios)] = np.nan  # a zero median on either side: no ratio, not infinity
    tail = (1 - level) / 2 * 100
    return float(np.nanpercentile(ratios, tail)), float(np.nanpercentile(ratios, 100 - tail))


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom: bisection on its CDF,
    from the regularized incomplete beta function (scipy is no dependency of diagtrain)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-9 * max(1.0, high):
            break
    return (low + high) / 2


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) for x >= 0."""
    return 1.0 - 0.5 * _betainc(df / 2, 0.5, df / (df + x * x))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (its continued fraction, Lentz's method)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * f / a


def rate_change(flags: np.ndarray) -> tuple[int, float]:
    """Where a 0/1 series most likely changed from one rate of ones to a higher one: the index of the first
    element after the change, and twice the log-likelihood ratio of two Bernoulli rates (before, after) against
    one for the whole series (0.0 at index 0 where no split fits better)."""
    x = np.asarray(flags, dtype=float)
    n = len(x)
    if n < 2:
        return 0, 0.0
    ones_before = np.cumsum(x)[:-1]  # ones among the first k elements, k = 1..n-1
    k = np.arange(1, n)
    before, after = ones_before / k, (x.sum() - ones_before) / (n - k)
    split = k * _bernoulli_ll(before) + (n - k) * _bernoulli_ll(after)
    llr = 2 * (split - n * _bernoulli_ll(np.array([x.mean()]))[0])
    llr = np.where(after > before, llr, -np.inf)  # only a rise: a cause that began
    best = int(np.argmax(llr))
    return (int(k[best]), float(llr[best])) if np.isfinite(llr[best]) else (0, 0.0)


def _bernoulli_ll(p: np.ndarray) -> np.ndarray:
    """The mean log-likelihood of one element of a Bernoulli series with rate ``p`` (0 log 0 taken as 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num(p * np.log(p)) + np.nan_to_num((1 - p) * np.log(1 - p))
