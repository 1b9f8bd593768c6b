"""The pipeline bubble: the share of a step every stage idles while the pipeline fills and drains."""

from __future__ import annotations

import math


def bubble(stages: int, microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """(p-1)/(m+p-1) for GPipe and 1F1B; (p-1)/(v*m+p-1) for interleaved 1F1B with v stages per rank.

    GPipe and 1F1B idle alike (1F1B only holds fewer microbatches' activations); interleaving cuts
    each rank's work into v smaller stages, so filling the pipeline costs 1/v as much.
    """
    if stages <= 1:
        return 0.0
    v = virtual_stages if schedule == "interleaved" else 1
    return (stages - 1) / (v * microbatches + stages - 1)


def microbatches_for(stages: int, target: float, schedule: str = "1f1b", virtual_stages: int = 1) -> int:
    """The fewest microbatches that keep the bubble at or under ``target`` (a fraction of the step)."""
    if stages <= 1:
        return 1
    v = virtual_stages if schedule == "interleaved" else 1
    return max(1, math.ceil((stages - 1) * (1 - target) / (target * v) - 1e-9))
