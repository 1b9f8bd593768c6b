"""The analysis tables every detector reads: steps (rank × step), ranks, collectives, run facts.

Built once from what the loaders returned and from the run directory's own files (steps.jsonl,
manifest, trainer.json, parameters.json, telemetry). Detectors never read files themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run import clocks, device_time
from diagtrain.profiler.analyzer.read import run_files as rf
from diagtrain.profiler.analyzer.rank.collectives import match
from diagtrain.profiler.analyzer.read.flight_records import (Entry, dump_version_problem, groups_of_dump, keyed_by_members, looks_like_dump,
                                                              rank_of_dump, read_dump)
from diagtrain.profiler.analyzer.read.inputs import Inputs, Skipped, rank_number
from diagtrain.profiler.analyzer.rank.result import RankResult
from diagtrain.profiler.analyzer.read.log_lines import local_to_unix
from diagtrain.profiler.analyzer.read.nccl_log import NcclLog, parse_nccl_log
from diagtrain.profiler.analyzer.read.stderr_errors import LogEvent, parse_errors
from diagtrain.profiler.analyzer.read.step_cache import cache_dir as step_cache_dir
from diagtrain.profiler.analyzer.read.step_cache import read_steps_cached
from diagtrain.profiler.analyzer.rank.p2p import P2PCalls
from diagtrain.profiler.analyzer.rank.p2p import from_flight_recorder as p2p_from_flight_recorder
from diagtrain.profiler.analyzer.rank.p2p import from_step_records as p2p_from_step_records
from diagtrain.profiler.analyzer.run.structure import Structure
from diagtrain.profiler.analyzer.run.structure import infer as infer_structure
from diagtrain.profiler.model.precision import bytes_per_parameter
from diagtrain.profiler.run_dir import CLOCK_RECORD, HOSTS_DIR, read_hosts, read_json, run_status

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


def build(run_dir: Path, results: list[RankResult], flight_recorder_dir: Path | None = None,
          cache_root: Path | None = None) -> Tables:
    """Join the per-rank results with the run directory's step records and facts.

    Every file is read behind the guard: one that cannot be used is listed in ``skipped``. With
    ``cache_root`` (analysis/cache), step records read before are taken from there (step_cache).
    """
    inputs, notes, flushed = Inputs(), [], []
    folders = rank_folders(run_dir, inputs)
    recorded, phases, counted_p2p = read_step_records(folders, inputs, notes, cache_root, flushed)
    # Counters no record carried (older runs, jobs whose counters are off) are no columns at all.
    recorded = recorded.drop(columns=[c for c in recorded.columns if c in COUNTER_COLUMNS and recorded[c].isna().all()])
    traced = pd.concat([r.steps for r in results], ignore_index=True) if results else pd.DataFrame()
    steps = _join_steps(recorded, traced)
    if "data" not in phases and "data_ms" in steps and steps["data_ms"].notna().any():
        phases = ["data", *phases]  # from the traces' DataLoader spans: a data phase comes first
    collectives = match(pd.concat([r.collectives for r in results], ignore_index=True)) if results else pd.DataFrame()
    manifest = _optional(run_dir / "manifest.json", inputs, rf.read_manifest) or {}
    hosts = read_hosts(run_dir)
    if hosts:  # the hosts' own records are newer than a manifest written while some still ran
        manifest["status"] = run_status([h["status"] for h in hosts], list((manifest.get("exit_codes") or {}).values()))
    world = manifest.get("world_size") or max((r.world_size or 0 for r in results), default=0) or None

    def per_rank(name: str, read: Callable[[Path], Any], checked: bool = False) -> dict[int, Any]:
        return _per_rank(folders, name, read, inputs, checked)

    infos = per_rank("rank.json", rf.read_rank_info)
    tables = Tables(steps=steps, ranks=pd.DataFrame(), collectives=collectives, phases=phases, manifest=manifest,
                    trainer=_optional(run_dir / "trainer.json", inputs, rf.read_trainer),
                    parameters=dict(per_rank("parameters.json", rf.read_parameters).values()), world_size=world,
                    on_gpu=any(r.on_gpu for r in results),
                    telemetry=_telemetry(run_dir, inputs),
                    nccl_logs=per_rank("nccl.log", lambda p: parse_nccl_log(rf.read_log_lines(p))),
                    log_events=per_rank("stderr.log", lambda p: parse_errors(rf.read_log_lines(p))),
                    rank_hosts={r: i.get("host") for r, i in infos.items()}, hosts=hosts,
                    dumps=per_rank("flight_recorder.json", _dump_and_problems, checked=True),
                    process_groups=per_rank("process_groups.json", rf.read_process_groups),
                    stacks=per_rank("stacks.json", rf.read_stacks),
                    exits=per_rank("exit.json", rf.read_exit))
    if flight_recorder_dir is not None:
        tables.dumps = read_dump_dir(flight_recorder_dir, inputs)
    for rank, dump in tables.dumps.items():  # NCCL's dumps list their groups (gloo's do not)
        tables.process_groups[rank] = tables.process_groups.get(rank) or groups_of_dump(dump)
    tables.flight_records = keyed_by_members(tables.dumps, tables.process_groups)
    # Before the clocks are lined up: a flight record's creation time is on its rank's own clock, as its steps are.
    tables.steps = device_time.add_device_time(tables.steps, [*device_time.records_of(tables.steps), *flushed],
                                               tables.flight_records, tables.process_groups)
    tables.segments = pd.concat([r.segments for r in results if len(r.segments)], ignore_index=True) \
        if any(len(r.segments) for r in results) else pd.DataFrame()
    tables.structure = infer_structure(tables.process_groups, {r.rank: r.pg_config for r in results},
                                       tables.flight_records, _p2p_calls(results, tables.dumps, steps, counted_p2p),
                                       _ops_per_group(collectives), tables.trainer, world)
    _time_log_lines(tables, infos)
    # Every host's times on the clock of the lowest rank's host (see clocks.py).
    rank_hosts = tables.rank_hosts or {r.rank: r.host_name for r in results}
    tables.host_clocks = clocks.host_clocks(collectives, rank_hosts, clock_measurements(run_dir))
    tables.rank_hosts = tables.rank_hosts or {r: h for r, h in rank_hosts.items() if h}
    clocks.align(tables)
    tables.steps = with_waits(tables.steps, tables.collectives)
    tables.ranks = rank_table(tables, results)
    tables.telemetry = join_telemetry(tables.telemetry, tables.steps)
    tables.skipped, tables.notes = inputs.skipped, notes
    return tables


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


def read_step_records(folders: dict[int, Path], inputs: Inputs, notes: list[dict], cache_root: Path | None = None,
                      flushed: list[device_time.DeviceRecord] | None = None,
                      ) -> tuple[pd.DataFrame, list[str], dict[int, dict[int, dict]]]:
    """Every rank's steps.jsonl as one table with a column per phase (ms), and per rank and step the
    point-to-point calls its records counted; the device timings of the end-of-run lines (not steps) are
    added to ``flushed``.

    Lines that are not step records are listed as skipped; records with impossible values (a
    duration of 1e18 ms, a negative one) are left out and named in the health ``notes``. With
    ``cache_root``, each file is read from where the last analysis left it (step_cache), to the same result.
    """
    rows, phases, p2p = [], [], {}
    for rank, folder in folders.items():
        path = folder / "steps.jsonl"
        if not os.path.lexists(path):
            continue
        if cache_root is None:
            found = inputs.read(path, lambda p: rf.read_steps(p, rank))
        else:
            found = inputs.read(path, lambda p: read_steps_cached(p, rank, step_cache_dir(cache_root, rank)))
        if found is None:
            continue
        if found.bad_count:
            shown = "; ".join(found.bad_lines[:rf.SHOWN_PROBLEMS])
            inputs.skip(path, f"{found.bad_count} of its {found.lines} lines are not step records ({shown}); "
                        "the others were used")
        if found.impossible_count:
            shown = "; ".join(found.impossible[:rf.SHOWN_PROBLEMS])
            notes.append({"check": "impossible_values", "severity": "warning",
                          "message": f"rank {rank}: {found.impossible_count} step records with impossible values left "
                                     f"out of the analysis ({shown})"})
        if found.repeated:
            notes.append({"check": "repeated_steps", "severity": "info",
                          "message": f"rank {rank}: {found.repeated} steps recorded more than once (a restarted "
                                     "job?); the last record of each is used"})
        rows += found.rows
        phases += [p for p in found.phases if p not in phases]
        if found.p2p:
            p2p[rank] = found.p2p
        if found.device and flushed is not None:
            flushed.append((rank, found.device.get("device_steps"), found.device.get("device_colls")))
    return pd.DataFrame(rows), phases, p2p


# The always-on counters' columns in the steps table (run_files.read_steps); absent: not measured.
COUNTER_COLUMNS = ("comm_wait_ms", "comm_calls", "cpu_ms", "runq_ms", "page_faults", *rf.MEMORY_COUNTERS,
                   "gpu_peak_since")


def _join_steps(recorded: pd.DataFrame, traced: pd.DataFrame) -> pd.DataFrame:
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
        return recorded.assign(profiled=False).sort_values(["rank", "step"], ignore_index=True)
    steps = recorded.merge(traced, on=["rank", "step"], how="left")
    steps["profiled"] = steps["compute_ms"].notna()
    # The recorded data phase where the job has one, else the wait inside DataLoader spans.
    data = steps["data_ms"].fillna(steps["trace_data_ms"]) if "data_ms" in steps else steps["trace_data_ms"]
    steps = steps.drop(columns="trace_data_ms")
    if data.notna().any():
        steps["data_ms"] = data
    return steps.sort_values(["rank", "step"], ignore_index=True)


def rank_table(tables: Tables, results: list[RankResult]) -> pd.DataFrame:
    """report.json's ``ranks``: steps, median step time, compute, non-compute, idle, overlap."""
    per_rank = _step_stats(tables.steps)
    traced = {r.rank: r for r in results}
    rows = []
    for rank in sorted(set(per_rank["steps"]) | set(traced) | set(tables.dumps)):
        b = traced[rank].breakdown if rank in traced else {}
        median_ms = per_rank["wall_ms"].get(rank)
        peak = per_rank["peak_mem_bytes"].get(rank)
        rows.append({
            "rank": rank,
            "steps": int(per_rank["steps"].get(rank, 0)),
            "step_time_median_us": float(median_ms * US_PER_MS) if rank in per_rank["steps"] else None,
            "compute_us": b.get("compute_us"),
            "non_compute_us": b.get("non_compute_us"),
            "idle_us": b.get("idle_us"),
            "comm_comp_overlap_pct": None if not b or np.isnan(b.get("overlap_pct", np.nan)) else b["overlap_pct"],
            # What compute, non-compute and idle add up to: the traced window, not one step.
            "window_us": b.get("total_us"),
            "profiled_steps": int(per_rank["profiled"].get(rank, 0)),
            "peak_mem_bytes": int(peak) if peak is not None and not np.isnan(peak) else None,
            "parameters": tables.parameters.get(rank),
            "model_state_bytes": tables.parameters[rank] * bytes_per_parameter() if rank in tables.parameters else None,
        })
    return pd.DataFrame(rows)


def _step_stats(steps: pd.DataFrame) -> dict[str, dict]:
    """Per rank, as dicts: its step count, median step time (ms), profiled steps and peak memory; one
    groupby each (a frame per rank cost 0.4 s at 1,024 ranks)."""
    if steps.empty:
        return {"steps": {}, "wall_ms": {}, "profiled": {}, "peak_mem_bytes": {}}
    by_rank = steps.groupby("rank")
    return {"steps": by_rank.size().to_dict(), "wall_ms": by_rank["wall_ms"].median().to_dict(),
            "profiled": by_rank["profiled"].sum().to_dict() if "profiled" in steps else {},
            "peak_mem_bytes": by_rank["peak_mem_bytes"].max().to_dict() if "peak_mem_bytes" in steps else {}}


def rank_folders(run_dir: Path, inputs: Inputs) -> dict[int, Path]:
    """``ranks/<r>`` of each rank, by rank; a ``ranks`` that cannot be listed is skipped."""
    ranks_dir = run_dir / "ranks"
    if not os.path.lexists(ranks_dir):
        return {}
    try:
        entries = sorted(ranks_dir.iterdir())
    except OSError as e:
        inputs.skip(ranks_dir, f"cannot list ({e.strerror or e})")
        return {}
    return {rank: p for p in entries if (rank := rank_number(p.name)) is not None}


def read_dump_dir(folder: Path, inputs: Inputs | None = None) -> dict[int, dict]:
    """Flight-recorder dumps made outside diagtrain (NCCL's pickles or JSON), one file per rank."""
    inputs = inputs or Inputs()
    dumps = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        if not looks_like_dump(path):
            inputs.skip(path, "not a flight-recorder dump (neither a pickle nor a dump's JSON)")
            continue
        dump = inputs.read_checked(path, _dump_and_problems)
        if dump is None:
            continue
        rank = rank_of_dump(path, dump)
        if rank is None:
            inputs.skip(path, "no rank in the dump or at the end of its name")
        else:
            dumps[rank] = dump
    return dumps


def _dump_and_problems(path: Path) -> tuple[dict, list[str]]:
    dump = read_dump(path)
    bad = dump.get("malformed_entries") or 0
    problems = [f"{bad} of its entries are not collective records; left out"] if bad else []
    if dump.get("cut_short"):
        problems.append(f"the file {dump['cut_short']}: its {len(dump['entries'])} entries complete before the cut "
                        "are used, the later ones are missing")
    if (unknown := dump_version_problem(dump)) is not None:
        problems.append(unknown)
    return dump, problems


def _telemetry(run_dir: Path, inputs: Inputs) -> pd.DataFrame | None:
    """telemetry.parquet, or the hosts' telemetry.jsonl where the wrapper did not merge them (it was killed, or
    the job still runs): the samples live judgement read are the final analysis' too."""
    merged = _optional(run_dir / "telemetry.parquet", inputs, rf.read_telemetry, checked=False)
    if merged is not None or not any(run_dir.glob("hosts/*/telemetry.jsonl")):
        return merged
    return inputs.read(run_dir / "hosts", rf.read_host_telemetry)


def _optional(path: Path, inputs: Inputs, read: Callable[[Path], Any], checked: bool = True) -> Any:
    """``read(path)`` behind the guard, None when the file is absent (a dangling link is not absent)."""
    if not os.path.lexists(path):
        return None
    return inputs.read_checked(path, read) if checked else inputs.read(path, read)


def _per_rank(folders: dict[int, Path], name: str, read: Callable[[Path], Any], inputs: Inputs,
              checked: bool = False) -> dict[int, Any]:
    """``read(path)`` of each rank's file ``name`` that exists, behind the guard (``checked``: see read_checked)."""
    found = {}
    for rank, folder in folders.items():
        path = folder / name
        if os.path.lexists(path):
            value = inputs.read_checked(path, read) if checked else inputs.read(path, read)
            if value is not None:
                found[rank] = value
    return found


def _time_log_lines(tables: Tables, infos: dict[int, dict]) -> None:
    """Give log lines that carry a local timestamp their Unix time (the rank's own clock)."""
    for rank, info in infos.items():
        offset, started = info.get("utc_offset_s"), info.get("started_at")
        if offset is None or started is None:
            continue  # a run from before ranks recorded their time zone
        year = datetime.fromtimestamp(started, tz=timezone.utc).year
        nccl = tables.nccl_logs.get(rank)
        for line in [*tables.log_events.get(rank, []), *(nccl.warnings if nccl else [])]:
            if line.timestamp:
                line.time = local_to_unix(line.timestamp, offset, year)


def clock_measurements(run_dir: Path) -> dict[str, list[dict]]:
    """Each host's clock handshakes with its peers (hosts/<h>/clock.json)."""
    found = {}
    for path in run_dir.glob(f"{HOSTS_DIR}/*/{CLOCK_RECORD}"):
        record = read_json(path)
        if isinstance(record, dict) and isinstance(record.get("measurements"), list):
            found[path.parent.name] = record["measurements"]
    return found
