"""A finished run in the plan's terms: its model and layout, and the speeds and times it measured.

Read from what the run directory and its analysis hold (trainer.json, ranks/*/parameters.json,
manifest.json, report.json, analysis/steps.parquet and collectives.parquet), never from the traces.
The analyzer calls ``describe`` and ``measure`` on its own tables (judge/model_check/expected.py); ``diagtrain
plan --from RUN`` reads the same from the files (``read_run``) and hands them to the planner's what-ifs.
Warm-up is the detectors' rule (``detectors.base.steady``), with one steady step enough for the model.

Which mesh dimension a process group spans comes from its DeviceMesh name (``mesh_dp``...) or its
members' mesh coordinates; the mesh itself from trainer.json or the manifest. This is the seam for
the analyzer's inferred structure: a run without them falls back to one data-parallel group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors.base import steady
from diagtrain.profiler.analyzer.run.spans import read_spans
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.model.collectives import RECV, SEND
from diagtrain.profiler.model.pipeline import bubble_with_stage_times
from diagtrain.profiler.model.precision import ASSUMED, FP32_AUTOCAST_BF16
from diagtrain.profiler.plan.comm import DP, PP, TP
from diagtrain.profiler.plan.compute import rank_flops
from diagtrain.profiler.plan.layout import REFERENCE_TP_BACKWARD_REDUCES, Implementation, Layout
from diagtrain.profiler.plan.model import reference_trainer, shape_for
from diagtrain.profiler.plan.run_model import Measured, PipelineTiming, RunModel
from diagtrain.profiler.run_dir import group_members, read_json
from diagtrain.profiler.util.groups import distinct_rows
from diagtrain.profiler.util.intervals import merge


@section("measured")
class MeasuredRun:
    """How a run that does not say how it was sharded is read."""

    # FSDP gathers every weight at least once a step (twice when it reshards after forward); half the
    # model's bytes leaves room for weights it keeps unsharded (a root module's, an embedding).
    sharded_gather_share: float = setting(0.5, "all-gathering this share of the model's bytes every step marks a "
                                          "run fully sharded (FSDP, ZeRO-3): a DDP job gathers only small metrics")


# The note ``describe`` leaves on a run whose shape it took from the nearest well-known model. The
# planner needs a shape for its what-ifs (``plan --from`` says so, and --layers/--hidden/--seq correct
# it); the analyzer's expected-vs-measured section reports none of it (judge/model_check/expected.py).
SHAPE_ASSUMED = "shape assumed"
NO_MESH = "no mesh recorded"  # the note on a run whose layout is plain data parallelism by assumption


class RunInputError(ValueError):
    """A run the plan cannot describe; the message names the file and what is missing."""


# -- describing the run -------------------------------------------------------------------------


def describe(run: dict[str, Any], trainer: dict | None, total_params: float | None, collectives: pd.DataFrame,
             steps: pd.DataFrame, on_gpu: bool) -> RunModel:
    """The run's model and layout: exact for a reference trainer (trainer.json), else estimated from its
    parameters or gradient traffic, with the assumptions in ``notes``."""
    world = int(run.get("world_size") or 1)
    impl = Implementation(reduce_scatter_as_all_reduce=not on_gpu,  # gloo runs reduce-scatter as all-reduce
                          tp_backward_reduces_per_layer=REFERENCE_TP_BACKWARD_REDUCES if trainer else 2)
    if trainer:
        return _reference(trainer, world, impl)
    mesh = run.get("mesh") or {}
    dims = {k: int(mesh.get(k) or 1) for k in ("pp", "dp", "tp")}
    notes = []
    if dims["pp"] * dims["dp"] * dims["tp"] != world:
        dims = {"pp": 1, "dp": world, "tp": 1}
        notes.append(f"{NO_MESH}: assumed plain data parallelism over the {world} ranks")
    profiled = with_steps(collectives, steps)
    params = total_params
    if params is None:
        # A rank reduces the gradients of its own tensor-parallel shard and pipeline stage only.
        shards = dims["tp"] * dims["pp"]
        params = _params_from_gradients(profiled) * shards
        notes.append(f"size read off the gradient reductions of one step: {params:,.0f} parameters "
                     f"({ASSUMED.grad}-byte gradients assumed"
                     f"{f', one rank holding 1/{shards} of them' if shards > 1 else ''})")
    model = shape_for(params)
    notes.append(f"{SHAPE_ASSUMED} from the nearest well-known model: {model.layers} layers, hidden {model.hidden}, "
                 f"sequence {model.seq_len} (pass --layers/--hidden/--seq to correct)")
    zero = 3 if (run.get("strategy") or "").lower() in ("fsdp", "zero3") else 0
    if not zero and run.get("strategy") is None and _gathers_weights(profiled, params):
        zero = 3
        notes.append("every step all-gathers as many bytes as the model holds: assumed fully sharded (FSDP, ZeRO-3)")
    layout = Layout(dp=dims["dp"], tp=dims["tp"], pp=dims["pp"], zero=zero)
    return RunModel(model, layout, ASSUMED, impl, world, strategy=run.get("strategy"), notes=notes)


def _reference(trainer: dict, world: int, impl: Implementation) -> RunModel:
    mesh = trainer["mesh"]
    dp, tp, pp = int(mesh["dp"]), int(mesh["tp"]), int(mesh["pp"])
    strategy = trainer["strategy"]
    stage_layers = trainer.get("stage_layers")
    virtual = len(stage_layers) // pp if stage_layers and pp > 1 else 1
    local_batch = int(trainer["global_batch"]) // dp
    microbatches = int(trainer.get("n_microbatches") or 1) if pp > 1 else 1
    schedule = {"interleaved1f1b": "interleaved"}.get(trainer.get("schedule"), trainer.get("schedule") or "1f1b")
    layout = Layout(dp=dp, tp=tp, pp=pp, zero=3 if strategy == "fsdp" or (strategy == "3d" and dp > 1) else 0,
                    micro_batch=local_batch // microbatches, microbatches=microbatches,
                    grad_accum=int(trainer.get("grad_accum") or 1), schedule=schedule if pp > 1 else "1f1b",
                    virtual_stages=virtual, activation_checkpointing=bool(trainer.get("activation_checkpoint")),
                    reshard_after_forward=bool(trainer.get("fsdp_reshard_after_forward", True)))
    precision = FP32_AUTOCAST_BF16 if trainer.get("bf16") else ASSUMED
    return RunModel(reference_trainer(trainer), layout, precision, impl, world,
                    layers_per_stage=stage_layers if pp > 1 else None, strategy=strategy)


def total_parameters(parameters: dict[int, dict]) -> float | None:
    """The model's size: every distinct parameter's global shape, over all ranks' parameters.json."""
    shapes = {}
    for info in parameters.values():
        for p in info.get("parameters") or []:
            shapes[p["name"]] = int(np.prod(p["shape"]))
    return float(sum(shapes.values())) if shapes else None


def _params_from_gradients(collectives: pd.DataFrame) -> float:
    """Parameters of a data-parallel run: the gradients it reduces in one profiled step (DDP's
    all-reduces, FSDP's reduce-scatters over the whole buffer), in the assumed precision's gradients."""
    if collectives.empty or "step" not in collectives:
        raise RunInputError("no parameters.json and no profiled collectives to size the model from")
    per_step = _bytes_per_step(collectives, ("all_reduce", "reduce_scatter"))
    if not per_step > 0:
        raise RunInputError("no parameters.json and no gradient all-reduce in the profiled steps to size the model "
                            "from")
    return per_step / ASSUMED.grad


def _gathers_weights(collectives: pd.DataFrame, params: float) -> bool:
    """Whether one rank all-gathers at least the model's weights every profiled step: FSDP's signature
    (a DDP job's all-gathers are of metrics, far smaller)."""
    if collectives.empty or "step" not in collectives:
        return False
    share = MeasuredRun.active().sharded_gather_share
    return _bytes_per_step(collectives, ("all_gather",)) >= share * params * ASSUMED.grad


def _bytes_per_step(collectives: pd.DataFrame, ops: tuple[str, ...]) -> float:
    """The median over profiled steps of the bytes one rank (the lowest) moved in ``ops``."""
    mine = collectives[collectives["op"].isin(ops) & (collectives["rank"] == collectives["rank"].min())]
    per_step = mine.groupby("step")["bytes"].sum()
    return float(per_step.median()) if len(per_step) else 0.0


# -- what the run measured ----------------------------------------------------------------------


def group_kind(desc: Any, members: Any, op: str, layout: Layout) -> str | None:
    """The mesh dimension (dp, tp, pp) a collective's group spans; None for a group the model has not
    (a job's own, such as the reference trainers' ``metrics``)."""
    if op in (SEND, RECV):
        return PP
    desc = str(desc or "")
    if desc.startswith("mesh_"):
        return desc.removeprefix("mesh_")
    if desc not in ("", "default_pg", "None", "nan", "?"):
        return None
    members = [int(m) for m in (members if members is not None else [])]
    if len(members) < 2:
        return None
    coords = [layout.coords(m) for m in members]
    varying = [name for i, name in enumerate((PP, DP, TP)) if len({c[i] for c in coords}) > 1]
    return varying[0] if len(varying) == 1 else None


def group_kinds(collectives: pd.DataFrame, layout: Layout) -> list[str | None]:
    """``group_kind`` of every row, worked out once per distinct group and op (a group has up to
    thousands of members, and there is a row per collective and rank)."""
    keys = collectives["group"] if "group" in collectives else collectives["pg"]
    # Grouped in C: a tuple per row, built and hashed in Python, cost 0.4 s a call at 1,024 ranks x 20k events.
    codes, firsts = distinct_rows(collectives["pg_desc"], keys, collectives["op"])
    first = collectives.iloc[firsts]
    kinds = [group_kind(desc, members, op, layout)
             for desc, members, op in zip(first["pg_desc"], first["group_ranks"], first["op"])]
    return list(np.array(kinds, dtype=object)[codes])


def with_steps(collectives: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The collectives of profiled steps, each with the step it ran in (by its start time)."""
    if "trace_start" not in steps and "start" in steps:  # steps known only from the traces
        steps = steps.rename(columns={"start": "trace_start", "end": "trace_end"})
    if collectives.empty or "trace_start" not in steps or steps["trace_start"].isna().all():
        return collectives.iloc[0:0].assign(step=pd.Series(dtype="int64"))
    spans = steps.loc[steps["trace_start"].notna(), ["rank", "step", "trace_start", "trace_end"]]
    spans = spans.astype({"rank": "int64"}).sort_values("trace_start")
    calls = collectives.astype({"rank": "int64"}).assign(unix=lambda c: c["ts"] / 1e6).sort_values("unix")
    joined = pd.merge_asof(calls, spans, left_on="unix", right_on="trace_start", by="rank", direction="backward")
    return joined[joined["unix"] <= joined["trace_end"]].drop(columns=["unix", "trace_start", "trace_end"])


def measure(rm: RunModel, steps: pd.DataFrame, collectives: pd.DataFrame, held: dict[int, int],
            spans_of: Callable[[int], pd.DataFrame | None] = lambda _: None) -> Measured:
    """Step time, compute speed, best bandwidth per group kind, bubble, parameters and peaks of a run;
    ``spans_of(rank)`` gives a rank's timeline spans (for the bubble)."""
    # One steady step is enough for medians and peaks: a 2- or 3-step run's leave its start-up out.
    s = steady(steps, at_least=1)
    step_s = float(s.groupby("rank")["wall_ms"].median().max()) / 1e3 if len(s) else None
    compute_s = {}
    if "compute_ms" in s and s["compute_ms"].notna().any():
        compute_s = {int(r): float(v) / 1e3 for r, v in s.dropna(subset=["compute_ms"]).groupby("rank")["compute_ms"].median().items()}
    peaks = {}
    if "peak_mem_bytes" in s and s["peak_mem_bytes"].notna().any():
        peaks = {int(r): float(v) for r, v in s.groupby("rank")["peak_mem_bytes"].max().items() if pd.notna(v)}
    return Measured(step_s=step_s, compute_s=compute_s, flops=_achieved_flops(rm, compute_s),
                    group_bw=best_bandwidth(rm, collectives),
                    pipeline=pipeline_timing(rm, steps, phase_busy(steps, spans_of)) if rm.layout.pp > 1 else None,
                    held=dict(held), peak_bytes=peaks)


def _achieved_flops(rm: RunModel, compute_s: dict[int, float]) -> float | None:
    """FLOP/s per rank: the forward and backward FLOPs the model predicts per step, over the profiled
    compute time (the median over ranks)."""
    rates = []
    passes = rm.layout.grad_accum * rm.layout.microbatches
    for rank, seconds in compute_s.items():
        flops = rank_flops(rm.model, rm.layout, rm.layout.coords(rank)[0], rm.layers_per_stage).total * passes
        if seconds > 0:
            rates.append(flops / seconds)
    return float(np.median(rates)) if rates else None


def best_bandwidth(rm: RunModel, collectives: pd.DataFrame) -> dict[str, float]:
    """The best bus bandwidth each group kind reached (bytes/s); point-to-point at its transfer rate."""
    if collectives.empty or "busbw_gbps" not in collectives:
        return {}
    c = collectives.assign(kind=group_kinds(collectives, rm.layout))
    c = c[c["kind"].notna() & np.isfinite(c["busbw_gbps"]) & (c["busbw_gbps"] > 0)]
    return {k: float(v) * 1e9 for k, v in c.groupby("kind")["busbw_gbps"].max().items()}


TAIL_PHASES = ("optimizer", "metrics", "checkpoint")  # phases that run after forward and backward in a step


P2P_OPS = ("send", "recv")  # a pipeline rank blocked on its neighbour sits in one of these


def phase_busy(steps: pd.DataFrame, spans_of: Callable[[int], pd.DataFrame | None]) -> dict[tuple[int, int], float]:
    """Per profiled (rank, step): ms the rank worked inside its forward-backward phase, from its timeline
    spans (``start_us``, ``end_us``, ``kind``, ``name`` on the common clock): the phase less the time
    it sat in pipeline sends and receives with nothing computing, waiting for a neighbour (its compute,
    its own tensor- and data-parallel collectives and the framework's work between ops all count as
    work). The phase runs from the end of the step's data phase to the start of its optimizer."""
    if "forward_backward_ms" not in steps or "profiled" not in steps:
        return {}
    rows = steps[steps["profiled"].fillna(False).astype(bool) & steps["forward_backward_ms"].notna()]
    out = {}
    for rank, mine in rows.groupby("rank"):
        spans = spans_of(int(rank))
        if spans is None or spans.empty:
            continue
        names = spans["name"].astype(str).str.lower()
        p2p = spans[(spans["kind"] == "comm") & names.str.contains("|".join(P2P_OPS))]
        compute = spans[spans["kind"] == "compute"]
        p2p_s, p2p_e = merge(p2p["start_us"].to_numpy(), p2p["end_us"].to_numpy())
        cs, ce = merge(compute["start_us"].to_numpy(), compute["end_us"].to_numpy())
        tail = sum(mine.get(f"{p}_ms", pd.Series(0.0, index=mine.index)).fillna(0.0) for p in TAIL_PHASES)
        lo = (mine["start"] + mine.get("data_ms", 0.0).fillna(0.0) / 1e3) * 1e6
        hi = (mine["end"] - tail / 1e3) * 1e6
        for step, a, b in zip(mine["step"], lo, hi):
            # Waiting: inside a send or receive with no compute running (an asynchronous one the rank
            # computes beside is not waiting).
            ws, we = np.maximum(p2p_s, a), np.minimum(p2p_e, b)
            keep = we > ws
            waited = sum(float(e - s) - _overlap(s, e, cs, ce) for s, e in zip(ws[keep], we[keep]))
            out[(int(rank), int(step))] = (b - a - waited) / 1e3
    return out


def _overlap(start: float, end: float, starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of [start, end) covered by the sorted disjoint intervals (starts, ends)."""
    lo, hi = np.searchsorted(ends, start, side="right"), np.searchsorted(starts, end, side="left")
    return float(np.clip(np.minimum(ends[lo:hi], end) - np.maximum(starts[lo:hi], start), 0, None).sum())


def pipeline_timing(rm: RunModel, steps: pd.DataFrame, busy: dict[tuple[int, int], float]) -> PipelineTiming | None:
    """Each pipeline rank works for ``busy`` of its forward-backward phase; the pipeline idled the rest
    of its longest phase; with its stages' busy times, GPipe and 1F1B explain the cost model's
    ``bubble_with_stage_times``."""
    lay = rm.layout
    if lay.pp < 2 or not busy:
        return None
    rows = steps.assign(busy=[busy.get((int(r), int(st)), np.nan) for r, st in zip(steps["rank"], steps["step"])])
    rows = rows.dropna(subset=["busy", "forward_backward_ms"])
    if rows.empty:
        return None
    rows = rows.assign(pp_rank=[lay.coords(int(r))[0] for r in rows["rank"]],
                       pipeline=[lay.coords(int(r))[1:] for r in rows["rank"]])
    per_step = [1 - g["busy"].mean() / g["forward_backward_ms"].max()
                for _, g in rows.groupby(["pipeline", "step"]) if g["pp_rank"].nunique() == lay.pp]
    if not per_step:
        return None
    stage_busy = rows.groupby("pp_rank")["busy"].median()
    with_times = None
    if lay.schedule in ("gpipe", "1f1b") and len(stage_busy) == lay.pp:
        with_times = bubble_with_stage_times(stage_busy, lay.microbatches * lay.grad_accum)
    return PipelineTiming(float(np.median(per_step)), {int(k): float(v) for k, v in stage_busy.items()}, with_times)


# -- reading a run directory --------------------------------------------------------------------


@dataclass
class RunFiles:
    """Everything ``plan --from`` reads of a run."""

    path: Path
    run: dict[str, Any]
    trainer: dict | None
    parameters: dict[int, dict]
    steps: pd.DataFrame
    collectives: pd.DataFrame
    on_gpu: bool

    @property
    def held(self) -> dict[int, int]:
        """Parameters each rank holds, from its parameters.json."""
        return {r: sum(p["local_numel"] for p in info["parameters"]) for r, info in self.parameters.items()}

    def describe(self) -> RunModel:
        return describe(self.run, self.trainer, total_parameters(self.parameters), self.collectives, self.steps,
                        self.on_gpu)

    def measure(self, rm: RunModel) -> Measured:
        return measure(rm, self.steps, self.collectives, self.held, self.spans)

    def spans(self, rank: int) -> pd.DataFrame | None:
        """The rank's timeline spans as the analysis left them (analysis/timeline.json), on the common clock."""
        index = read_json(self.path / "analysis" / "timeline.json") or {}
        info = (index.get("ranks") or {}).get(str(rank))
        if not info or "spans" not in info:
            return None
        return read_spans(self.path / "analysis" / info["spans"])  # published on the run's clock


ANALYSIS_FILES = ("report.json", "analysis/steps.parquet")


def with_members(collectives: pd.DataFrame) -> pd.DataFrame:
    """analysis/collectives.parquet with its ``group_ranks`` column back, read from the group keys."""
    if "group" not in collectives or "group_ranks" in collectives:
        return collectives
    members = {key: group_members(key) for key in collectives["group"].dropna().unique()}
    return collectives.assign(group_ranks=[members.get(key, ()) for key in collectives["group"]])


def read_run(path: Path) -> RunFiles:
    """Read a run's analysis and its own records; RunInputError names what is missing or unreadable."""
    missing = [name for name in ANALYSIS_FILES if not (path / name).exists()]
    if missing:
        raise RunInputError(f"{path}: no analysis ({', '.join(missing)} missing); run `diagtrain analyze {path}`")
    try:
        report = json.loads((path / "report.json").read_text())
        steps = pd.read_parquet(path / "analysis" / "steps.parquet")
        coll_path = path / "analysis" / "collectives.parquet"
        collectives = with_members(pd.read_parquet(coll_path)) if coll_path.exists() else pd.DataFrame()
    except (OSError, ValueError) as e:
        raise RunInputError(f"{path}: cannot read its analysis: {e}") from None
    trainer_path = path / "trainer.json"
    trainer = read_json(trainer_path)
    if trainer_path.exists() and not isinstance(trainer, dict):
        raise RunInputError(f"{trainer_path}: not a JSON object")
    parameters = {}
    for p in sorted(path.glob("ranks/*/parameters.json")):
        info = read_json(p)
        if isinstance(info, dict) and "parameters" in info:
            parameters[int(info.get("rank", p.parent.name))] = info
    run = report.get("run") or {}
    return RunFiles(path, run, trainer, parameters, steps, collectives, bool(run.get("on_gpu")))
