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

from diagtrain.profiler import run_summary
from diagtrain.profiler.analyzer.timeline import SPAN_KINDS

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

    def count(self) -> int:
        """How many spans of every kind."""
        return sum(len(s) for s in self.start.values())


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
    progress(f"read {run}")
    t0 = _origin(steps, timeline, analysis)
    steps = steps.assign(**{c: steps[c] - t0 for c in ("start", "end") if c in steps})
    if not telemetry.empty:
        telemetry = telemetry.assign(t=_unix_seconds(telemetry["time"]) - t0)
    data = RunData(path=run, report=report, steps=steps, ranks=ranks, collectives=collectives, telemetry=telemetry,
                   nccl=nccl, hang=hang, timeline=timeline, t0=t0)
    data.lanes = lanes(report, steps, timeline)
    if not data.lanes:
        raise RunError(f"{run}: nothing to show: the analysis found no step records and no traces there")
    return data


def lanes(report: dict[str, Any], steps: pd.DataFrame, timeline: dict[str, Any]) -> list[Lane]:
    """One lane per rank, grouped by host, labelled with the rank's mesh coordinate when 3D."""
    ranks = sorted({int(r) for r in steps["rank"].unique()} | {int(r) for r in timeline.get("ranks", {})}) \
        if len(steps) or timeline.get("ranks") else []
    hosts = {int(r): info.get("host") or "" for r, info in timeline.get("ranks", {}).items()}
    run_hosts = report.get("run", {}).get("hosts") or []
    mesh = report.get("run", {}).get("mesh") or {}
    found = []
    for rank in ranks:
        host = hosts.get(rank) or (run_hosts[0] if len(run_hosts) == 1 else "")
        coordinate = mesh_coordinate(rank, mesh)
        label = f"r{rank}" + (f" {coordinate}" if coordinate else "")
        found.append(Lane(rank=rank, host=host, label=f"{host} · {label}" if host else label))
    return sorted(found, key=lambda lane: (lane.host, lane.rank))


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
        spans = pd.read_parquet(analysis / info["spans"], columns=["start_us"])
        if len(spans):
            firsts.append((float(spans["start_us"].min()) + info.get("clock_shift_us", 0.0)) / 1e6)
    return min(firsts, default=0.0)


def _read_spans(analysis: Path, info: dict[str, Any] | None, t0: float) -> Spans | None:
    if not info:
        return None
    try:
        table = pd.read_parquet(analysis / info["spans"])
    except (OSError, ValueError):
        return None  # the cache was removed after the analysis: the lane shows step blocks only
    offset = info.get("clock_shift_us", 0.0)
    start, end, name = {}, {}, {}
    for kind in SPAN_KINDS:
        rows = table[table["kind"] == kind]
        start[kind] = (rows["start_us"].to_numpy(dtype=np.float64) + offset) / 1e6 - t0
        end[kind] = (rows["end_us"].to_numpy(dtype=np.float64) + offset) / 1e6 - t0
        name[kind] = rows["name"].astype(str).to_numpy()
    return Spans(start, end, name)


def _unix_seconds(times: pd.Series) -> pd.Series:
    """Telemetry times (timestamps or Unix seconds) as Unix seconds."""
    if times.dtype.kind == "M":
        return times.astype("int64") / 1e9
    return times.astype(float)


def _optional_parquet(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _optional_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
