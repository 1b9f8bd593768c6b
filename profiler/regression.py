"""Is NEW slower or heavier than BASE? Per metric: the change, a bootstrap interval of the ratio of
medians, a Mann-Whitney U test, and a verdict that needs all three to agree.

A regression needs the change of the medians beyond the threshold (and beyond a small absolute
floor, so a 0.4 ms phase going to 0.5 ms is not "+25%"), a one-sided Mann-Whitney p-value below
ALPHA, and the 95% interval of the ratio entirely on the worse side of 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from diagtrain.profiler.stats import bootstrap_ratio_of_medians, mann_whitney_greater

ALPHA = 0.01  # one false alarm in a hundred comparisons of identical distributions
MIN_SAMPLES = 5  # fewer steps than this cannot tell a change from noise
ABS_FLOOR = {"ms": 1.0, "MiB": 16.0, "/s": 0.0}  # smallest change worth a verdict, per unit
HIGHER_IS_BETTER = ("samples per second", "tokens per second")
UNITS = {"step time": "ms", "samples per second": "/s", "tokens per second": "/s", "peak memory": "MiB"}


@dataclass
class MetricResult:
    """One metric of one scope (the run, a rank, a collective) compared."""

    metric: str
    scope: str
    unit: str
    base_median: float
    new_median: float
    change_pct: float
    ci_low: float  # bounds of the ratio new/base
    ci_high: float
    p_value: float
    n_base: int
    n_new: int
    verdict: str  # regression | improvement | unchanged | too few samples
    base_p90: float = math.nan  # the slow tail, shown beside the medians (the verdict is on medians)
    new_p90: float = math.nan


@dataclass
class Comparison:
    """Everything `diagtrain compare` reports."""

    base: str
    new: str
    threshold_pct: float
    results: list[MetricResult]
    findings_new: list[dict] = field(default_factory=list)
    findings_resolved: list[dict] = field(default_factory=list)
    findings_unchanged: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[MetricResult]:
        return [r for r in self.results if r.verdict == "regression"]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "regression": bool(self.regressions),
                "regressions": [asdict(r) for r in self.regressions]}


def mismatch(base: dict, new: dict) -> str | None:
    """Why two runs should not be compared (different strategy or world size), or None."""
    for key in ("strategy", "world_size"):
        if base.get(key) != new.get(key):
            return f"{key} differs: BASE {base.get(key)!r}, NEW {new.get(key)!r}"
    return None


def compare(base: dict, new: dict, threshold_pct: float) -> Comparison:
    """Compare two run summaries (see run_summary.summarize)."""
    results = [_metric(name, "run", base["samples"][name], new["samples"][name], threshold_pct)
               for name in base["samples"] if name in new["samples"]]
    for rank in sorted(set(base["per_rank"]) & set(new["per_rank"]), key=int):
        b, n = base["per_rank"][rank], new["per_rank"][rank]
        results += [_metric(name, f"rank {rank}", b[name], n[name], threshold_pct) for name in b if name in n]
    for label in sorted(set(base["collectives"]) & set(new["collectives"])):
        results.append(_metric("collective time", label, base["collectives"][label], new["collectives"][label],
                               threshold_pct, unit="ms"))
    comparison = Comparison(base["source"], new["source"], threshold_pct, results)
    _findings(comparison, base["findings"], new["findings"])
    return comparison


def _metric(name: str, scope: str, base: list[float], new: list[float], threshold_pct: float,
            unit: str | None = None) -> MetricResult:
    unit = unit or UNITS.get(name, "ms")
    b, n = np.asarray(base, float), np.asarray(new, float)
    bm, nm = (float(np.median(b)) if len(b) else math.nan), (float(np.median(n)) if len(n) else math.nan)
    change = (nm / bm - 1) * 100 if bm else math.nan
    low, high = bootstrap_ratio_of_medians(n, b)
    higher_better = name in HIGHER_IS_BETTER
    worse_p = mann_whitney_greater(b, n) if higher_better else mann_whitney_greater(n, b)
    better_p = mann_whitney_greater(n, b) if higher_better else mann_whitney_greater(b, n)
    if min(len(b), len(n)) < MIN_SAMPLES:
        verdict = "too few samples"
    elif _beyond(change, nm - bm, threshold_pct, unit, worse=True, higher_better=higher_better) and worse_p < ALPHA and \
            (high < 1 if higher_better else low > 1):
        verdict = "regression"
    elif _beyond(change, nm - bm, threshold_pct, unit, worse=False, higher_better=higher_better) and better_p < ALPHA and \
            (low > 1 if higher_better else high < 1):
        verdict = "improvement"
    else:
        verdict = "unchanged"
    return MetricResult(name, scope, unit, bm, nm, change, low, high, worse_p, len(b), len(n), verdict,
                        base_p90=_p90(b), new_p90=_p90(n))


def _p90(values: np.ndarray) -> float:
    return float(np.percentile(values, 90)) if len(values) else math.nan


def _beyond(change_pct: float, delta: float, threshold_pct: float, unit: str, worse: bool, higher_better: bool) -> bool:
    if math.isnan(change_pct) or abs(delta) < ABS_FLOOR.get(unit, 0.0):
        return False
    signed = -change_pct if higher_better else change_pct
    return signed > threshold_pct if worse else signed < -threshold_pct


def _findings(comparison: Comparison, base: list[dict], new: list[dict]) -> None:
    key = lambda f: (f["kind"], tuple(f["ranks"]))  # noqa: E731 - a one-line identity of a finding
    base_keys, new_keys = {key(f) for f in base}, {key(f) for f in new}
    comparison.findings_new = [f for f in new if key(f) not in base_keys]
    comparison.findings_resolved = [f for f in base if key(f) not in new_keys]
    comparison.findings_unchanged = [f for f in new if key(f) in base_keys]
