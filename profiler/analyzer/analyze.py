"""The analysis pipeline, one stage after another: read → rank → run → judge → report.

``read/`` finds the inputs, ``rank/`` loads each rank (in worker processes, or on a Dask cluster),
``run/`` builds the cross-rank tables and checks their health, ``judge/`` finds and ranks what went
wrong, ``report/`` writes what the dashboard, ``compare`` and people read.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from diagtrain.profiler.util import settings
from diagtrain.profiler.util.collector import held_objects_spared
from diagtrain.profiler.analyzer.judge import judgement
from diagtrain.profiler.analyzer.per_rank import cluster, load
from diagtrain.profiler.analyzer.per_rank.cache import spans_path
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.analyzer.report import critical_path_section, document, outputs
from diagtrain.profiler.analyzer.run import health, tables
from diagtrain.profiler.analyzer.run.spans import read_spans
from diagtrain.profiler.run_dir import ANALYSIS_CACHE
from diagtrain.profiler.util.heap import arrow_on_the_c_heap


def analyze(path: Path, out: Path, formats: list[str], workers: int,
            progress: Callable[[str], None] = lambda _: None, flight_recorder: Path | None = None,
            scheduler: str | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Analyze the run directory or trace folder ``path``; write results under ``out``. The ranks load on
    the Dask cluster of ``scheduler`` when given (cluster.SchedulerError if it cannot be used), else here.
    ``overrides`` (from ``settings.parse``) replace settings' defaults for this analysis."""
    arrow_on_the_c_heap()  # the tables' Arrow columns too: their freed pages go back with malloc's
    analysis_dir, cache = out / "analysis", out / ANALYSIS_CACHE
    analysis_dir.mkdir(parents=True, exist_ok=True)
    inputs, skipped = discover(path)
    progress(f"{len(inputs)} rank inputs in {path}")
    if scheduler:
        progress(f"connecting to the Dask scheduler at {scheduler}")
    # The results and the tables are held to the end: out of the collector's passes once made. The settings are
    # in force from the ranks' reading (handed to the workers) to the report.
    with held_objects_spared() as held, settings.overriding(overrides or {}):
        with cluster.connect(scheduler) if scheduler else nullcontext() as on_cluster:
            results, more_skipped = load.load(inputs, cache, workers, progress, on_cluster)
        held()
        skipped += more_skipped
        progress("building the tables")
        t = tables.build(path, results, flight_recorder, cache)
        held()
        skipped += t.skipped
        notes = health.check(t, results)
        verdict = judgement.judge(t, spans_reader(t, results, cache), progress, notes)
        doc = document.build(path, t, verdict.findings, notes, [asdict(s) for s in skipped])
        doc["settings"] = used_settings(overrides or {})
        doc["expected"] = verdict.expected
        doc["critical_path"] = critical_path_section.section(verdict.paths, verdict.paths_failure)
        doc["ledger"] = verdict.ledger
        doc["job_time"] = verdict.job_time
        progress("writing the results")
        outputs.write(analysis_dir, t, doc, results)
        document.write(out, doc, formats, t)
    return doc


def spans_reader(t: tables.Tables, results: list[RankResult], cache: Path) -> Callable[[int], Any]:
    """rank -> its timeline spans on the common clock (None for a rank without spans)."""
    files = {r.rank: spans_path(cache, r) for r in results}

    def spans_of(rank: int):
        return read_spans(files[rank], t.clock_shifts_us.get(rank, 0.0)) if rank in files else None
    return spans_of


ANALYZER = "diagtrain.profiler.analyzer"  # the package whose settings sections judge an analysis


def used_settings(overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the report records of its settings: every value in force, and which were overridden."""
    values = {}
    for cls in judgement.all_sections().values():
        # The analysis' own: another stage's sections (compare's) are registered in some processes and not others.
        if cls.__module__.startswith(ANALYZER):
            values.update(settings.values(cls.active()))
    return {"values": values,
            "overridden": {f"{s}.{k}": v for s, fields in sorted(overrides.items()) for k, v in sorted(fields.items())}}
