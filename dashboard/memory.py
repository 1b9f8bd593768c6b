"""Memory: each rank's peak against the share its strategy gives it, and memory over time."""

from __future__ import annotations

from typing import Any

import numpy as np

from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.figures import empty
from diagtrain.dashboard.style import FINDING_COLORS
from diagtrain.profiler.analyzer.tables import BYTES_PER_PARAM

MIB = 2**20
BAR_COLOR = "#4C78A8"


def peaks(run: RunData) -> dict[str, Any]:
    """Peak memory per rank (bars), the model state its shard needs (markers), ranks a finding names in colour."""
    ranks = run.ranks
    if "peak_mem_bytes" not in ranks or ranks["peak_mem_bytes"].isna().all():
        return empty("No per-step peak memory was recorded.")
    peak = ranks.dropna(subset=["peak_mem_bytes"]).set_index("rank")["peak_mem_bytes"].astype(float) / MIB
    flagged = {r for f in run.findings if f["kind"] == "memory_imbalance" for r in f.get("ranks") or []}
    colors = [FINDING_COLORS["warning"] if r in flagged else BAR_COLOR for r in peak.index]
    data = [{"type": "bar", "name": "peak (per step, max)", "x": [int(r) for r in peak.index],
             "y": peak.round(1).tolist(), "marker": {"color": colors},
             "hovertemplate": "rank %{x}: peak %{y:.0f} MiB<extra></extra>"}]
    if "model_state_bytes" in run.ranks and run.ranks["model_state_bytes"].notna().any():
        state = run.ranks.dropna(subset=["model_state_bytes"])
        data.append({"type": "scatter", "mode": "markers", "name": f"model state of its shard ({BYTES_PER_PARAM} B/parameter)",
                     "x": state["rank"].astype(int).tolist(), "y": (state["model_state_bytes"] / MIB).round(1).tolist(),
                     "marker": {"symbol": "diamond", "size": 12, "color": "#222"},
                     "hovertemplate": "rank %{x}: model state %{y:.1f} MiB<extra></extra>"})
    median = float(np.median(peak))
    return {"data": data, "layout": {
        "title": {"text": "Peak memory per rank (MiB)"}, "xaxis": {"title": {"text": "rank"}, "dtick": 1},
        "yaxis": {"title": {"text": "MiB"}}, "height": 380,
        "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": median, "y1": median,
                    "line": {"dash": "dash", "color": "#888"}}],
        "annotations": [{"xref": "paper", "x": 1, "y": median, "text": f"median {median:.0f} MiB", "showarrow": False,
                         "xanchor": "right", "yanchor": "bottom"}],
        "meta": {"flagged": sorted(flagged)}}}


def over_time(run: RunData) -> dict[str, Any]:
    """Per-step peak of each rank, and the rank processes' resident memory from telemetry."""
    data = []
    steps = run.steps
    if "peak_mem_bytes" in steps and steps["peak_mem_bytes"].notna().any():
        for rank, rows in steps.groupby("rank"):
            data.append({"type": "scatter", "mode": "lines+markers", "name": f"rank {rank} step peak",
                         "x": (rows["end"]).round(3).tolist(), "y": (rows["peak_mem_bytes"] / MIB).round(1).tolist(),
                         "text": [f"step {s}" for s in rows["step"]],
                         "hovertemplate": f"rank {rank} %{{text}}: %{{y:.0f}} MiB<extra></extra>"})
    t = run.telemetry
    if not t.empty and "rss_bytes" in t and "rank" in t:
        proc = t[t["rank"].notna() & t["rss_bytes"].notna()]
        for rank, rows in proc.groupby("rank"):
            data.append({"type": "scatter", "mode": "lines", "name": f"rank {int(rank)} RSS", "line": {"dash": "dot"},
                         "x": rows["t"].round(3).tolist(),
                         "y": (rows["rss_bytes"] / MIB).round(1).tolist()})
    if not data:
        return empty("No memory samples over time.")
    return {"data": data, "layout": {"title": {"text": "Memory over time (MiB)"}, "height": 380,
                                     "xaxis": {"title": {"text": "seconds since the first step"}},
                                     "yaxis": {"title": {"text": "MiB"}}}}
