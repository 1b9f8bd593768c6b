"""A rank's per-step table: each ProfilerStep#N's wall time, its compute / communication / idle split,
its wait for data and its matrix multiplies' work."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.per_rank import breakdown as bd
from diagtrain.profiler.analyzer.read.dialects import DATALOADER_SPAN, STEP_ANNOTATION, name_matches, step_marks
from diagtrain.profiler.util import intervals as iv


def step_breakdown(events: pd.DataFrame, rank: int, on_gpu: bool, timed: bool = True,
                   work: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ProfilerStep#N: wall time and compute / communication / idle within it (µs), the wait for
    data inside DataLoader spans and the matrix multiplies' GFLOPs (``work``: ts, flops; see
    pipeline._matmul_work); only the wall time of the device's part when the device's work is not timed
    (``timed`` false on a GPU trace)."""
    host = (events["stream"] < 0).to_numpy()
    annotations = events[step_marks(events)]
    loading = events[host & name_matches(events["name"], DATALOADER_SPAN)]
    waiting_for_data = iv.merge(loading["ts"].to_numpy(), loading["end"].to_numpy())
    starts, flops = (work["ts"].to_numpy(), work["flops"].to_numpy()) if work is not None else (np.empty(0),) * 2
    bounds = list(zip(annotations["ts"], annotations["end"]))
    broken_down = bd.breakdowns(events, on_gpu, bounds) if timed or not on_gpu else None
    rows = []
    for i, (name, (start, end)) in enumerate(zip(annotations["name"].astype(str), bounds)):
        step = int(STEP_ANNOTATION.match(name).group(1))
        if broken_down is None:
            fields = {**dict.fromkeys(_STEP_FIELDS, math.nan), "wall_us": end - start}
        else:
            fields = _step_fields(broken_down[i])
        # A step that never asked a DataLoader for a batch has no data time, not zero.
        data = iv.length(iv.clip(waiting_for_data, start, end)) if len(loading) else np.nan
        # Shapes unrecorded: the work is unknown, not zero.
        gflops = float(flops[(starts >= start) & (starts < end)].sum()) / 1e9 if len(flops) else np.nan
        rows.append({"rank": rank, "step": step, "start_us": start, "end_us": end, **fields, "data_us": data,
                     "gflops": gflops})
    # Typed even without rows (a window cut before its first step ended): an empty table of object
    # columns turned every rank's joined step times into objects. Each column made typed: a table of
    # objects cast afterwards cost 0.9 ms a rank, 10x the table.
    return pd.DataFrame({name: np.array([r[name] for r in rows], dtype=dtype) for name, dtype in _STEP_TABLE.items()})


_STEP_TABLE = {"rank": "int64", "step": "int64", **dict.fromkeys(
    ("start_us", "end_us", "wall_us", "compute_us", "comm_us", "exposed_comm_us", "overlapped_comm_us", "idle_us",
     "data_us", "gflops"), "float64")}


_STEP_FIELDS = ("wall_us", "compute_us", "comm_us", "exposed_comm_us", "overlapped_comm_us", "idle_us")


def _step_fields(b: bd.Breakdown) -> dict:
    return {"wall_us": b.total_us, "compute_us": b.compute_us, "comm_us": b.comm_us,
            "exposed_comm_us": b.exposed_comm_us, "overlapped_comm_us": b.overlapped_comm_us, "idle_us": b.idle_us}
