"""The analysis of a run as a Python object, for notebooks: ``diagtrain.load(path)``.

A :class:`Run` reads what the analysis published (report.json and analysis/), analyzing first where there
is no analysis: findings as typed records, ranked as in the report; the tables as pandas DataFrames, on the
run's clock; the reports; and the figures the dashboard draws, as plotly figures. Nothing is read before it
is asked for.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.report.wording import saving_text

REPORTS = {"md": "report.md", "html": "report.html", "json": "report.json"}
# Published per-step columns that are memory, by kind (steps.parquet).
MEMORY_COLUMNS = ("rss_bytes", "peak_mem_bytes", "gpu_allocated_bytes", "gpu_reserved_bytes")


def load(path: str | Path, *, workers: int | None = None, settings: dict[str, Any] | None = None,
         scheduler: str | None = None, out: str | Path | None = None,
         progress: Callable[[str], None] | None = None) -> Run:
    """The analysis of ``path`` (a run directory, a folder of traces, or a folder of flight-recorder dumps),
    analyzed first where it has none, or where ``settings`` ({"straggler.min_excess_ms": 300, ...}) are given;
    ``workers``, ``scheduler`` and ``out`` as the CLI's options. Raise FileNotFoundError or ValueError (bad
    input, a bad setting) naming the path or the setting."""
    from diagtrain.profiler.analyzer import analysis_home, default_workers, holds_dumps, holds_inputs
    from diagtrain.profiler.analyzer.analyze import analyze
    from diagtrain.profiler.util import settings as settings_module

    source = Path(path)
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: no such directory")
    home = Path(out) if out is not None else analysis_home(source)
    if settings or not Run.analyzed(home):
        dumps = source if not holds_inputs(source) and holds_dumps(source) else None
        if not holds_inputs(source) and dumps is None:
            raise ValueError(f"{source}: nothing to analyze: no diagtrain run, no PyTorch Profiler traces and no "
                             "flight-recorder dumps")
        overrides = settings_module.parse([f"{k}={v}" for k, v in (settings or {}).items()])
        analyze(source, home, ["json", "md", "html"], workers or default_workers(), progress=progress or (lambda _: None),
                flight_recorder=dumps, scheduler=scheduler, overrides=overrides)
    return Run(home)


class Run:
    """One run's analysis: ``findings``, the tables, ``report()``, figures. See :func:`load`."""

    def __init__(self, path: str | Path) -> None:
        """The analysis published under ``path`` (report.json, analysis/); :func:`load` analyzes first."""
        self.path = Path(path)
        if not Run.analyzed(self.path):
            raise FileNotFoundError(f"{self.path}: no analysis (report.json, analysis/steps.parquet); "
                                    "diagtrain.load() analyzes it first")

    @staticmethod
    def analyzed(path: Path) -> bool:
        """Whether ``path`` holds a published analysis."""
        return (path / "report.json").exists() and (path / "analysis" / "steps.parquet").exists()

    def __repr__(self) -> str:
        return f"<diagtrain.Run {self.path} ({self.status}, {len(self.findings)} findings)>"

    # -- what the analysis found ----------------------------------------------------------------------

    @cached_property
    def document(self) -> dict[str, Any]:
        """report.json as a dict: every section of the report."""
        return json.loads((self.path / "report.json").read_text())

    @cached_property
    def findings(self) -> list[Finding]:
        """The findings, most worth fixing first (the report's order): their data, and the explanation and suggestion
        the report composed (never composed again here)."""
        fields = Finding.__dataclass_fields__
        return [Finding(**{k: (tuple(v) if k == "time_range" and v else v) for k, v in f.items() if k in fields})
                for f in self.document.get("findings") or []]

    @property
    def status(self) -> str:
        """How the run ended (ok, failed, hung, ...), or "traces" for a folder of traces."""
        return (self.document.get("run") or {}).get("status") or "traces"

    @property
    def settings(self) -> dict[str, Any]:
        """The settings the analysis judged with: every value in force, and those overridden."""
        return self.document.get("settings") or {}

    # -- the tables, on the run's clock ----------------------------------------------------------------

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per rank and step: rank, step, start/end (Unix s), wall_ms, each phase's ``<phase>_ms``, the
        always-on counters (comm_wait_ms, data wait, cpu_ms, runq_ms, memory), and for profiled steps compute_ms,
        comm_ms, exposed_comm_ms, idle_ms (docs/run-directory.md lists every column)."""
        return pd.read_parquet(self.path / "analysis" / "steps.parquet")

    @cached_property
    def ledger(self) -> pd.DataFrame:
        """Where each step's time went, per rank and step: its running, waiting and starved time, its excess over
        its peers, what it cost the job (lost_ms) and whom the others waited for (waited_for)."""
        return self._table("ledger.parquet")

    @cached_property
    def job_time(self) -> pd.DataFrame:
        """Where the job's wall time went, one row per category: seconds, share of the wall time (they add up to
        it), and the mean per steady step (the steps' categories); ``run.goodput`` is the share spent computing.
        Empty for a run without steps."""
        section = self.document.get("job_time") or {}
        if not section.get("wall_s"):
            return pd.DataFrame(columns=["category", "seconds", "share", "per_step_ms"])
        per_step = section.get("per_step_ms") or {}
        return pd.DataFrame([{"category": c, "seconds": s, "share": s / section["wall_s"], "per_step_ms": per_step.get(c)}
                             for c, s in section["seconds"].items()])

    @property
    def goodput(self) -> float | None:
        """The share of the job's wall time spent computing (None for a run without steps)."""
        return (self.document.get("job_time") or {}).get("goodput")

    @cached_property
    def job_steps(self) -> pd.DataFrame:
        """Where the job's steps went: per step on the job's timeline, its time and what its ranks share (compute,
        data, communication, imbalance, other, between, profiler; ms, adding up to ``time_ms``)."""
        return self._table("job_steps.parquet")

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """One row per rank and profiled collective call: group, op, seq, ts/dur (Unix µs), bytes, its wait for the
        last to arrive (wait_us), the transfer (transfer_us), who arrived last (last_rank), bandwidths."""
        return self._table("collectives.parquet")

    @cached_property
    def telemetry(self) -> pd.DataFrame:
        """The wrappers' samples: per host and rank, CPU, memory, GPU (NVML) and other processes, ``time`` UTC."""
        return self._table("telemetry.parquet")

    @cached_property
    def memory(self) -> pd.DataFrame:
        """Memory per rank and step, by kind (the step records' bytes columns that the run recorded)."""
        columns = [c for c in MEMORY_COLUMNS if c in self.steps]
        return self.steps[["rank", "step", *columns]]

    @cached_property
    def critical_path(self) -> pd.DataFrame:
        """The critical path of the median and the worst profiled step, one row per hop (empty without one)."""
        section = self.document.get("critical_path") or {}
        rows = []
        for which in ("median_step", "worst_step"):
            path = section.get(which) or {}
            for i, hop in enumerate(path.get("hops") or []):
                rows.append({"which": which, "step": path.get("step"), "hop": i, **hop})
        return pd.DataFrame(rows)

    def spans(self, rank: int, steps: Iterable[int] | None = None) -> pd.DataFrame:
        """The rank's profiled timeline (start_us, end_us on the run's clock, kind, name), within ``steps``."""
        info = (self._timeline.get("ranks") or {}).get(str(rank)) or {}
        name = info.get("spans")
        if not isinstance(name, str) or not (self.path / "analysis" / name).exists():
            return pd.DataFrame(columns=["start_us", "end_us", "kind", "name"])
        spans = pd.read_parquet(self.path / "analysis" / name, columns=["start_us", "end_us", "kind", "name"])
        if steps is None:
            return spans
        from diagtrain.profiler.util import intervals as iv

        chosen = self.steps[(self.steps["rank"] == rank) & self.steps["step"].isin(list(steps))]
        windows = (chosen["start"].to_numpy() * 1e6, chosen["end"].to_numpy() * 1e6)
        inside = iv.overlapping(spans["start_us"].to_numpy(), spans["end_us"].to_numpy(), windows)
        return spans[inside].reset_index(drop=True)

    # -- reports and figures -----------------------------------------------------------------------------

    def report(self, fmt: str = "md") -> str:
        """The report as written ("md", "html" or "json")."""
        if fmt not in REPORTS:
            raise ValueError(f"format {fmt!r}: choose one of {', '.join(REPORTS)}")
        path = self.path / REPORTS[fmt]
        if not path.exists():
            raise FileNotFoundError(f"{path}: not written by this analysis (diagtrain analyze --format {fmt})")
        return path.read_text()

    def timeline(self, ranks: Iterable[int] | None = None, steps: Iterable[int] | None = None) -> Any:
        """The dashboard's timeline of ``ranks`` over ``steps`` (default: all), as a plotly figure."""
        from diagtrain.dashboard import timeline

        data = self._dashboard
        rows = data.steps if steps is None else data.steps[data.steps["step"].isin(list(steps))]
        if ranks is not None:
            rows = rows[rows["rank"].isin(list(ranks))]
        x0, x1 = (float(rows["start"].min()), float(rows["end"].max())) if len(rows) else (0.0, max(data.end, 1e-3))
        window = timeline.Window(x0, x1, ranks=sorted(int(r) for r in ranks) if ranks is not None else None)
        return _plotly(timeline.figure(data, window))

    def heatmap(self, quantity: str = "wall_ms", relative: bool = True) -> Any:
        """The dashboard's rank x step heatmap of a steps column (default: step time; ``relative``: each cell's
        difference from its step's median), findings outlined, as a plotly figure."""
        from diagtrain.dashboard import heatmap

        if quantity not in self.steps:
            raise ValueError(f"{quantity!r} is not a column of run.steps")
        return _plotly(heatmap.figure(self._dashboard, quantity, heatmap.RELATIVE if relative else heatmap.ABSOLUTE))

    def job_time_figure(self) -> Any:
        """The job's wall time by category as one stacked bar (the dashboard's overview), or None without steps."""
        from diagtrain.profiler.analyzer.report import job_bar

        return job_bar.figure(self.document.get("job_time"))

    def ledger_figure(self) -> Any:
        """What each cause cost the job (the report's "where the time went"), as a plotly bar chart."""
        import plotly.graph_objects as go

        causes = (self.document.get("ledger") or {}).get("causes") or []
        labels = [f"rank {c['rank']}, {c['part']}" for c in causes]
        figure = go.Figure(go.Bar(x=[c["lost_s"] for c in causes], y=labels, orientation="h",
                                  hovertext=[c["pattern"] for c in causes]))
        return figure.update_layout(title="Where the time went: job time lost per cause", xaxis_title="seconds lost",
                                    yaxis={"autorange": "reversed"}, height=160 + 28 * len(causes))

    def _repr_html_(self) -> str:
        """Jupyter's view: the status, the top findings, where the time went."""
        from diagtrain.profiler.analyzer.report.sections import goodput_line

        items = "".join(f"<li><b>{html.escape(f.severity.upper())}</b> {html.escape(f.kind)} "
                        f"{html.escape(_ranks(f.ranks))}{html.escape(_saving(f))}: {html.escape(f.explanation[:300])}</li>"
                        for f in self.findings[:5])
        goodput = goodput_line(self.document.get("job_time"))
        ledger = self.document.get("ledger") or {}
        went = (f"<p>{html.escape(goodput.capitalize())}.</p>" if goodput else "") + (
            f"<p>{ledger.get('steady_steps')} steady steps, {ledger.get('job_s', 0):.2f} s of job time; ranks blocked "
            f"{ledger.get('waiting_s', 0):.2f} s in collectives.</p>" if ledger else "")
        more = f"<p>... and {len(self.findings) - 5} more (run.findings)</p>" if len(self.findings) > 5 else ""
        return (f"<div><p><b>diagtrain run</b> {html.escape(str(self.path))}: <b>{html.escape(self.status)}</b>, "
                f"{self.steps['rank'].nunique()} ranks, {self.steps['step'].nunique()} steps</p>"
                f"<ol>{items or '<li>no findings</li>'}</ol>{more}{went}</div>")

    # -- what the above read once ------------------------------------------------------------------------

    def _table(self, name: str) -> pd.DataFrame:
        path = self.path / "analysis" / name
        return pd.read_parquet(path) if path.exists() else pd.DataFrame()

    @cached_property
    def _timeline(self) -> dict[str, Any]:
        path = self.path / "analysis" / "timeline.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @cached_property
    def _dashboard(self) -> Any:
        from diagtrain.dashboard import data

        return data.load(self.path)


def _plotly(figure: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    return go.Figure(figure)


def _ranks(ranks: list[int]) -> str:
    from diagtrain.profiler.util.text import ranges

    return f"on rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}" if ranks else ""


def _saving(f: Finding) -> str:
    text = saving_text(f.to_json())
    return f" ({text})" if text else ""
