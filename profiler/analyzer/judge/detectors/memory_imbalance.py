"""memory_imbalance: one rank's peak memory stands far above its peers'."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.model.precision import bytes_per_parameter
from diagtrain.profiler.util.units import MIB


@section("memory_imbalance")
class MemoryImbalance:
    """When one rank's peak memory stands far enough above its peers'."""

    min_ratio: float = setting(1.2, "a peak above this many times the peers' median ...")
    min_excess_bytes: int = setting(64 * 2**20, "... and above it by this much: allocator rounding is smaller")


SETTINGS = (MemoryImbalance,)


def detect(tables: Tables) -> list[Candidate]:
    """Ranks whose peak memory stands above their peers' median by the ratio and the bytes."""
    s = MemoryImbalance.active()
    if "peak_mem_bytes" not in tables.steps or tables.steps["peak_mem_bytes"].isna().all():
        return []
    peaks = tables.steps.groupby("rank")["peak_mem_bytes"].max()
    findings = []
    for peers in tables.structure.peer_groups(sorted(peaks.index)):
        group = peaks[peaks.index.isin(peers)]
        if len(group) < 2:
            continue
        for rank, peak in group.items():
            median = float(group.drop(rank).median())
            if peak >= s.min_ratio * median and peak - median >= s.min_excess_bytes:
                findings.append(_finding(tables, int(rank), float(peak), median, s))
    return findings


def _finding(tables: Tables, rank: int, peak: float, median: float, s: MemoryImbalance) -> Candidate:
    params = tables.parameters.get(rank)
    # The run does not say how it trains: the model state of the assumed precision (16 bytes a parameter).
    per_param = bytes_per_parameter()
    expected = params * per_param if params else None
    where = (f"; the model state it holds needs about {expected / MIB:.0f} MiB "
             f"({params:,} parameters x {per_param} bytes)") if expected else ""
    return Candidate(
        kind="memory_imbalance", severity="warning", ranks=[rank],
        explanation=(f"rank {rank} peaks at {peak / MIB:.0f} MiB, {(peak - median) / MIB:.0f} MiB "
                     f"({peak / median:.2f}x) above its peers' median of {median / MIB:.0f} MiB{where}."),
        suggestion=("Find what that rank keeps that the others do not: tensors held across steps (logging, "
                    "caches, a list of losses), an uneven shard or pipeline stage, or rank-specific code."),
        metrics={"observed_bytes": peak, "expected_bytes": median, "threshold_ratio": s.min_ratio,
                 "threshold_bytes": s.min_excess_bytes, "model_state_bytes": expected},
        evidence=[{"type": "steps", "rank": rank, "peak_mem_bytes": int(peak)}],
    )
