"""When two findings describe one cause, keep the one that names the cause."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.quantities import SlowCause
from diagtrain.profiler.analyzer.judge.verdict import EXPLAINED, Assessed, Assessment
from diagtrain.profiler.analyzer.run.tables import Tables


def explained(findings: list[Finding], _: Tables | None = None) -> Assessed:
    """Findings another one explains: a straggler arrives last at the collectives after its slow work, so a
    late-arrival slow_collective on the same rank says nothing new; a rank whose memory grows every step
    stands above its peers' peak because of it; a rank slower than its peers only in the steps of a stall
    every rank has (a checkpoint each rank writes, one a little longer) is part of that stall, priced with it."""
    stragglers = {r for f in findings if f.kind == "straggler" for r in f.ranks}
    growing = {r for f in findings if f.kind == "memory_growth" for r in f.ranks}
    stalled = {s for f in findings if f.kind == "periodic_stall" for s in f.steps}
    out = Assessed()
    for i, f in enumerate(findings):
        if (f.kind == "slow_collective" and f.metrics.get("cause") == SlowCause.LATE_ARRIVAL
                and set(f.ranks) <= stragglers) or (f.kind == "memory_imbalance" and growing and set(f.ranks) <= growing) \
                or (f.kind in ("straggler", "dataloader_stall") and f.steps and set(f.steps) <= stalled):
            out.add(i, Assessment(EXPLAINED, drop=True))
    return out
