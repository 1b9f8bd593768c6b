"""One layout's estimate: memory per GPU by part, every collective with its time, the bubble, the step.

The step is built from one microbatch on the slowest pipeline rank (its compute at the achieved
FLOP rate, its tensor-parallel all-reduces and pipeline sends, which sit on the critical path):

    step = grad_accum x (m + (p-1)/v) x t_microbatch  +  exposed data-parallel communication

Data-parallel traffic overlaps with compute, as DDP's buckets and FSDP's prefetch make it: ZeRO-3's
weight gathers hide behind the microbatch they serve, the gradient sync behind the last
microbatch's backward, ZeRO-1/2's weight gather behind the next step's first forward; only what is
longer than the compute it hides behind is exposed. The optimizer step is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagtrain.profiler.model.pipeline import bubble, fill
from diagtrain.profiler.model.precision import Precision
from diagtrain.profiler.plan.comm import ALL_GATHER, DP, PP, SEND, TP, Collective, collectives
from diagtrain.profiler.plan.compute import flops_per_token, rank_flops
from diagtrain.profiler.plan.hardware import NVLINK, Cluster
from diagtrain.profiler.plan.layout import TEXTBOOK, Implementation, Layout
from diagtrain.profiler.plan.memory import RESERVED_FRACTION, Memory, rank_memory
from diagtrain.profiler.plan.model import Transformer

COMPONENTS = ("compute", "recompute", "bubble", "tensor_parallel", "pipeline_sends", "data_parallel")


@dataclass(frozen=True)
class Speeds:
    """How fast the hardware runs: achieved FLOP/s per GPU, and bus bandwidth per link class (bytes/s),
    optionally per group kind (dp, tp, pp) when a run measured them."""

    flops: float
    link_bw: dict[str, float]
    group_bw: dict[str, float] = field(default_factory=dict)

    def bandwidth(self, c: Collective) -> float:
        return self.group_bw.get(c.group) or self.link_bw[c.link]

    @classmethod
    def of(cls, cluster: Cluster, peak_fraction: float) -> "Speeds":
        from diagtrain.profiler.plan.hardware import NETWORK

        return cls(cluster.gpu.peak_flops * peak_fraction, {NVLINK: cluster.intra_node_bw, NETWORK: cluster.inter_node_bw})


@dataclass
class Timed:
    """A collective and its time per step."""

    collective: Collective
    seconds: float
    bandwidth: float


@dataclass
class Estimate:
    """Everything the planner says about one layout."""

    layout: Layout
    memory: Memory  # on the rank that needs the most
    memory_rank: int
    capacity: float | None  # usable bytes per GPU (None: no limit known)
    collectives: list[Timed]  # of the pacing rank
    bubble: float
    components: dict[str, float]  # seconds per step, adding up to the step
    tokens_per_step: float
    model_flops_per_step: float
    why: str = ""

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.memory.total <= self.capacity

    @property
    def step(self) -> float:
        return sum(self.components.values())

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step if self.step else 0.0


def usable_memory(cluster: Cluster | None) -> float | None:
    """Bytes per GPU the model may use: the device's memory less the reserve."""
    return None if cluster is None else cluster.gpu.memory_bytes * (1 - RESERVED_FRACTION)


def estimate(model: Transformer, layout: Layout, precision: Precision, speeds: Speeds, cluster: Cluster | None = None,
             impl: Implementation = TEXTBOOK, layers_per_stage: list[int] | None = None,
             capacity: float | None = None) -> Estimate:
    """Memory, communication, bubble and step time of ``layout``."""
    per_pp = []
    for pp_rank in range(layout.pp):
        rank = pp_rank * layout.dp * layout.tp
        calls = [Timed(c, c.seconds(speeds.bandwidth(c)), speeds.bandwidth(c))
                 for c in collectives(model, layout, precision, rank, cluster, impl, layers_per_stage)]
        per_pp.append((rank, calls, _microbatch_times(model, layout, speeds, pp_rank, calls, layers_per_stage)))
    _, calls, t = max(per_pp, key=lambda x: x[2]["microbatch"])  # the pacing (slowest) pipeline rank
    passes = layout.grad_accum * layout.microbatches
    filling = fill(layout.pp, layout.schedule, layout.virtual_stages)
    components = {
        "compute": passes * t["compute"], "recompute": passes * t["recompute"],
        "bubble": layout.grad_accum * filling * t["microbatch"],
        "tensor_parallel": passes * t["tensor_parallel"], "pipeline_sends": passes * t["pipeline_sends"],
        "data_parallel": max(_exposed_data_parallel(layout, c, tt) for _, c, tt in per_pp),
    }
    memories = [(r, rank_memory(model, layout, precision, r, layers_per_stage, impl.ddp_bucket_copy))
                for r, _, _ in per_pp]
    mem_rank, mem = max(memories, key=lambda rm: rm[1].total)
    tokens = layout.sequences_per_step * model.seq_len
    return Estimate(layout=layout, memory=mem, memory_rank=mem_rank,
                    capacity=capacity if capacity is not None else usable_memory(cluster),
                    collectives=calls, bubble=bubble(layout.pp, layout.microbatches, layout.schedule, layout.virtual_stages),
                    components=components, tokens_per_step=tokens, model_flops_per_step=tokens * flops_per_token(model))


def _microbatch_times(model, layout, speeds, pp_rank, calls: list[Timed], layers_per_stage) -> dict[str, float]:
    """Seconds one microbatch costs a pipeline rank, by part; ``microbatch`` is their sum."""
    f = rank_flops(model, layout, pp_rank, layers_per_stage)
    passes = layout.grad_accum * layout.microbatches
    t = {"forward": f.forward / speeds.flops, "backward": f.backward / speeds.flops,
         "recompute": f.recompute / speeds.flops,
         "tensor_parallel": sum(c.seconds for c in calls if c.collective.group == TP) / passes,
         # A transfer is on the critical path once: count the sends (its receiver waits the same time).
         "pipeline_sends": sum(c.seconds for c in calls if c.collective.group == PP and c.collective.op == SEND) / passes}
    t["compute"] = t["forward"] + t["backward"]
    t["microbatch"] = t["compute"] + t["recompute"] + t["tensor_parallel"] + t["pipeline_sends"]
    return t


def _exposed_data_parallel(layout: Layout, calls: list[Timed], t: dict[str, float]) -> float:
    """Data-parallel seconds per step that no compute hides."""
    dp = [c for c in calls if c.collective.group == DP]
    if not dp:
        return 0.0
    passes = layout.grad_accum * layout.microbatches
    if layout.zero >= 3:
        gathers = sum(c.seconds for c in dp if c.collective.op == ALL_GATHER)
        per_pass = gathers / passes
        exposed = passes * max(0.0, per_pass - (t["compute"] + t["recompute"]))
        sync = sum(c.seconds for c in dp if c.collective.op != ALL_GATHER)
        return exposed + max(0.0, sync - (t["backward"] + t["recompute"]))
    if layout.zero in (1, 2):
        gather = sum(c.seconds for c in dp if c.collective.op == ALL_GATHER)
        sync = sum(c.seconds for c in dp if c.collective.op != ALL_GATHER)
        return max(0.0, sync - t["backward"]) + max(0.0, gather - t["forward"])
    sync = sum(c.seconds for c in dp)
    return max(0.0, sync - (t["backward"] + t["recompute"]))
