"""When two findings describe one cause, keep the one that names the cause."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.quantities import SlowCause


def explained(findings: list[Finding]) -> list[Finding]:
    """Drop findings another one explains: a straggler arrives last at the collectives after its
    slow work, so a late-arrival slow_collective on the same rank says nothing new; a rank whose memory
    grows every step stands above its peers' peak because of it."""
    stragglers = {r for f in findings if f.kind == "straggler" for r in f.ranks}
    growing = {r for f in findings if f.kind == "memory_growth" for r in f.ranks}
    return [f for f in findings
            if not (f.kind == "slow_collective" and f.metrics.get("cause") == SlowCause.LATE_ARRIVAL
                    and set(f.ranks) <= stragglers)
            and not (f.kind == "memory_imbalance" and growing and set(f.ranks) <= growing)]
