"""The multi-rank timeline, with its level of detail chosen on the server.

Zoomed out (more than DETAIL_MAX_STEPS steps in view), each rank's steps are drawn as blocks, one
segment per phase of the step record. Zoomed in, the real compute, communication, memory and
idle spans of the profiled steps are drawn (step blocks where a step was not profiled). Spans
closer together than a pixel merge, and the resolution coarsens until at most MAX_SEGMENTS
segments go to the browser: the figure's size depends on the view, not on the trace.

Segments are thick line pieces (x0, x1, gap) in one trace per kind, sent as typed arrays: WebGL
when there are many (an SVG line trace draws one path element per piece, so its cost would grow
with the segments), SVG for a few (a WebGL context costs more to start than they cost to draw).
A big job's ranks are grouped into rows (rows.py) drawn as the distribution of their states
(distribution.py): the browser's cost follows the rows on screen, not the ranks or the spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from diagtrain.dashboard import distribution, figures, rows
from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.distribution import export_gaps
from diagtrain.dashboard.rows import Row
from diagtrain.dashboard.style import EXPORT_COLOR, FINDING_COLORS, KIND_COLORS, PHASE_COLORS, STEP_COLOR
from diagtrain.profiler.util import intervals as iv
MAX_SEGMENTS = 50_000  # the most segments the browser gets at once (the budget)
PIXELS = 2_000  # horizontal resolution drawn for: spans closer than one of these merge
DETAIL_MAX_STEPS = 6  # more steps than this in view (on any rank): per-step blocks
SVG_MAX_SEGMENTS = 5_000  # fewer pieces than this draw faster as SVG than a WebGL context starts (measured:
# 1,680 pieces zoom in 370 ms as SVG, 650 ms in WebGL by software; benchmarks/results/dashboard_speed.md)
HOVER_MAX = 6_000  # segments that carry a hover label; beyond, labels would swell the payload
LANE_PX = 34  # height of one rank's lane
# Where each kind sits inside a rank's lane (lane centre = 0): compute above communication, so
# overlap shows as two bars one over the other; idle and memory copies share the bottom row.
ROW_OFFSET = {"compute": -0.27, "comm": 0.0, "memory": 0.27, "idle": 0.27}
ROW_PX = 8
BLOCK_PX = 20
CRITICAL_PATH_COLOR = "#d62728"
PAD_SHARE = 0.1  # a finding opens with this share of its duration shown on each side
LEVEL_WORDS = {"steps": "phases per step", "spans": "operators of profiled steps"}
EXPORT_LABEL = distribution.EXPORT


@dataclass
class Window:
    """What the timeline shows: a time range (s since t0) and the ranks, possibly one finding."""

    x0: float
    x1: float
    ranks: list[int] | None = None  # None: every rank
    focus: int | None = None  # index of the finding that opened this view
    expand: list[str] | None = None  # keys of the group rows opened into their ranks


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
    """The timeline figure for ``window``; ``layout.meta`` says the level, the rows and the segment count."""
    table = rows.rows(run, window.ranks, window.expand)
    lane_y = {row.ranks[0]: i for i, row in enumerate(table) if not row.is_group}
    grouped = [(i, row) for i, row in enumerate(table) if row.is_group]
    shown = set(lane_y) | {r for _, row in grouped for r in row.ranks}
    in_view = _steps_in(run, window, shown)
    detailed = bool(len(in_view)) and int(in_view.groupby("rank").size().max()) <= DETAIL_MAX_STEPS
    lane_steps = in_view[in_view["rank"].isin(set(lane_y))] if len(in_view) else in_view
    traces, segments, blocks = [], 0, lane_steps
    if detailed:
        span_traces, segments = _span_traces(run, window, lane_y)
        traces += span_traces
        blocks = lane_steps[~lane_steps["profiled"]] if "profiled" in lane_steps else lane_steps
    if not detailed or len(blocks):
        block_traces, count = _step_traces(run, blocks, lane_y)
        traces += block_traces
        segments += count
    if "export gaps" not in run.cache:
        run.cache["export gaps"] = export_gaps(run.steps)
    exports = run.cache["export gaps"]
    traces += _export_traces(exports, window, lane_y)
    traces.append(_step_starts(lane_steps, lane_y))
    traces += distribution.group_traces(run, window.x0, window.x1, grouped, detailed, exports)
    traces += _legend_only(traces, run, detailed, bool(grouped))
    if detailed:
        traces += _critical_paths(run, window, lane_y)
    level = "spans" if detailed else "steps"
    layout = _layout(run, window, table, level, segments)
    layout["meta"]["rank_count"] = len(shown)
    return {"data": traces, "layout": layout}


def _steps_in(run: RunData, window: Window, ranks: set[int]):
    s = run.steps
    if s.empty or "start" not in s:
        return s
    return s[(s["end"] > window.x0) & (s["start"] < window.x1) & s["rank"].isin(ranks)]


def _span_traces(run: RunData, window: Window, y_of: dict[int, int]) -> tuple[list[dict], int]:
    """One trace per span kind, spans merged at the coarsest resolution that fits the budget."""
    visible = {}
    run.load_spans(list(y_of))
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
    """Per-step blocks, one segment per phase (or one per step without phase records); runs of steps where the
    view holds more than the budget (:func:`_step_runs`)."""
    if not len(steps):
        return [], 0
    if _runs_of(steps) > 1:
        return _step_runs(steps, y_of)
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


def _runs_of(steps) -> int:
    """How many consecutive steps of a rank one block stands for: 1 while every step's phases fit the budget and a
    lane's steps its pixels, else enough that they do (a long run zoomed out: a million steps)."""
    per_lane = int(steps.groupby("rank").size().max())
    return max(1, -(-per_lane // PIXELS), -(-len(steps) * len(PHASE_COLORS) // MAX_SEGMENTS))


def _step_runs(steps, y_of: dict[int, int]) -> tuple[list[dict], int]:
    """Each rank's steps in runs of :func:`_runs_of` consecutive ones, a block each from the first's start to the
    last's end, its mean step time in its label: phases, a pixel's fraction of a block, are left to a zoom."""
    k = _runs_of(steps)
    s = steps[["rank", "step", "start", "end", "wall_ms"]].sort_values(["rank", "start"])
    run_of = s.groupby("rank").cumcount().to_numpy() // k
    runs = s.groupby([s["rank"].to_numpy(), run_of]).agg(rank=("rank", "first"), first=("step", "min"),
                                                         last=("step", "max"), start=("start", "min"),
                                                         end=("end", "max"), wall_ms=("wall_ms", "mean"))
    y = runs["rank"].map(y_of).to_numpy(dtype=float)
    labels = np.array([f"rank {r} steps {a}-{b}: mean {ms:.1f} ms" for r, a, b, ms in
                       zip(runs["rank"], runs["first"], runs["last"], runs["wall_ms"])], dtype=object)
    hover = len(runs) <= HOVER_MAX
    return [_segments(f"steps ({k} a block)", STEP_COLOR, y, runs["start"].to_numpy(), runs["end"].to_numpy(), labels,
                      BLOCK_PX, hover=hover)], len(runs)


def _step_starts(steps, y_of: dict[int, int]) -> dict[str, Any]:
    """A thin tick at each step's start in each lane, labelled with the step number (none where a lane holds more
    steps than pixels: the ticks would be one band)."""
    if len(steps) and _runs_of(steps) > 1:
        steps = steps.iloc[:0]
    if not len(steps):
        return {"type": "scatter", "x": [], "y": [], "name": "step start", "mode": "lines", "showlegend": False}
    y = steps["rank"].map(y_of).to_numpy(dtype=float)
    x = np.repeat(steps["start"].to_numpy(), 3)
    x[2::3] = np.nan
    ys = np.column_stack([y - 0.45, y + 0.45, np.full(len(y), np.nan)]).ravel()
    text = np.repeat([f"step {s}" for s in steps["step"]], 3)
    return {"type": _kind(len(steps)), "mode": "lines", "name": "step start", "x": figures.typed(x), "y": figures.typed(ys),
            "text": text.tolist(), "hoverinfo": "text", "line": {"color": "#444", "width": 1}, "showlegend": True}


def _segments(name: str, color: str, y: np.ndarray, starts: np.ndarray, ends: np.ndarray, labels: np.ndarray,
              width_px: int, hover: bool) -> dict[str, Any]:
    """One trace of horizontal bars, one (start, end, gap) triple of points per bar."""
    gaps = np.full(len(starts), np.nan)
    trace = {"type": _kind(len(starts)), "mode": "lines", "name": name, "legendgroup": name,
             "x": figures.typed(np.column_stack([starts, ends, gaps]).ravel()),
             "y": figures.typed(np.column_stack([y, y, gaps]).ravel()),
             "line": {"color": color, "width": width_px}, "hoverinfo": "skip"}
    if hover:
        text = np.column_stack([labels, labels, np.full(len(labels), "")]).ravel()  # the gap is never hovered
        trace.update(text=text.tolist(), hoverinfo="text")
    return trace


def _export_traces(exports, window: Window, y_of: dict[int, int]) -> list[dict]:
    """The stretches after a profiled window where the ranks wrote the trace, on each lane."""
    shown = exports[exports["rank"].isin(set(y_of)) & (exports["end"] > window.x0) & (exports["start"] < window.x1)]
    if shown.empty:
        return []
    y = shown["rank"].map(y_of).to_numpy(dtype=float)
    labels = np.array([f"rank {r}: {EXPORT_LABEL} after step {s} ({(e - b) * 1e3:.0f} ms): the ranks were writing the "
                       f"profiled steps' trace" for r, s, b, e in zip(shown["rank"], shown["step"], shown["start"],
                                                                      shown["end"])], dtype=object)
    return [_segments(EXPORT_LABEL, EXPORT_COLOR, y, shown["start"].to_numpy(), shown["end"].to_numpy(), labels,
                      ROW_PX, hover=True)]


def _legend_only(traces: list[dict], run: RunData, detailed: bool, grouped: bool) -> list[dict]:
    """Legend entries for what group rows draw in colours no lane trace names (a heatmap has no legend)."""
    if not grouped:
        return []
    named = {t.get("name") for t in traces}
    wanted = [p for p in run.phases] or ["step"]
    wanted += list(KIND_COLORS) if detailed else []
    wanted.append(EXPORT_LABEL)
    return [{"type": "scatter", "mode": "lines", "x": [None], "y": [None], "name": name, "legendgroup": name,
             "line": {"color": distribution.color(name), "width": ROW_PX}, "showlegend": True, "hoverinfo": "skip"}
            for name in wanted if name not in named]


def _kind(pieces: int) -> str:
    """WebGL for many pieces (an SVG line trace draws one path element per piece), SVG for a few."""
    return "scattergl" if pieces > SVG_MAX_SEGMENTS else "scatter"


def _layout(run: RunData, window: Window, table: list[Row], level: str, segments: int) -> dict[str, Any]:
    n = max(len(table), 1)
    row_of = {}
    for i, row in enumerate(table):
        for rank in row.ranks:
            row_of.setdefault(rank, i)  # a rank on its own lane is marked there, else on its group's row
    shapes, annotations = _finding_marks(run, window, row_of)
    shapes += _host_separators(table)
    groups = [row for row in table if row.is_group]
    words = LEVEL_WORDS[level]
    if groups:
        words += " · group rows: top strip = what most of its ranks do, bottom = its slowest rank"
    return {
        "height": 130 + LANE_PX * n,
        "margin": {"l": 215, "r": 60, "t": 100, "b": 30},
        # The time axis sits on top, beside the legend: on screen with the first rows of a tall figure.
        "xaxis": {"range": [window.x0, window.x1], "side": "top", "showgrid": True, "zeroline": False,
                  "title": {"text": "seconds since the first step", "standoff": 4}},
        "yaxis": {"range": [n - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(len(table))),
                  "ticktext": [_tick(row) for row in table], "fixedrange": True, "showgrid": False, "zeroline": False},
        "dragmode": "zoom",
        "hovermode": "closest",
        # Inside the figure's top margin (a legend anchored above the container is clipped away).
        "legend": {"orientation": "h", "yref": "container", "y": 1.0, "yanchor": "top", "x": 0, "xanchor": "left",
                   "title": {"text": f"<b>{LEVEL_WORDS[level]}</b>: ", "side": "left"}, "font": {"size": 12}},
        "shapes": shapes,
        "annotations": annotations,
        "meta": {"level": level, "level_words": words, "segments": segments,
                 "ranks": [row.ranks[0] for row in table if not row.is_group],
                 "groups": [{"key": row.key, "label": row.label, "ranks": len(row.ranks)} for row in groups],
                 "rows": [row.label for row in table]},
        "plot_bgcolor": "#fafafa",
        "modebar": {"orientation": "v"},  # beside the plot, never over the legend
    }


def _tick(row: Row) -> str:
    if not row.is_group:
        return row.label
    return (f"<b>{'▾' if row.opened else '▸'} {row.label}</b><br>"
            "<span style='font-size:10px;color:#666'>most ranks / slowest</span>")


def _finding_marks(run: RunData, window: Window, y_of: dict[int, int]) -> tuple[list[dict], list[dict]]:
    """An outlined band over each finding's rows and time range, labelled on an opaque tag."""
    shapes, annotations = [], []
    for i, f in enumerate(run.findings):
        span = finding_range(run, f)
        rows_hit = sorted({y_of[r] for r in f.get("ranks") or [] if r in y_of})
        if span is None or not rows_hit or span[1] < window.x0 or span[0] > window.x1:
            continue
        if len(rows_hit) > len(y_of) // 2 and len(y_of) > 2:
            continue  # a finding on most rows would cover the timeline; the overview lists it
        focused = i == window.focus
        color = FINDING_COLORS.get(f["severity"], "#888")
        for y in rows_hit:
            shapes.append({"type": "rect", "xref": "x", "yref": "y", "x0": span[0], "x1": span[1],
                           "y0": y - 0.5, "y1": y + 0.5, "layer": "above",
                           "fillcolor": _rgba(color, 0.07 if focused else 0.04),
                           "line": {"color": color, "width": 3 if focused else 2}})
        ranks = f.get("ranks") or []
        annotations.append({"x": max(span[0], window.x0), "y": rows_hit[0] - 0.5, "xref": "x", "yref": "y",
                            "text": f"<b>{f['kind']}</b> (rank {', '.join(map(str, ranks[:4]))}"
                                    f"{'…' if len(ranks) > 4 else ''})",
                            "showarrow": False, "xanchor": "left", "yanchor": "middle", "bgcolor": "#ffffff",
                            "bordercolor": color, "borderwidth": 1, "borderpad": 2,
                            "font": {"color": color, "size": 12}})
    return shapes, annotations


def _critical_paths(run: RunData, window: Window, y_of: dict[int, int]) -> list[dict]:
    """The report's median and worst step's critical path across the lanes, where the view shows them:
    along a rank's lane for its work, from the waited-for rank's lane to the released one for a collective."""
    section = run.report.get("critical_path") or {}
    traces, drawn = [], set()
    for name in ("worst_step", "median_step"):
        path = section.get(name)
        if not path or path["step"] in drawn:
            continue
        hops = [h for h in path["hops"] if h["rank"] in y_of and h.get("released_rank", h["rank"]) in y_of]
        if not hops or hops[-1]["end"] - run.t0 < window.x0 or hops[0]["start"] - run.t0 > window.x1:
            continue
        drawn.add(path["step"])
        x, y, text = [], [], []
        for h in hops:
            x += [h["start"] - run.t0, h["end"] - run.t0]
            y += [y_of[h["rank"]], y_of[h.get("released_rank", h["rank"])]]
            text += [h["text"]] * 2
        traces.append({"type": "scatter", "mode": "lines+markers", "x": x, "y": y, "hovertext": text,
                       "hoverinfo": "text", "name": f"critical path, step {path['step']}",
                       "line": {"color": CRITICAL_PATH_COLOR, "width": 2}, "marker": {"size": 4}})
    return traces


def _host_separators(table: list[Row]) -> list[dict]:
    """A dotted line between rows of different hosts, and between group rows and lanes."""
    return [{"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": i - 0.5, "y1": i - 0.5,
             "line": {"color": "#999", "width": 1, "dash": "dot"}}
            for i in range(1, len(table))
            if table[i].host != table[i - 1].host or table[i].is_group or table[i - 1].is_group]


def _rgba(color: str, alpha: float) -> str:
    """``#rrggbb`` with an alpha: a band's tint, while its outline stays opaque."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"
