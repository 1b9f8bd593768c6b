"""Which files hold which rank: a run directory's rank folders, or a folder of traces, one file per rank.

Input is a diagtrain run directory (``ranks/<r>/trace-*.json.gz``, several windows per rank, and
the flight-recorder dumps) or any folder of PyTorch Profiler traces, one file per rank, as
Holistic Trace Analysis takes them. Nothing is read here: the files are only found and named, and
what their folder or name says of their rank noted (rank_names.py) for traces that do not say it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from diagtrain.profiler.analyzer.read.inputs import Skipped, rank_number
from diagtrain.profiler.analyzer.read.rank_names import ranks_from_names
from diagtrain.profiler.util.bounded_read import display

TRACE_PATTERNS = ("*.json", "*.json.gz")
OWN_FILES = {"report.json", "manifest.json", "trainer.json", "injected.json"}  # diagtrain's, not traces


@dataclass
class RankInput:
    """The files of one rank (a run directory's rank folder, or one trace file)."""

    key: str
    files: list[Path]
    rank_hint: int | None  # from the folder or file name
    flight_recorder: Path | None = None
    rank_why: str = ""  # how the folder or name gave ``rank_hint``, or why the name gave none


def discover(path: Path) -> tuple[list[RankInput], list[Skipped]]:
    """The rank inputs under ``path``: a run directory's ranks, else the trace files in it."""
    ranks_dir = path / "ranks"
    if ranks_dir.is_dir():
        inputs, skipped = [], []
        try:
            folders = [p for p in ranks_dir.iterdir() if rank_number(p.name) is not None and p.is_dir()]
        except OSError as e:
            return [], [Skipped(display(ranks_dir), f"cannot list ({e.strerror or e})")]
        for folder in sorted(folders, key=lambda p: int(p.name)):
            try:
                files = sorted(f for pattern in TRACE_PATTERNS for f in folder.glob("trace-" + pattern))
            except OSError as e:
                skipped.append(Skipped(display(folder), f"cannot list ({e.strerror or e})"))
                continue
            fr = folder / "flight_recorder.json"
            if files:
                inputs.append(RankInput(f"rank-{folder.name}", files, int(folder.name), fr if fr.exists() else None,
                                        f"its folder ranks/{folder.name}"))
        return inputs, skipped
    files = sorted(f for pattern in TRACE_PATTERNS for f in path.glob(pattern) if f.name not in OWN_FILES)
    named = ranks_from_names([f.name for f in files])
    return [RankInput(_key(f), [f], n.rank, rank_why=n.why) for f, n in zip(files, named)], []


def _key(path: Path) -> str:
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", path.name)
    if key != path.name:  # two names that differ only in replaced characters keep separate caches
        key += "-" + hashlib.sha256(os.fsencode(path.name)).hexdigest()[:8]
    return key
