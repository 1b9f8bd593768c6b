"""Memory: each rank's peak against the share its strategy gives it, and memory over time."""

from __future__ import annotations

from typing import Any

import numpy as np

from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.figures import empty
from diagtrain.dashboard.style import FINDING_COLORS
from diagtrain.profiler.model.precision import bytes_per_parameter
from diagtrain.profiler.util.units import MIB

BAR_COLOR = "#4C78A8"


STATE_COLOR = "#222"
# One colour per rank in memory over time (plotly's default sequence), so a rank's two lines match.
RANK_COLORS = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
               "#FECB52"]


def peaks(run: RunData) -> dict[str, Any]:
    """Peak memory per rank as a stacked bar: the model state its shard needs, and the rest (activations,
    buffers, the runtime); the state written above each bar, since a small one is too thin to read."""
    ranks = run.ranks
    if "peak_mem_bytes" not in ranks or ranks["peak_mem_bytes"].isna().all():
        return empty("No per-step peak memory was recorded.")
    rows = ranks.dropna(subset=["peak_mem_bytes"]).set_index("rank")
    peak = rows["peak_mem_bytes"].astype(float) / MIB
    state = (rows["model_state_bytes"].astype(float) / MIB if "model_state_bytes" in rows
             else peak * np.nan).clip(upper=peak)
    known = state.notna()
    flagged = {r for f in run.findings if f["kind"] == "memory_imbalance" for r in f.get("ranks") or []}
    colors = [FINDING_COLORS["warning"] if r in flagged else BAR_COLOR for r in peak.index]
    x = [int(r) for r in peak.index]
    data = []
    if known.any():
        data.append({"type": "bar", "name": f"model state of its shard ({bytes_per_parameter()} B/parameter)", "x": x,
                     "y": state.fillna(0).round(2).tolist(), "marker": {"color": STATE_COLOR},
                     "hovertemplate": "rank %{x}: model state %{y:.1f} MiB<extra></extra>"})
    rest = peak - state.fillna(0)
    labels = [f"state {s:.1f} MiB ({_share(s / p)})" if ok and p > 0 else "" for s, p, ok in zip(state.fillna(0), peak, known)]
    data.append({"type": "bar", "name": "rest of the peak (activations, buffers, runtime)" if known.any() else
                 "peak (per step, max)", "x": x, "y": rest.round(2).tolist(), "marker": {"color": colors},
                 "text": labels, "textposition": "outside", "cliponaxis": False,
                 "customdata": peak.round(1).tolist(),
                 "hovertemplate": "rank %{x}: peak %{customdata:.0f} MiB<extra></extra>"})
    median = float(np.median(peak))
    # The median as a legend entry: a label on the plot would sit on a bar's text.
    data.append({"type": "scatter", "mode": "lines", "name": f"median peak {median:.0f} MiB",
                 "x": [min(x) - 0.5, max(x) + 0.5], "y": [median, median], "hoverinfo": "skip",
                 "line": {"dash": "dash", "color": "#888", "width": 1}})
    return {"data": data, "layout": {
        "title": {"text": "Peak memory per rank (MiB): model state and the rest"}, "barmode": "stack",
        "xaxis": {"title": {"text": "rank"}, "dtick": 1}, "yaxis": {"title": {"text": "MiB"}}, "height": 420,
        "legend": {"orientation": "h", "y": -0.3, "traceorder": "normal"},
        "meta": {"flagged": sorted(flagged)}}}


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.01 else "<1%"


def over_time(run: RunData) -> dict[str, Any]:
    """Per-step peak of each rank, and the rank processes' resident memory from telemetry: one legend
    entry per kind (it shows or hides every rank's line of it), one colour per rank, the rank on hover."""
    data = []
    steps = run.steps
    if "peak_mem_bytes" in steps and steps["peak_mem_bytes"].notna().any():
        groups = list(steps.groupby("rank"))
        for i, (rank, rows) in enumerate(groups):
            data.append({"type": "scatter", "mode": "lines+markers", **_grouped("peak", i, rank, len(groups)),
                         "x": (rows["end"]).round(3).tolist(), "y": (rows["peak_mem_bytes"] / MIB).round(1).tolist(),
                         "text": [f"step {s}" for s in rows["step"]],
                         "hovertemplate": f"rank {rank} %{{text}}: %{{y:.0f}} MiB<extra></extra>"})
    t = run.telemetry
    if not t.empty and "rss_bytes" in t and "rank" in t:
        proc = t[t["rank"].notna() & t["rss_bytes"].notna()]
        groups = list(proc.groupby("rank"))
        for i, (rank, rows) in enumerate(groups):
            data.append({"type": "scatter", "mode": "lines", **_grouped("rss", i, int(rank), len(groups)),
                         "x": rows["t"].round(3).tolist(), "y": (rows["rss_bytes"] / MIB).round(1).tolist(),
                         "hovertemplate": f"rank {int(rank)} RSS: %{{y:.0f}} MiB<extra></extra>"})
    if not data:
        return empty("No memory samples over time.")
    return {"data": data, "layout": {"title": {"text": "Memory over time (MiB)"}, "height": 380,
                                     "xaxis": {"title": {"text": "seconds since the first step"}},
                                     "yaxis": {"title": {"text": "MiB"}}}}


KINDS = {"peak": ("step peak", "solid"), "rss": ("process RSS (telemetry)", "dot")}


def _grouped(kind: str, index: int, rank: int, count: int) -> dict[str, Any]:
    """A line's name, colour and legend group: the kind's first line stands in the legend for all of them."""
    label, dash = KINDS[kind]
    every = f"{label}, all {count} ranks (hover for each)" if count > 1 else f"rank {rank} {label}"
    return {"name": every if index == 0 else f"rank {rank} {label}", "legendgroup": kind, "showlegend": index == 0,
            "line": {"dash": dash, "color": RANK_COLORS[rank % len(RANK_COLORS)]}}
