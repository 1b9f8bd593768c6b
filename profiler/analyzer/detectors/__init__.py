"""Detectors: one module each, a ``detect(tables) -> list[Finding]`` function, registered here.

Adding a detector means adding its module and its name to ``DETECTORS``; nothing else changes.
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
)


def all_detectors() -> dict[str, Callable[[Tables], list[Finding]]]:
    """name -> detect function, in registration order."""
    return {name: importlib.import_module(f"{__name__}.{name}").detect for name in DETECTORS}
