"""Compare: two runs side by side, with the statistics of `diagtrain compare`."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from diagtrain.dashboard.data import RunData
from diagtrain.profiler import regression

VERDICT_ORDER = ("regression", "improvement", "unchanged", "too few samples")


def comparison(base: RunData, new: RunData, threshold_pct: float) -> regression.Comparison:
    """The same comparison `diagtrain compare BASE NEW --threshold` makes."""
    return regression.compare(base.summary(), new.summary(), threshold_pct)


def rows(result: regression.Comparison) -> list[dict[str, Any]]:
    """One row per metric and scope, regressions first."""
    out = []
    for r in sorted(result.results, key=lambda r: (VERDICT_ORDER.index(r.verdict), -abs(_finite(r.change_pct)))):
        d = asdict(r)
        out.append({"metric": d["metric"], "scope": d["scope"], "unit": d["unit"], "verdict": d["verdict"],
                    "base": _round(d["base_median"]), "new": _round(d["new_median"]),
                    "p90": f"{_round(d['base_p90'])} → {_round(d['new_p90'])}",
                    "change": "" if math.isnan(d["change_pct"]) else f"{d['change_pct']:+.1f}%",
                    "interval": "" if math.isnan(d["ci_low"]) else f"{d['ci_low']:.3f}-{d['ci_high']:.3f}",
                    "p": "" if math.isnan(d["p_value"]) else f"{d['p_value']:.2g}",
                    "n": f"{d['n_base']}/{d['n_new']}"})
    return out


COLUMNS = [{"name": n, "id": i} for n, i in (
    ("metric", "metric"), ("scope", "scope"), ("verdict", "verdict"), ("BASE median", "base"), ("NEW median", "new"),
    ("unit", "unit"), ("p90 BASE → NEW", "p90"), ("change", "change"), ("95% interval of NEW/BASE", "interval"), ("Mann-Whitney p", "p"),
    ("steps BASE/NEW", "n"))]


def step_times(base: RunData, new: RunData) -> dict[str, Any]:
    """The per-step time of both runs (after warm-up), side by side."""
    data = []
    for label, run in (("BASE", base), ("NEW", new)):
        samples = run.summary()["samples"]["step time"]
        data.append({"type": "box", "name": f"{label}: {run.path.name}", "y": samples, "boxpoints": "all",
                     "jitter": 0.4, "pointpos": 0})
    return {"data": data, "layout": {"title": {"text": "Step time per step (ms), warm-up excluded"}, "height": 380,
                                     "yaxis": {"title": {"text": "ms"}}, "showlegend": False}}


def _finite(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)
