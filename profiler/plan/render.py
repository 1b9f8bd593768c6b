"""A plan, or a run's what-if answers, as Markdown (pastes into an issue) or JSON (for scripts)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from diagtrain.profiler.plan.estimate import COMPONENTS, Estimate
from diagtrain.profiler.plan.hardware import NVLINK
from diagtrain.profiler.plan.memory import RESERVED_FRACTION
from diagtrain.profiler.plan.planner import Plan, min_gpus_for_state
from diagtrain.profiler.plan.units import fmt_count, fmt_rate, fmt_seconds
from diagtrain.profiler.util.units import fmt_bytes
from diagtrain.profiler.plan.whatif import RunReport

FORMATS = ("md", "json")
DETAILED = 3  # layouts shown with every part of their memory and every collective
NOT_FITTING_SHOWN = 5
COMPONENT_WORDS = {"compute": "compute", "recompute": "recompute", "bubble": "bubble",
                   "tensor_parallel": "TP all-reduces", "pipeline_sends": "PP sends",
                   "data_parallel": "exposed DP traffic"}


# -- JSON ----------------------------------------------------------------------------------------


def estimate_json(e: Estimate) -> dict[str, Any]:
    """One layout's numbers, in bytes and seconds."""
    return {"layout": {**asdict(e.layout), "name": e.layout.name()}, "fits": e.fits, "why": e.why,
            "memory_bytes": e.memory.parts(), "memory_rank": e.memory_rank, "usable_bytes": e.capacity,
            "bubble": e.bubble, "step_s": e.step, "components_s": e.components,
            "tokens_per_s": e.tokens_per_second, "model_flops_per_step": e.model_flops_per_step,
            "collectives": [{"group": t.collective.group, "op": t.collective.op, "link": t.collective.link,
                             "bytes": t.collective.bytes, "calls_per_step": t.collective.calls,
                             "bytes_per_step": t.collective.bytes * t.collective.calls, "seconds_per_step": t.seconds,
                             "bus_bandwidth": t.bandwidth, "group_size": t.collective.group_size,
                             "purpose": t.collective.purpose} for t in e.collectives]}


def plan_json(p: Plan, top: int) -> dict[str, Any]:
    """The plan: its inputs, the ranked layouts (``top`` of them), what did not fit, the advice."""
    return {"model": {**{k: v for k, v in asdict(p.model).items() if k != "total_params"}, "parameters": p.model.params},
            "cluster": {"gpu": p.cluster.gpu.key, "gpu_name": p.cluster.gpu.name, "gpus": p.cluster.gpus,
                        "gpus_per_node": p.cluster.gpus_per_node, "memory_bytes": p.cluster.gpu.memory_bytes,
                        "intra_node_bw": p.cluster.intra_node_bw, "inter_node_bw": p.cluster.inter_node_bw,
                        "sources": list(p.cluster.gpu.sources)},
            "precision": asdict(p.precision), "global_batch": p.global_batch,
            "flops_per_gpu": p.speeds.flops, "peak_fraction": None if p.measured_speeds else p.peak_fraction,
            "state_bytes": p.model.params * p.precision.state_bytes,
            "min_gpus_for_state": min_gpus_for_state(p.model.params, p.cluster.gpu.memory_bytes, p.precision),
            "fits": bool(p.ranked), "ranked": [estimate_json(e) for e in p.ranked[:top]],
            "ranked_total": len(p.ranked), "not_fitting": [estimate_json(e) for e in p.not_fitting[:NOT_FITTING_SHOWN]],
            "advice": p.advice}


def run_json(r: RunReport, top: int) -> dict[str, Any]:
    """A run against the model and its what-if answers."""
    m = r.measured
    return {"run": r.path, "strategy": r.rm.strategy, "world_size": r.rm.world_size, "notes": r.rm.notes,
            "model": {**{k: v for k, v in asdict(r.rm.model).items() if k != "total_params"},
                      "parameters": r.rm.model.params},
            "precision": asdict(r.rm.precision),
            "measured": {"step_s": m.step_s, "flops_per_rank": m.flops, "bus_bandwidth": m.group_bw,
                         "pipeline_bubble": m.pipeline.measured if m.pipeline else None},
            "current": estimate_json(r.current), "not_modeled_ms": r.other_ms,
            "what_if": [{"change": a.change, "answer": a.sentence, "step_ms": a.step_ms,
                         "memory_delta_bytes": a.memory_delta, "estimate": estimate_json(a.estimate)}
                        for a in r.answers],
            "plan": plan_json(r.plan, top) if r.plan else None}


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


# -- Markdown ------------------------------------------------------------------------------------


def plan_markdown(p: Plan, top: int) -> str:
    """The plan for an issue or a design doc: inputs and assumptions, the ranking, details, advice."""
    m, c = p.model, p.cluster
    state = m.params * p.precision.state_bytes
    lines = [f"## diagtrain plan: {fmt_count(m.params)} parameters on {c.gpus} x {c.gpu.name} "
             f"({c.gpus_per_node} per node)", ""]
    lines += [f"- Model: {m.layers} layers, hidden {m.hidden}, {m.heads} heads"
              f"{f' ({m.kv_heads} KV)' if m.kv_heads else ''}, MLP {m.mlp} {m.ffn}, sequence {m.seq_len}, "
              f"vocabulary {m.vocab}.",
              f"- {p.precision.name}: {p.precision.state_bytes} bytes of model state per parameter, "
              f"{fmt_bytes(state)}{f' ({state / 1e12:.3g} TB)' if state >= 1e11 else ''} in all: at least "
              f"{min_gpus_for_state(m.params, c.gpu.memory_bytes, p.precision)} of these GPUs for the state alone.",
              f"- Global batch {p.global_batch} sequences ({fmt_count(p.global_batch * m.seq_len)} tokens) per step.",
              _links(p),
              ("- Compute: " + (f"{p.speeds.flops / 1e12:.3g} TFLOP/s per GPU, as the run measured."
                                if p.measured_speeds else
                                f"{p.peak_fraction:.0%} of {c.gpu.peak_flops / 1e12:.0f} TFLOP/s dense BF16 peak.")),
              f"- Usable memory per GPU: {fmt_bytes(c.gpu.memory_bytes * (1 - RESERVED_FRACTION))} "
              f"({RESERVED_FRACTION:.0%} kept for the CUDA context, NCCL and fragmentation).", ""]
    if not p.ranked:
        lines += ["### Nothing fits", ""] + [f"- {a}" for a in p.advice] + [""]
        lines += _not_fitting(p)
        return "\n".join(lines)
    shown = p.ranked[:top]
    lines += [f"### Layouts that fit, fastest first ({len(shown)} of {len(p.ranked)})", "",
              "| # | layout | micro-batch x microbatches x accumulation | schedule | checkpointing | memory per GPU "
              "| bubble | step | tokens/s | why |",
              "| ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for i, e in enumerate(shown, 1):
        lay = e.layout
        schedule = (f"{lay.schedule}" + (f" (v={lay.virtual_stages})" if lay.virtual_stages > 1 else "")) if lay.pp > 1 else ""
        lines.append(f"| {i} | {lay.name()} | {lay.micro_batch} x {lay.microbatches} x {lay.grad_accum} | {schedule} | "
                     f"{'yes' if lay.activation_checkpointing else 'no'} | {fmt_bytes(e.memory.total)} | "
                     f"{e.bubble:.0%} | {fmt_seconds(e.step)} | {e.tokens_per_second:,.0f} | {e.why} |")
    lines.append("")
    for i, e in enumerate(shown[:DETAILED], 1):
        lines += _detail(f"#{i} {e.layout.name()}", e)
    lines += _not_fitting(p)
    return "\n".join(lines)


def _links(p: Plan) -> str:
    c = p.cluster
    if p.measured_speeds:
        measured = ", ".join(f"{k} {fmt_rate(v)}" for k, v in p.speeds.group_bw.items())
        return f"- Links: as the run measured them (best bus bandwidth per group: {measured})."
    return (f"- Links: {fmt_rate(c.intra_node_bw)} inside a node, {fmt_rate(c.inter_node_bw)} per GPU between nodes "
            "(bus bandwidth of a ring).")


def _detail(title: str, e: Estimate) -> list[str]:
    parts = e.memory.parts()
    lines = [f"### {title}", "",
             "Memory per GPU (rank " + str(e.memory_rank) + "): " + ", ".join(
                 f"{k} {fmt_bytes(v)}" for k, v in parts.items() if k != "total" and v)
             + f"; total {fmt_bytes(parts['total'])}" + (f" of {fmt_bytes(e.capacity)} usable." if e.capacity else "."),
             "",
             "Step " + fmt_seconds(e.step) + " = " + " + ".join(
                 f"{COMPONENT_WORDS[k]} {fmt_seconds(e.components[k])}" for k in COMPONENTS if e.components[k]) + ".", ""]
    if e.collectives:
        lines += ["| group | op | link | bytes per call | calls per step | bytes per step | time per step | what |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for t in e.collectives:
            c = t.collective
            lines.append(f"| {c.group} (x{c.group_size}) | {c.op} | {'NVLink' if c.link == NVLINK else 'network'} | "
                         f"{fmt_bytes(c.bytes)} | {c.calls:g} | {fmt_bytes(c.bytes * c.calls)} | "
                         f"{fmt_seconds(t.seconds)} | {c.purpose} |")
        lines.append("")
    return lines


def _not_fitting(p: Plan) -> list[str]:
    if not p.not_fitting:
        return []
    lines = ["### Did not fit (leanest first)", ""]
    for e in p.not_fitting[:NOT_FITTING_SHOWN]:
        lines.append(f"- {e.layout.name()}: {e.why}")
    return lines + [""]


def run_markdown(r: RunReport, top: int) -> str:
    """The run against the model, then the what-if answers."""
    m, cur = r.measured, r.current
    lines = [f"## diagtrain plan --from {r.path}", "",
             f"- This run: {r.rm.strategy or 'a job'} on {r.rm.world_size} ranks, layout {r.rm.layout.name()}, "
             f"{r.rm.model.params:,.0f} parameters ({r.rm.model.layers} layers, hidden {r.rm.model.hidden}), "
             f"{r.rm.precision.name}."]
    lines += [f"- Assumed: {n}" for n in r.rm.notes]
    speeds = ", ".join(f"{k} {v / 1e9:.3g} GB/s" for k, v in m.group_bw.items()) or "no collectives profiled"
    lines += [f"- Measured: step {m.step_s * 1e3:.1f} ms (median after warm-up), {m.flops / 1e9:.3g} GFLOP/s per rank "
              f"of model compute, best bus bandwidth {speeds}"
              + (f", pipeline bubble {m.pipeline.measured:.0%}" if m.pipeline else "") + "."
              if m.step_s is not None else "- Measured: no steps.",
              f"- The model at these speeds: {fmt_seconds(cur.step)} per step ("
              + ", ".join(f"{COMPONENT_WORDS[k]} {fmt_seconds(v)}" for k, v in cur.components.items() if v)
              + (f"); {r.other_ms:.1f} ms of the measured step is outside it (optimizer, data, overhead)."
                 if r.other_ms is not None else ")."),
              f"- Memory per rank, the model: {fmt_bytes(cur.memory.total)} "
              f"({fmt_bytes(cur.memory.model_state)} of model state).", ""]
    if r.answers:
        lines += ["### What if", "", "| change | memory per rank | bubble | step (ms) | answer |",
                  "| --- | ---: | ---: | ---: | --- |"]
        for a in r.answers:
            step = "" if a.step_ms is None else f"{a.step_ms:.0f}"
            lines.append(f"| {a.change} | {fmt_bytes(a.estimate.memory.total)} | {a.estimate.bubble:.0%} | {step} | "
                         f"{a.sentence} |")
        lines.append("")
    if r.plan:
        lines += [plan_markdown(r.plan, top)]
    return "\n".join(lines)
