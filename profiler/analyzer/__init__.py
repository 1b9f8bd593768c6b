"""The analyzer: run directory (or a folder of traces) → tables → detectors → findings → report."""

import os

# The Dask scheduler's address, for `diagtrain analyze` where --scheduler cannot be passed (cluster.py).
SCHEDULER_ENV = "DIAGTRAIN_DASK_SCHEDULER"


def default_workers() -> int:
    """Worker processes that load ranks: one per core, at least one."""
    return max(1, os.cpu_count() or 1)
