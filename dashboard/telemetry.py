"""Telemetry: one metric over time, a line per GPU or per rank process (and the hosts)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.figures import empty
from diagtrain.profiler.util.units import MIB

# Columns that are identifiers or times, not metrics to plot.
NOT_METRICS = {"time", "t", "unix", "rank", "pid", "step", "host", "kind", "device", "index", "uuid", "name",
               "bus_id", "threads", "throttle_reasons"}
SCALE = {"_bytes": (MIB, "MiB")}  # shown in MiB


def metrics(run: RunData) -> list[dict[str, str]]:
    """The numeric telemetry columns that have samples, as dropdown options."""
    t = run.telemetry
    if t.empty:
        return []
    return [{"label": _label(c), "value": c} for c in t.columns
            if c not in NOT_METRICS and t[c].dtype.kind in "fiu" and t[c].notna().any()]


def default_metric(run: RunData) -> str | None:
    """GPU utilization where there is a GPU, else CPU of the rank processes."""
    names = [o["value"] for o in metrics(run)]
    for preferred in ("gpu_util_percent", "cpu_percent", "rss_bytes"):
        if preferred in names:
            return preferred
    return names[0] if names else None


def figure(run: RunData, metric: str | None) -> dict[str, Any]:
    """``metric`` over time, one line per source (GPU, rank process, host)."""
    t = run.telemetry
    if t.empty or metric is None or metric not in t:
        return empty("No telemetry in this run." if t.empty else f"No {metric} in this run's telemetry.")
    divisor, unit = next(((d, u) for suffix, (d, u) in SCALE.items() if metric.endswith(suffix)), (1, ""))
    data = []
    sampled = t[t[metric].notna()]
    for source, rows in sampled.groupby(pd.Series(_source(sampled), index=sampled.index), sort=True):
        data.append({"type": "scatter", "mode": "lines", "name": source, "x": rows["t"].round(3).tolist(),
                     "y": (rows[metric] / divisor).round(3).tolist()})
    return {"data": data, "layout": {"title": {"text": _label(metric) + (f" ({unit})" if unit else "")},
                                     "height": 420, "xaxis": {"title": {"text": "seconds since the first step"}},
                                     "yaxis": {"title": {"text": unit or _label(metric)}}}}


def _source(t: pd.DataFrame) -> list[str]:
    """A label per sample: ``gpu 0 @ host``, ``rank 3``, ``host vm``, ``python (pid 42) @ vm`` (another
    process on the host)."""
    cols = t.reindex(columns=["kind", "host", "rank", "device", "name", "pid"])
    return [f"rank {int(r)}" if k == "process" and r == r and r is not None else
            f"gpu {int(d)} @ {h}" if k == "gpu" else
            f"{n} (pid {int(p)}) @ {h}" if k == "other" else f"host {h}"
            for k, h, r, d, n, p in cols.itertuples(index=False)]


def _label(column: str) -> str:
    return column.replace("_", " ").replace(" percent", " %").replace(" bytes", "")
