"""A group row of the timeline: what the ranks of a group do over time, as two strips of colour.

The view is cut into BINS time bins. In each, every rank of the group has a state: the phase of
its step (zoomed out), the span kind that fills most of the bin (zoomed in to profiled steps), the
profiler writing its trace, or nothing. The top strip is the state most of the group's ranks are
in; the bottom one the state of the group's slowest rank, the one furthest behind in its steps.
A straggler among a thousand ranks shows as the bottom strip still computing while the top one
waits. The row costs the browser one small image whatever the ranks and spans behind it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.rows import Row
from diagtrain.dashboard.style import EXPORT_COLOR, KIND_COLORS, PHASE_COLORS, STEP_COLOR
from diagtrain.profiler.util import intervals as iv
BINS = 400  # time bins per group row: about 3 px each at the dashboard's width
EXPORT = "profiler export"
STATES = [*PHASE_COLORS, "step", EXPORT, *KIND_COLORS]
CODE = {name: i for i, name in enumerate(STATES)}
STRIP_OFFSET = 0.25  # the two strips' centres, above and below the row's centre


def color(state: str) -> str:
    """The colour of a state (a phase, a span kind, a bare step or the profiler's export)."""
    return {**PHASE_COLORS, **KIND_COLORS, "step": STEP_COLOR, EXPORT: EXPORT_COLOR}.get(state, STEP_COLOR)


def export_gaps(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the stretch from the end of a profiled window's last step to the next step's start.

    The profiler stops and writes the trace there (seconds of it on a big model): drawn and named,
    so an empty stretch of a lane never looks like lost data.
    """
    columns = ["rank", "step", "start", "end"]
    if steps.empty or "profiled" not in steps or "start" not in steps:
        return pd.DataFrame(columns=columns)
    s = steps.sort_values(["rank", "start"])
    following = s.groupby("rank")
    next_start, next_profiled = following["start"].shift(-1), following["profiled"].shift(-1)
    gap = s["profiled"].astype(bool) & (next_profiled == False) & (next_start > s["end"])  # noqa: E712 (NaN: no next)
    return pd.DataFrame({"rank": s["rank"][gap].to_numpy(), "step": s["step"][gap].to_numpy(),
                         "start": s["end"][gap].to_numpy(), "end": next_start[gap].to_numpy()})


def group_traces(run: RunData, x0: float, x1: float, grouped: list[tuple[int, Row]], detailed: bool,
                 exports: pd.DataFrame) -> list[dict[str, Any]]:
    """The heatmap(s) of the group rows (``grouped``: row position and row) over the view ``x0``..``x1``."""
    if not grouped:
        return []
    edges = np.linspace(x0, x1, BINS + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    ranks = [r for _, row in grouped for r in row.ranks]
    codes, progress = _step_states(run, ranks, centers)
    _mark_exports(codes, ranks, exports, centers)
    if detailed:
        run.load_spans(ranks)
        kind_codes = _span_states(run, ranks, edges)
        codes = np.where(np.isnan(kind_codes), codes, kind_codes)
    strips, first = [], 0
    for y, row in grouped:
        last = first + len(row.ranks)
        strips.append((y, _strips(row, codes[first:last], progress[first:last])))
        first = last
    return [_heatmap(centers, run_of_rows) for run_of_rows in _contiguous(strips)]


def _contiguous(strips: list[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
    """Group rows on consecutive positions, together: one image each (not one per group)."""
    runs: list[list[tuple[int, Any]]] = []
    for y, strip in strips:
        if runs and runs[-1][-1][0] == y - 1:
            runs[-1].append((y, strip))
        else:
            runs.append([(y, strip)])
    return runs


def _step_states(run: RunData, ranks: list[int], centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's step phase at each bin centre (NaN outside its steps) and its progress in steps
    (step number plus the share of it done; +inf for a rank without steps: never the slowest).

    All ranks in one search: each rank's steps are laid end to end on one axis, rank i's shifted
    by i times the whole time range, so one sorted array answers every (rank, bin) pair.
    """
    codes = np.full((len(ranks), len(centers)), np.nan)
    progress = np.full((len(ranks), len(centers)), np.inf)
    steps = run.steps
    if steps.empty or "start" not in steps:
        return codes, progress
    position = pd.Series(np.arange(len(ranks)), index=ranks)
    steps = steps[steps["rank"].isin(position.index)]
    row = position[steps["rank"]].to_numpy()
    order = np.lexsort((steps["start"].to_numpy(), row))
    steps, row = steps.iloc[order], row[order]
    if steps.empty:
        return codes, progress
    starts, ends, numbers = (steps[c].to_numpy(dtype=float) for c in ("start", "end", "step"))
    phases = run.phases
    done = (np.cumsum(steps[[f"{p}_ms" for p in phases]].fillna(0.0).to_numpy(), axis=1) / 1e3 if phases
            else np.zeros((len(steps), 0)))
    phase_codes = np.array([CODE.get(p, CODE["step"]) for p in phases] + [CODE["step"]], dtype=float)
    origin = min(starts.min(), centers[0])
    width = max(ends.max(), centers[-1]) - origin + 1.0
    query = (centers[None, :] - origin) + np.arange(len(ranks))[:, None] * width
    index = np.searchsorted(starts - origin + row * width, query.ravel(), side="right").reshape(query.shape) - 1
    at = np.clip(index, 0, None)
    mine = (index >= 0) & (row[at] == np.arange(len(ranks))[:, None])  # a step of this rank, not the one before
    t = np.broadcast_to(centers, query.shape)
    inside = mine & (t < ends[at])
    which = (done[at] <= (t - starts[at])[..., None]).sum(axis=-1)  # phases already over
    codes[inside] = phase_codes[which][inside]
    share = (t - starts[at]) / np.maximum(ends[at] - starts[at], 1e-9)
    progress = np.where(inside, numbers[at] + share, numbers[at] + 1.0)  # between steps: the last one done
    first = np.full(len(ranks), np.inf)
    np.minimum.at(first, row, numbers)
    progress = np.where(mine, progress, first[:, None])  # before its first step: not begun
    return codes, progress


def _mark_exports(codes: np.ndarray, ranks: list[int], exports: pd.DataFrame, centers: np.ndarray) -> None:
    """The bins where a rank was writing its profiler trace."""
    position = {r: i for i, r in enumerate(ranks)}
    for rank, start, end in zip(exports["rank"], exports["start"], exports["end"]):
        if rank in position:
            codes[position[rank], (centers >= start) & (centers < end)] = CODE[EXPORT]


def _span_states(run: RunData, ranks: list[int], edges: np.ndarray) -> np.ndarray:
    """Each rank's span kind covering most of each bin (NaN where none falls), all ranks at once."""
    kinds = list(KIND_COLORS)
    cover = np.zeros((len(kinds), len(ranks), len(edges) - 1))
    for k, kind in enumerate(kinds):
        laid = _laid_out(run, ranks, kind)
        if laid is None:
            continue
        s, e, origin, width = laid
        t = np.clip(edges, origin, origin + width - 1.0)  # beyond every span: no coverage, no spill to the next rank
        query = (t[None, :] - origin) + np.arange(len(ranks))[:, None] * width
        cover[k] = np.diff(_covered_until((s, e), query.ravel()).reshape(query.shape), axis=1)
    best = cover.argmax(axis=0)
    codes = np.array([CODE[kind] for kind in kinds], dtype=float)[best]
    return np.where(cover.max(axis=0) > 0, codes, np.nan)


def _laid_out(run: RunData, ranks: list[int], kind: str) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """The ranks' merged spans of ``kind`` laid end to end as in _step_states (rank i shifted by i
    widths), built once per set of ranks: a zoom then costs one search, not one per rank."""
    key = ("laid out", kind, tuple(ranks))
    if key not in run.cache:
        unions = [(i, run.spans(r).union(kind)) for i, r in enumerate(ranks) if run.spans(r) is not None]
        unions = [(i, u) for i, u in unions if len(u[0])]
        if not unions:
            run.cache[key] = None
        else:
            origin = min(u[0][0] for _, u in unions)
            width = max(u[1][-1] for _, u in unions) - origin + 2.0
            run.cache[key] = (np.concatenate([u[0] - origin + i * width for i, u in unions]),
                              np.concatenate([u[1] - origin + i * width for i, u in unions]), origin, width)
    return run.cache[key]


def _covered_until(merged: iv.Intervals, t: np.ndarray) -> np.ndarray:
    """Total length of the disjoint ``merged`` intervals before each time in ``t``."""
    s, e = merged
    before = np.concatenate([[0.0], np.cumsum(e - s)])
    i = np.searchsorted(s, t, side="right") - 1
    at = np.clip(i, 0, None)
    partial = np.clip(t - s[at], 0.0, (e - s)[at])
    return np.where(i >= 0, before[at] + partial, 0.0)


def _strips(row: Row, codes: np.ndarray, progress: np.ndarray) -> tuple[list, list]:
    """The row's two strips (state codes, hover labels): most ranks' state, and the slowest rank's."""
    bins = codes.shape[1]
    counts = np.stack([(codes == c).sum(axis=0) for c in range(len(STATES))])
    most = counts.argmax(axis=0)
    most_n = counts.max(axis=0)
    slowest = progress.argmin(axis=0)
    slow_code = codes[slowest, np.arange(bins)]
    n = len(row.ranks)
    top = [None if k == 0 else int(c) for c, k in zip(most, most_n)]
    bottom = [None if np.isnan(c) else int(c) for c in slow_code]
    # Short labels: a 1,024-rank view has ~13,000 cells (the row's name is beside it, on the axis).
    top_text = ["no step" if c is None else f"{STATES[c]} on {k}/{n}" for c, k in zip(top, most_n)]
    bottom_text = ["no step" if c is None else f"slowest: r{row.ranks[w]} {STATES[c]}" for c, w in zip(bottom, slowest)]
    return [top, bottom], [top_text, bottom_text]


def _heatmap(centers: np.ndarray, rows_: list[tuple[int, Any]]) -> dict[str, Any]:
    """One image for group rows on consecutive positions: two strips each, evenly spaced."""
    ys, z, text = [], [], []
    for y, (codes, labels) in rows_:
        ys += [y - STRIP_OFFSET, y + STRIP_OFFSET]
        z += codes
        text += labels
    size = len(STATES)
    scale = [[edge / size, color(STATES[i])] for i in range(size) for edge in (i, i + 1)]
    return {"type": "heatmap", "name": "group rows", "x": centers.tolist(), "y": ys, "z": z, "text": text,
            "hoverinfo": "text", "hoverongaps": False, "zmin": -0.5, "zmax": size - 0.5, "colorscale": scale,
            "showscale": False, "ygap": 2}
