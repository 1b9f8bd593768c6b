"""The multi-rank timeline, with its level of detail chosen on the server.

Zoomed out (more than DETAIL_MAX_STEPS steps in view), each rank's steps are drawn as blocks, one
segment per phase of the step record. Zoomed in, the real compute, communication, memory and
idle spans of the profiled steps are drawn (step blocks where a step was not profiled). Spans
closer together than a pixel merge, and the resolution coarsens until at most MAX_SEGMENTS
segments go to the browser: the figure's size depends on the view, not on the trace.

Segments are thick line pieces (x0, x1, gap) in one trace per kind, sent as typed arrays: a
Plotly shape per span would be thousands of times slower to draw.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from diagtrain.dashboard.data import Lane, RunData
from diagtrain.dashboard.style import FINDING_COLORS, KIND_COLORS, PHASE_COLORS, STEP_COLOR
from diagtrain.profiler.analyzer import intervals as iv

MAX_SEGMENTS = 50_000  # the most segments the browser gets at once (the budget)
PIXELS = 2_000  # horizontal resolution drawn for: spans closer than one of these merge
DETAIL_MAX_STEPS = 6  # more steps than this in view (on any rank): per-step blocks
HOVER_MAX = 6_000  # segments that carry a hover label; beyond, labels would swell the payload
LANE_PX = 34  # height of one rank's lane
# Where each kind sits inside a rank's lane (lane centre = 0): compute above communication, so
# overlap shows as two bars one over the other; idle and memory copies share the bottom row.
ROW_OFFSET = {"compute": -0.27, "comm": 0.0, "memory": 0.27, "idle": 0.27}
ROW_PX = 8
BLOCK_PX = 20
PAD_SHARE = 0.1  # a finding opens with this share of its duration shown on each side


@dataclass
class Window:
    """What the timeline shows: a time range (s since t0) and the ranks, possibly one finding."""

    x0: float
    x1: float
    ranks: list[int] | None = None  # None: every rank
    focus: int | None = None  # index of the finding that opened this view


def full_window(run: RunData) -> Window:
    """The whole run."""
    return Window(0.0, max(run.end, 1e-3))


def finding_window(run: RunData, index: int) -> Window:
    """The time range of finding ``index``, padded, with the finding focused."""
    f = run.findings[index]
    lo, hi = finding_range(run, f) or (0.0, run.end)
    pad = max((hi - lo) * PAD_SHARE, 1e-3)
    return Window(max(lo - pad, 0.0), hi + pad, focus=index)


def finding_range(run: RunData, finding: dict[str, Any]) -> tuple[float, float] | None:
    """Seconds since t0 covered by a finding: its time range, else its steps on its ranks."""
    if finding.get("time_range"):
        lo, hi = finding["time_range"]
        return lo - run.t0, hi - run.t0
    rows = run.steps
    if finding.get("steps"):
        rows = rows[rows["step"].isin(finding["steps"])]
    if finding.get("ranks"):
        rows = rows[rows["rank"].isin(finding["ranks"])]
    if rows.empty or "start" not in rows:
        return None
    return float(rows["start"].min()), float(rows["end"].max())


def figure(run: RunData, window: Window) -> dict[str, Any]:
    """The timeline figure for ``window``; ``layout.meta`` says the level and the segment count."""
    lanes = [lane for lane in run.lanes if window.ranks is None or lane.rank in window.ranks]
    y_of = {lane.rank: i for i, lane in enumerate(lanes)}
    in_view = _steps_in(run, window, set(y_of))
    detailed = bool(len(in_view)) and int(in_view.groupby("rank").size().max()) <= DETAIL_MAX_STEPS
    traces, segments, blocks = [], 0, in_view
    if detailed:
        span_traces, segments = _span_traces(run, window, y_of)
        traces += span_traces
        blocks = in_view[~in_view["profiled"]] if "profiled" in in_view else in_view
    if not detailed or len(blocks):
        block_traces, count = _step_traces(run, blocks, y_of)
        traces += block_traces
        segments += count
    traces.append(_step_starts(in_view, y_of))
    return {
        "data": traces,
        "layout": _layout(run, window, lanes, "spans" if detailed else "steps", segments),
    }


def _steps_in(run: RunData, window: Window, ranks: set[int]):
    s = run.steps
    if s.empty or "start" not in s:
        return s
    return s[(s["end"] > window.x0) & (s["start"] < window.x1) & s["rank"].isin(ranks)]


def _span_traces(run: RunData, window: Window, y_of: dict[int, int]) -> tuple[list[dict], int]:
    """One trace per span kind, spans merged at the coarsest resolution that fits the budget."""
    visible = {}
    for rank in y_of:
        spans = run.spans(rank)
        if spans is None:
            continue
        for kind in spans.start:
            s, e = spans.start[kind], spans.end[kind]
            keep = (e > window.x0) & (s < window.x1)
            if keep.any():
                visible[(rank, kind)] = (s[keep], e[keep], spans.name[kind][keep])
    resolution = (window.x1 - window.x0) / PIXELS
    while True:
        merged = {key: _coalesce(*value, resolution) for key, value in visible.items()}
        total = sum(len(m[0]) for m in merged.values())
        if total <= MAX_SEGMENTS:
            break
        resolution *= 2
    traces = []
    for kind in ROW_OFFSET:
        parts = [(np.full(len(m[0]), y_of[rank] + ROW_OFFSET[kind]), *m) for (rank, k), m in merged.items() if k == kind]
        if parts:
            y, starts, ends, labels = (np.concatenate(column) for column in zip(*parts))
            traces.append(_segments(kind, KIND_COLORS[kind], y, starts, ends, labels, ROW_PX, hover=total <= HOVER_MAX))
    return traces, total


def _coalesce(starts: np.ndarray, ends: np.ndarray, names: np.ndarray, resolution: float):
    """Merge spans less than ``resolution`` apart; each is at least ``resolution`` wide (one pixel)."""
    (merged_starts, merged_ends), first = iv.merge_with_first(starts, ends, gap=resolution)
    count = np.diff(np.append(np.searchsorted(np.sort(starts), merged_starts), len(starts)))  # spans in each
    labels = names[first].astype(object)
    many = count > 1
    labels[many] = [f"{n} and {c - 1} more" for n, c in zip(labels[many], count[many])]
    return merged_starts, np.maximum(merged_ends, merged_starts + resolution), labels


def _step_traces(run: RunData, steps, y_of: dict[int, int]) -> tuple[list[dict], int]:
    """Per-step blocks, one segment per phase (or one per step without phase records)."""
    if not len(steps):
        return [], 0
    y = steps["rank"].map(y_of).to_numpy(dtype=float)
    starts, ends = steps["start"].to_numpy(), steps["end"].to_numpy()
    where = [f"rank {r} step {s}" for r, s in zip(steps["rank"], steps["step"])]
    phases = [p for p in run.phases if steps[f"{p}_ms"].notna().any()]
    if not phases:
        labels = np.array([f"{w}: {ms:.1f} ms" for w, ms in zip(where, steps["wall_ms"])], dtype=object)
        return [_segments("step", STEP_COLOR, y, starts, ends, labels, BLOCK_PX, hover=True)], len(steps)
    traces, count, done_ms = [], 0, np.zeros(len(steps))
    hover = len(steps) * len(phases) <= HOVER_MAX
    for phase in phases:
        ms = steps[f"{phase}_ms"].fillna(0.0).to_numpy()
        s = starts + done_ms / 1e3  # phases run one after the other from the step's start
        e = np.minimum(s + ms / 1e3, ends)
        done_ms += ms
        keep = e > s
        labels = np.array([f"{w}: {phase} {m:.1f} ms" for w, m in zip(where, ms)], dtype=object)
        traces.append(_segments(phase, PHASE_COLORS.get(phase, STEP_COLOR), y[keep], s[keep], e[keep], labels[keep],
                                BLOCK_PX, hover=hover))
        count += int(keep.sum())
    return traces, count


def _step_starts(steps, y_of: dict[int, int]) -> dict[str, Any]:
    """A thin tick at each step's start in each lane, labelled with the step number."""
    if not len(steps):
        return {"type": "scatter", "x": [], "y": [], "name": "step start", "mode": "lines"}
    y = steps["rank"].map(y_of).to_numpy(dtype=float)
    x = np.repeat(steps["start"].to_numpy(), 3)
    x[2::3] = np.nan
    ys = np.column_stack([y - 0.45, y + 0.45, np.full(len(y), np.nan)]).ravel()
    text = np.repeat([f"step {s}" for s in steps["step"]], 3)
    return {"type": "scatter", "mode": "lines", "name": "step start", "x": _typed(x), "y": _typed(ys),
            "text": text.tolist(), "hoverinfo": "text", "line": {"color": "#444", "width": 1}, "showlegend": True}


def _segments(name: str, color: str, y: np.ndarray, starts: np.ndarray, ends: np.ndarray, labels: np.ndarray,
              width_px: int, hover: bool) -> dict[str, Any]:
    """One trace of horizontal bars, one (start, end, gap) triple of points per bar."""
    gaps = np.full(len(starts), np.nan)
    trace = {"type": "scatter", "mode": "lines", "name": name, "legendgroup": name,
             "x": _typed(np.column_stack([starts, ends, gaps]).ravel()),
             "y": _typed(np.column_stack([y, y, gaps]).ravel()),
             "line": {"color": color, "width": width_px}, "hoverinfo": "skip"}
    if hover:
        trace.update(text=np.repeat(np.asarray(labels, dtype=str), 3).tolist(), hoverinfo="text")
    return trace


def _layout(run: RunData, window: Window, lanes: list[Lane], level: str, segments: int) -> dict[str, Any]:
    n = max(len(lanes), 1)
    shapes, annotations = _finding_marks(run, window, {lane.rank: i for i, lane in enumerate(lanes)})
    shapes += _host_separators(lanes)
    return {
        "height": 110 + LANE_PX * n,
        "margin": {"l": 170, "r": 20, "t": 70, "b": 40},
        "xaxis": {"range": [window.x0, window.x1], "title": {"text": "seconds since the first step"},
                  "showgrid": True, "zeroline": False},
        "yaxis": {"range": [n - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(len(lanes))),
                  "ticktext": [lane.label for lane in lanes], "fixedrange": True, "showgrid": False, "zeroline": False},
        "dragmode": "zoom",
        "hovermode": "closest",
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "yref": "container"},
        "shapes": shapes,
        "annotations": annotations,
        "meta": {"level": level, "segments": segments, "ranks": [lane.rank for lane in lanes]},
        "plot_bgcolor": "#fafafa",
    }


def _finding_marks(run: RunData, window: Window, y_of: dict[int, int]) -> tuple[list[dict], list[dict]]:
    """A translucent box over each finding's ranks and time range, labelled with its kind."""
    shapes, annotations = [], []
    for i, f in enumerate(run.findings):
        span = finding_range(run, f)
        ranks = [r for r in f.get("ranks") or [] if r in y_of]
        if span is None or not ranks or span[1] < window.x0 or span[0] > window.x1:
            continue
        focused = i == window.focus
        color = FINDING_COLORS.get(f["severity"], "#888")
        for rank in ranks:
            shapes.append({"type": "rect", "xref": "x", "yref": "y", "x0": span[0], "x1": span[1],
                           "y0": y_of[rank] - 0.48, "y1": y_of[rank] + 0.48, "layer": "above",
                           "fillcolor": color, "opacity": 0.18 if focused else 0.08,
                           "line": {"color": color, "width": 3 if focused else 1}})
        annotations.append({"x": max(span[0], window.x0), "y": y_of[ranks[0]] - 0.5, "xref": "x", "yref": "y",
                            "text": f"{f['kind']} (rank {', '.join(map(str, ranks))})", "showarrow": False,
                            "xanchor": "left", "yanchor": "bottom", "font": {"color": color, "size": 11}})
    return shapes, annotations


def _host_separators(lanes: list[Lane]) -> list[dict]:
    return [{"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": i - 0.5, "y1": i - 0.5,
             "line": {"color": "#999", "width": 1, "dash": "dot"}}
            for i in range(1, len(lanes)) if lanes[i].host != lanes[i - 1].host]


def _typed(values: np.ndarray) -> dict[str, str]:
    """A float64 array in Plotly's typed-array form (base64): a fraction of a JSON list's size."""
    return {"dtype": "f8", "bdata": base64.b64encode(np.ascontiguousarray(values, dtype=np.float64)).decode()}
