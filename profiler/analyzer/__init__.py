"""The analyzer: run directory (or a folder of traces) → tables → detectors → findings → report."""

import os
from pathlib import Path

from diagtrain.profiler.run_dir import is_run_dir

# The Dask scheduler's address, for `diagtrain analyze` where --scheduler cannot be passed (cluster.py).
SCHEDULER_ENV = "DIAGTRAIN_DASK_SCHEDULER"


def default_workers() -> int:
    """Worker processes that load ranks: one per core, at least one."""
    return max(1, os.cpu_count() or 1)


def analysis_home(path: Path) -> Path:
    """Where the analysis of ``path`` goes unless told: into a run directory, beside any other folder."""
    if is_run_dir(path):
        return path
    folder = path.resolve()  # "." has no name of its own
    return folder.with_name(f"{folder.name}-diagtrain")


def holds_inputs(path: Path) -> bool:
    """Whether ``path`` holds anything the analyzer reads: a run's files, or trace files."""
    try:
        return any(p.name in ("ranks", "manifest.json") or p.name.endswith((".json", ".json.gz")) for p in path.iterdir())
    except OSError:
        return True  # let the analysis say what it cannot read


def holds_dumps(path: Path) -> bool:
    """Whether ``path`` holds flight-recorder dumps (files that start as a pickle or a dump's JSON)."""
    from diagtrain.profiler.analyzer.read.flight_records import looks_like_dump

    try:
        return any(looks_like_dump(p) for p in path.iterdir() if p.is_file())
    except OSError:
        return False
