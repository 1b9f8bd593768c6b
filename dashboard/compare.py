"""Compare: two runs side by side, with the verdicts and statistics of `diagtrain compare BASE NEW`."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from diagtrain.dashboard.data import RunData
from diagtrain.profiler.compare import regression, report

BY_CAUSE = "Findings, by cause:"  # the heading of the list `diagtrain compare` ends with


def comparison(base: RunData, new: RunData, threshold_pct: float) -> regression.Comparison:
    """The same comparison `diagtrain compare BASE NEW --threshold --allow-mismatch` makes (BASE: one run)."""
    return regression.compare_anyway([base.summary()], new.summary(), threshold_pct)


def verdict(result: regression.Comparison) -> str:
    """The headline `diagtrain compare` prints, capitalised."""
    line = report.headline(result)
    return line[0].upper() + line[1:]


def changes(result: regression.Comparison) -> list[str]:
    """What `diagtrain compare` lists above its table (causes, regressions, undecided metrics, notes),
    then its findings by cause: the same lines, from the same functions."""
    return [line.replace("**", "") for line in report.lines(result)] + result.notes + \
        [BY_CAUSE] + report.by_cause(result)


def rows(result: regression.Comparison) -> list[dict[str, Any]]:
    """One row per metric and scope, in the order of `diagtrain compare`'s table."""
    out = []
    for r in report.shown(result):
        d = asdict(r)
        out.append({"metric": d["metric"], "scope": d["scope"], "unit": d["unit"], "verdict": d["verdict"],
                    "band": r.noise_band, "reason": d["reason"], "statistic": d["statistic"],
                    "base": _round(d["base_value"]), "new": _round(d["new_value"]),
                    "p90": f"{_round(d['base_p90'])} → {_round(d['new_p90'])}",
                    "change": "" if math.isnan(d["change_pct"]) else f"{d['change_pct']:+.1f}%",
                    "interval": "" if math.isnan(d["ci_low"]) else f"{d['ci_low']:.3f}-{d['ci_high']:.3f}",
                    "p": "" if math.isnan(d["p_value"]) else f"{d['p_value']:.2g}",
                    "n": f"{d['n_base']}/{d['n_new']}"})
    return out


COLUMNS = [{"name": n, "id": i} for n, i in (
    ("metric", "metric"), ("scope", "scope"), ("verdict", "verdict"), ("BASE pace", "base"), ("NEW pace", "new"),
    ("of the steps", "statistic"),
    ("unit", "unit"), ("change", "change"), ("noise band", "band"), ("why", "reason"), ("p90 BASE → NEW", "p90"),
    ("95% interval of NEW/BASE (steps)", "interval"), ("Mann-Whitney p (steps)", "p"), ("steps BASE/NEW", "n"))]


def step_times(base: RunData, new: RunData) -> dict[str, Any]:
    """The per-step time of both runs (after warm-up), side by side."""
    data = []
    for label, run in (("BASE", base), ("NEW", new)):
        samples = run.summary()["samples"]["step time"]
        data.append({"type": "box", "name": f"{label}: {run.path.name}", "y": samples, "boxpoints": "all",
                     "jitter": 0.4, "pointpos": 0})
    return {"data": data, "layout": {"title": {"text": "Step time per step (ms), warm-up excluded"}, "height": 380,
                                     "yaxis": {"title": {"text": "ms"}}, "showlegend": False}}


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)
