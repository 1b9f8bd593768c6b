"""The analysis tables every detector reads: steps (rank × step), ranks, collectives, run facts.

A finished run's are built from what the loaders returned and the run directory's files (read/run_read.py),
a live window's from the records read so far (live_tables.py); both through :func:`assemble`, so the
detectors see the same columns either way. Detectors never read files themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.util.heap import release_freed_memory
from diagtrain.profiler.analyzer.run import clocks, device_time, job_time, ledger
from diagtrain.profiler.analyzer.read import run_files as rf
from diagtrain.profiler.analyzer.per_rank.collectives import match
from diagtrain.profiler.analyzer.read.flight_records import Entry
from diagtrain.profiler.analyzer.read.inputs import Skipped
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.read.nccl_log import NcclLog
from diagtrain.profiler.analyzer.read.run_files import DeviceRecord
from diagtrain.profiler.analyzer.read.run_read import read_run
from diagtrain.profiler.analyzer.read.stderr_errors import LogEvent
from diagtrain.profiler.analyzer.per_rank.p2p import P2PCalls
from diagtrain.profiler.analyzer.per_rank.p2p import from_flight_recorder as p2p_from_flight_recorder
from diagtrain.profiler.analyzer.per_rank.p2p import from_step_records as p2p_from_step_records
from diagtrain.profiler.analyzer.run.structure import Structure
from diagtrain.profiler.analyzer.run.structure import infer as infer_structure
from diagtrain.profiler.model.precision import bytes_per_parameter
from diagtrain.profiler.util.groups import strictly_ordered

US_PER_MS = 1e3


@dataclass
class Tables:
    """Everything the detectors look at."""

    # rank, step, start, end (Unix s), wall_ms, <phase>_ms, peak_mem_bytes, the always-on counters
    # (comm_wait_ms, <phase>_comm_wait_ms, comm_calls, cpu_ms, runq_ms, page_faults, and memory at the step's end:
    # rss_bytes, gpu_allocated_bytes, gpu_reserved_bytes, gpu_peak_bytes, gpu_peak_since; NaN where not measured),
    # on a CUDA device its timings (device_step_ms, device_idle_ms, device_comm_wait_ms, last_arrivals, and
    # time_source: "device" or "host"; run/device_time.py), trace columns
    steps: pd.DataFrame
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
    hosts: list[dict] = field(default_factory=list)  # every wrapper's host record (abandoned ones marked)
    host_clocks: dict[str, clocks.HostClock] = field(default_factory=dict)  # how each host's times were moved
    clock_shifts_us: dict[int, float] = field(default_factory=dict)  # rank -> µs added to line up clocks
    dumps: dict[int, dict] = field(default_factory=dict)  # rank -> flight-recorder dump
    flight_records: list[Entry] = field(default_factory=list)  # every dump's collectives, groups keyed by members
    process_groups: dict[int, dict] = field(default_factory=dict)  # rank -> {pg name: {desc, ranks}}
    stacks: dict[int, dict] = field(default_factory=dict)  # rank -> stacks.json (dumped on a hang)
    exits: dict[int, dict] = field(default_factory=dict)  # rank -> exit.json
    skipped: list[Skipped] = field(default_factory=list)  # run-directory files that could not be used
    notes: list[dict] = field(default_factory=list)  # health notes from reading them (impossible values, ...)
    segments: pd.DataFrame = field(default_factory=pd.DataFrame)  # each rank's work per profiled step (work_segments)
    structure: Structure = field(default_factory=Structure)  # groups, mesh, pipeline stages
    ledger: pd.DataFrame = field(default_factory=pd.DataFrame)  # where each rank's step went (run/ledger.py)
    job_steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # where the job's steps went (run/job_time.py)
    rank_starts: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> its start-up times (rank.json)
    # What judgement derives from these tables and reads more than once (judge/assessments/ledger_price.py's causes), by name: made
    # once per table, not once per reader.
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def build(run_dir: Path, results: list[RankResult], flight_recorder_dir: Path | None = None,
          cache_root: Path | None = None) -> Tables:
    """The tables of a finished run: the per-rank results joined with the run directory's files (read/run_read.py;
    one that cannot be used is listed in ``skipped``), assembled as a live window's are."""
    files = read_run(run_dir, flight_recorder_dir, cache_root)
    traced = pd.concat([r.steps for r in results], ignore_index=True) if results else pd.DataFrame()
    collectives = match(pd.concat([r.collectives for r in results], ignore_index=True)) if results else pd.DataFrame()
    world = files.manifest.get("world_size") or max((r.world_size or 0 for r in results), default=0) or None
    steps = step_table(files.steps, traced)
    tables = Tables(steps=steps, ranks=pd.DataFrame(), collectives=collectives, phases=files.phases,
                    manifest=files.manifest, trainer=files.trainer, parameters=files.parameters, world_size=world,
                    on_gpu=any(r.on_gpu for r in results), telemetry=files.telemetry, nccl_logs=files.nccl_logs,
                    log_events=files.log_events, hosts=files.hosts, dumps=files.dumps,
                    flight_records=files.flight_records, process_groups=files.process_groups, stacks=files.stacks,
                    exits=files.exits, skipped=files.skipped, notes=files.notes, rank_starts=files.rank_starts,
                    # Traces name their host where no rank.json does (a folder of traces).
                    rank_hosts=files.rank_hosts or {r.rank: r.host_name for r in results})
    p2p = _p2p_calls(results, files.dumps, steps, files.counted_p2p)
    return assemble(tables, [*device_time.records_of(steps), *files.device], p2p, files.clock_measurements, results)


def assemble(t: Tables, device: list[DeviceRecord], p2p: dict[int, P2PCalls], measurements: dict[str, list[dict]],
             results: list[RankResult] | tuple = (), ledger_of: Callable[[Tables], pd.DataFrame] = ledger.build,
             job_steps_of: Callable[[Tables], pd.DataFrame] = job_time.build, live: bool = False) -> Tables:
    """What the read tables imply, derived the same way for a live window (run/live_tables.py) and a finished
    run: device timings, the run's structure, every host on one clock, waits, ranks, telemetry by step, the ledgers
    (the ranks' and the job's). ``ledger_of`` and ``job_steps_of``: the ranks' ledger of the tables and the job's
    steps, as ``ledger.build`` and ``job_time.build`` give them (a live window's reuse the steps the window before
    held: run/live_ledger.py). ``live``: a running job's window, judged every few seconds and never reported: no
    rank table (report.json's; 15 ms at 8,192 ranks) and no memory handed back between stages (8 ms)."""
    if "data" not in t.phases and "data_ms" in t.steps and t.steps["data_ms"].notna().any():
        t.phases = ["data", *t.phases]  # from the traces' DataLoader spans: a data phase comes first
    # Before the clocks are lined up: a flight record's creation time is on its rank's own clock, as its steps are.
    t.steps = device_time.add_device_time(t.steps, device, t.flight_records, t.process_groups)
    t.segments = pd.concat([r.segments for r in results if len(r.segments)], ignore_index=True) \
        if any(len(r.segments) for r in results) else pd.DataFrame()
    t.structure = infer_structure(t.process_groups, {r.rank: r.pg_config for r in results}, t.flight_records, p2p,
                                  _ops_per_group(t.collectives), t.trainer, t.world_size)
    # Every host's times on the clock of the lowest rank's host (see clocks.py).
    t.host_clocks = clocks.host_clocks(t.collectives, t.rank_hosts, measurements)
    t.rank_hosts = {r: h for r, h in t.rank_hosts.items() if h}
    clocks.align(t)
    t.steps = with_waits(t.steps, t.collectives)
    t.ranks = pd.DataFrame() if live else rank_table(t, results)
    trim = (lambda: None) if live else release_freed_memory
    t.telemetry = join_telemetry(t.telemetry, t.steps)
    t.ledger = ledger_of(t)
    trim()  # each ledger's temporaries, before the next stage's: a long run's peak is one stage's
    t.job_steps = job_steps_of(t)
    trim()
    return t


def _p2p_calls(results: list[RankResult], dumps: dict[int, dict], steps: pd.DataFrame,
               counted: dict[int, dict[int, dict]]) -> dict[int, P2PCalls]:
    """Each rank's point-to-point calls: from its traces, else from its flight recorder (NCCL), else
    from the always-on counters in its step records."""
    calls = {r.rank: r.p2p for r in results if not r.p2p.empty}
    for rank, dump in dumps.items():
        if rank not in calls and isinstance(dump, dict) and not steps.empty:
            found = p2p_from_flight_recorder(dump, steps.loc[steps["rank"] == rank, ["step", "start", "end"]])
            if not found.empty:
                calls[rank] = found
    for rank, per_step in counted.items():
        if rank not in calls:
            calls[rank] = p2p_from_step_records(per_step)
    return calls


def _ops_per_group(collectives: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per group key: how many collectives of each op were seen."""
    if collectives.empty or "group" not in collectives:
        return {}
    counts = collectives.drop_duplicates(["group", "op", "seq"]).groupby(["group", "op"]).size()
    out: dict[str, dict[str, int]] = {}
    for (group, op), n in counts.items():
        out.setdefault(str(group), {})[str(op)] = int(n)
    return out


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
    # Waits in collectives whose group was not fully seen are unknown: a step of only those is too.
    per_step = joined.groupby(["rank", "step"])["wait_us"].agg(wait_ms=lambda w: w.sum(min_count=1) / US_PER_MS,
                                                              collectives="size").reset_index()
    merged = steps.merge(per_step.astype({"step": steps["step"].dtype}), on=["rank", "step"], how="left")
    # A profiled step with no collective waited for nobody.
    merged.loc[merged["trace_start"].notna() & merged["collectives"].isna(), "wait_ms"] = 0.0
    return merged.drop(columns="collectives")


def join_telemetry(telemetry: pd.DataFrame | None, steps: pd.DataFrame) -> pd.DataFrame | None:
    """Give each rank's telemetry sample the step that rank was in when it was taken."""
    if telemetry is None or telemetry.empty or steps.empty or "rank" not in telemetry:
        return telemetry
    t = telemetry.assign(unix=unix_seconds(telemetry["time"]))
    with_rank = t[t["rank"].notna()].astype({"rank": "int64"}).sort_values("unix")
    spans = steps[["rank", "step", "start", "end"]].dropna().astype({"rank": "int64"}).sort_values("start")
    joined = pd.merge_asof(with_rank, spans, left_on="unix", right_on="start", by="rank", direction="backward")
    joined.loc[joined["unix"] > joined["end"], "step"] = np.nan  # between steps (or after the last)
    return pd.concat([joined.drop(columns=["start", "end"]), t[t["rank"].isna()]], ignore_index=True)


def unix_seconds(time: pd.Series) -> pd.Series:
    """Telemetry times (datetimes, or Unix seconds) as Unix seconds."""
    return time.astype("int64") / 1e9 if time.dtype.kind == "M" else time.astype(float)


# The always-on counters' columns in the steps table (run_files.read_steps); absent: not measured.
COUNTER_COLUMNS = ("comm_wait_ms", "comm_calls", "cpu_ms", "runq_ms", "comm_runq_ms", "page_faults", *rf.MEMORY_COUNTERS,
                   "gpu_peak_since")


# Columns no record carried a value of: not measured, no column (a column of Nones is 8 bytes a rank-step).
UNKNOWN_DROPPED = (*COUNTER_COLUMNS, "peak_mem_bytes", "samples", "tokens")


def step_table(recorded: pd.DataFrame, traced: pd.DataFrame | None = None, profiled: set[int] | None = None) -> pd.DataFrame:
    """The steps table: each rank's step records joined with its traced steps, sorted, profiled steps marked (by the
    traces, or ``profiled``: the steps the ranks were asked to profile, for a window whose traces are not read), no
    column for a counter no record carried (older runs, jobs whose counters are off)."""
    if len(recorded):
        recorded = recorded.drop(columns=[c for c in recorded.columns
                                          if c in UNKNOWN_DROPPED and recorded[c].isna().all()])
    steps = _joined(recorded, pd.DataFrame() if traced is None else traced)
    if profiled is not None and len(steps):
        # Profiled steps carry the profiler's own cost (its buffers grow RSS): the detectors know them.
        steps["profiled"] = steps["profiled"] | steps["step"].isin(profiled)
    return steps


def _joined(recorded: pd.DataFrame, traced: pd.DataFrame) -> pd.DataFrame:
    if not traced.empty:
        traced = traced.assign(**{c.replace("_us", "_ms"): traced[c] / US_PER_MS
                                  for c in ("compute_us", "comm_us", "exposed_comm_us", "overlapped_comm_us", "idle_us")})
        traced = traced.assign(trace_wall_ms=traced["wall_us"] / US_PER_MS, trace_start=traced["start_us"] / 1e6,
                               trace_end=traced["end_us"] / 1e6,
                               trace_data_ms=traced["data_us"] / US_PER_MS if "data_us" in traced else np.nan,
                               gflops=traced["gflops"] if "gflops" in traced else np.nan)
        traced = traced[["rank", "step", "trace_wall_ms", "trace_start", "trace_end", "compute_ms", "comm_ms",
                         "exposed_comm_ms", "overlapped_comm_ms", "idle_ms", "trace_data_ms", "gflops"]]
    if recorded.empty:
        if traced.empty:
            return pd.DataFrame(columns=["rank", "step", "wall_ms", "profiled"])
        steps = traced.rename(columns={"trace_wall_ms": "wall_ms", "trace_start": "start", "trace_end": "end",
                                       "trace_data_ms": "data_ms"})
        if steps["data_ms"].isna().all():
            steps = steps.drop(columns="data_ms")
        return steps.assign(profiled=True).sort_values(["rank", "step"], ignore_index=True)
    if traced.empty:
        return _by_rank(recorded.assign(profiled=False))
    steps = recorded.merge(traced, on=["rank", "step"], how="left")
    steps["profiled"] = steps["compute_ms"].notna()
    # The recorded data phase where the job has one, else the wait inside DataLoader spans.
    data = steps["data_ms"].fillna(steps["trace_data_ms"]) if "data_ms" in steps else steps["trace_data_ms"]
    steps = steps.drop(columns="trace_data_ms")
    if data.notna().any():
        steps["data_ms"] = data
    return steps.sort_values(["rank", "step"], ignore_index=True)


def _by_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """The rows by rank, then step (a live window's come so: no sort of 160,000 rows at 8,192 ranks)."""
    if strictly_ordered(steps["rank"].to_numpy(), steps["step"].to_numpy()):
        return steps.reset_index(drop=True)
    return steps.sort_values(["rank", "step"], ignore_index=True)


def rank_table(tables: Tables, results: list[RankResult]) -> pd.DataFrame:
    """report.json's ``ranks``: steps, median step time, compute, non-compute, idle, overlap. Built a column at a
    time, as arrays where no value is missing (a dict per rank cost 70 ms of a live judgement at 8,192 ranks, and
    lists of 8,192 Nones or floats that pandas types one by one 20 ms), as a frame of those rows would be."""
    per_rank = _step_stats(tables.steps)
    traced = {r.rank: r for r in results}
    ranks = sorted(set(per_rank["steps"].index) | set(traced) | set(tables.dumps))
    if not ranks:
        return pd.DataFrame()
    breakdowns = [traced[rank].breakdown if rank in traced else {} for rank in ranks]
    counted = per_rank["steps"].reindex(ranks, fill_value=0).to_numpy().astype(int)
    medians = per_rank["wall_ms"].reindex(ranks).to_numpy(dtype=float)
    peaks = per_rank["peak_mem_bytes"].reindex(ranks).to_numpy(dtype=float)
    held = [tables.parameters.get(rank) for rank in ranks] if tables.parameters else _nones(len(ranks))
    per_parameter = bytes_per_parameter() if tables.parameters else 0
    return pd.DataFrame({
        "rank": np.asarray(ranks, dtype=np.int64),
        "steps": counted,
        "step_time_median_us": _where_known(medians * US_PER_MS, counted > 0),
        **_breakdown_columns(breakdowns),
        "profiled_steps": per_rank["profiled"].reindex(ranks, fill_value=0).to_numpy().astype(int),
        "peak_mem_bytes": [int(p) if not np.isnan(p) else None for p in peaks] if not np.isnan(peaks).all()
        else _nones(len(ranks)),
        "parameters": held,
        "model_state_bytes": [n * per_parameter if n is not None else None for n in held] if tables.parameters
        else _nones(len(ranks)),
    })


def _breakdown_columns(breakdowns: list[dict[str, Any]]) -> dict[str, Any]:
    """The traced ranks' compute, non-compute, idle, overlap and window (None for a rank not traced)."""
    if not any(breakdowns):
        return {column: _nones(len(breakdowns)) for column in ("compute_us", "non_compute_us", "idle_us",
                                                               "comm_comp_overlap_pct", "window_us")}
    return {**{column: [b.get(column) for b in breakdowns] for column in ("compute_us", "non_compute_us", "idle_us")},
            "comm_comp_overlap_pct": [None if not b or np.isnan(b.get("overlap_pct", np.nan)) else b["overlap_pct"]
                                      for b in breakdowns],
            # What compute, non-compute and idle add up to: the traced window, not one step.
            "window_us": [b.get("total_us") for b in breakdowns]}


def _nones(n: int) -> np.ndarray:
    """A column of ``n`` Nones, as a frame types a list of them (objects)."""
    return np.full(n, None, dtype=object)


def _where_known(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """``values`` where ``known``, else None, as a frame types such a list: floats (NaN for None), objects where
    none is known."""
    if not known.any():
        return _nones(len(values))
    return np.where(known, values, np.nan)


def _step_stats(steps: pd.DataFrame) -> dict[str, pd.Series]:
    """Per rank: its step count, median step time (ms), profiled steps and peak memory; one groupby each (a frame
    per rank cost 0.4 s at 1,024 ranks)."""
    if steps.empty:
        return {name: pd.Series(dtype=float) for name in ("steps", "wall_ms", "profiled", "peak_mem_bytes")}
    by_rank = steps.groupby("rank")
    none = pd.Series(dtype=float)
    peak = _numbers(steps["peak_mem_bytes"]) if "peak_mem_bytes" in steps else None
    return {"steps": by_rank.size(), "wall_ms": by_rank["wall_ms"].median(),
            "profiled": by_rank["profiled"].sum() if "profiled" in steps else none,
            "peak_mem_bytes": peak.groupby(steps["rank"]).max() if peak is not None else none}


def _numbers(column: pd.Series) -> pd.Series:
    """A column as numbers, NaN where a value is none: a column of records that carried no peak is of objects
    (None), which pandas would take a row at a time (30 ms at 8,192 ranks); as floats in one pass where it can."""
    if column.dtype == object:
        try:
            return pd.Series(np.asarray(column, dtype=float), index=column.index)
        except (TypeError, ValueError):
            pass  # text among them: to_numeric reads what it can
    return pd.to_numeric(column, errors="coerce")
