"""Expected vs measured: the run held against the plan's model of its own layout.

Per rank, the model state the layout should leave it (diagtrain.profiler.plan's tensor-by-tensor
count) against what it holds (parameters.json) and its peak; per collective, the calls and bytes
the layout implies per step against those in the profiled steps, and the measured transfer time
against the ring model at the best bandwidth that group reached; for a pipeline, the bubble it lived
against its schedule's (diagtrain.profiler.model). A large difference the model cannot explain is a
finding, with its evidence.

The layout comes from trainer.json (the reference trainers); without it the section says what it
assumed (the manifest's mesh, else plain data parallelism) and raises no finding. Nor does it
borrow a shape: a plain script records no layers, hidden size, sequence or batch, so the section
gives the size the run measured, the layout it could infer, per-rank shares that need no shape, and
lists the rest under ``unknown`` (no peak, compute or step-time estimate rests on a guess).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.model_check import measured as run_measured
from diagtrain.profiler.analyzer.judge.detectors.base import Steady
from diagtrain.profiler.analyzer.judge.kinds import KINDS as ALL_KINDS, MODEL_CHECK
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.model.collectives import WHOLE_BUFFER_OPS, ring_time
from diagtrain.profiler.model.precision import model_state
from diagtrain.profiler.model.pipeline import bubble as bubble_formula
from diagtrain.profiler.plan.comm import Collective
from diagtrain.profiler.plan.comm import collectives as plan_collectives
from diagtrain.profiler.plan.estimate import Speeds, estimate
from diagtrain.profiler.plan.hardware import NETWORK, NVLINK
from diagtrain.profiler.plan.layout import Layout
from diagtrain.profiler.plan.memory import held as plan_held, rank_memory
from diagtrain.profiler.plan.run_model import Measured, RunModel
from diagtrain.profiler.util.groups import distinct_rows


@section("expected")
class Expected:
    """When a run differs from what the plan's model of its own layout says, by more than the model's error."""

    bytes_tolerance_share: float = setting(0.05, "bytes per step of a collective off the model by more than this share "
                                           "is not rounding: an extra or a missing call (a second bucket, a "
                                           "re-gather, a broadcast the layout does not need)")
    small_bytes: int = setting(4096, "... and by more than this: a job's own bookkeeping (a loss all-reduce of a few "
                               "bytes, an object broadcast) is in no layout; it is listed, never a finding")
    bubble_excess_share: float = setting(0.15, "a pipeline idling this much more of its step than the schedule "
                                         "explains with its own stage times has waits the model does not know "
                                         "(slow sends, a stage stalled outside compute)")
    peak_ratio: float = setting(1.5, "a GPU peak this many times the model's estimate holds memory the layout does not")
    peak_min_excess_bytes: int = setting(1 << 30, "... and above it by this much")
    slow_group_ratio: float = setting(3.0, "a group's collectives taking this many times the ring model at the "
                                      "group's own best bandwidth are slow")
    min_group_excess_share: float = setting(0.05, "... and costing this share of the step: noise on tiny messages is "
                                            "not worth a finding")


# The step time and peaks held against the model leave warm-up out as the detectors do (measured.py).
SETTINGS = (Expected, Steady)
# The kinds of finding the model's check makes: a finished run's, never a running job's (judge/judgement.py).
KINDS = tuple(k.name for k in ALL_KINDS if k.detector == MODEL_CHECK)


def check(tables: Tables, spans_of: Callable[[int], pd.DataFrame | None] = lambda _: None,
          ) -> tuple[dict[str, Any] | None, list[Candidate]]:
    """The report's ``expected`` section and its findings; (None, []) for a run without steps.
    ``spans_of(rank)`` gives a rank's timeline spans on the common clock (for the pipeline bubble)."""
    if tables.steps.empty:
        return None, []
    # A plain script records no mesh: the one its DeviceMesh process groups show stands in for it.
    run = {"world_size": tables.world_size, "mesh": tables.manifest.get("mesh") or tables.structure.mesh or None,
           "strategy": tables.manifest.get("strategy")}
    coll = tables.collectives if not tables.collectives.empty else pd.DataFrame()
    try:
        rm = run_measured.describe(run, tables.trainer, None, coll, tables.steps, tables.on_gpu)
    except run_measured.RunInputError as e:
        return {"available": False, "reason": str(e)}, []
    m = run_measured.measure(rm, tables.steps, coll, tables.parameters, spans_of)
    exact = tables.trainer is not None  # the layout is known, not assumed
    if exact:
        section = {"available": True, "exact_layout": True, "model": _model(rm), "notes": rm.notes,
                   "state": _state(rm, m, exact), "collectives": _collectives(rm, coll, tables, exact),
                   "bubble": _bubble(rm, m), "step": _step(rm, m)}
    else:
        section = {"available": True, "exact_layout": False, "model": _inferred_model(rm),
                   "notes": _inferred_notes(rm), "unknown": unknown(rm.layout),
                   "state": _state(rm, m, exact), "collectives": _collectives(rm, coll, tables, exact),
                   "bubble": _inferred_bubble(rm, m), "step": _measured_step(m)}
    return section, findings(section, tables, exact, Expected.active())


def _model(rm: RunModel) -> dict[str, Any]:
    mdl, lay = rm.model, rm.layout
    return {"parameters": mdl.params, "layers": mdl.layers, "hidden": mdl.hidden, "heads": mdl.heads,
            "seq_len": mdl.seq_len, "vocab": mdl.vocab, "precision": rm.precision.name,
            "state_bytes_per_parameter": rm.precision.state_bytes, "layout": lay.name(), "dims": asdict(lay)}


# -- a run that records no shape: what it measured and what it did not ------------------------------

# What a plain script does not record, by the key the section (or trainer.json's model) would give it.
UNKNOWN = {"layers": "layers", "hidden": "hidden size", "heads": "attention heads", "seq_len": "sequence length",
           "vocab": "vocabulary", "batch": "batch size", "grad_accum": "gradient accumulation",
           "activation_checkpointing": "activation checkpointing"}
UNKNOWN_PIPELINE = {"microbatches": "microbatches", "schedule": "pipeline schedule"}


def unknown(layout: Layout) -> list[str]:
    """What the section cannot know of a run without trainer.json (``UNKNOWN``'s keys)."""
    return [*UNKNOWN, *(UNKNOWN_PIPELINE if layout.pp > 1 else ())]


def _inferred_model(rm: RunModel) -> dict[str, Any]:
    """The size the run's gradient reductions measured and the layout read off its groups and traffic;
    no shape (``describe`` gives the planner the nearest well-known one, which this section never shows)."""
    lay = rm.layout
    assumed = any(n.startswith(run_measured.NO_MESH) for n in rm.notes)
    return {"parameters": rm.model.params, "parameters_from": "gradient reductions",
            "layers": None, "hidden": None, "heads": None, "seq_len": None, "vocab": None,
            "precision": rm.precision.name, "precision_assumed": True,
            "state_bytes_per_parameter": rm.precision.state_bytes, "layout": lay.name(),
            "layout_from": "assumed" if assumed else "inferred",
            "dims": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "zero": lay.zero}}


def _inferred_notes(rm: RunModel) -> list[str]:
    """``describe``'s assumptions less the borrowed shape, and what the state columns rest on."""
    lay = rm.layout
    notes = [n for n in rm.notes if not n.startswith(run_measured.SHAPE_ASSUMED)]
    notes.append(f"{rm.precision.name} weights, gradients and Adam's two moments ({rm.precision.state_bytes} bytes "
                 "per parameter): the model-state columns rest on it")
    split = [f"{n} {what} ranks" for n, what in ((lay.tp, "tensor-parallel"), (lay.pp, "pipeline"),
                                                 (lay.dp if lay.zero >= 3 else 1, "sharding")) if n > 1]
    if split:
        notes.append(f"per-rank parameters split the size evenly over {' x '.join(split)} "
                     "(the real split depends on the shape)")
    return notes


def _even_split(rm: RunModel) -> tuple[float, float]:
    """(parameters a rank computes with, parameters it keeps after ZeRO's sharding): the measured size
    spread evenly over the layout, the only split that needs no shape."""
    lay = rm.layout
    local = rm.model.params / (lay.tp * lay.pp)
    return local, local / lay.dp if lay.zero >= 1 else local


def _inferred_bubble(rm: RunModel, m: Measured) -> dict[str, Any] | None:
    """A pipeline's measured bubble; its schedule and microbatches are not recorded, so no formula."""
    if rm.layout.pp < 2:
        return None
    return {"stages": rm.layout.pp, "microbatches": None, "schedule": None, "formula": None, "with_stage_times": None,
            "measured": m.pipeline.measured if m.pipeline else None,
            "stage_busy_ms": m.pipeline.stage_busy_ms if m.pipeline else None}


def _measured_step(m: Measured) -> dict[str, Any] | None:
    """The measured step and bandwidths; no model time or FLOP/s: both need the shape and batch."""
    if m.step_s is None:
        return None
    return {"measured_ms": m.step_s * 1e3, "model_ms": None, "components_ms": None, "achieved_tflops_per_rank": None,
            "best_busbw_gbps": {k: v / 1e9 for k, v in m.group_bw.items()}}


# -- model state and memory ------------------------------------------------------------------------


def _state(rm: RunModel, m: Measured, exact: bool) -> list[dict[str, Any]]:
    """Per rank, parameters, model state and peak: expected and measured. No peak is estimated for an
    assumed layout: its activations come from a guessed shape and batch, and they dominate the peak."""
    if not exact:  # no shape: the even split, model state only
        local, shard = _even_split(rm)
        state = sum(model_state(local, shard, rm.layout.zero, rm.precision).values())
        return [{"rank": rank, "expected_parameters": shard if rm.layout.zero >= 3 else local,
                 "held_parameters": m.held.get(rank), "expected_state_bytes": state,
                 "held_state_bytes": m.held[rank] * rm.precision.state_bytes if rank in m.held else None,
                 "expected_peak_bytes": None, "expected_memory": None, "peak_bytes": m.peak_bytes.get(rank)}
                for rank in range(rm.world_size)]
    rows = []
    for rank in range(rm.world_size):
        h = plan_held(rm.model, rm.layout, rank, rm.layers_per_stage)
        expected = h.shard if rm.layout.zero >= 3 else h.local
        mem = rank_memory(rm.model, rm.layout, rm.precision, rank, rm.layers_per_stage, rm.impl.ddp_bucket_copy)
        held = m.held.get(rank)
        rows.append({"rank": rank, "expected_parameters": expected, "held_parameters": held,
                     "expected_state_bytes": mem.model_state,
                     "held_state_bytes": held * rm.precision.state_bytes if held is not None else None,
                     "expected_peak_bytes": mem.total if exact else None,
                     "expected_memory": mem.parts() if exact else None,
                     "peak_bytes": m.peak_bytes.get(rank)})
    return rows


# -- collectives -----------------------------------------------------------------------------------


def _trace_bytes(c: Collective, on_gpu: bool) -> float:
    """A collective's size as the collectives table records it: all-gather and reduce-scatter over the
    whole group's buffer (nccl-tests' size), on GPU kernels and CPU host ops alike (collectives.py)."""
    return c.bytes * c.group_size if c.op in WHOLE_BUFFER_OPS else c.bytes


def _collectives(rm: RunModel, coll: pd.DataFrame, tables: Tables, exact: bool) -> list[dict[str, Any]]:
    """Per rank and (op, size): the calls per step the layout implies (when it is known) and those the
    profiled steps hold, and one call's transfer time against the ring model at its group's best bandwidth."""
    if coll.empty:
        return []
    calls = run_measured.with_steps(coll, tables.steps)
    named = any(str(d or "") not in UNNAMED for d in calls["pg_desc"])
    # Decided per distinct (group, op), not per row: a row per collective and rank.
    kinds, firsts = distinct_rows(calls["pg_desc"], calls["op"])
    modeled = np.array([_modeled(d, named) or op in ("send", "recv")
                        for d, op in zip(calls["pg_desc"].iloc[firsts], calls["op"].iloc[firsts])], dtype=bool)
    calls = calls[modeled[kinds].tolist()]
    calls = calls[calls["bytes"].notna()]
    if calls.empty:
        return []
    calls = calls.assign(kind=run_measured.group_kinds(calls, rm.layout), size=_group_sizes(calls),
                         key=[round(float(b)) for b in calls["bytes"]])
    bw = run_measured.best_bandwidth(rm, coll)
    # One aggregation for all ranks: one per rank cost ~15 ms each, 15 s at 1,024 ranks.
    seen_by_rank = calls.groupby(["rank", "op", "key"]).agg(
        calls=("step", "size"), transfer_us=("transfer_us", "median"), kind=("kind", "first"), size=("size", "max"))
    # Rows as dicts per rank, in one pass: a .xs and a .loc per rank and key cost ~1.5 ms a rank.
    measured_by_rank: dict[int, dict[tuple, dict[str, Any]]] = {}
    for (rank, op, key), row in zip(seen_by_rank.index, seen_by_rank.to_dict("records")):
        measured_by_rank.setdefault(rank, {})[(op, key)] = row
    rows = []
    for rank, steps in calls.groupby("rank")["step"].nunique().items():
        measured = measured_by_rank[rank]
        expected: dict[tuple, list[Collective]] = {}
        if exact:
            for c in plan_collectives(rm.model, rm.layout, rm.precision, int(rank), impl=rm.impl,
                                      layers_per_stage=rm.layers_per_stage):
                expected.setdefault((c.op, round(_trace_bytes(c, tables.on_gpu))), []).append(c)
            measured = _onto_expected(seen_by_rank.xs(rank, level="rank"), expected).to_dict("index")
        for key in sorted(set(expected) | set(measured)):
            cs = expected.get(key, [])
            row = measured.get(key)
            group = cs[0].group if cs else (row["kind"] if row is not None else None)
            bandwidth = bw.get(group) if group else None
            rows.append({"rank": int(rank), "op": key[0], "bytes": key[1], "group": group,
                         "purpose": ", ".join(sorted({c.purpose for c in cs})) or None,
                         "expected_calls": sum(c.calls for c in cs) if exact else None,
                         "measured_calls": float(row["calls"]) / steps if row is not None else 0.0,
                         "measured_transfer_ms": float(row["transfer_us"]) / 1e3 if row is not None else None,
                         "model_ms": _model_ms(key, cs, row, bandwidth, tables.on_gpu),
                         "best_busbw_gbps": bandwidth / 1e9 if bandwidth else None})
    return rows


def _onto_expected(seen: pd.DataFrame, expected: dict[tuple, list[Collective]]) -> pd.DataFrame:
    """Measured calls recorded by their local input (a host all-gather whose group is unknown, so its
    whole buffer is too) put under the whole-buffer size the layout gives them, where that matches."""
    keys = []
    for (op, size), row in seen.iterrows():
        whole = (op, round(size * max(int(row["size"]), 1)))
        moved = op in WHOLE_BUFFER_OPS and (op, size) not in expected and whole in expected
        keys.append(whole if moved else (op, size))
    if keys == list(seen.index):
        return seen
    seen = seen.set_axis(pd.MultiIndex.from_tuples(keys, names=seen.index.names))
    return seen.groupby(level=[0, 1]).agg(calls=("calls", "sum"), transfer_us=("transfer_us", "median"),
                                          kind=("kind", "first"), size=("size", "max"))


def _model_ms(key: tuple[str, int], cs: list[Collective], row: dict[str, Any] | None, bandwidth: float | None,
              on_gpu: bool) -> float | None:
    """One call's ring time at ``bandwidth``: the layout's collective, else the measured call's own size and group."""
    if not bandwidth:
        return None
    if cs:
        return cs[0].seconds_per_call(bandwidth) * 1e3
    op, size = key
    n = int(row["size"]) if row is not None and row["size"] else 2
    whole = size  # the table records all-gathers by their whole buffer (collectives.py)
    return ring_time(op, whole, n, bandwidth) * 1e3


def _group_sizes(calls: pd.DataFrame) -> np.ndarray:
    """Per row, its group's size: the members it lists, else the ranks seen in the collective. Counted once
    per members object (rows share their group's), not per row."""
    members = calls["group_ranks"].to_numpy()
    objects, firsts = distinct_rows(np.fromiter(map(id, members), np.int64, len(members)))
    listed = np.array([len(g) if g is not None else 0 for g in members[firsts]], dtype=np.int64)[objects]
    if (listed > 0).all():
        return listed
    return np.where(listed > 0, listed, calls["ranks_seen"].to_numpy())


UNNAMED = ("", "None", "nan", "?")  # a collective whose trace event names no group


def _modeled(desc: Any, run_names_groups: bool) -> bool:
    """A group the model knows: a DeviceMesh dimension, the default group, or, where the run's traces name no
    group, one not named. Among named calls an unnamed one is an event that lost its arguments (one all-gather of
    an 8-rank 3D job's rank 0, once in several runs), no evidence of communication the layout lacks."""
    text = str(desc or "")
    return text.startswith("mesh_") or text == "default_pg" or (text in UNNAMED and not run_names_groups)


# -- pipeline and step -------------------------------------------------------------------------------


def _bubble(rm: RunModel, m: Measured) -> dict[str, Any] | None:
    lay = rm.layout
    if lay.pp < 2:
        return None
    out = {"stages": lay.stages, "microbatches": lay.microbatches, "schedule": lay.schedule,
           "formula": bubble_formula(lay.pp, lay.microbatches, lay.schedule, lay.virtual_stages)}
    if m.pipeline:
        out.update(measured=m.pipeline.measured, with_stage_times=m.pipeline.with_stage_times,
                   stage_busy_ms=m.pipeline.stage_busy_ms)
    return out


def _step(rm: RunModel, m: Measured) -> dict[str, Any] | None:
    """The step the model predicts with the speeds this run reached, against the measured one."""
    if not m.flops or m.step_s is None:
        return None
    fallback = max(m.group_bw.values(), default=None)
    if fallback is None and rm.world_size > 1:
        return None
    speeds = Speeds(m.flops, {NVLINK: fallback or 1.0, NETWORK: fallback or 1.0}, m.group_bw)
    e = estimate(rm.model, rm.layout, rm.precision, speeds, impl=rm.impl, layers_per_stage=rm.layers_per_stage)
    return {"measured_ms": m.step_s * 1e3, "model_ms": e.step * 1e3,
            "components_ms": {k: v * 1e3 for k, v in e.components.items()},
            "achieved_tflops_per_rank": m.flops / 1e12,
            "best_busbw_gbps": {k: v / 1e9 for k, v in m.group_bw.items()}}


# -- findings ----------------------------------------------------------------------------------------


def findings(section: dict[str, Any], tables: Tables, exact: bool, s: Expected) -> list[Candidate]:
    """Differences the model cannot explain, each with the numbers on both sides; none for a layout
    the section had to assume (a difference would say more about the assumption than the run)."""
    if not exact:
        return []
    found = _state_findings(section) + _collective_findings(section, s) + _bubble_findings(section, tables, s)
    if tables.on_gpu:
        found += _peak_findings(section, s)
        found += _slow_group_findings(section, s)
    return found


def _state_findings(section: dict[str, Any]) -> list[Candidate]:
    off = [r for r in section["state"] if r["held_parameters"] is not None
           and round(r["held_parameters"]) != round(r["expected_parameters"])]
    if not off:
        return []
    layout = section["model"]["layout"]
    worst = max(off, key=lambda r: abs(r["held_parameters"] - r["expected_parameters"]))
    return [Candidate(
        kind="state_mismatch", ranks=[r["rank"] for r in off],
        facts={"rank": worst["rank"], "held_parameters": worst["held_parameters"],
               "expected_parameters": worst["expected_parameters"], "layout": layout, "ranks_off": len(off)},
        metrics={"observed_parameters": worst["held_parameters"], "expected_parameters": worst["expected_parameters"],
                 "threshold": "exact"},
        evidence=[{"type": "file", "file": f"ranks/{r['rank']}/parameters.json", "held": r["held_parameters"],
                   "expected": r["expected_parameters"]} for r in off])]


def _collective_findings(section: dict[str, Any], s: Expected) -> list[Candidate]:
    per_rank: dict[tuple, dict[str, float]] = {}
    for r in section["collectives"]:
        key = (r["op"], r["group"] or "unattributed")
        d = per_rank.setdefault(key, {"expected": 0.0, "measured": 0.0, "ranks": set()})
        d["expected"] += r["expected_calls"] * r["bytes"]
        d["measured"] += r["measured_calls"] * r["bytes"]
        if abs(r["expected_calls"] - r["measured_calls"]) > s.bytes_tolerance_share * max(r["expected_calls"], 1):
            d["ranks"].add(r["rank"])
    out = []
    for (op, group), d in per_rank.items():
        if not d["ranks"] or abs(d["measured"] - d["expected"]) <= max(s.bytes_tolerance_share * d["expected"],
                                                                     s.small_bytes):
            continue
        ratio = d["measured"] / d["expected"] if d["expected"] else float("inf")
        out.append(Candidate(
            kind="unexpected_communication", ranks=sorted(d["ranks"]),
            facts={"op": op, "group": group, "measured_bytes": d["measured"], "expected_bytes": d["expected"],
                   "layout": section["model"]["layout"], "ratio": ratio},
            metrics={"observed_bytes_per_step": d["measured"], "expected_bytes_per_step": d["expected"],
                     "threshold_ratio": 1 + s.bytes_tolerance_share},
            evidence=[{"type": "collectives", "rank": r["rank"], "op": r["op"], "bytes": r["bytes"],
                       "expected_calls": r["expected_calls"], "measured_calls": r["measured_calls"]}
                      for r in section["collectives"] if (r["op"], r["group"] or "unattributed") == (op, group)
                      and r["rank"] in d["ranks"]][:16]))
    return out


def _bubble_findings(section: dict[str, Any], tables: Tables, s: Expected) -> list[Candidate]:
    b = section.get("bubble")
    if not b or b.get("measured") is None:
        return []
    explained = b.get("with_stage_times") or b["formula"]
    if b["measured"] - explained < s.bubble_excess_share:
        return []
    return [Candidate(
        kind="bubble_above_model", ranks=sorted(int(r) for r in tables.steps["rank"].unique()),
        facts={"measured": b["measured"], "schedule": b["schedule"], "stages": b["stages"],
               "microbatches": b["microbatches"], "formula": b["formula"], "explained": explained,
               "on_gpu": tables.on_gpu},
        metrics={"observed_bubble": b["measured"], "expected_bubble": explained, "threshold": s.bubble_excess_share},
        evidence=[{"type": "stage", "stage": st, "busy_ms": ms} for st, ms in (b.get("stage_busy_ms") or {}).items()])]


def _peak_findings(section: dict[str, Any], s: Expected) -> list[Candidate]:
    over = [r for r in section["state"] if r["peak_bytes"] and
            r["peak_bytes"] > s.peak_ratio * r["expected_peak_bytes"] and
            r["peak_bytes"] - r["expected_peak_bytes"] > s.peak_min_excess_bytes]
    if not over:
        return []
    worst = max(over, key=lambda r: r["peak_bytes"] - r["expected_peak_bytes"])
    return [Candidate(
        kind="memory_above_model", ranks=[r["rank"] for r in over],
        facts={"rank": worst["rank"], "peak_bytes": worst["peak_bytes"],
               "expected_peak_bytes": worst["expected_peak_bytes"]},
        metrics={"observed_bytes": worst["peak_bytes"], "expected_bytes": worst["expected_peak_bytes"],
                 "threshold_ratio": s.peak_ratio, "threshold_bytes": s.peak_min_excess_bytes},
        evidence=[{"type": "steps", "rank": r["rank"], "peak_bytes": r["peak_bytes"],
                   "expected": r["expected_memory"]} for r in over])]


def _slow_group_findings(section: dict[str, Any], s: Expected) -> list[Candidate]:
    step = section.get("step") or {}
    if not step:
        return []
    rows = [r for r in section["collectives"] if r["model_ms"] and r["measured_transfer_ms"] is not None]
    out = []
    for group in sorted({r["group"] for r in rows}):
        mine = [r for r in rows if r["group"] == group]
        measured = sum(r["measured_transfer_ms"] * r["measured_calls"] for r in mine) / len({r["rank"] for r in mine})
        model = sum(r["model_ms"] * r["measured_calls"] for r in mine) / len({r["rank"] for r in mine})
        if model <= 0 or measured < s.slow_group_ratio * model or \
                measured - model < s.min_group_excess_share * step["measured_ms"]:
            continue
        out.append(Candidate(
            kind="slow_collective_group", ranks=sorted({r["rank"] for r in mine}),
            facts={"group": group, "measured_ms": measured, "best_busbw_gbps": mine[0]["best_busbw_gbps"],
                   "model_ms": model},
            metrics={"observed_ms": measured, "expected_ms": model, "threshold_ratio": s.slow_group_ratio},
            evidence=[{"type": "collectives", **{k: r[k] for k in ("rank", "op", "bytes", "measured_transfer_ms",
                                                                   "model_ms")}} for r in mine[:16]]))
    return out
