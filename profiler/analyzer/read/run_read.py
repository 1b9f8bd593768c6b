"""A run directory's files, read behind the guard: what run/tables.py assembles the tables from.

Every file is read through :class:`Inputs`: one that cannot be used is listed in ``skipped`` with the
reason, and the rest is read. With ``cache_root`` (analysis/cache), step records read before are taken
from there (step_cache.py). Nothing here lines up clocks or joins tables: that is run/'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from diagtrain.profiler.analyzer.read import run_files as rf
from diagtrain.profiler.analyzer.read.run_files import DeviceRecord, device_record
from diagtrain.profiler.analyzer.read.flight_records import (Entry, dump_version_problem, groups_of_dump, keyed_by_members,
                                                              looks_like_dump, rank_of_dump, read_dump)
from diagtrain.profiler.analyzer.read.inputs import Inputs, Skipped, rank_number
from diagtrain.profiler.analyzer.read.log_lines import local_to_unix
from diagtrain.profiler.analyzer.read.nccl_log import NcclLog, parse_nccl_log
from diagtrain.profiler.analyzer.read.stderr_errors import LogEvent, parse_errors
from diagtrain.profiler.analyzer.read.step_cache import cache_dir as step_cache_dir
from diagtrain.profiler.analyzer.read.step_cache import read_steps_cached
from diagtrain.profiler.run_dir import (CLOCK_RECORD, HOST_RECORD, HOSTS_DIR, PROFILE_WINDOWS_FILE, STEPS_FILE,
                                        has_step_records, read_hosts, read_json, run_status)
from diagtrain.profiler.util.heap import release_freed_memory
from diagtrain.profiler.util.step_ranges import parse_step_ranges

MAX_WINDOW_STEPS = 10_000  # one requested window's steps counted at most: a larger range is a typo, not a profile


@dataclass
class RunFiles:
    """What a run directory's files say, as read (each rank's own clock)."""

    steps: pd.DataFrame  # every step record: rank, step, start, end, wall_ms, <phase>_ms, counters
    phases: list[str]
    counted_p2p: dict[int, dict[int, dict]]  # rank -> step -> the point-to-point calls its records counted
    device: list[DeviceRecord]  # device timings of the end-of-run lines (not steps)
    manifest: dict[str, Any] = field(default_factory=dict)
    hosts: list[dict] = field(default_factory=list)
    trainer: dict[str, Any] | None = None
    parameters: dict[int, int] = field(default_factory=dict)
    telemetry: pd.DataFrame | None = None
    nccl_logs: dict[int, NcclLog] = field(default_factory=dict)
    log_events: dict[int, list[LogEvent]] = field(default_factory=dict)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    dumps: dict[int, dict] = field(default_factory=dict)
    flight_records: list[Entry] = field(default_factory=list)
    process_groups: dict[int, dict] = field(default_factory=dict)
    stacks: dict[int, dict] = field(default_factory=dict)
    exits: dict[int, dict] = field(default_factory=dict)
    clock_measurements: dict[str, list[dict]] = field(default_factory=dict)
    rank_starts: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> its start-up times (rank.json)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)


def read_run(run_dir: Path, flight_recorder_dir: Path | None = None, cache_root: Path | None = None) -> RunFiles:
    """Every file of ``run_dir`` the tables are built from; a folder of traces alone reads as an empty run."""
    inputs, notes, flushed = Inputs(), [], []
    folders = rank_folders(run_dir, inputs)
    steps, phases, counted_p2p = read_step_records(folders, inputs, notes, cache_root, flushed)
    manifest = _optional(run_dir / "manifest.json", inputs, rf.read_manifest) or {}
    hosts = read_hosts(run_dir)
    if hosts:  # the hosts' own records are newer than a manifest written while some still ran
        manifest["status"] = run_status([h["status"] for h in hosts], list((manifest.get("exit_codes") or {}).values()))

    def per_rank(name: str, read: Callable[[Path], Any], checked: bool = False) -> dict[int, Any]:
        return _per_rank(folders, name, read, inputs, checked)

    infos = per_rank("rank.json", rf.read_rank_info)
    found = RunFiles(steps=steps, phases=phases, counted_p2p=counted_p2p, device=flushed, manifest=manifest, hosts=hosts,
                     trainer=_optional(run_dir / "trainer.json", inputs, rf.read_trainer),
                     parameters=dict(per_rank("parameters.json", rf.read_parameters).values()),
                     telemetry=_telemetry(run_dir, inputs),
                     nccl_logs=per_rank("nccl.log", lambda p: parse_nccl_log(rf.read_log_lines(p))),
                     log_events=per_rank("stderr.log", lambda p: parse_errors(rf.read_log_lines(p))),
                     rank_hosts={r: i.get("host") for r, i in infos.items()},
                     rank_starts={r: rf.start_times(i) for r, i in infos.items()},
                     dumps=per_rank("flight_recorder.json", dump_and_problems, checked=True),
                     process_groups=per_rank("process_groups.json", rf.read_process_groups),
                     stacks=per_rank("stacks.json", rf.read_stacks),
                     exits=per_rank("exit.json", rf.read_exit),
                     clock_measurements=clock_measurements(run_dir))
    if flight_recorder_dir is not None:
        found.dumps = read_dump_dir(flight_recorder_dir, inputs)
    for rank, dump in found.dumps.items():  # NCCL's dumps list their groups (gloo's do not)
        found.process_groups[rank] = found.process_groups.get(rank) or groups_of_dump(dump)
    found.flight_records = keyed_by_members(found.dumps, found.process_groups)
    _time_log_lines(found, infos)
    found.skipped, found.notes = inputs.skipped, notes
    return found


def read_step_records(folders: dict[int, Path], inputs: Inputs, notes: list[dict], cache_root: Path | None = None,
                      flushed: list[DeviceRecord] | None = None,
                      ) -> tuple[pd.DataFrame, list[str], dict[int, dict[int, dict]]]:
    """Every rank's steps.jsonl as one table with a column per phase (ms), and per rank and step the
    point-to-point calls its records counted; the device timings of the end-of-run lines (not steps) are
    added to ``flushed``.

    Lines that are not step records are listed as skipped; records with impossible values (a
    duration of 1e18 ms, a negative one) are left out and named in the health ``notes``. With
    ``cache_root``, each file is read from where the last analysis left it (step_cache), to the same result.
    """
    frames, phases, p2p = [], [], {}
    for rank, folder in folders.items():
        path = folder / STEPS_FILE
        if not has_step_records(path):  # steps.jsonl, or segments closed from it (a rank killed mid-close: only those)
            continue
        cache = step_cache_dir(cache_root, rank) if cache_root is not None else None
        found = inputs.read(path, lambda p: read_steps_cached(p, rank, cache))
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
        frames += found.frames
        phases += [p for p in found.phases if p not in phases]
        if found.p2p:
            p2p[rank] = found.p2p
        if found.device and flushed is not None:
            flushed.append(device_record(rank, found.device))
    table = rf.one_table(frames)
    del frames
    release_freed_memory()  # the blocks' columns, joined: holes in the heap the whole table never reuses
    return table, phases, p2p


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
        dump = inputs.read_checked(path, dump_and_problems)
        if dump is None:
            continue
        rank = rank_of_dump(path, dump)
        if rank is None:
            inputs.skip(path, "no rank in the dump or at the end of its name")
        else:
            dumps[rank] = dump
    return dumps


def dump_and_problems(path: Path) -> tuple[dict, list[str]]:
    """A flight-recorder dump, and what is wrong with it (bad entries, cut short, an unknown version)."""
    dump = read_dump(path)
    bad = dump.get("malformed_entries") or 0
    problems = [f"{bad} of its entries are not collective records; left out"] if bad else []
    if dump.get("cut_short"):
        problems.append(f"the file {dump['cut_short']}: its {len(dump['entries'])} entries complete before the cut "
                        "are used, the later ones are missing")
    if (unknown := dump_version_problem(dump)) is not None:
        problems.append(unknown)
    return dump, problems


def requested_profile_steps(run_dir: Path) -> set[int]:
    """The steps every rank profiles: the wrapper's requests (profile_windows.json, under ``--profile-steps auto``)
    and the ranges given on the command line (host records)."""
    ranges = []
    windows = read_json(run_dir / PROFILE_WINDOWS_FILE)
    if isinstance(windows, dict) and isinstance(windows.get("windows"), list):
        ranges += [(w.get("first"), w.get("last")) for w in windows["windows"] if isinstance(w, dict)]
    for path in run_dir.glob(f"{HOSTS_DIR}/*/{HOST_RECORD}"):
        given = (read_json(path) or {}).get("profile_steps")
        try:
            ranges += [(r.first, r.last) for r in parse_step_ranges(given)] if isinstance(given, str) else []
        except ValueError:
            continue  # "auto" or "none": no ranges of its own
    return {s for first, last in ranges if isinstance(first, int) and isinstance(last, int)
            for s in range(first, min(last, first + MAX_WINDOW_STEPS) + 1)}


def clock_measurements(run_dir: Path) -> dict[str, list[dict]]:
    """Each host's clock handshakes with its peers (hosts/<h>/clock.json)."""
    found = {}
    for path in run_dir.glob(f"{HOSTS_DIR}/*/{CLOCK_RECORD}"):
        record = read_json(path)
        if isinstance(record, dict) and isinstance(record.get("measurements"), list):
            found[path.parent.name] = record["measurements"]
    return found


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


def _time_log_lines(found: RunFiles, infos: dict[int, dict]) -> None:
    """Give log lines that carry a local timestamp their Unix time (the rank's own clock)."""
    for rank, info in infos.items():
        offset, started = info.get("utc_offset_s"), info.get("started_at")
        if offset is None or started is None:
            continue  # a run from before ranks recorded their time zone
        year = datetime.fromtimestamp(started, tz=timezone.utc).year
        nccl = found.nccl_logs.get(rank)
        for line in [*found.log_events.get(rank, []), *(nccl.warnings if nccl else [])]:
            if line.timestamp:
                line.time = local_to_unix(line.timestamp, offset, year)
