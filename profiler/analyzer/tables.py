"""The analysis tables every detector reads: steps (rank × step), ranks, collectives, run facts.

Built once from what the loaders returned and from the run directory's own files (steps.jsonl,
manifest, trainer.json, parameters.json, telemetry). Detectors never read files themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer import clocks
from diagtrain.profiler.analyzer.collectives import match
from diagtrain.profiler.analyzer.flight_records import Entry, keyed_by_members, rank_of_dump, read_dump
from diagtrain.profiler.analyzer.load import RankResult
from diagtrain.profiler.analyzer.logs import LogEvent, NcclLog, parse_errors, read_nccl_log
from diagtrain.profiler.rank_files import RankIndex, read_json

US_PER_MS = 1e3
BYTES_PER_PARAM = 16  # AdamW with fp32 master weights: param, grad, two moments (4 bytes each)


@dataclass
class Tables:
    """Everything the detectors look at."""

    steps: pd.DataFrame  # rank, step, start, end (Unix s), wall_ms, <phase>_ms, peak_mem_bytes, trace columns
    ranks: pd.DataFrame  # one row per rank: the report's per-rank record
    collectives: pd.DataFrame  # matched across ranks (see collectives.match)
    phases: list[str]  # phase names, in the order a step runs them
    manifest: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] | None = None
    parameters: dict[int, int] = field(default_factory=dict)  # rank -> parameters held (local numel)
    world_size: int | None = None
    on_gpu: bool = False
    telemetry: pd.DataFrame | None = None
    nccl_logs: dict[int, NcclLog] = field(default_factory=dict)  # rank -> its NCCL_DEBUG log
    log_events: dict[int, list[LogEvent]] = field(default_factory=dict)  # rank -> errors in its stderr
    rank_hosts: dict[int, str] = field(default_factory=dict)  # rank -> host (rank.json)
    clock_shifts_us: dict[int, float] = field(default_factory=dict)  # rank -> µs added to line up clocks
    dumps: dict[int, dict] = field(default_factory=dict)  # rank -> flight-recorder dump
    flight_records: list[Entry] = field(default_factory=list)  # every dump's collectives, groups keyed by members
    process_groups: dict[int, dict] = field(default_factory=dict)  # rank -> {pg name: {desc, ranks}}
    stacks: dict[int, dict] = field(default_factory=dict)  # rank -> stacks.json (dumped on a hang)
    exits: dict[int, dict] = field(default_factory=dict)  # rank -> exit.json


def build(run_dir: Path, results: list[RankResult], flight_recorder_dir: Path | None = None) -> Tables:
    """Join the per-rank results with the run directory's step records and facts."""
    recorded, phases = read_step_records(run_dir)
    traced = pd.concat([r.steps for r in results], ignore_index=True) if results else pd.DataFrame()
    steps = _join_steps(recorded, traced)
    collectives = match(pd.concat([r.collectives for r in results], ignore_index=True)) if results else pd.DataFrame()
    manifest = read_json(run_dir / "manifest.json") or {}
    world = manifest.get("world_size") or max((r.world_size or 0 for r in results), default=0) or None
    tables = Tables(steps=steps, ranks=pd.DataFrame(), collectives=collectives, phases=phases, manifest=manifest,
                    trainer=read_json(run_dir / "trainer.json"), parameters=_parameters(run_dir), world_size=world,
                    on_gpu=any(r.on_gpu for r in results), telemetry=_telemetry(run_dir),
                    nccl_logs=_per_rank(run_dir, "nccl.log", read_nccl_log),
                    log_events=_per_rank(run_dir, "stderr.log", lambda p: parse_errors(_lines(p))),
                    rank_hosts={r: i.get("host") for r, i in RankIndex(run_dir).refresh().items()},
                    dumps=_per_rank(run_dir, "flight_recorder.json", read_dump),
                    process_groups=_per_rank(run_dir, "process_groups.json", read_json),
                    stacks=_per_rank(run_dir, "stacks.json", read_json),
                    exits=_per_rank(run_dir, "exit.json", read_json))
    if flight_recorder_dir is not None:
        tables.dumps = read_dump_dir(flight_recorder_dir)
    tables.flight_records = keyed_by_members(tables.dumps, tables.process_groups)
    # Ranks on other hosts: line up their clocks on collective end times (see clocks.py).
    hosts = tables.rank_hosts or {r.rank: r.host_name for r in results}
    tables.clock_shifts_us = clocks.offsets(collectives, hosts)
    clocks.apply(tables.clock_shifts_us, collectives, steps)
    tables.steps = with_waits(steps, collectives)
    tables.ranks = rank_table(tables, results)
    tables.telemetry = join_telemetry(tables.telemetry, steps)
    return tables


def with_waits(steps: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """Add ``wait_ms``: per profiled step, the rank's time in collectives waiting for the last rank."""
    if collectives.empty or "trace_start" not in steps or steps["trace_start"].isna().all():
        return steps
    spans = steps.loc[steps["trace_start"].notna(), ["rank", "step", "trace_start", "trace_end"]]
    spans = spans.astype({"rank": "int64"}).sort_values("trace_start")
    waits = collectives[["rank", "ts", "wait_us"]].astype({"rank": "int64"}).assign(unix=lambda c: c["ts"] / 1e6)
    joined = pd.merge_asof(waits.sort_values("unix"), spans, left_on="unix", right_on="trace_start", by="rank",
                           direction="backward")
    joined = joined[joined["unix"] <= joined["trace_end"]]
    per_step = joined.groupby(["rank", "step"])["wait_us"].sum().div(US_PER_MS).rename("wait_ms").reset_index()
    merged = steps.merge(per_step.astype({"step": steps["step"].dtype}), on=["rank", "step"], how="left")
    # A profiled step with no collective waited for nobody.
    merged.loc[merged["trace_start"].notna() & merged["wait_ms"].isna(), "wait_ms"] = 0.0
    return merged


def join_telemetry(telemetry: pd.DataFrame | None, steps: pd.DataFrame) -> pd.DataFrame | None:
    """Give each rank's telemetry sample the step that rank was in when it was taken."""
    if telemetry is None or telemetry.empty or steps.empty or "rank" not in telemetry:
        return telemetry
    t = telemetry.assign(unix=telemetry["time"].astype("int64") / 1e9 if telemetry["time"].dtype.kind == "M"
                         else telemetry["time"].astype(float))
    with_rank = t[t["rank"].notna()].astype({"rank": "int64"}).sort_values("unix")
    spans = steps[["rank", "step", "start", "end"]].dropna().astype({"rank": "int64"}).sort_values("start")
    joined = pd.merge_asof(with_rank, spans, left_on="unix", right_on="start", by="rank", direction="backward")
    joined.loc[joined["unix"] > joined["end"], "step"] = np.nan  # between steps (or after the last)
    return pd.concat([joined.drop(columns=["start", "end"]), t[t["rank"].isna()]], ignore_index=True)


def read_step_records(run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """Every rank's steps.jsonl as one table with a column per phase (ms)."""
    rows, phases = [], []
    for path in sorted(run_dir.glob("ranks/*/steps.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            for name in record.get("phases_ms", {}):
                if name not in phases:
                    phases.append(name)
            rows.append({
                "rank": record["rank"], "step": record["step"], "start": record["start"], "end": record["end"],
                "wall_ms": record["duration_ms"], "peak_mem_bytes": record.get("peak_mem_bytes"),
                "samples": record.get("samples"), "tokens": record.get("tokens"),
                **{f"{k}_ms": v for k, v in record.get("phases_ms", {}).items()},
            })
    return pd.DataFrame(rows), phases


def _join_steps(recorded: pd.DataFrame, traced: pd.DataFrame) -> pd.DataFrame:
    if not traced.empty:
        traced = traced.assign(**{c.replace("_us", "_ms"): traced[c] / US_PER_MS
                                  for c in ("compute_us", "comm_us", "exposed_comm_us", "overlapped_comm_us", "idle_us")})
        traced = traced.assign(trace_wall_ms=traced["wall_us"] / US_PER_MS, trace_start=traced["start_us"] / 1e6,
                               trace_end=traced["end_us"] / 1e6)
        traced = traced[["rank", "step", "trace_wall_ms", "trace_start", "trace_end", "compute_ms", "comm_ms",
                         "exposed_comm_ms", "overlapped_comm_ms", "idle_ms"]]
    if recorded.empty:
        if traced.empty:
            return pd.DataFrame(columns=["rank", "step", "wall_ms", "profiled"])
        steps = traced.rename(columns={"trace_wall_ms": "wall_ms", "trace_start": "start", "trace_end": "end"})
        return steps.assign(profiled=True).sort_values(["rank", "step"], ignore_index=True)
    if traced.empty:
        return recorded.assign(profiled=False).sort_values(["rank", "step"], ignore_index=True)
    steps = recorded.merge(traced, on=["rank", "step"], how="left")
    steps["profiled"] = steps["compute_ms"].notna()
    return steps.sort_values(["rank", "step"], ignore_index=True)


def rank_table(tables: Tables, results: list[RankResult]) -> pd.DataFrame:
    """report.json's ``ranks``: steps, median step time, compute, non-compute, idle, overlap."""
    rows = []
    steps_by_rank = dict(tuple(tables.steps.groupby("rank"))) if not tables.steps.empty else {}
    traced = {r.rank: r for r in results}
    for rank in sorted(set(steps_by_rank) | set(traced)):
        steps = steps_by_rank.get(rank, pd.DataFrame())
        b = traced[rank].breakdown if rank in traced else {}
        rows.append({
            "rank": rank,
            "steps": int(len(steps)),
            "step_time_median_us": float(steps["wall_ms"].median() * US_PER_MS) if len(steps) else None,
            "compute_us": b.get("compute_us"),
            "non_compute_us": b.get("non_compute_us"),
            "idle_us": b.get("idle_us"),
            "comm_comp_overlap_pct": None if not b or np.isnan(b.get("overlap_pct", np.nan)) else b["overlap_pct"],
            "peak_mem_bytes": int(steps["peak_mem_bytes"].max()) if "peak_mem_bytes" in steps and steps["peak_mem_bytes"].notna().any() else None,
            "parameters": tables.parameters.get(rank),
            "model_state_bytes": tables.parameters[rank] * BYTES_PER_PARAM if rank in tables.parameters else None,
        })
    return pd.DataFrame(rows)


def _parameters(run_dir: Path) -> dict[int, int]:
    held = {}
    for path in run_dir.glob("ranks/*/parameters.json"):
        info = read_json(path)
        if info:
            held[int(info["rank"])] = sum(p["local_numel"] for p in info["parameters"])
    return held


def read_dump_dir(folder: Path) -> dict[int, dict]:
    """Flight-recorder dumps made outside diagtrain (NCCL's pickles or JSON), one file per rank."""
    dumps = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        try:
            dump = read_dump(path)
        except Exception:  # noqa: BLE001 - not a dump: skip it, as the trace loader skips non-traces
            continue
        rank = rank_of_dump(path, dump) if isinstance(dump, dict) else None
        if rank is not None:
            dumps[rank] = dump
    return dumps


def _per_rank(run_dir: Path, name: str, read) -> dict:
    """``read(path)`` for each rank's file ``name`` that exists and is not empty."""
    found = {}
    for path in run_dir.glob(f"ranks/*/{name}"):
        if path.parent.name.isdigit() and path.stat().st_size:
            found[int(path.parent.name)] = read(path)
    return found


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def _telemetry(run_dir: Path) -> pd.DataFrame | None:
    path = run_dir / "telemetry.parquet"
    return pd.read_parquet(path) if path.exists() else None
