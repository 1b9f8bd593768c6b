"""What-if answers for a finished run: the same job with more microbatches, another ZeRO stage,
checkpointing, another mesh, or more GPUs, at the speeds the run measured.

Each answer applies the model's predicted change to the measured step ("the step from 410 to 350
ms"): what the model leaves out (optimizer step, data loading, framework overhead) stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from diagtrain.profiler.model.pipeline import microbatches_for
from diagtrain.profiler.plan.comm import ALL_GATHER, DP
from diagtrain.profiler.plan.estimate import Estimate, Speeds, estimate
from diagtrain.profiler.plan.hardware import NETWORK, NVLINK, Cluster
from diagtrain.profiler.plan.layout import ZERO_NAMES, Layout
from diagtrain.profiler.plan.planner import Plan, divisors, plan
from diagtrain.profiler.plan.run_model import Measured, RunModel
from diagtrain.profiler.util.units import fmt_bytes

BUBBLE_TARGET = 0.2  # the microbatch count suggested first keeps the bubble at or under this
OTHER_MESHES = 5  # other layouts of the same GPUs shown


@dataclass
class Answer:
    """One change to the run and what the model expects of it."""

    change: str
    sentence: str
    estimate: Estimate
    step_ms: float | None  # the measured step moved by the model's predicted change
    memory_delta: float  # bytes per GPU, against the run's layout (negative: saves)


@dataclass
class RunReport:
    """A run held against the model, and the what-if answers."""

    path: str
    rm: RunModel
    measured: Measured
    current: Estimate
    answers: list[Answer] = field(default_factory=list)
    plan: Plan | None = None  # with --gpus: the layouts of the job on that many GPUs

    @property
    def other_ms(self) -> float | None:
        """Measured step time the model does not account for (optimizer, data, overhead)."""
        return None if self.measured.step_s is None else self.measured.step_s * 1e3 - self.current.step * 1e3


def speeds_of(m: Measured, fallback_bw: float | None = None) -> Speeds:
    """The speeds a run reached, for the model: its FLOP/s per rank and best bandwidth per group kind."""
    if not m.flops:
        raise ValueError("the run has no profiled compute to measure its speed from (run it with --profile-steps)")
    bw = fallback_bw or max(m.group_bw.values(), default=None) or 1e9
    return Speeds(m.flops, {NVLINK: bw, NETWORK: bw}, dict(m.group_bw))


def predict(rm: RunModel, m: Measured, layout: Layout, capacity: float | None = None) -> tuple[Estimate, float | None]:
    """The model's estimate of ``layout`` for this job at the run's speeds, and its step in ms: the
    measured step moved by the model's change from the run's own layout."""
    speeds = speeds_of(m)
    current = _estimate(rm, rm.layout, speeds, capacity)
    e = _estimate(rm, layout, speeds, capacity)
    return e, (m.step_s * 1e3 + (e.step - current.step) * 1e3 if m.step_s is not None else None)


def answer(path: str, rm: RunModel, m: Measured, capacity: float | None = None, cluster: Cluster | None = None,
           gpus: int | None = None) -> RunReport:
    """The run against the model, and every what-if that applies to its layout."""
    speeds = speeds_of(m)
    current = _estimate(rm, rm.layout, speeds, capacity)
    report = RunReport(path, rm, m, current)
    measured_ms = m.step_s * 1e3 if m.step_s is not None else None

    def add(change: str, layout: Layout, words) -> None:
        e, step = predict(rm, m, layout, capacity)
        delta = e.memory.total - current.memory.total
        report.answers.append(Answer(change, words(e, step, delta), e, step, delta))

    lay = rm.layout
    for mb in _more_microbatches(lay):
        add(f"{mb} microbatches", with_microbatches(lay, mb),
            lambda e, step, _d, mb=mb: f"With {mb} microbatches the bubble falls from {current.bubble:.0%} to "
                                       f"{e.bubble:.0%}{_step_words(measured_ms, step)}.")
    if lay.pp > 1 and lay.schedule != "interleaved" and rm.model.layers % (lay.pp * 2) == 0 \
            and lay.microbatches % lay.pp == 0:
        add("interleaved 1F1B", replace(lay, schedule="interleaved", virtual_stages=2),
            lambda e, step, _d: f"Interleaved 1F1B (2 stages per rank) cuts the bubble from {current.bubble:.0%} to "
                                f"{e.bubble:.0%}{_step_words(measured_ms, step)}.")
    if lay.dp > 1:
        for zero in (z for z in (0, 1, 2, 3) if z != lay.zero):
            add(ZERO_NAMES[zero], replace(lay, zero=zero),
                lambda e, step, delta, zero=zero: _zero_words(current, e, zero, step, measured_ms))
    add("activation checkpointing " + ("off" if lay.activation_checkpointing else "on"),
        replace(lay, activation_checkpointing=not lay.activation_checkpointing),
        lambda e, step, delta: f"Activation checkpointing {'off' if lay.activation_checkpointing else 'on'} "
                               f"{'saves' if delta < 0 else 'costs'} {fmt_bytes(abs(delta))} per rank"
                               f"{_step_words(measured_ms, step)}.")
    for other in _other_meshes(rm, speeds, capacity):
        add(other.name(), other, lambda e, step, delta: f"{e.layout.name()}: {fmt_bytes(e.memory.total)} per rank "
            f"({'+' if delta >= 0 else '-'}{fmt_bytes(abs(delta))}), bubble {e.bubble:.0%}{_step_words(measured_ms, step)}.")
    if gpus and cluster:
        batch = lay.sequences_per_step
        report.plan = plan(rm.model, replace(cluster, gpus=gpus), rm.precision, batch, 1.0, speeds=speeds,
                           impl=rm.impl, capacity=capacity)
    return report


def _estimate(rm: RunModel, layout: Layout, speeds: Speeds, capacity: float | None) -> Estimate:
    same_split = (layout.pp, layout.virtual_stages) == (rm.layout.pp, rm.layout.virtual_stages)
    return estimate(rm.model, layout, rm.precision, speeds, impl=rm.impl,
                    layers_per_stage=rm.layers_per_stage if same_split else None, capacity=capacity)


def with_microbatches(lay: Layout, microbatches: int) -> Layout:
    """``lay`` with the same sequences per pass cut into ``microbatches``."""
    return replace(lay, microbatches=microbatches, micro_batch=lay.micro_batch * lay.microbatches // microbatches)


def _more_microbatches(lay: Layout) -> list[int]:
    """Microbatch counts worth trying: the fewest that keep the bubble at or under the target, and the most."""
    if lay.pp < 2:
        return []
    sequences = lay.micro_batch * lay.microbatches
    options = [m for m in divisors(sequences) if m > lay.microbatches]
    if not options:
        return []
    enough = microbatches_for(lay.pp, BUBBLE_TARGET, lay.schedule, lay.virtual_stages)
    good = [m for m in options if m >= enough]
    return sorted({good[0] if good else options[-1], options[-1]})


def _other_meshes(rm: RunModel, speeds: Speeds, capacity: float | None) -> list[Layout]:
    """The fastest other dp x tp x pp splits of the same ranks (same ZeRO stage where data-parallel)."""
    lay, world, found = rm.layout, rm.world_size, []
    sequences = lay.sequences_per_step // lay.grad_accum
    for tp in divisors(world):
        if rm.model.heads % tp:
            continue
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if (dp, tp, pp) == (lay.dp, lay.tp, lay.pp) or pp > rm.model.layers or sequences % dp:
                continue
            per_replica = sequences // dp
            m = per_replica if pp > 1 else 1
            candidate = Layout(dp=dp, tp=tp, pp=pp, zero=lay.zero if dp > 1 else 0, micro_batch=per_replica // m,
                               microbatches=m, grad_accum=lay.grad_accum,
                               schedule="1f1b" if pp > 1 and m >= pp else "gpipe" if pp > 1 else "1f1b",
                               activation_checkpointing=lay.activation_checkpointing,
                               reshard_after_forward=lay.reshard_after_forward)
            found.append((_estimate(rm, candidate, speeds, capacity).step, candidate))
    return [c for _, c in sorted(found, key=lambda x: x[0])[:OTHER_MESHES]]


def _step_words(measured_ms: float | None, step_ms: float | None) -> str:
    if measured_ms is None or step_ms is None:
        return ""
    if round(step_ms) == round(measured_ms):
        return f", and the step stays at {measured_ms:.0f} ms"
    verb = "falls" if step_ms < measured_ms else "rises"
    return f", and the step {verb} from {measured_ms:.0f} to {step_ms:.0f} ms"


def _zero_words(current: Estimate, e: Estimate, zero: int, step: float | None, measured_ms: float | None) -> str:
    delta = e.memory.total - current.memory.total
    gather = sum(t.seconds for t in e.collectives if t.collective.group == DP and t.collective.op == ALL_GATHER)
    before = sum(t.seconds for t in current.collectives if t.collective.group == DP and t.collective.op == ALL_GATHER)
    comm = gather - before
    name = ZERO_NAMES[zero] + (" instead of " + ZERO_NAMES[current.layout.zero])
    memory = f"{'saves' if delta < 0 else 'costs'} {fmt_bytes(abs(delta))} per rank"
    traffic = (f" and {'costs' if comm > 0 else 'saves'} ~{abs(comm) * 1e3:.1f} ms of all-gather per step"
               if abs(comm) > 0 else "")
    return f"{name} {memory}{traffic}{_step_words(measured_ms, step)}."
