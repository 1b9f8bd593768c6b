"""A finished run as the planner takes it: what it trained and how (``RunModel``), and the speeds and
times it measured (``Measured``).

The analyzer fills both from a run's files and tables (diagtrain.profiler.analyzer.judge.model_check.measured);
``whatif`` answers questions about the run with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagtrain.profiler.model.precision import Precision
from diagtrain.profiler.plan.layout import Implementation, Layout
from diagtrain.profiler.plan.model import Transformer


@dataclass
class RunModel:
    """What a run trained and how, as the plan models it."""

    model: Transformer
    layout: Layout
    precision: Precision
    impl: Implementation
    world_size: int
    layers_per_stage: list[int] | None = None
    strategy: str | None = None
    notes: list[str] = field(default_factory=list)  # assumptions made where the run did not say


@dataclass
class PipelineTiming:
    """The bubble a pipeline lived, from its profiled steps."""

    measured: float  # 1 - mean busy time of its stages / the longest forward-backward phase (median over steps)
    stage_busy_ms: dict[int, float]  # per pipeline position: work inside the forward-backward phase
    with_stage_times: float | None  # GPipe/1F1B's bubble for these measured stage times (unequal stages idle more)


@dataclass
class Measured:
    """What the run measured, per rank where it differs."""

    step_s: float | None  # median steady step (the slowest rank's median)
    compute_s: dict[int, float]  # median profiled compute per step, by rank
    flops: float | None  # achieved FLOP/s per rank: the model's FLOPs per step over the compute time
    group_bw: dict[str, float]  # best bus bandwidth per group kind (dp, tp, pp), bytes/s
    pipeline: PipelineTiming | None  # the bubble the pipeline lived (pipelines with profiled steps)
    held: dict[int, int]  # parameters each rank holds (parameters.json)
    peak_bytes: dict[int, float]  # peak memory per rank
