"""memory_imbalance: one rank's peak memory stands far above its peers'."""

from __future__ import annotations

from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import BYTES_PER_PARAM, Tables

RATIO = 1.2  # peak above 1.2x the peers' median...
MIN_EXCESS_BYTES = 64 * 2**20  # ...and by at least 64 MiB: allocator rounding is smaller than that
MIB = 2**20


def detect(tables: Tables) -> list[Finding]:
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
            if peak >= RATIO * median and peak - median >= MIN_EXCESS_BYTES:
                findings.append(_finding(tables, int(rank), float(peak), median))
    return findings


def _finding(tables: Tables, rank: int, peak: float, median: float) -> Finding:
    params = tables.parameters.get(rank)
    expected = params * BYTES_PER_PARAM if params else None
    where = (f"; the model state it holds needs about {expected / MIB:.0f} MiB "
             f"({params:,} parameters x {BYTES_PER_PARAM} bytes)") if expected else ""
    return Finding(
        kind="memory_imbalance", severity="warning", ranks=[rank],
        explanation=(f"rank {rank} peaks at {peak / MIB:.0f} MiB, {(peak - median) / MIB:.0f} MiB "
                     f"({peak / median:.2f}x) above its peers' median of {median / MIB:.0f} MiB{where}."),
        suggestion=("Find what that rank keeps that the others do not: tensors held across steps (logging, "
                    "caches, a list of losses), an uneven shard or pipeline stage, or rank-specific code."),
        metrics={"observed_bytes": peak, "expected_bytes": median, "threshold_ratio": RATIO,
                 "threshold_bytes": MIN_EXCESS_BYTES, "model_state_bytes": expected},
        evidence=[{"type": "steps", "rank": rank, "peak_mem_bytes": int(peak)}],
    )
