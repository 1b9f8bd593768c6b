"""The analysis pipeline: inputs → per-rank loads → tables → health → detectors → report."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from diagtrain.profiler.analyzer import cluster, contention, critical_path, detectors, expected, health, load, outputs, report, tables
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.plan.measured import read_spans
from diagtrain.profiler.util.heap import arrow_on_the_c_heap


def analyze(path: Path, out: Path, formats: list[str], workers: int,
            progress: Callable[[str], None] = lambda _: None, flight_recorder: Path | None = None,
            scheduler: str | None = None) -> dict[str, Any]:
    """Analyze the run directory or trace folder ``path``; write results under ``out``. The ranks load on
    the Dask cluster of ``scheduler`` when given (cluster.SchedulerError if it cannot be used), else here."""
    arrow_on_the_c_heap()  # the tables' Arrow columns too: their freed pages go back with malloc's
    analysis_dir = out / "analysis"
    analysis_dir.mkdir(parents=True, exist_ok=True)
    inputs, skipped = load.discover(path)
    progress(f"{len(inputs)} rank inputs in {path}")
    if scheduler:
        progress(f"connecting to the Dask scheduler at {scheduler}")
    with cluster.connect(scheduler) if scheduler else nullcontext() as on_cluster:
        results, more_skipped = load.load(inputs, analysis_dir / "cache", workers, progress, on_cluster)
    skipped += more_skipped
    progress("building the tables")
    t = tables.build(path, results, flight_recorder)
    skipped += t.skipped
    notes = health.check(t, results)
    progress("running the detectors")
    findings = run_detectors(t, progress, notes)
    progress("tracing the critical path")
    path_section = trace_critical_path(t, findings, progress)
    model_section, model_findings = check_expected(t, results, analysis_dir / "cache", progress)
    findings = report.order(findings + model_findings)
    doc = report.build(path, t, findings, notes, [asdict(s) for s in skipped])
    doc["expected"] = model_section
    doc["critical_path"] = path_section
    progress("writing the results")
    outputs.write(analysis_dir, t, doc, results)
    report.write(out, doc, formats, t)
    return doc


def run_detectors(t: tables.Tables, progress: Callable[[str], None], notes: list[dict] | None = None) -> list[Finding]:
    """Every registered detector; one that fails is reported (in the health ``notes`` too), never fatal.
    A rank slowed by other processes on its host, or by its allocator's memory churn, is not reported as a
    straggler or a late rank (contention.py)."""
    found = []
    for name, detect in detectors.all_detectors().items():
        try:
            found += detect(t)
        except Exception as e:  # noqa: BLE001 - one broken detector must not hide the others
            progress(f"detector {name} failed: {type(e).__name__}: {e}")
            if notes is not None:
                notes.append({"check": "detector", "severity": "warning",
                              "message": f"the {name} detector failed ({type(e).__name__}: {e}); its findings are "
                                         "missing from this report"})
    try:
        found = contention.own_work_only(found, t)
    except Exception as e:  # noqa: BLE001 - the findings stand as the detectors made them
        progress(f"host contention check failed: {type(e).__name__}: {e}")
    return report.order(detectors.explained(found))


def trace_critical_path(t: tables.Tables, findings: list[Finding], progress: Callable[[str], None]) -> dict[str, Any]:
    """The critical-path section; the stragglers' impact from its what-ifs. A failure is reported, never fatal."""
    try:
        paths = critical_path.analyze(t)
        critical_path.with_impacts(findings, paths)
        return paths.section()
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"critical path failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def check_expected(t: tables.Tables, results: list[load.RankResult], cache: Path,
                   progress: Callable[[str], None]) -> tuple[dict | None, list[Finding]]:
    """The expected-vs-measured section and its findings; a failure is reported, never fatal."""
    files = {r.rank: load.spans_path(cache, r) for r in results}

    def spans_of(rank: int):
        return read_spans(files[rank], t.clock_shifts_us.get(rank, 0.0)) if rank in files else None

    try:
        return expected.check(t, spans_of)
    except Exception as e:  # noqa: BLE001 - the model's check must not take the analysis down
        progress(f"expected vs measured failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}, []
