"""What loading one rank sends back: small tables and facts about the rank, never its events."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from diagtrain.profiler.analyzer.per_rank.p2p import P2PCalls
from diagtrain.profiler.analyzer.per_rank.work_segments import COLUMNS as SEGMENT_COLUMNS
from diagtrain.profiler.analyzer.read.inputs import Skipped


@dataclass
class RankResult:
    """What a worker sends back for one rank: small tables and facts, never the events."""

    key: str
    rank: int
    rank_source: str  # distributedInfo | folder | file name
    files: list[str]
    backend: str | None
    world_size: int | None
    on_gpu: bool
    record_shapes: bool
    profile_memory: bool
    pg_config: list[dict]
    host_name: str | None
    breakdown: dict
    steps: pd.DataFrame
    collectives: pd.DataFrame
    health: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)  # how the traces' events were read: {check, severity, message}
    skipped: list[Skipped] = field(default_factory=list)  # this rank's trace files that could not be used
    p2p: P2PCalls = field(default_factory=P2PCalls)
    cached: bool = False
    # the work segments of each profiled step, the critical path's nodes (work_segments.py)
    segments: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SEGMENT_COLUMNS))
