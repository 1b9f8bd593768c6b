"""One analysis is one job: traces that disagree on the world size, or two different traces that
claim the same rank, come from different jobs (or windows) and must not be merged into one run.

A copy of a rank's trace (the same steps and times) is no conflict: it is skipped as a duplicate (load.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # load.py calls this module on what it loaded
    from diagtrain.profiler.analyzer.per_rank.result import RankResult

FILES_NAMED = 4  # per group in the message; the rest are counted


class MixedJobs(ValueError):
    """The inputs belong to more than one job; ``conflicts`` says how, one line each, naming the files."""

    def __init__(self, conflicts: list[str]) -> None:
        super().__init__("; ".join(conflicts))
        self.conflicts = conflicts


def check_one_job(results: list[RankResult]) -> None:
    """Raise :class:`MixedJobs` when ``results`` disagree on the world size or two different traces claim one rank."""
    conflicts = _world_sizes(results) + _double_claims(results)
    if conflicts:
        raise MixedJobs(conflicts)


def _world_sizes(results: list[RankResult]) -> list[str]:
    by_size: dict[int, list[str]] = defaultdict(list)
    for r in results:
        if r.world_size is not None:
            by_size[r.world_size] += r.files
    if len(by_size) < 2:
        return []
    return [f"world size {size}: {_files(files)}" for size, files in sorted(by_size.items())]


def _double_claims(results: list[RankResult]) -> list[str]:
    by_rank: dict[int, list[RankResult]] = defaultdict(list)
    for r in results:
        if r.rank >= 0 and r.rank_source == "distributedInfo":
            by_rank[r.rank].append(r)
    conflicts = []
    for rank, claims in sorted(by_rank.items()):
        distinct = {_fingerprint(r): r for r in claims}  # copies of one trace are one claim
        if len(distinct) > 1:
            conflicts.append(f"rank {rank} claimed by {_files([f for r in distinct.values() for f in r.files])}")
    return conflicts


def _fingerprint(result: RankResult) -> tuple:
    """What two reads of the same trace share and two different traces (almost surely) do not."""
    steps = result.steps
    first = float(steps["start_us"].min()) if len(steps) and "start_us" in steps else None
    breakdown = tuple((k, None if isinstance(v, float) and math.isnan(v) else v)  # NaN != NaN: a copy must match
                      for k, v in sorted(result.breakdown.items()))
    return breakdown, len(steps), first, result.world_size


def _files(files: list[str]) -> str:
    names = [Path(f).name for f in files]
    more = len(names) - FILES_NAMED
    return ", ".join(names[:FILES_NAMED]) + (f" and {more} more" if more > 0 else "")
