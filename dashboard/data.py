"""A run as the dashboard sees it: the analyzer's output, read once, spans loaded on first use.

Only files the analysis wrote are read (report.json and ``analysis/``); the raw traces and logs
are never opened here. Times are kept as seconds since the run's first step (``t0``), the
timeline's x axis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.analyzer.per_rank.timeline import SPAN_KINDS
from diagtrain.profiler.compare import summary as run_summary

# What `diagtrain analyze` must have written for the dashboard to open a run.
REQUIRED = ("report.json", "analysis/steps.parquet", "analysis/timeline.json")
MESH_ORDER = ("pp", "dp", "tp")  # the reference trainers' DeviceMesh dimension order


class RunError(ValueError):
    """A run directory the dashboard cannot open; the message names the path and the problem."""


@dataclass
class Lane:
    """One rank's row on the timeline."""

    rank: int
    host: str
    label: str  # "vm · r3 pp0 dp1 tp1"


@dataclass
class Spans:
    """One rank's timeline spans as arrays (seconds since t0), sorted by start within each kind."""

    start: dict[str, np.ndarray]
    end: dict[str, np.ndarray]
    name: dict[str, np.ndarray]
    _union: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def union(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """The spans of ``kind`` merged into sorted disjoint intervals, computed once."""
        if kind not in self._union:
            self._union[kind] = iv.merge(self.start.get(kind, np.empty(0)), self.end.get(kind, np.empty(0)))
        return self._union[kind]

    def count(self) -> int:
        """How many spans of every kind."""
        return sum(len(s) for s in self.start.values())


@dataclass
class LiveMark:
    """A running job's view (dashboard/live.py): where it stands; the final analysis replaces it."""

    state: str  # the job's: running, analyzing, or ended (without an analysis so far)
    step: int | None  # the latest step every rank has finished
    updated_at: float  # Unix seconds of the last read of the run


@dataclass
class RunData:
    """Everything one run's views need."""

    path: Path
    report: dict[str, Any]
    steps: pd.DataFrame  # rank, step, start/end (s since t0), wall_ms, <phase>_ms, ...
    ranks: pd.DataFrame
    collectives: pd.DataFrame
    telemetry: pd.DataFrame  # one row per sample, with ``t`` (s since t0)
    nccl: dict[str, Any]
    hang: dict[str, Any]
    timeline: dict[str, Any]
    t0: float  # Unix seconds of x = 0
    lanes: list[Lane] = field(default_factory=list)
    _spans: dict[int, Spans | None] = field(default_factory=dict, repr=False)
    _summary: dict[str, Any] | None = field(default=None, repr=False)
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)  # what views derive once from the above
    live: LiveMark | None = None  # set while the job runs: steps and findings so far, no traces or analysis

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.report.get("findings", [])

    @property
    def phases(self) -> list[str]:
        """Phases of the step records, in the order a step runs them."""
        return [p for p in self.report.get("run", {}).get("phases") or [] if f"{p}_ms" in self.steps]

    @property
    def end(self) -> float:
        """Seconds from t0 to the end of the last step."""
        return float(self.steps["end"].max()) if "end" in self.steps and len(self.steps) else 0.0

    def summary(self) -> dict[str, Any]:
        """What `diagtrain compare` compares of this run (per-step samples and facts), computed once."""
        if self._summary is None:
            self._summary = run_summary.summarize(self.path)
        return self._summary

    def load_spans(self, ranks: list[int]) -> None:
        """Read the spans of those of ``ranks`` not read yet, in one scan."""
        missing = {r: self.timeline["ranks"].get(str(r)) for r in ranks if r not in self._spans}
        if len(missing) > 1:
            self._spans.update(_read_many_spans(self.path / "analysis", missing, self.t0))

    def spans(self, rank: int) -> Spans | None:
        """The rank's spans, read from the analysis on first use (None when it has no trace)."""
        if rank not in self._spans:
            self._spans[rank] = _read_spans(self.path / "analysis", self.timeline["ranks"].get(str(rank)), self.t0)
        return self._spans[rank]


def missing_analysis(run: Path) -> list[str]:
    """The analysis files that ``run`` lacks (empty: the dashboard can open it)."""
    return [name for name in REQUIRED if not (run / name).exists()]


def load(run: Path, progress: Callable[[str], None] = lambda _: None) -> RunData:
    """Read a run's analysis; raise :class:`RunError` naming what is missing or unreadable."""
    missing = missing_analysis(run)
    if missing:
        raise RunError(f"{run}: no analysis ({', '.join(missing)} missing); run `diagtrain analyze {run}`")
    analysis = run / "analysis"
    try:
        report = json.loads((run / "report.json").read_text())
        steps = pd.read_parquet(analysis / "steps.parquet")
        ranks = pd.read_parquet(analysis / "ranks.parquet") if (analysis / "ranks.parquet").exists() else pd.DataFrame()
        collectives = _optional_parquet(analysis / "collectives.parquet")
        telemetry = _optional_parquet(analysis / "telemetry.parquet")
        timeline = json.loads((analysis / "timeline.json").read_text())
        nccl = _optional_json(analysis / "nccl.json")
        hang = _optional_json(analysis / "hang.json")
    except (OSError, ValueError) as e:
        raise RunError(f"{run}: cannot read its analysis: {e}") from None
    for name, doc in (("report.json", report), ("analysis/timeline.json", timeline)):
        if not isinstance(doc, dict):
            raise RunError(f"{run}: {name} holds {type(doc).__name__}, not the analysis; run `diagtrain analyze {run}`")
    if not isinstance(timeline.get("ranks", {}), dict) or not isinstance(report.get("findings", []), list):
        raise RunError(f"{run}: its analysis is damaged; run `diagtrain analyze {run}`")
    progress(f"read {run}")
    t0 = _origin(steps, timeline, analysis)
    steps, telemetry = since(steps, telemetry, t0)
    data = RunData(path=run, report=report, steps=steps, ranks=ranks, collectives=collectives, telemetry=telemetry,
                   nccl=nccl, hang=hang, timeline=timeline, t0=t0)
    data.lanes = lanes(report, steps, timeline)
    if not data.lanes and not hang.get("flight_recorder"):  # dumps alone still make a Hang tab
        raise RunError(f"{run}: nothing to show: the analysis found no step records and no traces there")
    return data


def since(steps: pd.DataFrame, telemetry: pd.DataFrame, t0: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Steps and telemetry with their times as seconds since ``t0`` (Unix seconds): the timeline's x."""
    steps = steps.assign(**{c: steps[c] - t0 for c in ("start", "end") if c in steps})
    if not telemetry.empty:
        telemetry = telemetry.assign(t=_unix_seconds(telemetry["time"]) - t0)
    return steps, telemetry


def lanes(report: dict[str, Any], steps: pd.DataFrame, timeline: dict[str, Any]) -> list[Lane]:
    """One lane per rank, grouped by host, labelled with the rank's mesh coordinate when 3D."""
    ranks = sorted({int(r) for r in steps["rank"].unique()} | {int(r) for r in timeline.get("ranks", {})}) \
        if len(steps) or timeline.get("ranks") else []
    hosts = {int(r): info.get("host") or "" for r, info in timeline.get("ranks", {}).items()}
    run_hosts = report.get("run", {}).get("hosts") or []
    mesh = report.get("run", {}).get("mesh") or {}
    structure = report.get("structure") or {}
    found = []
    for rank in ranks:
        host = hosts.get(rank) or (run_hosts[0] if len(run_hosts) == 1 else "")
        coordinate = structure_coordinate(rank, structure) or mesh_coordinate(rank, mesh)
        label = f"r{rank}" + (f" {coordinate}" if coordinate else "")
        found.append(Lane(rank=rank, host=host, label=f"{host} · {label}" if host else label))
    return sorted(found, key=lambda lane: (lane.host, lane.rank))


def structure_coordinate(rank: int, structure: dict[str, Any]) -> str:
    """``dp1 tp0`` from the DeviceMesh the analysis found in the run (two or more dimensions), else ``""``."""
    dims = {d: n for d, n in (structure.get("mesh") or {}).items() if n > 1}
    coords = (structure.get("coords") or {}).get(str(rank)) or {}
    if len(dims) < 2 or structure.get("mesh_source") != "process groups":
        return ""
    return " ".join(f"{d}{coords[d]}" for d in dims if d in coords)


def mesh_coordinate(rank: int, mesh: dict[str, int]) -> str:
    """``pp0 dp1 tp1`` for a rank of a mesh with more than one dimension above 1, else ``""``."""
    sizes = [(name, int(mesh.get(name) or 1)) for name in MESH_ORDER]
    if sum(size > 1 for _, size in sizes) < 2:
        return ""
    parts, stride = [], 1
    for name, size in reversed(sizes):
        parts.append(f"{name}{(rank // stride) % size}")
        stride *= size
    return " ".join(reversed(parts))


def _origin(steps: pd.DataFrame, timeline: dict[str, Any], analysis: Path) -> float:
    """The run's first step start, else the first span (Unix seconds)."""
    if "start" in steps and steps["start"].notna().any():
        return float(steps["start"].min())
    firsts = []
    for info in timeline.get("ranks", {}).values():
        path = spans_file(analysis, info)
        try:
            spans = pd.read_parquet(path, columns=["start_us"]) if path else pd.DataFrame()
        except (OSError, ValueError, KeyError):
            continue
        if len(spans):
            firsts.append(float(spans["start_us"].min()) / 1e6)
    return min(firsts, default=0.0)


def spans_file(analysis: Path, info: Any) -> Path | None:
    """A rank's spans file named in timeline.json, only if it lies inside ``analysis`` (never ``../..``)."""
    name = info.get("spans") if isinstance(info, dict) else None
    if not isinstance(name, str):
        return None
    path = (analysis / name).resolve()
    return path if path.is_relative_to(analysis.resolve()) else None


def _read_spans(analysis: Path, info: dict[str, Any] | None, t0: float) -> Spans | None:
    path = spans_file(analysis, info)
    if path is None:
        return None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None  # the spans were removed after the analysis: the lane shows step blocks only
    return _spans_of(table, t0)


def _read_many_spans(analysis: Path, infos: dict[int, Any], t0: float) -> dict[int, Spans | None]:
    """Several ranks' spans in one dataset scan: many times faster than a file at a time at 1,000 ranks."""
    paths = {rank: spans_file(analysis, info) for rank, info in infos.items()}
    found: dict[int, Spans | None] = {rank: None for rank, path in paths.items() if path is None or not path.exists()}
    readable = {str(path): rank for rank, path in paths.items() if rank not in found}
    if not readable:
        return found
    batches: dict[str, list] = {}
    try:
        for tagged in ds.dataset(list(readable), format="parquet").scanner().scan_batches():
            batches.setdefault(tagged.fragment.path, []).append(tagged.record_batch)
    except (OSError, ValueError, KeyError, pa.ArrowException):  # one damaged file: read them one by one
        return found | {rank: _read_spans(analysis, infos[rank], t0) for rank in readable.values()}
    for path, rank in readable.items():
        parts = batches.get(path)
        found[rank] = _spans_of(pa.Table.from_batches(parts), t0) if parts else None
    return found


def _spans_of(table: pa.Table, t0: float) -> Spans:
    """A spans table (start_us, end_us, kind, name; on the run's clock) as per-kind arrays in seconds since t0."""
    kinds = _strings(table.column("kind"))
    names = _strings(table.column("name"))
    starts = table.column("start_us").to_numpy().astype(np.float64) / 1e6 - t0
    ends = table.column("end_us").to_numpy().astype(np.float64) / 1e6 - t0
    start, end, name = {}, {}, {}
    for kind in SPAN_KINDS:
        rows = kinds == kind
        start[kind], end[kind], name[kind] = starts[rows], ends[rows], names[rows]
    return Spans(start, end, name)


def _strings(column: pa.ChunkedArray) -> np.ndarray:
    """A string column (dictionary-encoded or not) as a numpy array of str."""
    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        values = np.asarray(array.dictionary.to_pylist(), dtype=object).astype(str)
        return values[array.indices.to_numpy(zero_copy_only=False)] if len(values) else np.empty(len(array), str)
    return np.asarray(array.to_pylist(), dtype=object).astype(str)


def _unix_seconds(times: pd.Series) -> pd.Series:
    """Telemetry times (timestamps or Unix seconds) as Unix seconds."""
    if times.dtype.kind == "M":
        return times.astype("int64") / 1e9
    return times.astype(float)


def _optional_parquet(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _optional_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
