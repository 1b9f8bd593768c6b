"""The analyzer: run directory (or a folder of traces) → tables → detectors → findings → report."""

import os


def default_workers() -> int:
    """Worker processes that load ranks: one per core, at least one."""
    return max(1, os.cpu_count() or 1)
