"""Detectors: one module each, a ``detect(tables) -> list[Finding]`` function, registered here.

Adding a detector means adding its module and its name to ``DETECTORS``; nothing else changes.
When two findings describe one cause, ``explained`` keeps the one that names the cause.
"""

from __future__ import annotations

import importlib
from typing import Callable

from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import Tables

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
    "missing_evidence",
)


def all_detectors() -> dict[str, Callable[[Tables], list[Finding]]]:
    """name -> detect function, in registration order."""
    return {name: importlib.import_module(f"{__name__}.{name}").detect for name in DETECTORS}


def explained(findings: list[Finding]) -> list[Finding]:
    """Drop findings another one explains: a straggler arrives last at the collectives after its
    slow work, so a late-arrival slow_collective on the same rank says nothing new."""
    stragglers = {r for f in findings if f.kind == "straggler" for r in f.ranks}
    return [f for f in findings
            if not (f.kind == "slow_collective" and "observed_late_share" in f.metrics and set(f.ranks) <= stragglers)]
