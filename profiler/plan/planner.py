"""Enumerate every layout of a model on a cluster, keep those that fit, rank them by estimated step time.

Layouts: dp x tp x pp = GPUs with tensor parallelism inside a node (tp <= GPUs per node, dividing
the attention heads), pipelines no deeper than the layers; each ZeRO stage; every micro-batch size
that divides a replica's share of the global batch; 1F1B (GPipe when there are fewer microbatches
than stages: it idles as 1F1B does, with more memory) and interleaved 1F1B; activation
checkpointing off and on. For each mesh (dp, tp, pp) the fastest variant that fits is kept.

The step time is an estimate: layouts within ``TIE`` of the fastest are ranked by simplicity
(fewer parallel dimensions, then a lower ZeRO stage, then no checkpointing): at equal speed, the
layout with less to tune and less that can go wrong comes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from diagtrain.profiler.model.precision import Precision
from diagtrain.profiler.plan.estimate import Estimate, Speeds, estimate, usable_memory
from diagtrain.profiler.plan.hardware import Cluster
from diagtrain.profiler.plan.layout import Implementation, Layout, TEXTBOOK
from diagtrain.profiler.plan.memory import RESERVED_FRACTION
from diagtrain.profiler.plan.model import Transformer
from diagtrain.profiler.plan.units import fmt_seconds
from diagtrain.profiler.util.units import fmt_bytes

TIE = 0.03  # step times within 3% are inside the model's error: simpler first
MAX_MICRO_BATCH = 64  # sequences per microbatch: beyond this no GPU gains throughput
INTERLEAVE = 2  # virtual stages per rank tried for interleaved 1F1B
MAX_GPUS_SEARCHED = 65536  # "what would fit" looks this far


@dataclass
class Plan:
    """The ranked layouts, those that did not fit, and what to do when none fits."""

    model: Transformer
    cluster: Cluster
    precision: Precision
    global_batch: int
    peak_fraction: float
    ranked: list[Estimate]
    speeds: Speeds
    not_fitting: list[Estimate] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)  # when nothing fits: what would
    measured_speeds: bool = False  # speeds from a run (--from), not the GPU table


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(model: Transformer, cluster: Cluster, global_batch: int) -> list[Layout]:
    """Every layout the planner considers (before memory is checked)."""
    out = []
    for tp in divisors(cluster.gpus):
        if tp > cluster.gpus_per_node or model.heads % tp or (model.kv_heads or model.heads) % tp:
            continue
        for pp in divisors(cluster.gpus // tp):
            dp = cluster.gpus // (tp * pp)
            if pp > model.layers or global_batch % dp:
                continue
            per_replica = global_batch // dp
            for b in (d for d in divisors(per_replica) if d <= MAX_MICRO_BATCH):
                n = per_replica // b
                for base in _schedules(model, pp, n):
                    for zero in ((0, 1, 2, 3) if dp > 1 else (0,)):
                        for ac in (False, True):
                            out.append(replace(base, dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=b,
                                               activation_checkpointing=ac))
    return out


def _schedules(model: Transformer, pp: int, n: int) -> list[Layout]:
    """How ``n`` microbatches per replica run: accumulated without a pipeline, else one pipeline pass."""
    if pp == 1:
        return [Layout(microbatches=1, grad_accum=n)]
    out = [Layout(microbatches=n, schedule="1f1b" if n >= pp else "gpipe")]
    if model.layers % (pp * INTERLEAVE) == 0 and n % pp == 0:
        out.append(Layout(microbatches=n, schedule="interleaved", virtual_stages=INTERLEAVE))
    return out


def plan(model: Transformer, cluster: Cluster, precision: Precision, global_batch: int, peak_fraction: float,
         speeds: Speeds | None = None, impl: Implementation = TEXTBOOK, capacity: float | None = None,
         where: Callable[[Layout], bool] = lambda _: True) -> Plan:
    """Every layout, estimated; the fitting ones ranked, the best per (dp, tp, pp, ZeRO stage)."""
    speeds_given = speeds is not None
    speeds = speeds or Speeds.of(cluster, peak_fraction)
    capacity = capacity if capacity is not None else usable_memory(cluster)
    fitting: dict[tuple, list[Estimate]] = {}
    smallest: dict[tuple, Estimate] = {}
    for layout in filter(where, candidate_layouts(model, cluster, global_batch)):
        e = estimate(model, layout, precision, speeds, cluster, impl, capacity=capacity)
        mesh = (layout.dp, layout.tp, layout.pp)
        if e.fits:
            fitting.setdefault(mesh, []).append(e)
        elif mesh not in smallest or e.memory.total < smallest[mesh].memory.total:
            smallest[mesh] = e
    # One layout per mesh: its fastest variant (ZeRO stage, micro-batch, schedule, checkpointing),
    # the simplest of those within TIE of it.
    ranked = rank([rank(variants)[0] for variants in fitting.values()])
    not_fitting = sorted((e for mesh, e in smallest.items() if mesh not in fitting), key=lambda e: e.memory.total)
    result = Plan(model, cluster, precision, global_batch, peak_fraction, ranked, speeds, not_fitting,
                  measured_speeds=speeds_given)
    if not ranked:
        result.advice = what_would_fit(model, cluster, precision, global_batch, peak_fraction, not_fitting, impl)
    for e in not_fitting:
        e.why = (f"Does not fit: needs {fmt_bytes(e.memory.total)} per GPU, over the {fmt_bytes(e.capacity)} usable "
                 f"({_largest_part(e)}).")
    return result


def simplicity(layout: Layout) -> tuple:
    """Smaller is simpler: parallel dimensions besides data, ZeRO stage, checkpointing, interleaving."""
    return ((layout.tp > 1) + (layout.pp > 1), layout.zero, layout.activation_checkpointing, layout.virtual_stages)


def rank(estimates: list[Estimate]) -> list[Estimate]:
    """Fastest first, the ones within ``TIE`` of the fastest ordered by simplicity; each gets its reason."""
    if not estimates:
        return []
    fastest = min(e.step for e in estimates)
    tied = sorted((e for e in estimates if e.step <= fastest * (1 + TIE)), key=lambda e: (simplicity(e.layout), e.step))
    rest = sorted((e for e in estimates if e.step > fastest * (1 + TIE)), key=lambda e: e.step)
    ordered = tied + rest
    first = ordered[0]
    for e in ordered:
        e.why = _why(e, first, fastest)
    return ordered


def _why(e: Estimate, first: Estimate, fastest: float) -> str:
    """One sentence: why this layout wins, ties, or loses against the first."""
    if e is first:
        hidden = "its data-parallel traffic hides behind compute" if e.components["data_parallel"] == 0 else \
            f"{fmt_seconds(e.components['data_parallel'])} of data-parallel traffic stays exposed"
        lead = "Fastest" if e.step <= fastest else "Simplest of the fastest"
        return (f"{lead}: {e.components['compute'] / e.step:.0%} of its step is model compute, {hidden}, "
                f"and it uses {fmt_bytes(e.memory.total)} of {fmt_bytes(e.capacity)}." if e.capacity else
                f"{lead}: {e.components['compute'] / e.step:.0%} of its step is model compute and {hidden}.")
    if e.step <= fastest * (1 + TIE):
        added = _added_complexity(e.layout, first.layout)
        return f"As fast as the first (within {TIE:.0%}), but {added}."
    component, extra = max(((c, e.components[c] - first.components[c]) for c in e.components), key=lambda x: x[1])
    return f"{e.step / first.step - 1:+.0%} step time against the first: {_cost_of(e, component, extra)}."


def _added_complexity(layout: Layout, first: Layout) -> str:
    parts = []
    if layout.tp > 1 and first.tp == 1:
        parts.append("adds tensor parallelism")
    if layout.pp > 1 and first.pp == 1:
        parts.append("adds a pipeline")
    if layout.zero > first.zero:
        parts.append(f"shards more (ZeRO-{layout.zero})")
    if layout.activation_checkpointing and not first.activation_checkpointing:
        parts.append("recomputes activations")
    return " and ".join(parts) or "is no simpler"


def _cost_of(e: Estimate, component: str, extra: float) -> str:
    t = fmt_seconds(e.components[component])
    links = sorted({c.collective.link for c in e.collectives if c.collective.group == {"tensor_parallel": "tp",
                    "pipeline_sends": "pp", "data_parallel": "dp"}.get(component)})
    over = f" over {'/'.join(links)}" if links else ""
    return {
        "bubble": f"its pipeline bubble ({e.bubble:.0%} of each pass) costs {t} per step",
        "tensor_parallel": f"its tensor-parallel all-reduces cost {t} per step{over}",
        "pipeline_sends": f"its pipeline sends cost {t} per step{over}",
        "data_parallel": f"{t} of data-parallel traffic{over} is not hidden behind compute",
        "recompute": f"recomputing activations (checkpointing, needed to fit) costs {t} per step",
        "compute": f"its slowest pipeline stage computes {fmt_seconds(extra)} more per step than the first's",
    }[component]


def _largest_part(e: Estimate) -> str:
    parts = {k: v for k, v in e.memory.parts().items() if k != "total"}
    name = max(parts, key=parts.get)
    return f"largest part: {name}, {fmt_bytes(parts[name])}"


def what_would_fit(model: Transformer, cluster: Cluster, precision: Precision, global_batch: int,
                   peak_fraction: float, not_fitting: list[Estimate], impl: Implementation) -> list[str]:
    """Sentences for a plan where nothing fits: how far the leanest layout is over, and what would do."""
    advice = []
    if not_fitting:
        lean = not_fitting[0]
        advice.append(f"The leanest layout, {lean.layout.name()}"
                      f"{' with activation checkpointing' if lean.layout.activation_checkpointing else ''}, needs "
                      f"{fmt_bytes(lean.memory.total)} per GPU; {fmt_bytes(lean.capacity)} are usable "
                      f"({cluster.gpu.name}, {RESERVED_FRACTION:.0%} kept free).")
    state = model.params * precision.state_bytes
    advice.append(f"The model state alone is {fmt_bytes(state)} ({model.params / 1e9:.3g}B parameters x "
                  f"{precision.state_bytes} bytes): at least {min_gpus_for_state(model.params, cluster.gpu.memory_bytes, precision)} "
                  f"GPUs of this kind for it, before activations.")
    gpus = cluster.gpus
    while gpus < MAX_GPUS_SEARCHED:
        gpus *= 2
        bigger = replace(cluster, gpus=gpus)
        batch = global_batch if global_batch % (gpus // min(gpus, cluster.gpus_per_node)) == 0 else \
            math.lcm(global_batch, gpus)
        found = plan_fits(model, bigger, precision, batch, peak_fraction, impl)
        if found:
            note = "" if batch == global_batch else f" (with a global batch of {batch} sequences)"
            advice.append(f"With {gpus} GPUs{note} it fits: {found.layout.name()}"
                          f"{', activation checkpointing' if found.layout.activation_checkpointing else ''}, "
                          f"{fmt_bytes(found.memory.total)} per GPU.")
            break
    return advice


def plan_fits(model: Transformer, cluster: Cluster, precision: Precision, global_batch: int, peak_fraction: float,
              impl: Implementation) -> Estimate | None:
    """The leanest fitting layout on ``cluster`` (by memory), or None."""
    speeds = Speeds.of(cluster, peak_fraction)
    capacity = usable_memory(cluster)
    leanest = None
    for layout in candidate_layouts(model, cluster, global_batch):
        if layout.micro_batch != 1:
            continue
        e = estimate(model, layout, precision, speeds, cluster, impl, capacity=capacity)
        if e.fits and (leanest is None or e.memory.total < leanest.memory.total):
            leanest = e
    return leanest


def min_gpus_for_state(params: float, memory_bytes: float, precision: Precision) -> int:
    """GPUs whose whole memory holds the model state once: the floor before activations and reserve."""
    return math.ceil(params * precision.state_bytes / memory_bytes - 1e-9)



