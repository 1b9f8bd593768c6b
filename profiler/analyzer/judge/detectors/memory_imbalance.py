"""memory_imbalance: one rank's peak memory stands far above its peers'."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.model.precision import bytes_per_parameter


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
    return Candidate(
        kind="memory_imbalance", ranks=[rank],
        facts={"rank": rank, "peak_bytes": peak, "median_bytes": median, "parameters": params if expected else None,
               "bytes_per_parameter": per_param, "model_state_bytes": expected},
        metrics={"observed_bytes": peak, "expected_bytes": median, "threshold_ratio": s.min_ratio,
                 "threshold_bytes": s.min_excess_bytes, "model_state_bytes": expected},
        evidence=[{"type": "steps", "rank": rank, "peak_mem_bytes": int(peak)}],
    )
