"""The analysis pipeline: inputs → per-rank loads → tables → health → detectors → report."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from diagtrain.profiler.analyzer import detectors, health, load, outputs, report, tables
from diagtrain.profiler.analyzer.findings import Finding


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
    outputs.write(analysis_dir, t, doc, results)
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
    return report.order(detectors.explained(found))
