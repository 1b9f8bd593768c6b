"""The profiled windows of a running job, loaded as the final analysis loads them, for live judgement.

Each rank writes a window's trace when the window ends (``ranks/<r>/trace-rank<r>-steps<a>-<b>.json.gz``,
renamed into place whole), under ``--profile-steps auto`` (the default) as under given ranges. Once
every rank has finished a step after a window, live judgement loads the ranks' traces with the final
analysis' own loader (per_rank/load.py, into analysis/cache; the final analysis reuses a rank's tables
unless a flight-recorder dump came since, which ranks write at the end and which the loader pairs
gloo's calls with) and matches their collectives (per_rank/collectives.py): what slow_collective, and the straggler
detector's test of a delay right before the calls, judge. Loading is the costly part of a judgement
(a second or more a rank on GPU traces), so it happens once a new window is complete, and live
judgement's pacing (``live.max_cpu_share``) counts it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from diagtrain.profiler.analyzer.per_rank import load
from diagtrain.profiler.analyzer.per_rank.collectives import match
from diagtrain.profiler.analyzer.read.discover import RankInput, discover
from diagtrain.profiler.run_dir import ANALYSIS_CACHE

WINDOW = re.compile(r"-steps(\d+)-(\d+)\.json(?:\.gz)?$")  # instrument.py's name for a window's trace


class LiveTraces:
    """The collectives of every profiled window that all ranks are past, matched across ranks."""

    def __init__(self, run_dir: Path, max_bytes: float) -> None:
        """``max_bytes``: the trace files (as written, compressed) live judgement loads at most."""
        self.run_dir, self.max_bytes = Path(run_dir), max_bytes
        self.loaded: frozenset[Path] = frozenset()
        self.collectives = pd.DataFrame()
        self.on_gpu = False
        self.problem: str | None = None  # why the last load failed (the counters are judged without traces)
        self._ended: frozenset[int] = frozenset()  # the requested windows' last steps looked for so far

    def update(self, finished: int, requested: set[int]) -> bool:
        """Load the traces again if a window is newly complete (``finished``: the latest step every running
        rank has finished; ``requested``: the steps the ranks were asked to profile); whether the collectives
        changed. The ranks' folders are listed only once a requested window ended (a listing of 1,024 folders
        cost more than the rest of a judgement)."""
        ended = frozenset(s for s in requested if s + 1 not in requested and s < finished)
        if ended == self._ended:
            return False
        self._ended = ended
        inputs = [i for i in (self._complete(i, finished) for i in discover(self.run_dir)[0]) if i.files]
        files = frozenset(f for i in inputs for f in i.files)
        if files == self.loaded:
            return False
        self.loaded = files
        size = sum(f.stat().st_size for f in files if f.exists())
        if size > self.max_bytes:
            self.problem, self.collectives = (f"the profiled windows' traces ({size / 2**20:,.0f} MiB) are left to the final "
                                              "report (live.max_trace_mb)"), pd.DataFrame()
            return True
        try:
            results, _ = load.load(inputs, self.run_dir / ANALYSIS_CACHE, workers=1)
        except Exception as e:  # noqa: BLE001 - traces of another job, a loader failure: judged without them
            self.problem, self.collectives = f"{type(e).__name__}: {e}", pd.DataFrame()
            return True
        parts = [r.collectives for r in results if not r.collectives.empty]
        self.collectives = match(pd.concat(parts, ignore_index=True)) if parts else pd.DataFrame()
        self.on_gpu, self.problem = any(r.on_gpu for r in results), None
        return True

    @staticmethod
    def _complete(item: RankInput, finished: int) -> RankInput:
        """The rank's trace files of windows every running rank has finished a step after (its export is
        done: a rank writes the trace before it goes on)."""
        return replace(item, files=[f for f in item.files if (m := WINDOW.search(f.name)) and int(m.group(2)) < finished])
