"""Steps: a rank × step heatmap of one metric, with the cells that findings name outlined.

Shown as the difference from each step's median across ranks by default: in synchronous training
every rank's step lasts as long as the slowest one's, so what singles out a straggler is its own
part of the step (a phase, compute, or waiting less than the others), against its peers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.figures import empty
from diagtrain.dashboard.style import FINDING_COLORS
from diagtrain.profiler.analyzer.judge.quantities import Measure, Quantity

RELATIVE, ABSOLUTE = "relative", "absolute"
TRACE_METRICS = {"compute_ms": "compute (profiled)", "exposed_comm_ms": "exposed communication (profiled)",
                 "idle_ms": "idle (profiled)", "wait_ms": "wait for the last rank (profiled)"}
# A straggler finding's quantity names the part of the step it was seen in: show that metric first.
FINDING_METRIC = {Measure.COMPUTE: "compute_ms", Measure.IDLE: "idle_ms", Measure.OUTSIDE_COLLECTIVES: "wait_ms"}


def metrics(run: RunData) -> list[dict[str, str]]:
    """The metrics the heatmap can show for this run, as dropdown options."""
    options = [{"label": "step time", "value": "wall_ms"}]
    options += [{"label": f"{p} phase", "value": f"{p}_ms"} for p in run.phases]
    options += [{"label": label, "value": column} for column, label in TRACE_METRICS.items()
                if column in run.steps and run.steps[column].notna().any()]
    return options


def default_metric(run: RunData) -> str:
    """The metric in which the most important finding with steps shows; step time otherwise."""
    available = {o["value"] for o in metrics(run)}
    for f in run.findings:
        if not f.get("steps"):
            continue
        column = finding_column((f.get("metrics") or {}).get("quantity"))
        if f["kind"] == "dataloader_stall":
            column = "data_ms"
        if column in available:
            return column
    return "wall_ms"


def finding_column(key: str | None) -> str | None:
    """The steps column of a finding's ``metrics["quantity"]`` (None where it has none, or none we show)."""
    try:
        quantity = Quantity.from_key(key) if key else None
    except ValueError:  # a report from a newer diagtrain: show step time
        return None
    if quantity is None:
        return None
    return f"{quantity.phase}_ms" if quantity.measure is Measure.PHASE else FINDING_METRIC.get(quantity.measure)


def figure(run: RunData, metric: str, mode: str = RELATIVE) -> dict[str, Any]:
    """The heatmap of ``metric`` (ms) per rank and step; findings' cells outlined."""
    steps = run.steps
    if steps.empty or metric not in steps:
        return empty(f"no {metric} in this run's steps")
    grid = steps.pivot_table(index="rank", columns="step", values=metric, aggfunc="first")
    z = grid.to_numpy(dtype=float)
    if mode == RELATIVE:
        z = z - np.nanmedian(z, axis=0, keepdims=True) if np.isfinite(z).any() else z
    label = next((o["label"] for o in metrics(run) if o["value"] == metric), metric)
    limit = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    heat = {"type": "heatmap", "z": _nullable(z), "x": [int(s) for s in grid.columns], "y": [int(r) for r in grid.index],
            "colorscale": "RdBu" if mode == RELATIVE else "Viridis",  # Plotly's RdBu: blue low, red high
            "zmid": 0 if mode == RELATIVE else None, "zmin": -limit if mode == RELATIVE else None,
            "zmax": limit if mode == RELATIVE else None, "xgap": 1, "ygap": 1,
            "colorbar": {"title": {"text": "ms vs step median" if mode == RELATIVE else "ms"}},
            "hovertemplate": "rank %{y}, step %{x}: %{z:.1f} ms<extra></extra>", "name": label}
    data = [heat] + _finding_cells(run, set(grid.index), set(grid.columns))
    return {"data": data, "layout": {
        "title": {"text": f"{label} per rank and step" + (" (difference from the step's median)" if mode == RELATIVE else "")},
        "xaxis": {"title": {"text": "step"}, "dtick": 1 if len(grid.columns) <= 40 else None},
        "yaxis": {"title": {"text": "rank"}, "autorange": "reversed", "dtick": 1 if len(grid.index) <= 32 else None,
                  "zeroline": False},
        "height": max(320, 140 + 22 * len(grid.index)), "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "legend": {"orientation": "h", "y": -0.2}, "showlegend": True,
        "meta": {"marked": sorted({r for f in _marked(run) for r in f.get("ranks") or []})},
    }}


def _marked(run: RunData) -> list[dict[str, Any]]:
    """Findings worth outlining: warnings and worse that name steps (info ones would cover the map)."""
    return [f for f in run.findings if f.get("steps") and f["severity"] != "info"]


def _finding_cells(run: RunData, ranks: set[int], steps: set[int]) -> list[dict[str, Any]]:
    """One outline trace per finding that names ranks and steps."""
    traces = []
    for f in _marked(run):
        cells = [(s, r) for r in f.get("ranks") or [] for s in f.get("steps") or [] if r in ranks and s in steps]
        if not cells:
            continue
        color = FINDING_COLORS.get(f["severity"], "#333")
        traces.append({"type": "scatter", "mode": "markers", "name": f"{f['kind']} (rank {', '.join(map(str, f['ranks']))})",
                       "x": [c[0] for c in cells], "y": [c[1] for c in cells],
                       "marker": {"symbol": "square-open", "size": 16, "color": color, "line": {"width": 3, "color": color}},
                       "hovertemplate": f"{f['kind']}: rank %{{y}}, step %{{x}}<extra></extra>"})
    return traces


def _nullable(z: np.ndarray) -> list[list[float | None]]:
    return [[None if not np.isfinite(v) else round(float(v), 3) for v in row] for row in z]
