"""The run directory's own files (all but the traces), read safely and checked for shape.

Each reader takes a path and returns the content in the types the analysis relies on, or raises
:class:`InputError` saying what is wrong; :func:`tables.build` calls them through the guard
(:class:`inputs.Inputs`), so a bad file is skipped with its reason and never reaches a detector.
Readers that can use part of a file return ``(value, problems)``: what they left out, and why.
Values that cannot be true (a step of 1e18 ms, a negative one) are not dropped silently either:
they are counted for the health check and kept away from the detectors.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read.inputs import MAX_DOC_BYTES, MAX_RANKS, MAX_TABLE_BYTES, expect
from diagtrain.profiler.run_dir import members_of_text, telemetry_rows, telemetry_table
from diagtrain.profiler.util.bounded_read import MAX_LINES_BYTES, InputError, read_input, read_json, read_lines, read_text

# Bounds of the possible. A training step or phase longer than a week, or memory beyond a
# pebibyte per rank, is a corrupt record, not a measurement.
MAX_STEP_MS = 7 * 24 * 3600 * 1e3
MAX_MEMORY_BYTES = 2**50
MAX_STEP_NUMBER = 2**53  # steps are counted one by one: beyond this a step number is corrupt
MAX_TELEMETRY_CELLS = 500_000_000  # rows x columns: a month of 1 Hz samples of a large host, ~4 GiB as floats
SHOWN_PROBLEMS = 3  # bad lines quoted per file; the rest are counted

Problems = list[str]


def read_object(path: Path) -> dict[str, Any]:
    """A small JSON document that must be an object (rank.json, exit.json, trainer.json, ...)."""
    return expect(read_json(path, MAX_DOC_BYTES), dict, path)


# -- manifest.json, trainer.json: documents whose fields are checked one by one --------------------

NUMBER = (int, float)
MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "status": str, "exit_code": int, "world_size": int, "hosts": list, "command": list,
    "argv": list, "env": dict, "strategy": str, "mesh": dict, "injected": list, "exit_codes": dict,
    "rank_exits": dict, "started_at": NUMBER, "ended_at": NUMBER, "versions": dict, "warnings": list,
}
TRAINER_FIELDS: dict[str, type | tuple[type, ...]] = {
    "strategy": str, "mesh": dict, "n_microbatches": int, "stage_layers": list, "schedule": str,
}


def read_manifest(path: Path) -> tuple[dict[str, Any], Problems]:
    """manifest.json with every field the analysis reads in its type; wrong ones left out and named."""
    doc, problems = _typed_fields(read_object(path), MANIFEST_FIELDS)
    doc = {k: v for k, v in doc.items() if v is not None}
    if doc.get("world_size") == 0:
        del doc["world_size"]  # no rank started: unknown, not wrong
    elif "world_size" in doc and not 0 < doc["world_size"] <= MAX_RANKS:
        problems.append(f"world_size {doc.pop('world_size')} is impossible; left out")
    if "hosts" in doc:
        hosts = [h for h in doc["hosts"] if isinstance(h, dict) and isinstance(h.get("name"), str)]
        if len(hosts) < len(doc["hosts"]):
            problems.append(f"{len(doc['hosts']) - len(hosts)} of its hosts are not host records; left out")
        doc["hosts"] = hosts
    if "injected" in doc:
        doc["injected"] = [f for f in doc["injected"] if isinstance(f, dict)]
    if "mesh" in doc:
        doc["mesh"] = _mesh(doc["mesh"], problems)
    return doc, problems


def read_trainer(path: Path) -> tuple[dict[str, Any], Problems]:
    """trainer.json (a reference trainer's strategy, mesh and pipeline schedule), fields checked."""
    doc, problems = _typed_fields(read_object(path), TRAINER_FIELDS)
    doc = {k: v for k, v in doc.items() if v is not None}
    if "mesh" in doc:
        doc["mesh"] = _mesh(doc["mesh"], problems)
    if "n_microbatches" in doc and doc["n_microbatches"] < 1:
        problems.append(f"n_microbatches {doc.pop('n_microbatches')} is impossible; left out")
    if "stage_layers" in doc and not all(_is_int(x) for x in doc["stage_layers"]):
        problems.append("stage_layers is not a list of integers; left out")
        del doc["stage_layers"]
    return doc, problems


def _typed_fields(doc: dict[str, Any], fields: dict[str, type | tuple[type, ...]]) -> tuple[dict[str, Any], Problems]:
    problems = []
    clean = dict(doc)
    for name, kind in fields.items():
        if name in clean and clean[name] is not None and not _is(clean[name], kind):
            expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            problems.append(f"field '{name}' holds {type(clean.pop(name)).__name__}, not {expected}; left out")
    return clean, problems


def _mesh(mesh: dict[str, Any], problems: Problems) -> dict[str, int]:
    clean = {k: v for k, v in mesh.items() if isinstance(k, str) and _is_int(v) and 0 < v <= MAX_RANKS}
    if len(clean) < len(mesh):
        problems.append("mesh sizes that are not positive integers; left out")
    return clean


# -- per-rank documents ----------------------------------------------------------------------------


def read_rank_info(path: Path) -> dict[str, Any]:
    """rank.json: who the rank is and its host."""
    doc = read_object(path)
    if doc.get("host") is not None:
        expect(doc["host"], str, path, "its 'host'")
    return doc


# rank.json's start-up times (Unix seconds, the rank's clock): the process's start, torch imported, the process group.
START_TIMES = ("process_started_at", "started_at", "torch_imported_at", "process_group_began_at", "process_group_ready_at")


def start_times(info: dict[str, Any]) -> dict[str, float]:
    """The start-up times a rank.json holds, each a number (others left out)."""
    return {k: float(info[k]) for k in START_TIMES if _is(info.get(k), NUMBER) and math.isfinite(info[k])}


def read_exit(path: Path) -> dict[str, Any]:
    """exit.json: the rank's exit code and cause, each field in its type (others left out)."""
    doc = read_object(path)
    kinds = {"code": int, "reason": str, "exception": str, "where": str, "time": NUMBER}
    return {k: v for k, v in doc.items() if k not in kinds or v is None or _is(v, kinds[k])}


def read_process_groups(path: Path) -> dict[str, dict[str, Any]]:
    """process_groups.json: each group's description and member ranks (a tuple; the same tuple for the same
    members in every rank's file: the world's group is held once, not once a rank)."""
    doc = read_object(path)
    groups = {}
    for name, info in doc.items():
        info = expect(info, dict, path, f"group {name!r}")
        desc = info.get("desc")
        groups[str(name)] = {"desc": desc if isinstance(desc, str) else None, "ranks": _members(info, path, name)}
    return groups


def _members(info: dict[str, Any], path: Path, name: str) -> tuple[int, ...]:
    """A group's members: ``members`` as run_dir.members_text writes them, or a ``ranks`` list (runs recorded
    before it)."""
    if "members" in info:
        text = info["members"]
        try:
            if isinstance(text, str):
                return members_of_text(text)
        except ValueError:
            pass
        raise InputError(path, f"group {name!r}: 'members' is not a list of ranks such as \"0-7\" or \"0,4,8\"")
    ranks = info.get("ranks") or []
    if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
        raise InputError(path, f"group {name!r}: 'ranks' is not a list of integers")
    members = tuple(ranks)
    return _LISTED.setdefault(members, members) if len(_LISTED) < _MAX_LISTED else members


_LISTED: dict[tuple[int, ...], tuple[int, ...]] = {}  # the groups read as lists, one tuple each (as members_of_text)
_MAX_LISTED = 4096  # distinct groups kept shared: a job's few, not an unbounded memo in a long-lived judge


def read_stacks(path: Path) -> dict[str, Any]:
    """stacks.json (dumped on a hang): threads, each with its frames (file, line, function, code)."""
    doc = read_object(path)
    threads = expect(doc.get("threads") or [], list, path, "its 'threads'")
    clean = []
    for t in threads:
        if not isinstance(t, dict) or not isinstance(t.get("frames") or [], list):
            raise InputError(path, "a thread that is not a thread record")
        frames = [f for f in t.get("frames") or [] if isinstance(f, dict) and isinstance(f.get("file"), str)]
        clean.append({**t, "name": str(t.get("name")), "main": t.get("main") is True, "frames": frames})
    return {**doc, "threads": clean}


def read_parameters(path: Path) -> tuple[int, int]:
    """parameters.json: (rank, parameters it holds)."""
    doc = read_object(path)
    rank, params = doc.get("rank"), doc.get("parameters")
    if not _is_int(rank) or not isinstance(params, list):
        raise InputError(path, "not a parameter list (needs an integer 'rank' and a list 'parameters')")
    numels = [p.get("local_numel") if isinstance(p, dict) else None for p in params]
    if not all(_is_int(n) and n >= 0 for n in numels):
        raise InputError(path, "a parameter without a non-negative integer 'local_numel'")
    return rank, sum(numels)


def read_log_lines(path: Path) -> list[str]:
    """A rank's log (stderr.log, nccl.log) as lines; undecodable bytes replaced."""
    return list(read_lines(path, MAX_LINES_BYTES))


# -- telemetry.parquet ---------------------------------------------------------------------------


def read_host_telemetry(hosts_dir: Path) -> pd.DataFrame | None:
    """Every host's telemetry.jsonl under ``hosts_dir`` as telemetry.parquet would hold it (None without rows)."""
    rows = telemetry_rows(hosts_dir.parent, lambda path: read_text(path, MAX_TABLE_BYTES).splitlines())  # .gz too
    return telemetry_table(rows) if rows else None


def read_telemetry(path: Path) -> pd.DataFrame:
    """telemetry.parquet, refused before decoding when it would unpack to an impossible size."""
    import pyarrow.parquet as pq

    data = read_input(path, MAX_TABLE_BYTES)
    try:
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise InputError(path, f"not a Parquet table ({type(e).__name__}: {e})"[:300]) from None
    if meta.num_rows * meta.num_columns > MAX_TELEMETRY_CELLS:
        raise InputError(path, f"{meta.num_rows:,} rows x {meta.num_columns} columns: over the limit of "
                               f"{MAX_TELEMETRY_CELLS:,} values")
    table = pd.read_parquet(io.BytesIO(data))
    if "time" not in table or table["time"].dtype.kind not in "Mif":
        raise InputError(path, "no 'time' column of timestamps")
    if "rank" in table and table["rank"].dtype.kind not in "if":
        raise InputError(path, "its 'rank' column is not numeric")
    return table


# -- steps.jsonl ---------------------------------------------------------------------------------


@dataclass
class StepFile:
    """One rank's step records, and what could not be used of them."""

    # The records' rows in file order, a table per block read: a step recorded again included while the read
    # goes on, each step once when it is done (:meth:`finish`). ``table`` joins them.
    frames: list[pd.DataFrame] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)  # "line 3: why", not step records at all
    lines: int = 0
    impossible: list[str] = field(default_factory=list)  # "step 4: duration_ms 1e+18", records left out
    repeated: int = 0  # steps recorded more than once (a restarted job): the last record kept
    p2p: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> its point-to-point calls (checked)
    # The device timings of the end-of-run flush line ("kind": "device", no step): {"device_steps": [...], ...}
    device: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Problems counted but no longer held: a cache of the records (step_cache) keeps only the first few.
    bad_lines_dropped: int = 0
    impossible_dropped: int = 0
    parsed: int = 0  # lines this read went through: every line, or after a cache only the new ones

    @property
    def bad_count(self) -> int:
        """Lines that are not step records, held or not."""
        return len(self.bad_lines) + self.bad_lines_dropped

    @property
    def impossible_count(self) -> int:
        """Records with impossible values left out, held or not."""
        return len(self.impossible) + self.impossible_dropped

    def bound_problems(self) -> None:
        """Hold the first few problems only (a reader of a long run's records), counting the others."""
        self.bad_lines_dropped += max(0, len(self.bad_lines) - SHOWN_PROBLEMS)
        self.impossible_dropped += max(0, len(self.impossible) - SHOWN_PROBLEMS)
        del self.bad_lines[SHOWN_PROBLEMS:], self.impossible[SHOWN_PROBLEMS:]

    def finish(self) -> None:
        """Each step once in the frames read: the last record of it in the place of the first."""
        self.frames, self.repeated = once_per_step(self.frames)

    @property
    def table(self) -> pd.DataFrame:
        """The rows as one table (a reader of many ranks joins every rank's frames once instead)."""
        return one_table(self.frames)


def once_per_step(frames: list[pd.DataFrame]) -> tuple[list[pd.DataFrame], int]:
    """The rows of ``frames`` (in file order) with each step once, as a dict by step would keep them (the last
    record's values where the step was first seen), and how many records a later one replaced. Each column's
    type is inferred from the rows kept, as a table of those rows alone would have it."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return [], 0
    steps = pd.Series(np.concatenate([f["step"].to_numpy() for f in frames]))
    repeated = int(steps.duplicated().sum())
    if not repeated:
        return frames, 0
    kept, at = ~steps.duplicated(keep="last").to_numpy(), 0
    parts = []
    for frame in frames:
        parts.append(frame[kept[at:at + len(frame)]])
        at += len(frame)
    table = one_table(parts).set_index("step", drop=False)
    table = table.loc[steps.drop_duplicates().to_numpy()].reset_index(drop=True)
    return [table.dropna(axis="columns", how="all")], repeated  # a phase only a replaced record had is no column


def one_table(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Tables of step rows as one, with one type per column, as one table of every row would infer it (a
    block whose counters were all unknown holds Nones)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    return (frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)).infer_objects()


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows of :func:`step_row` as a table: NaN where a row lacks a phase, None where a counter is unknown."""
    return pd.DataFrame(rows)


def add_last_step(found: StepFile, by_step: dict[int, dict[str, Any]], number: int, line: str, rank: int | None) -> None:
    """The file's last line, through :func:`add_step` only if it is JSON: a line cut short by a kill is no bad line."""
    try:
        json.loads(line)
    except ValueError:
        found.parsed += 1
        return  # the last line, cut short by a kill: everything before it is intact
    add_step(found, by_step, number, line, rank)


def add_step(found: StepFile, by_step: dict[int, dict[str, Any]], number: int, line: str, rank: int | None) -> None:
    """Line ``number`` of a steps.jsonl into ``by_step`` (step -> row) and ``found`` (phases, p2p, what was wrong)."""
    row = step_row(found, number, line, rank)
    if row is not None:
        if row["step"] in by_step:
            found.repeated += 1
        by_step[row["step"]] = row


def step_row(found: StepFile, number: int, line: str, rank: int | None) -> dict[str, Any] | None:
    """The table row of line ``number``, or None (a blank line, or one that is not a usable record: said in
    ``found``); its phases and point-to-point calls go into ``found``."""
    found.parsed += 1
    if not line.strip():
        return None
    found.lines += 1
    try:
        record = json.loads(line)
        if is_device_line(record):
            _add_device_line(found, record, rank)
            return None
        row = _step_row(record, rank)
    except (ValueError, RecursionError) as e:
        found.bad_lines.append(f"line {number}: {str(e)[:120]}")
        return None
    if isinstance(row, str):
        found.impossible.append(row)
        return None
    for name in row.pop("_phases"):
        if name not in found.phases:
            found.phases.append(name)
    p2p = row.pop("_p2p")
    if p2p:
        found.p2p[row["step"]] = p2p
    return row


def _step_row(record: Any, rank: int | None) -> dict[str, Any] | str:
    """The table row of one record; a string naming the impossible value; ValueError if not a record."""
    if not isinstance(record, dict):
        raise ValueError(f"not a step record ({type(record).__name__})")
    for key, most in (("rank", MAX_RANKS), ("step", MAX_STEP_NUMBER)):
        if not _is_int(record.get(key)) or not 0 <= record[key] < most:
            raise ValueError(f"'{key}' is not an integer from 0 to {most - 1}")
    if rank is not None and record["rank"] != rank:
        raise ValueError(f"a record of rank {record['rank']} in rank {rank}'s folder")
    for key in ("start", "end", "duration_ms"):
        if not _is(record.get(key), NUMBER):
            raise ValueError(f"'{key}' is not a number")
    phases = record.get("phases_ms") or {}
    if not isinstance(phases, dict) or not all(_is(v, NUMBER) for v in phases.values()):
        raise ValueError("'phases_ms' is not an object of numbers")
    step = record["step"]
    start, end, duration = record["start"], record["end"], record["duration_ms"]
    if not (_finite(start) and _finite(end) and end >= start):
        return f"step {step}: start {start!r}, end {end!r}"
    for name, value in [("duration_ms", duration), *((f"phase {k}", v) for k, v in phases.items())]:
        if not (_finite(value) and 0 <= value <= MAX_STEP_MS):
            return f"step {step}: {name} {value!r}"[:120]
    return {"rank": record["rank"], "step": step, "start": start, "end": end, "wall_ms": duration,
            "peak_mem_bytes": _bounded(record.get("peak_mem_bytes"), MAX_MEMORY_BYTES),
            "samples": _bounded(record.get("samples"), math.inf), "tokens": _bounded(record.get("tokens"), math.inf),
            **{f"{k}_ms": v for k, v in phases.items()}, **_counters(record), **device_lists(record),
            "_phases": list(phases), "_p2p": _p2p(record.get("p2p"))}


# The columns every step row has (the others: <phase>_ms and <phase>_comm_wait_ms of the phases it recorded, and the
# device timings' lists where it carried some).
STEP_COLUMNS = ("rank", "step", "start", "end", "wall_ms", "peak_mem_bytes", "samples", "tokens", "comm_wait_ms",
                "comm_calls", "cpu_ms", "runq_ms", "comm_runq_ms", "page_faults", "rss_bytes",
                "gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_peak_bytes", "gpu_peak_since")


# -- device timings (CUDA events, NCCL's collective timing): the fields of an earlier step, carried by a later
# record or by the run's last line (docs/run-directory.md) ----------------------------------------------------

DEVICE_LISTS = ("device_steps", "device_colls", "device_colls_lost")
# A record of the device's timings: its rank, then its device_steps, device_colls and device_colls_lost (lists, or
# None), in the order of DEVICE_LISTS.
DeviceRecord = tuple[int, Any, Any, Any]
MAX_DEVICE_ENTRIES = 100_000  # per record: a step of more collectives than this is a corrupt record
# Each list's fields and their kinds: a step and a sequence number are counts, the rest are strings or ms.
DEVICE_FIELDS: dict[str, dict[str, str]] = {
    "device_steps": {"step": "count", "step_ms": "ms", "idle_before_ms": "ms"},
    "device_colls": {"step": "count", "group": "str", "seq": "count", "op": "str", "ms": "ms"},
    # collectives the flight recorder's ring overwrote before a read (issued during these steps): waits unknown
    "device_colls_lost": {"first_step": "count", "last_step": "count", "entries": "count"},
}


def device_record(rank: int, lists: dict[str, Any]) -> DeviceRecord:
    """The :data:`DeviceRecord` of ``lists`` (a record's or the end-of-run line's device lists, by name)."""
    return (rank, *(lists.get(name) for name in DEVICE_LISTS))


def is_device_line(record: Any) -> bool:
    """The end-of-run line that holds the device timings still pending: not a step."""
    return isinstance(record, dict) and record.get("kind") == "device" and "step" not in record


def _add_device_line(found: StepFile, record: dict[str, Any], rank: int | None) -> None:
    """The flush line's lists into ``found.device``; a line of another rank is no line of this one."""
    if not _is_int(record.get("rank")) or (rank is not None and record["rank"] != rank):
        raise ValueError(f"a device line of rank {record.get('rank')!r} in rank {rank}'s folder")
    for name, entries in device_lists(record).items():
        found.device.setdefault(name, []).extend(entries)


def device_lists(record: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """A record's ``device_steps`` and ``device_colls``, each entry in its types; entries with a value that is
    missing or impossible are left out (as an impossible counter is unknown), and an empty list is no column."""
    lists = {}
    for name, fields in DEVICE_FIELDS.items():
        raw = record.get(name)
        if isinstance(raw, list) and len(raw) <= MAX_DEVICE_ENTRIES:
            clean = [e for e in (_device_entry(x, fields) for x in raw) if e is not None]
            if clean:
                lists[name] = clean
    return lists


def _device_entry(entry: Any, fields: dict[str, str]) -> dict[str, Any] | None:
    if not isinstance(entry, dict):
        return None
    clean: dict[str, Any] = {}
    for key, kind in fields.items():
        value = entry.get(key)
        if kind == "count" and _is_int(value) and 0 <= value < MAX_STEP_NUMBER:
            clean[key] = value
        elif kind == "ms" and _bounded(value, MAX_STEP_MS) is not None:
            clean[key] = float(value)  # one type per field: the step cache stores the lists as Parquet structs
        elif kind == "str" and isinstance(value, str) and len(value) <= 200:
            clean[key] = value
        else:
            return None
    return clean


P2P_KINDS = ("send", "recv")


def _p2p(value: Any) -> dict[str, Any] | None:
    """A step record's ``p2p`` (``{"first": [kind, peer], "send": {peer: calls}, "recv": {...}}``) if
    well formed, else None: a malformed one is no evidence, and no reason to drop the step."""
    if not isinstance(value, dict):
        return None
    first = value.get("first")
    if not (isinstance(first, list) and len(first) == 2 and first[0] in P2P_KINDS and _is_int(first[1])
            and 0 <= first[1] < MAX_RANKS):
        return None
    counts: dict[str, dict[int, int]] = {}
    for kind in P2P_KINDS:
        per_peer = value.get(kind) or {}
        if not isinstance(per_peer, dict):
            return None
        try:
            counts[kind] = {int(peer): n for peer, n in per_peer.items() if _is_int(n) and n > 0}
        except ValueError:
            return None
        if not all(0 <= peer < MAX_RANKS for peer in counts[kind]):
            return None
    return {"first": list(first), **counts}


def p2p_to_json(calls: dict[str, Any]) -> dict[str, Any]:
    """A step's point-to-point calls as JSON has them (peers as strings)."""
    return {"first": calls["first"], **{kind: {str(peer): n for peer, n in per_peer.items()}
                                        for kind, per_peer in calls.items() if kind != "first"}}


def p2p_from_json(calls: dict[str, Any]) -> dict[str, Any]:
    """:func:`p2p_to_json` read back: peers as ranks again."""
    return {"first": calls["first"], **{kind: {int(peer): n for peer, n in per_peer.items()}
                                        for kind, per_peer in calls.items() if kind != "first"}}


# Memory at a step's end (bytes): the process's resident memory; on a GPU the caching allocator's
# allocated and reserved bytes and its peak, since the step began or since the process started
# (``gpu_peak_since``, one of PEAK_SINCE).
MEMORY_COUNTERS = ("rss_bytes", "gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_peak_bytes")
PEAK_SINCE = ("step", "start")


def _counters(record: dict[str, Any]) -> dict[str, Any]:
    """The always-on counters of a step record as step-table columns, None where unknown or impossible.
    ``comm_ms`` there (time blocked in communication) becomes ``comm_wait_ms``: ``comm_ms`` is the traces' time in collectives."""
    columns = {"comm_wait_ms": _bounded(record.get("comm_ms"), MAX_STEP_MS),
               "comm_calls": _bounded(record.get("comm_calls"), math.inf),
               "cpu_ms": _bounded(record.get("cpu_ms"), MAX_STEP_MS), "runq_ms": _bounded(record.get("runq_ms"), MAX_STEP_MS),
               "comm_runq_ms": _bounded(record.get("comm_runq_ms"), MAX_STEP_MS),
               "page_faults": _bounded(record.get("page_faults"), math.inf),
               **{k: _bounded(record.get(k), MAX_MEMORY_BYTES) for k in MEMORY_COUNTERS},
               "gpu_peak_since": record.get("gpu_peak_since") if record.get("gpu_peak_since") in PEAK_SINCE else None}
    waits = record.get("phase_comm_ms")
    if isinstance(waits, dict):
        columns.update({f"{k}_comm_wait_ms": _bounded(v, MAX_STEP_MS) for k, v in waits.items() if isinstance(k, str)})
    return columns


def _bounded(value: Any, most: float) -> float | int | None:
    """A count or size: kept when it is a number in [0, most], else unknown."""
    ok = _is(value, NUMBER) and _finite(value) and 0 <= value <= most
    return value if ok else None


def _finite(value: float | int) -> bool:
    try:
        return math.isfinite(value) and abs(value) < 2**63  # an int too large for a float is not finite either
    except OverflowError:
        return False


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _is_int(value: Any) -> bool:
    return _is(value, int)
