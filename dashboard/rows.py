"""The timeline's rows: one lane per rank in a small job; in a big one, ranks grouped into rows.

A job of up to MAX_RANK_LANES ranks shows every rank. A bigger one shows its ranks grouped (by
host, else by pipeline stage, else in blocks of consecutive ranks) into at most MAX_GROUPS rows
that the timeline draws as a distribution; the ranks that findings name are pulled out as their
own lanes, and a group the user expands shows its ranks below it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from diagtrain.dashboard.data import Lane, RunData

MAX_RANK_LANES = 16  # this many lanes of LANE_PX fit one screen with the time axis in view
MAX_GROUPS = 16  # a big job's first view: this many group rows, the same screen
MIN_BLOCK = 8  # blocks of consecutive ranks hold at least this many (a node's worth of GPUs)
MAX_OUTLIER_LANES = 8  # ranks named by findings shown on their own lanes, most severe first
SEVERITY_ORDER = {"critical": 0, "error": 1, "warning": 2, "info": 3}
STAGE = re.compile(r"\bpp(\d+)\b")


@dataclass
class Row:
    """One row of the timeline: a rank's lane, or a group of ranks drawn as their distribution."""

    label: str
    ranks: list[int]
    key: str | None = None  # set for a group: what the "expand" control names
    host: str = ""
    opened: bool = False  # a group shown with its ranks' lanes below it

    @property
    def is_group(self) -> bool:
        return self.key is not None


def rows(run: RunData, ranks: list[int] | None = None, expand: list[str] | None = None) -> list[Row]:
    """The rows for ``ranks`` (None: the whole job), with the groups named in ``expand`` opened."""
    lanes = run.lanes if ranks is None else [lane for lane in run.lanes if lane.rank in set(ranks)]
    if ranks is not None or len(lanes) <= MAX_RANK_LANES:
        return [_lane(lane) for lane in lanes]
    pulled = outlier_ranks(run)
    result = [_lane(lane) for rank in pulled for lane in lanes if lane.rank == rank]
    for group in groups(run, [lane for lane in lanes if lane.rank not in pulled]):
        group.opened = group.key in set(expand or [])
        result.append(group)
        if group.opened:
            result += [_lane(lane) for lane in lanes if lane.rank in set(group.ranks)]
    return result


def outlier_ranks(run: RunData) -> list[int]:
    """Ranks that findings single out (a minority of the job), most severe finding first."""
    world = len(run.lanes)
    found: list[int] = []
    for f in sorted(run.findings, key=lambda f: SEVERITY_ORDER.get(f.get("severity"), 9)):
        named = [int(r) for r in f.get("ranks") or []]
        if 0 < len(named) <= world // 2:  # a finding on most ranks singles none out
            found += [r for r in named if r not in found]
    return found[:MAX_OUTLIER_LANES]


def groups(run: RunData, lanes: list[Lane]) -> list[Row]:
    """``lanes`` in at most MAX_GROUPS groups: by host, else by pipeline stage, else blocks of ranks."""
    by_host = _split(lanes, lambda lane: lane.host)
    if 1 < len(by_host) <= MAX_GROUPS:
        return [_group(f"{host} ({len(members)} ranks)", f"host:{host}", members) for host, members in by_host.items()]
    by_stage = _split(lanes, lambda lane: (STAGE.search(lane.label) or [None, ""])[1])
    if "" not in by_stage and 1 < len(by_stage) <= MAX_GROUPS:
        return [_group(f"stage pp{stage} ({len(members)} ranks)", f"pp:{stage}", members)
                for stage, members in sorted(by_stage.items(), key=lambda kv: int(kv[0]))]
    size = max(MIN_BLOCK, math.ceil(len(lanes) / MAX_GROUPS))
    blocks = [lanes[i:i + size] for i in range(0, len(lanes), size)]
    return [_group(f"{_span(block)} ({len(block)} ranks)", f"block:{block[0].rank}", block) for block in blocks]


def _split(lanes: list[Lane], key: Any) -> dict[str, list[Lane]]:
    found: dict[str, list[Lane]] = {}
    for lane in lanes:
        found.setdefault(key(lane), []).append(lane)
    return found


def _span(block: list[Lane]) -> str:
    ranks = sorted(lane.rank for lane in block)
    contiguous = ranks[-1] - ranks[0] + 1 == len(ranks)
    return f"ranks {ranks[0]}–{ranks[-1]}" if contiguous else f"ranks {ranks[0]}…{ranks[-1]}"


def _group(label: str, key: str, members: list[Lane]) -> Row:
    return Row(label=label, ranks=[lane.rank for lane in members], key=key, host=members[0].host)


def _lane(lane: Lane) -> Row:
    return Row(label=lane.label, ranks=[lane.rank], host=lane.host)
