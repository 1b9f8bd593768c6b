"""The pipeline bubble: the share of a step every stage idles while the pipeline fills and drains.

GPipe and 1F1B idle alike (1F1B only holds fewer microbatches' activations); interleaved 1F1B cuts
each rank's work into v smaller stages, so filling the pipeline costs 1/v as much.
"""

from __future__ import annotations

import math

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _chunks(schedule: str, virtual_stages: int) -> int:
    """Stages per rank the schedule interleaves (1 unless interleaved)."""
    return virtual_stages if schedule == "interleaved" else 1


def bubble(stages: int, microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """(p-1)/(m+p-1) for GPipe and 1F1B; (p-1)/(v*m+p-1) for interleaved 1F1B with v stages per rank."""
    if stages <= 1:
        return 0.0
    v = _chunks(schedule, virtual_stages)
    return (stages - 1) / (v * microbatches + stages - 1)


def fill(stages: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """Microbatch times a pass spends filling and draining the pipeline: (p-1), or (p-1)/v interleaved."""
    return (stages - 1) / _chunks(schedule, virtual_stages)


def microbatches_for(stages: int, target: float, schedule: str = "1f1b", virtual_stages: int = 1) -> int:
    """The fewest microbatches that keep the bubble at or under ``target`` (a fraction of the step)."""
    if stages <= 1:
        return 1
    v = _chunks(schedule, virtual_stages)
    return max(1, math.ceil((stages - 1) * (1 - target) / (target * v) - 1e-9))


def in_flight(stages: int, position: int, microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """Microbatches whose activations the rank at pipeline ``position`` (0 first) holds at once: all of
    them under GPipe, the stages still ahead under 1F1B."""
    if stages == 1:
        return 1.0
    m = microbatches
    if schedule == "gpipe":
        return float(m)
    ahead = stages - position
    if schedule == "interleaved":
        # Megatron's interleaved 1F1B: the first rank holds (1 + (p-1)/(p*v)) x p microbatches of each chunk.
        return min(float(m), ahead * (1 + (stages - 1) / (stages * virtual_stages)))
    return float(min(ahead, m))


def bubble_with_stage_times(busy, microbatches: int) -> float | None:
    """GPipe's and 1F1B's bubble for stages of unequal speed: each busy ``busy`` (an array or Series,
    one value per stage) per pass of ``microbatches``. A pass takes sum(b)/m + (m-1)·max(b)/m, which is
    (m+p-1)/m times the work for equal stages: the formula's bubble. None for stages that never work."""
    m = microbatches
    per_pass = busy.sum() / m + (m - 1) * busy.max() / m
    return float(1 - busy.mean() / per_pass) if per_pass > 0 else None
