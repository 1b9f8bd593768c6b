"""Is NEW slower or heavier than BASE, beyond what two clean runs of this job on this machine differ by?

The verdict per metric is judged on each run's pace (:func:`noise.pace`: the quick quartile of its
steps) against the baseline runs' noise band (:mod:`noise`): a regression needs NEW's pace outside
the band, beyond ``--threshold`` and beyond a small absolute floor (a 0.4 ms phase going to 0.5 ms
is not "+25%"), and the per-step evidence to agree. With one baseline run the band is unknown: a
change the per-step statistics see but that stays inside the one-run ceiling is
*inconclusive*; so is one inside a band wider than that ceiling (baseline runs that differ more than
one run is assumed to), and any time that changed while NEW ran on another machine or beside more
load (:mod:`machine`). The per-step statistics (a one-sided Mann-Whitney U test and a bootstrap
interval of the ratio of medians, NEW's steps against the baseline runs' steps pooled) are shown as
evidence: they see the noise between steps of one run, never between runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from diagtrain.profiler.compare import findings as by_cause
from diagtrain.profiler.compare import machine, noise
from diagtrain.profiler.compare.thresholds import CompareSettings, in_force
from diagtrain.profiler.util.stats import bootstrap_ratio_of_medians, mann_whitney_greater

HIGHER_IS_BETTER = ("samples per second", "tokens per second")
UNITS = {"step time": "ms", "samples per second": "/s", "tokens per second": "/s", "peak memory": "MiB"}
LOAD_BOUND_UNITS = ("ms", "/s")  # what a busier host moves; peak memory it does not
VERDICTS = ("regression", "inconclusive", "improvement", "unchanged", "too few samples")


def keep_runs_hint() -> str:
    """The command that makes a baseline able to decide."""
    wanted = CompareSettings.active().recommended_runs
    runs = " ".join(f"RUN{i}" for i in range(1, wanted + 1))
    return f"keep {wanted} baseline runs: diagtrain baseline {runs} -o base.json"


@dataclass
class MetricResult:
    """One metric of one scope (the run, a rank, a collective) compared."""

    metric: str
    scope: str
    unit: str
    statistic: str  # what a run's value is: the quantile of its steps (noise.pace), "p25", "p75" or "median"
    base_value: float  # the baseline's typical value (geometric mean of its runs' values)
    new_value: float
    change_pct: float
    ci_low: float  # per-step evidence: bounds of the bootstrap interval of the ratio new/base
    ci_high: float
    p_value: float  # per-step evidence: one-sided Mann-Whitney U, NEW worse than BASE
    n_base: int  # steps, over all baseline runs
    n_new: int
    verdict: str  # one of VERDICTS
    base_p90: float = math.nan  # the slow tail, shown beside the paces (the verdict is on paces)
    new_p90: float = math.nan
    base_runs: list[float] = field(default_factory=list)  # each baseline run's value
    noise_low_pct: float = math.nan  # the noise band, as changes from base_value
    noise_high_pct: float = math.nan
    reason: str = ""  # why this verdict, in words

    @property
    def noise_band(self) -> str:
        """``-12%..+14% (3 runs)``, or the one-run ceiling, for a reader."""
        if math.isnan(self.noise_low_pct):
            return ""
        runs = len(self.base_runs)
        what = f"{runs} runs" if runs > 1 else "1 run: assumed"
        return f"{self.noise_low_pct:+.0f}%..{self.noise_high_pct:+.0f}% ({what})"


@dataclass
class Comparison:
    """Everything `diagtrain compare` reports."""

    base: str
    new: str
    threshold_pct: float
    base_runs: int
    results: list[MetricResult]
    findings: list[by_cause.FindingChange] = field(default_factory=list)
    machine: machine.MachineCheck = field(default_factory=machine.MachineCheck)
    notes: list[str] = field(default_factory=list)
    time_lost: list[dict[str, Any]] = field(default_factory=list)  # per cause: BASE's and NEW's cost (time_lost())
    settings: dict[str, Any] = field(default_factory=dict)  # the thresholds it judged with (thresholds.in_force)
    goodput: dict[str, float | None] = field(default_factory=dict)  # "base" (mean of its runs) and "new"

    @property
    def regressions(self) -> list[MetricResult]:
        """The regressions, the cause (a rank's phase) first and the run-level consequences after."""
        return self._ordered("regression")

    @property
    def inconclusive(self) -> list[MetricResult]:
        return self._ordered("inconclusive")

    @property
    def verdict(self) -> str:
        """``regression``, ``inconclusive`` (the data cannot tell code from machine noise) or ``no regression``."""
        if self.regressions:
            return "regression"
        return "inconclusive" if self.inconclusive or not self.judged else "no regression"

    @property
    def judged(self) -> bool:
        """Whether any metric had samples enough to be judged (a 1-step run has none)."""
        return any(r.verdict in ("unchanged", "improvement") for r in self.results)

    def changed(self, change: str) -> list[by_cause.FindingChange]:
        """The findings that changed this way (new, worse, resolved, better, unchanged)."""
        return [f for f in self.findings if f.change == change]

    def _ordered(self, verdict: str) -> list[MetricResult]:
        blamed = _blame(self.findings)
        return sorted((r for r in self.results if r.verdict == verdict),
                      key=lambda r: (*_scope_rank(r.scope, blamed), *_weight(r)))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict, "regression": bool(self.regressions),
                "regressions": [asdict(r) for r in self.regressions],
                "inconclusive": [asdict(r) for r in self.inconclusive]}


def mismatch(base: dict, new: dict) -> str | None:
    """Why two runs should not be compared (different strategy or world size), or None."""
    for key in ("strategy", "world_size"):
        if base.get(key) != new.get(key):
            return f"{key} differs: BASE {base.get(key)!r}, NEW {new.get(key)!r}"
    return None


def compare_anyway(base: list[dict], new: dict, threshold_pct: float, same_machine: bool = False) -> Comparison:
    """:func:`compare`, with the runs' first :func:`mismatch` kept as a note rather than refused
    (`diagtrain compare --allow-mismatch`, and the dashboard's Compare tab)."""
    result = compare(base, new, threshold_pct, same_machine=same_machine)
    problem = next((p for b in base if (p := mismatch(b, new))), None)
    if problem:
        result.notes.append(f"compared despite a mismatch: {problem}")
    return result


def compare(base: list[dict], new: dict, threshold_pct: float, same_machine: bool = False) -> Comparison:
    """Compare NEW's summary against the baseline runs' summaries (see summary.summarize).

    ``same_machine``: the user vouches that differently named hosts are the same hardware (CI runners).
    """
    check = machine.check(base, new, same_hosts=same_machine)
    comparison = Comparison(", ".join(b["source"] for b in base), new["source"], threshold_pct, len(base), [],
                            by_cause.compare_findings([b["findings"] for b in base], new["findings"]), check)
    step_ms = noise.typical([noise.pace(b["samples"]["step time"]) for b in base if b["samples"].get("step time")])
    metrics = list(_metrics(base, new))
    timing = [paces(runs, name in HIGHER_IS_BETTER) for _, name, unit, runs, _ in metrics
              if (unit or UNITS.get(name, "ms")) in LOAD_BOUND_UNITS
              and min(map(len, runs)) >= CompareSettings.active().min_samples]
    judge = _Judge(threshold_pct, check, step_ms, noise.shared_spread(timing))
    for scope, name, unit, runs, mine in metrics:
        comparison.results.append(judge.metric(name, scope, runs, mine, unit))
    comparison.notes += check.notes + settings_notes(base, new)
    comparison.time_lost = time_lost(base, new)
    comparison.goodput = goodput(base, new)
    comparison.settings = in_force()
    if len(base) == 1 and comparison.inconclusive:
        comparison.notes.append(f"One baseline run cannot tell a change below x{CompareSettings.active().one_run_ceiling:g} from the "
                                f"difference between two clean runs; {keep_runs_hint()}")
    return comparison


def time_lost(base: list[dict], new: dict) -> list[dict[str, Any]]:
    """Per cause of the runs' ledgers (a rank and the part of its step the others waited for): the job
    time it cost per step in BASE (mean over its runs, 0 where a run had no such cause) and in NEW,
    costliest in NEW first. Empty where no run recorded a ledger."""
    def per_cause(summary: dict) -> dict[tuple[int, str], float]:
        return {(c["rank"], c["part"]): c["per_step_ms"] for c in summary.get("time_lost") or []}

    theirs, mine = [per_cause(b) for b in base], per_cause(new)
    keys = set(mine).union(*theirs) if theirs else set(mine)
    rows = [{"rank": r, "part": part, "base_ms_per_step": float(np.mean([t.get((r, part), 0.0) for t in theirs])) if theirs else 0.0,
             "new_ms_per_step": mine.get((r, part), 0.0)} for r, part in keys]
    return sorted(rows, key=lambda x: (-x["new_ms_per_step"], -x["base_ms_per_step"], x["rank"], x["part"]))


def goodput(base: list[dict], new: dict) -> dict[str, float | None]:
    """BASE's goodput (the mean of its runs that measured it) and NEW's; None where none did. Shown, not judged:
    it holds the start-up, which a run's length alone moves."""
    def of(summary: dict) -> float | None:
        return (summary.get("job_time") or {}).get("goodput")

    theirs = [g for g in map(of, base) if g is not None]
    return {"base": float(np.mean(theirs)) if theirs else None, "new": of(new)}


def settings_notes(base: list[dict], new: dict) -> list[str]:
    """A note naming the analyzer settings that differ between BASE and NEW: their findings were judged
    by different thresholds, so a finding that appears or goes may be the settings' doing."""
    mine = new.get("settings") or {}
    changed = {}
    for b in base:
        theirs = b.get("settings") or {}
        changed.update({k: (theirs.get(k), mine.get(k)) for k in sorted(set(theirs) | set(mine))
                        if theirs and mine and theirs.get(k) != mine.get(k)})
    if not changed:
        return []
    return ["the findings were judged with different settings (BASE → NEW): "
            + ", ".join(f"{k} {old!r} → {now!r}" for k, (old, now) in changed.items())]


def _metrics(base: list[dict], new: dict):
    """(scope, metric, unit, each baseline run's samples, NEW's samples) for every metric all runs have."""
    for name in new["samples"]:
        if all(name in b["samples"] for b in base):
            yield "run", name, None, [b["samples"][name] for b in base], new["samples"][name]
    for rank in sorted(new["per_rank"], key=int):
        if all(rank in b["per_rank"] for b in base):
            for name in new["per_rank"][rank]:
                if all(name in b["per_rank"][rank] for b in base):
                    yield f"rank {rank}", name, None, [b["per_rank"][rank][name] for b in base], new["per_rank"][rank][name]
    for label in sorted(new["collectives"]):
        if all(label in b["collectives"] for b in base):
            yield label, "collective time", "ms", [b["collectives"][label] for b in base], new["collectives"][label]


@dataclass
class _Judge:
    """The verdict on one metric, with the threshold, machine check and step time of this comparison."""

    threshold_pct: float
    check: machine.MachineCheck
    step_ms: float  # the baseline's step time: what a change of one phase is weighed against from one run
    timing_spread: float  # the machine's spread between runs, shared by every timing metric (noise.shared_spread)

    def metric(self, name: str, scope: str, runs: list[list[float]], new: list[float], unit: str | None) -> MetricResult:
        unit = unit or UNITS.get(name, "ms")
        s = CompareSettings.active()
        ceiling = s.one_run_ceiling_memory if unit == "MiB" else s.one_run_ceiling
        floor = self.timing_spread if unit in LOAD_BOUND_UNITS else s.min_log_spread
        run_paces = paces(runs, name in HIGHER_IS_BETTER, unit in LOAD_BOUND_UNITS)
        band = noise.band(run_paces, ceiling, floor)
        result, worse, better = self._evidence(name, scope, unit, runs, run_paces, np.asarray(new, float), band)
        if min([len(r) for r in runs] + [len(new)]) < s.min_samples:
            result.verdict, result.reason = "too few samples", f"fewer than {s.min_samples} steps in a run"
        else:
            result.verdict, result.reason = self._verdict(result, band, worse, better, ceiling)
            if unit in LOAD_BOUND_UNITS and self.check.loaded_base and result.verdict in ("unchanged", "improvement"):
                # A slower NEW hides under a slowed BASE; a NEW slower even than that is still a regression.
                result.verdict, result.reason = "inconclusive", (
                    "; ".join(self.check.loaded_base) + ": the baseline's own load could hide a regression of NEW "
                    "(rerun the baseline where the host is as quiet as NEW's)")
        return result

    def _evidence(self, name: str, scope: str, unit: str, runs: list[list[float]], run_paces: list[float],
                  n: np.ndarray, band: noise.NoiseBand) -> tuple[MetricResult, bool, bool]:
        """The metric's numbers, and whether the per-step evidence says worse, or better."""
        pooled = np.concatenate([np.asarray(r, float) for r in runs])
        higher_better, load_bound = name in HIGHER_IS_BETTER, unit in LOAD_BOUND_UNITS
        q = noise.pace_quantile(higher_better, load_bound)
        bm = band.center if band.runs else noise.pace(pooled, higher_better, load_bound)
        nm = noise.pace(n, higher_better, load_bound)
        low, high = bootstrap_ratio_of_medians(n, pooled)
        worse_p = mann_whitney_greater(pooled, n) if higher_better else mann_whitney_greater(n, pooled)
        better_p = mann_whitney_greater(n, pooled) if higher_better else mann_whitney_greater(pooled, n)
        result = MetricResult(name, scope, unit, "median" if q == 50 else f"p{q:g}", bm, nm,
                              (nm / bm - 1) * 100 if bm else math.nan, low, high, worse_p,
                              len(pooled), len(n), "unchanged", base_p90=_p90(pooled), new_p90=_p90(n),
                              base_runs=[round(m, 6) for m in run_paces],
                              noise_low_pct=(band.low - 1) * 100, noise_high_pct=(band.high - 1) * 100)
        alpha = CompareSettings.active().step_alpha
        worse = self._beyond(result, True, higher_better) and worse_p < alpha and (high < 1 if higher_better else low > 1)
        better = self._beyond(result, False, higher_better) and better_p < alpha and (low > 1 if higher_better else high < 1)
        return result, worse, better

    def _verdict(self, r: MetricResult, band: noise.NoiseBand, worse: bool, better: bool, ceiling: float) -> tuple[str, str]:
        worse_side, better_side = ("below", "above") if r.metric in HIGHER_IS_BETTER else ("above", "below")
        position = band.position(r.new_value)
        s = CompareSettings.active()
        share = s.material_step_share if band.measured else s.one_run_step_share
        small = r.unit == "ms" and r.metric != "step time" and r.new_value - r.base_value < share * self.step_ms
        if position == worse_side and worse and not small:
            return self._regression(r, band)
        if position == worse_side and worse and band.measured:
            return "unchanged", (f"beyond the noise band {r.noise_band}, but +{r.new_value - r.base_value:.1f} ms is "
                                 f"under {share:.0%} of a step: it does not move the job")
        if position == better_side and better:
            return "improvement", f"beyond the noise band {r.noise_band}"
        if worse and not band.measured:
            why = f"{r.change_pct:+.0f}% is within the x{ceiling:g} two clean runs can differ by" \
                if position != worse_side else \
                f"+{r.new_value - r.base_value:.1f} ms is under {s.one_run_step_share:.0%} of a step"
            return "inconclusive", f"the steps differ, but {why}"
        if not band.measured and self._beyond(r, True, r.metric in HIGHER_IS_BETTER):
            # One run cannot measure the noise, nor can its steps vouch for the change: never "unchanged".
            needed = noise.runs_needed(r.new_value / r.base_value if r.base_value else math.nan)
            return "inconclusive", (f"{r.change_pct:+.0f}% is within the x{ceiling:g} two clean runs can differ by, and "
                                    "the steps do not say it beyond their own noise: add baseline runs"
                                    + (f" (at least {needed} to decide a change this size, if clean runs of this job "
                                       "agree closely; more if they spread more)" if needed else ""))
        if worse and band.high > ceiling:  # the baseline's runs knew no better than one run would
            return "inconclusive", (f"the steps differ, but the {band.runs} baseline runs differ so much (noise band "
                                    f"{r.noise_band}) that no change below x{band.high:.1f} can be told from it; "
                                    "rerun the baseline where the host is quieter, or keep more runs")
        return "unchanged", f"within the noise band {r.noise_band}" if band.measured else "the steps do not differ"

    def _regression(self, result: MetricResult, band: noise.NoiseBand) -> tuple[str, str]:
        """A regression, unless the machine explains it: then inconclusive, saying which difference."""
        machine_said = self.check.different + (self.check.contention if result.unit in LOAD_BOUND_UNITS else [])
        if machine_said:
            return "inconclusive", "; ".join(machine_said) + ": not a code change until rerun on the same machine"
        return "regression", (f"beyond the noise band {result.noise_band}" if band.measured else
                              f"beyond x{band.high:g}, more than two clean runs differ by")

    def _beyond(self, r: MetricResult, worse: bool, higher_better: bool) -> bool:
        """Whether the change passes --threshold and the absolute floor, on the worse (or better) side."""
        s = CompareSettings.active()
        floor = {"ms": s.min_change_ms, "MiB": s.min_change_mib}.get(r.unit, 0.0)  # a throughput has none
        if math.isnan(r.change_pct) or abs(r.new_value - r.base_value) < floor:
            return False
        signed = -r.change_pct if higher_better else r.change_pct
        return signed > self.threshold_pct if worse else signed < -self.threshold_pct


def paces(runs: list[list[float]], higher_is_better: bool = False, load_bound: bool = True) -> list[float]:
    """Each run's pace (:func:`noise.pace`; runs without samples left out)."""
    return [noise.pace(r, higher_is_better, load_bound) for r in runs if len(r)]


def _blame(findings: list[by_cause.FindingChange]) -> dict[int, tuple[int, int]]:
    """Each rank a new or worse finding names, with how strongly (lower first): the most severe, then the
    most specific finding naming it. A new straggler on rank 1 outranks busy-host information on ranks 0-1."""
    blame: dict[int, tuple[int, int]] = {}
    for f in findings:
        if f.change in ("new", "worse"):
            strength = (-by_cause.SEVERITIES.index(f.severity), len(f.ranks))
            for rank in f.ranks:
                blame[rank] = min(blame.get(rank, strength), strength)
    return blame


def _scope_rank(scope: str, blamed: dict[int, tuple[int, int]]) -> tuple[int, int, int]:
    """Root cause first: the ranks new or worse findings name (most strongly first), other ranks,
    collectives, then the run."""
    if scope.startswith("rank "):
        rank = int(scope.split()[1])
        return (0, *blamed[rank]) if rank in blamed else (1, 0, 0)
    return (3, 0, 0) if scope == "run" else (2, 0, 0)


def _weight(r: MetricResult) -> tuple[int, float]:
    """Times by the milliseconds they added to a step (a 5 ms phase tripling explains less than a
    100 ms one growing by half), then other units by their relative change."""
    if r.unit == "ms":
        return 0, -abs(_finite(r.new_value - r.base_value))
    return 1, -abs(_finite(r.change_pct))


def _p90(values: np.ndarray) -> float:
    return float(np.percentile(values, 90)) if len(values) else math.nan


def _finite(x: float) -> float:
    return 0.0 if math.isnan(x) else x
