"""`diagtrain export RUN --perfetto OUT.json.gz`: every rank in one trace for Perfetto and chrome://tracing.

The Trace Event Format (JSON): a process per rank ("rank N", ordered by rank, its host as a label), on the
run's clock as the analysis published it (analysis/, never the raw traces): each step as a slice (every
step, from the always-on records; the profiled ones say so), the profiled timeline's compute,
communication and memory spans, each collective call, a flow from the last rank to arrive at a
collective to every rank that waited for it, and each finding as a slice over the steps it names on its
ranks. Times are microseconds from the run's first step. Written a rank at a time into a gzip stream:
memory holds one rank's spans and collectives, not the run's.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.util.text import ranges

# One thread (lane) per kind of slice, in this order under each rank.
STEPS, COMPUTE, COMM, MEMORY, COLLECTIVES, FINDINGS = range(6)
LANES = {STEPS: "steps", COMPUTE: "compute (profiled)", COMM: "communication (profiled)",
         MEMORY: "memory (profiled)", COLLECTIVES: "collectives", FINDINGS: "findings"}
SPAN_LANES = {"compute": COMPUTE, "comm": COMM, "memory": MEMORY}  # idle is the gaps between them
COLLECTIVE_COLUMNS = ["rank", "op", "seq", "group", "ts", "dur", "bytes", "wait_us", "last_rank", "arrived_ts"]


class ExportError(ValueError):
    """The run cannot be exported; the message names the file and the problem."""


@dataclass
class Exported:
    """What was written."""

    path: Path
    ranks: int
    events: int
    bytes: int


def export(run: Path, out: Path, ranks: set[int] | None = None, steps: set[int] | None = None,
           progress: Callable[[str], None] = lambda _: None) -> Exported:
    """Write ``run``'s analysis as one Perfetto trace at ``out`` (gzipped when it ends in .gz), for ``ranks``
    and ``steps`` (None: all)."""
    analysis = run / "analysis"
    table = _steps(analysis)
    if ranks is not None:
        table = table[table["rank"].isin(ranks)]
    if steps is not None:
        table = table[table["step"].isin(steps)]
    if table.empty:
        raise ExportError(f"{run}: no steps of the ranks and steps asked for")
    origin = float(table["start"].min())
    report = _json(run / "report.json")
    timeline = (_json(analysis / "timeline.json").get("ranks") or {}) if (analysis / "timeline.json").exists() else {}
    collectives = analysis / "collectives.parquet"
    count, chosen = 0, sorted(int(r) for r in table["rank"].unique())
    calls = _call_times(collectives, table)
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "wt", encoding="utf-8") as f:
        f.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps({"run": str(run), "exported_by": "diagtrain"})
                + ', "traceEvents": [\n')
        first = True
        for i, rank in enumerate(chosen):
            mine = table[table["rank"] == rank]
            info = timeline.get(str(rank)) or {}
            events = _rank_events(rank, mine, info, analysis, collectives, report, origin, calls)
            for event in events:
                f.write(("" if first else ",\n") + json.dumps(event, separators=(",", ":"), allow_nan=False))
                first, count = False, count + 1
            if (i + 1) % 64 == 0:
                progress(f"exported {i + 1} of {len(chosen)} ranks")
        f.write("\n]}\n")
    return Exported(out, len(chosen), count, out.stat().st_size)


def _steps(analysis: Path) -> pd.DataFrame:
    path = analysis / "steps.parquet"
    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: cannot read the analysis' steps ({e}); run diagtrain analyze first") from None
    if not {"rank", "step", "start", "end"} <= set(table.columns):
        raise ExportError(f"{path}: no step times (rank, step, start, end) to place the steps on a timeline")
    return table.dropna(subset=["start", "end"])


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: cannot read ({e}); run diagtrain analyze first") from None
    if not isinstance(doc, dict):
        raise ExportError(f"{path}: not a JSON object")
    return doc


def _call_times(path: Path, steps: pd.DataFrame) -> dict[tuple[str, int, int], tuple[float, float]]:
    """(group, seq, rank) -> (start, end) in Unix µs of each call exported (the chosen ranks' calls inside their
    chosen steps): where a flow's ends bind."""
    if not path.exists():
        return {}
    ranks = sorted(int(r) for r in steps["rank"].unique())
    table = pq.read_table(path, columns=["group", "seq", "rank", "ts", "dur"], filters=[("rank", "in", ranks)]).to_pandas()
    found = {}
    for rank, calls in table.groupby("rank"):
        mine = steps[steps["rank"] == rank]
        inside = _inside(calls["ts"], list(zip(mine["start"], mine["end"])))
        for g, q, t, d in zip(calls["group"][inside], calls["seq"][inside], calls["ts"][inside], calls["dur"][inside]):
            found[(str(g), int(q), int(rank))] = (float(t), float(t) + float(d))
    return found


def _inside(ts_us: pd.Series, windows: list[tuple[float, float]]) -> np.ndarray:
    """Which of the times (Unix µs) fall inside one of the windows (Unix s)."""
    return iv.within(ts_us.to_numpy(), _us(windows))


def _us(windows: list[tuple[float, float]]) -> iv.Intervals:
    """Windows in Unix s as (starts, ends) in Unix µs."""
    return (np.array([w[0] for w in windows], dtype=float) * 1e6, np.array([w[1] for w in windows], dtype=float) * 1e6)


def _rank_events(rank: int, steps: pd.DataFrame, info: dict[str, Any], analysis: Path, collectives: Path,
                 report: dict[str, Any], origin: float,
                 calls: dict[tuple[str, int, int], tuple[float, float]]) -> Iterator[dict[str, Any]]:
    """One rank's events: its process and lanes, steps, profiled spans, collectives and their flows, findings."""
    yield from _metadata(rank, info.get("host"))
    windows = list(zip(steps["start"].astype(float), steps["end"].astype(float)))
    for row in steps.itertuples(index=False):
        yield _slice(rank, STEPS, f"step {int(row.step)}" + (" (profiled)" if getattr(row, "profiled", False) else ""),
                     row.start, row.end, origin, _step_args(row))
    yield from _spans(rank, info, analysis, windows, origin)
    if collectives.exists():
        yield from _collectives(rank, collectives, windows, origin, calls)
    yield from _findings(rank, steps, report, origin)


def _metadata(rank: int, host: str | None) -> Iterator[dict[str, Any]]:
    yield {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}}
    yield {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
    if host:
        yield {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": f"host {host}"}}
    for lane, name in LANES.items():
        yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": lane, "args": {"name": name}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": lane, "args": {"sort_index": lane}}


def _slice(rank: int, lane: int, name: str, start_s: float, end_s: float, origin: float,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
    ts = (float(start_s) - origin) * 1e6
    event = {"ph": "X", "name": name, "pid": rank, "tid": lane, "ts": round(ts, 3),
             "dur": round(max(float(end_s) - float(start_s), 0.0) * 1e6, 3)}
    if args:
        event["args"] = args
    return event


def _step_args(row: Any) -> dict[str, Any]:
    fields = row._asdict()
    keep = {k: v for k, v in fields.items() if k.endswith("_ms") or k in ("samples", "tokens", "time_source")}
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in keep.items() if _plain(v)}


def _plain(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (int, str, bool))


def _spans(rank: int, info: dict[str, Any], analysis: Path, windows: list[tuple[float, float]],
           origin: float) -> Iterator[dict[str, Any]]:
    """The profiled timeline's spans inside the chosen steps (published on the run's clock, Unix µs)."""
    name = info.get("spans")
    path = (analysis / name).resolve() if isinstance(name, str) else None
    if path is None or not path.is_relative_to(analysis.resolve()) or not path.exists():
        return
    spans = pd.read_parquet(path, columns=["start_us", "end_us", "kind", "name"])
    spans = spans[spans["kind"].isin(list(SPAN_LANES))]
    inside = iv.overlapping(spans["start_us"].to_numpy(), spans["end_us"].to_numpy(), _us(windows))
    for row in spans[inside].itertuples(index=False):
        yield _slice(rank, SPAN_LANES[str(row.kind)], str(row.name), row.start_us / 1e6, row.end_us / 1e6, origin)


def _collectives(rank: int, path: Path, windows: list[tuple[float, float]], origin: float,
                 calls: dict[tuple[str, int, int], tuple[float, float]]) -> Iterator[dict[str, Any]]:
    """The rank's collective calls in the chosen steps, and a flow from the last to arrive to this rank where it
    waited: from the last one's call to this one's, at the moment the last one came (each pair written once,
    with the rank that waited)."""
    present = [c for c in COLLECTIVE_COLUMNS if c in pq.read_schema(path).names]
    mine = pq.read_table(path, columns=present, filters=[("rank", "=", rank)]).to_pandas()
    if mine.empty:
        return
    for row in mine[_inside(mine["ts"], windows)].itertuples(index=False):
        fields = row._asdict()
        group = str(fields.get("group") or "")
        args = {k: fields[k] for k in ("bytes", "wait_us") if k in fields and _plain(fields[k])}
        yield _slice(rank, COLLECTIVES, f"{row.op} #{int(row.seq)}" + (f" ({group})" if group else ""),
                     row.ts / 1e6, (row.ts + row.dur) / 1e6, origin, {"group": group, **args})
        last, waited = fields.get("last_rank"), fields.get("wait_us")
        if not (_plain(last) and _plain(waited) and waited > 0 and int(last) != rank):
            continue
        theirs = calls.get((group, int(row.seq), int(last)))
        if theirs is None:  # the last to arrive is not among the ranks exported
            continue
        came = fields.get("arrived_ts", row.ts) + waited  # when the last one came (Unix µs)
        flow = zlib.crc32(f"{group}|{int(row.seq)}|{rank}".encode())  # the same in every export
        common = {"name": "waited for the last to arrive", "cat": "collective", "id": flow}
        yield {"ph": "s", "pid": int(last), "tid": COLLECTIVES, "ts": _at(came, theirs, origin), **common}
        yield {"ph": "f", "bp": "e", "pid": rank, "tid": COLLECTIVES, "ts": _at(came, (row.ts, row.ts + row.dur), origin),
               **common}


def _at(unix_us: float, call: tuple[float, float], origin: float) -> float:
    """``unix_us`` on the trace's time line, inside ``call``: a flow's end binds to the slice that encloses it."""
    return round((min(max(unix_us, call[0]), call[1]) / 1e6 - origin) * 1e6, 3)  # as _slice computes its ts


def _findings(rank: int, steps: pd.DataFrame, report: dict[str, Any], origin: float) -> Iterator[dict[str, Any]]:
    """Each finding on this rank as a slice over each run of consecutive steps it names (its whole window where it
    names none)."""
    times = steps.set_index("step")[["start", "end"]]
    for f in report.get("findings") or []:
        if not isinstance(f, dict) or rank not in (f.get("ranks") or []):
            continue
        named = sorted(int(s) for s in (f.get("steps") or []) if int(s) in times.index) or sorted(times.index)
        if not named:
            continue
        args = {"severity": f.get("severity"), "explanation": f.get("explanation"), "suggestion": f.get("suggestion"),
                "impact_ms": f.get("impact_ms"), "steps": ranges(named)}
        for first, last in _runs(named):
            yield _slice(rank, FINDINGS, f"{f.get('severity')}: {f.get('kind')}", times.loc[first, "start"],
                         times.loc[last, "end"], origin, {k: v for k, v in args.items() if v is not None})


def _runs(steps: list[int]) -> Iterator[tuple[int, int]]:
    """Consecutive runs of sorted step numbers, as (first, last)."""
    start = prev = steps[0]
    for s in steps[1:]:
        if s != prev + 1:
            yield start, prev
            start = s
        prev = s
    yield start, prev
