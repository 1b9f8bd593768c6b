"""The analysis pipeline: inputs → per-rank loads → tables → health → detectors → report."""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from diagtrain.profiler.analyzer import detectors, health, load, report, tables
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.run_dir import write_bytes_atomic, write_json_atomic


def analyze(path: Path, out: Path, formats: list[str], workers: int,
            progress: Callable[[str], None] = lambda _: None, flight_recorder: Path | None = None) -> dict[str, Any]:
    """Analyze the run directory or trace folder ``path``; write results under ``out``."""
    analysis_dir = out / "analysis"
    analysis_dir.mkdir(parents=True, exist_ok=True)
    inputs, skipped = load.discover(path)
    progress(f"{len(inputs)} rank inputs in {path}")
    results, more_skipped = load.load(inputs, analysis_dir / "cache", workers, progress)
    skipped += more_skipped
    t = tables.build(path, results, flight_recorder)
    notes = health.check(t, results)
    findings = run_detectors(t, progress)
    doc = report.build(path, t, findings, notes, [asdict(s) for s in skipped])
    _write_tables(analysis_dir, t, doc)
    report.write(out, doc, formats, t)
    return doc


def run_detectors(t: tables.Tables, progress: Callable[[str], None]) -> list[Finding]:
    """Every registered detector; one that fails is reported, never fatal."""
    found = []
    for name, detect in detectors.all_detectors().items():
        try:
            found += detect(t)
        except Exception as e:  # noqa: BLE001 - one broken detector must not hide the others
            progress(f"detector {name} failed: {type(e).__name__}: {e}")
    return report.order(found)


def _write_tables(analysis_dir: Path, t: tables.Tables, doc: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_bytes_atomic(analysis_dir / "steps.parquet", t.steps.to_parquet(index=False))
        write_bytes_atomic(analysis_dir / "ranks.parquet", t.ranks.to_parquet(index=False))
        if not t.collectives.empty:
            c = t.collectives.assign(group_ranks=t.collectives["group_ranks"].map(list))
            write_bytes_atomic(analysis_dir / "collectives.parquet", c.to_parquet(index=False))
    write_json_atomic(analysis_dir / "findings.json", doc["findings"])
