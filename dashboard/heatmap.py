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


def figure(run: RunData, metric: str, mode: str = RELATIVE, step_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """The heatmap of ``metric`` (ms) per rank and step (within ``step_range``, a zoom, where given); findings'
    cells outlined. Past ``MAX_STEP_COLUMNS`` steps each column is a run of consecutive steps, their mean: a
    level of detail that a zoom refines down to single steps."""
    steps = run.steps
    if steps.empty or metric not in steps:
        return empty(f"no {metric} in this run's steps")
    grid = _grid(steps, metric, step_range)
    if grid is None:
        return empty(f"no steps between {step_range[0]:.0f} and {step_range[1]:.0f}" if step_range else "no steps")
    ranks, columns, z = grid
    if mode == RELATIVE and np.isfinite(z).any():
        with np.errstate(all="ignore"):
            z = z - np.nanmedian(z, axis=0, keepdims=True)  # each step against its own median: before binning
    edges = _bin_edges(len(columns))
    z, x = (_binned(z, edges), columns[edges[:-1]]) if edges is not None else (z, columns)
    label = next((o["label"] for o in metrics(run) if o["value"] == metric), metric)
    limit = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    per = f"steps %{{x}}+ ({int(np.ceil(len(columns) / (len(edges) - 1)))} a column, mean)" if edges is not None else "step %{x}"
    heat = {"type": "heatmap", "z": _nullable(z), "x": [int(v) for v in x], "y": [int(r) for r in ranks],
            "colorscale": "RdBu" if mode == RELATIVE else "Viridis",  # Plotly's RdBu: blue low, red high
            "zmid": 0 if mode == RELATIVE else None, "zmin": -limit if mode == RELATIVE else None,
            "zmax": limit if mode == RELATIVE else None, "xgap": 1 if edges is None else 0, "ygap": 1,
            "colorbar": {"title": {"text": "ms vs step median" if mode == RELATIVE else "ms"}},
            "hovertemplate": f"rank %{{y}}, {per}: %{{z:.1f}} ms<extra></extra>", "name": label}
    data = [heat] + _finding_cells(run, ranks, columns, edges)
    detail = (f"; {len(columns):,} steps, each column the mean of a run of them (zoom in for single steps)"
              if edges is not None else "")
    return {"data": data, "layout": {
        "title": {"text": f"{label} per rank and step" + (" (difference from the step's median)" if mode == RELATIVE else "")
                  + detail},
        "xaxis": {"title": {"text": "step"}, "dtick": 1 if len(x) <= 40 else None,
                  **({"range": list(step_range)} if step_range else {})},
        "yaxis": {"title": {"text": "rank"}, "autorange": "reversed", "dtick": 1 if len(ranks) <= 32 else None,
                  "zeroline": False},
        "height": max(320, 140 + 22 * len(ranks)), "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "legend": {"orientation": "h", "y": -0.2}, "showlegend": True, "uirevision": f"{metric}/{mode}",
        "meta": {"marked": sorted({r for f in _marked(run) for r in f.get("ranks") or []}),
                 "steps": len(columns), "binned": edges is not None},
    }}


MAX_STEP_COLUMNS = 2000  # about a screen's width in pixels: more columns than that are drawn over each other


def zoomed_range(relayout: dict[str, Any] | None) -> tuple[float, float] | None | bool:
    """The step range a zoom of the heatmap asks for; None for the whole run (autorange); False if the change
    is not about the step axis."""
    relayout = relayout or {}
    if relayout.get("xaxis.autorange"):
        return None
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        return float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    if isinstance(relayout.get("xaxis.range"), list) and len(relayout["xaxis.range"]) == 2:
        return float(relayout["xaxis.range"][0]), float(relayout["xaxis.range"][1])
    return False


def _grid(steps: Any, metric: str, step_range: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Ranks, steps and the rank x step values of ``metric`` (NaN where a rank has no such step), dense: a
    pivot table of a million steps cost seconds."""
    step = steps["step"].to_numpy()
    keep = (step >= step_range[0]) & (step <= step_range[1]) if step_range else np.ones(len(step), dtype=bool)
    if not keep.any():
        return None
    ranks, at_rank = np.unique(steps["rank"].to_numpy()[keep], return_inverse=True)
    columns, at_step = np.unique(step[keep], return_inverse=True)
    z = np.full((len(ranks), len(columns)), np.nan)
    z[at_rank, at_step] = steps[metric].to_numpy(dtype=float)[keep]
    return ranks, columns, z


def _bin_edges(columns: int) -> np.ndarray | None:
    """Where each binned column starts (and the end), None when every step can have its own column."""
    if columns <= MAX_STEP_COLUMNS:
        return None
    return np.unique(np.linspace(0, columns, MAX_STEP_COLUMNS + 1).astype(int))


def _binned(z: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each run of columns' mean, per rank (NaN where a rank had none of those steps)."""
    known = np.isfinite(z)
    sums = np.add.reduceat(np.where(known, z, 0.0), edges[:-1], axis=1)
    counts = np.add.reduceat(known, edges[:-1], axis=1)
    with np.errstate(all="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _marked(run: RunData) -> list[dict[str, Any]]:
    """Findings worth outlining: warnings and worse that name steps (info ones would cover the map)."""
    return [f for f in run.findings if f.get("steps") and f["severity"] != "info"]


def _finding_cells(run: RunData, ranks: np.ndarray, columns: np.ndarray, edges: np.ndarray | None) -> list[dict[str, Any]]:
    """One outline trace per finding that names ranks and steps: its cells, or the binned columns holding its steps."""
    traces = []
    for f in _marked(run):
        named = np.asarray(f.get("steps") or [], dtype=np.int64)
        at = np.searchsorted(columns, named)
        at = np.unique(at[(at < len(columns)) & (columns[np.minimum(at, len(columns) - 1)] == named)])
        if edges is not None:
            at = np.unique(np.searchsorted(edges, at, side="right") - 1)
        x = columns[edges[at]] if edges is not None else columns[at]
        shown = set(ranks.tolist())
        cells = [(int(s), int(r)) for r in f.get("ranks") or [] if r in shown for s in x]
        if not cells:
            continue
        color = FINDING_COLORS.get(f["severity"], "#333")
        traces.append({"type": "scatter", "mode": "markers", "name": f"{f['kind']} (rank {', '.join(map(str, f['ranks']))})",
                       "x": [c[0] for c in cells], "y": [c[1] for c in cells],
                       "marker": {"symbol": "square-open", "size": 16 if edges is None else 6, "color": color,
                                  "line": {"width": 3 if edges is None else 1, "color": color}},
                       "hovertemplate": f"{f['kind']}: rank %{{y}}, step %{{x}}<extra></extra>"})
    return traces


def _nullable(z: np.ndarray) -> list[list[float | None]]:
    return [[None if not np.isfinite(v) else round(float(v), 3) for v in row] for row in z]
