"""Judgement, in the order it happens: the detectors, then every pass that changes their findings.

Adding a detector: its module in ``detectors/`` (a ``detect(tables) -> list[Finding]`` and, for its
thresholds, a settings class registered with ``settings.section``) and its name in ``DETECTORS``.
Adding a pass that rewrites findings: a function ``(findings, tables) -> findings`` in ``PASSES``.
Every finding records the settings its detector ran with (``Finding.settings``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import pandas as pd

from diagtrain.profiler.analyzer import settings
from diagtrain.profiler.analyzer.judge import contention, cost, critical_path, expected, traced_excess
from diagtrain.profiler.analyzer.judge.explained import explained
from diagtrain.profiler.analyzer.judge.findings import Finding, order
from diagtrain.profiler.analyzer.run.tables import Tables

DETECTORS = (
    "hang",
    "straggler",
    "dataloader_stall",
    "memory_imbalance",
    "pipeline_bubble",
    "slow_collective",
    "exposed_communication",
    "nccl_transport",
    "gpu_throttling",
    "low_utilization",
    "host_contention",
    "memory_growth",
    "missing_evidence",
)

# Passes over the detectors' findings, in order; each takes (findings, tables) and returns findings.
PASSES: tuple[tuple[str, Callable[[list[Finding], Tables], list[Finding]]], ...] = (
    # Stragglers and data stalls priced by what they cost the job over the whole run (the ledger),
    # with one severity rule; a cause in the ledger that no detector named becomes a finding.
    ("cost", cost.priced),
    # A rank slowed by other processes on its host, or by its allocator's memory churn, is lowered to
    # info and said so: it is not a straggler or a late rank.
    ("host contention", contention.own_work_only),
    # A late arrival that a straggler explains says nothing new.
    ("explained", lambda findings, _: explained(findings)),
)

def detector_modules() -> dict[str, ModuleType]:
    """name -> detector module, in registration order."""
    return {name: importlib.import_module(f"{__package__}.detectors.{name}") for name in DETECTORS}


@dataclass
class Judgement:
    """What judgement gives the report: the findings, ranked, and the sections they rest on."""

    findings: list[Finding]
    critical_path: dict[str, Any]
    expected: dict[str, Any] | None
    ledger: dict[str, Any] | None


def judge(t: Tables, spans_of: Callable[[int], pd.DataFrame | None], progress: Callable[[str], None],
          notes: list[dict]) -> Judgement:
    """Detectors, passes, the critical path and expected vs measured. A failing step is reported (in
    ``notes`` too for a detector), never fatal."""
    progress("running the detectors")
    findings = run_passes(run_detectors(t, progress, notes), t, progress)
    findings = traced(findings, t, spans_of, progress)
    progress("tracing the critical path")
    path_section = trace_critical_path(t, findings, progress)
    findings = cost.reconcile(findings)
    model_section, model_findings = check_expected(t, spans_of, progress)
    return Judgement(order(findings + model_findings), path_section, model_section, ledger_section(t, progress))


def ledger_section(t: Tables, progress: Callable[[str], None]) -> dict[str, Any] | None:
    """The report's "where the time went"; a failure is reported, never fatal."""
    try:
        return cost.ledger_section(t)
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"ledger failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def run_detectors(t: Tables, progress: Callable[[str], None], notes: list[dict] | None = None,
                  only: list[str] | None = None) -> list[Finding]:
    """Every registered detector's findings (those named in ``only``, when given), each stamped with the
    settings it ran with."""
    found = []
    for name, module in detector_modules().items():
        if only is not None and name not in only:
            continue
        try:
            made = module.detect(t)
        except Exception as e:  # noqa: BLE001 - one broken detector must not hide the others
            progress(f"detector {name} failed: {type(e).__name__}: {e}")
            if notes is not None:
                notes.append({"check": "detector", "severity": "warning",
                              "message": f"the {name} detector failed ({type(e).__name__}: {e}); its findings are "
                                         "missing from this report"})
            continue
        used = _settings_of(module)
        for f in made:
            f.settings = {**used, **f.settings}
        found += made
    return found


def run_passes(findings: list[Finding], t: Tables, progress: Callable[[str], None]) -> list[Finding]:
    """``PASSES`` in order; a pass that fails leaves the findings as they were."""
    for name, apply in PASSES:
        try:
            findings = apply(findings, t)
        except Exception as e:  # noqa: BLE001 - the findings stand as they were
            progress(f"{name} check failed: {type(e).__name__}: {e}")
    return findings


def traced(findings: list[Finding], t: Tables, spans_of: Callable[[int], pd.DataFrame | None],
           progress: Callable[[str], None]) -> list[Finding]:
    """Ledger-priced findings told which operators their excess was in, where traced; never fatal."""
    try:
        return traced_excess.refine(findings, t, spans_of)
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"reading the traced excess failed: {type(e).__name__}: {e}")
        return findings


def trace_critical_path(t: Tables, findings: list[Finding], progress: Callable[[str], None]) -> dict[str, Any]:
    """The critical-path section; the stragglers' impact from its what-ifs. A failure is reported, never fatal."""
    try:
        paths = critical_path.analyze(t)
        critical_path.with_impacts(findings, paths, t.ledger)
        return paths.section()
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"critical path failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def check_expected(t: Tables, spans_of: Callable[[int], pd.DataFrame | None],
                   progress: Callable[[str], None]) -> tuple[dict | None, list[Finding]]:
    """The expected-vs-measured section and its findings; a failure is reported, never fatal."""
    try:
        section, found = expected.check(t, spans_of)
    except Exception as e:  # noqa: BLE001 - the model's check must not take the analysis down
        progress(f"expected vs measured failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}, []
    used = _settings_of(expected)
    for f in found:
        f.settings = {**used, **f.settings}
    return section, found


def _settings_of(module: ModuleType) -> dict[str, Any]:
    """``{"section.name": value}`` of the settings classes a module declares it judges with."""
    out: dict[str, Any] = {}
    for cls in getattr(module, "SETTINGS", ()):
        out.update(settings.values(cls.active()))
    return out


def all_sections() -> dict[str, type]:
    """Every settings section of the analyzer (importing every judging module registers them)."""
    detector_modules()
    importlib.import_module(f"{__package__}.live")  # live judgement's own: how often, over which steps
    return dict(settings.SECTIONS)
