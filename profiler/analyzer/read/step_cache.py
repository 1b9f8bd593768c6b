"""A rank's steps.jsonl read once: its parsed records kept in ``analysis/cache/@steps/<rank>/``, so that
the next analysis of a run that grew reads only the bytes appended since.

The cache holds what :func:`run_files.read_steps` found in a prefix of the file (the rows as Parquet, their
device timings as lists of structs, the problem counts, phases, point-to-point calls and the end-of-run
device line as JSON) and a fingerprint of that prefix. A read
goes on from the prefix's end through the same :func:`run_files.add_step`, so its result is the full
read's: a step recorded again replaces its row and counts as repeated, line numbers go on. The prefix
always stops before the file's last line: a full read treats that line alone differently (ignored
unless it is JSON: the line a killed job was writing), and once more is appended it is an ordinary line.

Fingerprint: the file's device and inode, and a hash of the first and the last ``FINGERPRINT_BYTES``
of the prefix. The record files are only appended to; what replaces one (a rename over it, a
rewrite, a truncation) changes the inode, its length or the bytes where the prefix begins or ends.
Hashing the whole prefix would cost the full read the cache avoids. Anything else (another cache
version, another file or rank, a damaged cache) reads the whole file and rewrites the cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.read.inputs import MAX_LINES_BYTES
from diagtrain.profiler.analyzer.read.run_files import (SHOWN_PROBLEMS, StepFile, add_last_step, add_step, p2p_from_json,
                                                         p2p_to_json)
from diagtrain.profiler.run_dir import remove_quietly, replacing, write_json_atomic
from diagtrain.profiler.util.bounded_read import MAX_LINE_CHARS, InputError, display, open_regular

CACHE_VERSION = 4  # bump when what the cache holds, or how a record is read, changes
STEPS_CACHE = "@steps"  # under analysis/cache: a trace's cache key never holds "@" (discover._key)
STATE_FILE = "state.json"
FINGERPRINT_BYTES = 4096
MISSING = "_missing"  # per row, the columns its record did not have (a None value is a column it had)
BLOCK_BYTES = 1 << 16
SMALL_PART_ROWS = 4096  # a last file of fewer rows takes the new rows in (reading a file costs ~3 ms)


def cache_dir(cache_root: Path, rank: int) -> Path:
    """Where rank ``rank``'s step records are cached."""
    return cache_root / STEPS_CACHE / str(rank)


@dataclass
class Prefix:
    """The part of the file a cache holds: its length, its lines and its fingerprint."""

    offset: int  # bytes: up to the start of the file's last line
    number: int  # lines in it (blank ones too), for the next line's number
    fingerprint: dict[str, Any]


def read_steps_cached(path: Path, rank: int, cache: Path) -> StepFile:
    """What ``read_steps(path, rank)`` gives, reading only what was appended since ``cache`` was written
    (the whole file if the cache does not hold its start), then bringing the cache up to date."""
    fd = open_regular(path, MAX_LINES_BYTES)  # the full read's checks, and its errors
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(f.fileno())
        state = _state(cache, f, st, path, rank)
        restored = _with_rows(cache, state) if state is not None else None
        found, by_step, start, parts = restored or (StepFile(), {}, Prefix(0, 0, {}), [])
        cached = list(by_step.values())
        end = _last_line_start(f, start.offset, st.st_size)
        number = _add_lines(found, by_step, _lines(f, start.offset, end), start.number, rank)
        if end > start.offset or not start.fingerprint:
            _write(cache, found, _parts(parts, cached, list(by_step.values()), end),
                   Prefix(end, number, _fingerprint(f, st, end)), path, rank, max(by_step, default=None))
        last = list(_lines(f, end, st.st_size))  # the held-back last line (pieces of it, if over MAX_LINE_CHARS)
    number = _add_lines(found, by_step, last[:-1], number, rank)
    if last:
        add_last_step(found, by_step, number + 1, last[-1], rank)
    found.rows = list(by_step.values())
    return found


def extend_cache(path: Path, rank: int, cache: Path, small_rows: int | None = None) -> int:
    """Add the lines appended since ``cache`` was written to it, reading back none of its rows but those of
    a last file under ``small_rows`` (default ``SMALL_PART_ROWS``), which takes the new ones in: the wrapper
    does this while the job runs, so that the final analysis parses only the lines after. The lines parsed.
    Without a cache of this file, or where a new line records a cached step again (its row must replace
    one in a file), the file is read whole as :func:`read_steps_cached` reads it."""
    fd = open_regular(path, MAX_LINES_BYTES)
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(f.fileno())
        state = _state(cache, f, st, path, rank)
        if state is not None and state.last_step is not None:
            end = _last_line_start(f, state.prefix.offset, st.st_size)
            by_step: dict[int, dict[str, Any]] = {}
            number = _add_lines(state.found, by_step, _lines(f, state.prefix.offset, end), state.prefix.number, rank)
            parts = _appended(cache, state, by_step, end, SMALL_PART_ROWS if small_rows is None else small_rows)
            if parts is not None:
                if end > state.prefix.offset:
                    _write(cache, state.found, parts, Prefix(end, number, _fingerprint(f, st, end)), path, rank,
                           max(by_step, default=state.last_step))
                return state.found.parsed
    return read_steps_cached(path, rank, cache).parsed


def _appended(cache: Path, state: State, by_step: dict[int, dict[str, Any]], offset: int,
              small_rows: int) -> list[Part] | None:
    """The cache's files with the new rows after them; None if a row replaces a cached step or the small
    last file cannot be read back."""
    if min(by_step, default=state.last_step + 1) <= state.last_step:
        return None
    try:
        return _parts_after(state.parts, list(by_step.values()), offset, lambda part: _rows(cache / part.file, part.rows),
                            small_rows)
    except Exception:  # noqa: BLE001 - a damaged or missing file of rows: the file is read whole
        return None


@dataclass
class Part:
    """One Parquet file of cached rows: its name, and the rows to write (None: already written)."""

    file: str
    rows: int
    new: list[dict[str, Any]] | None = None


def _parts(parts: list[Part], cached: list[dict[str, Any]], rows: list[dict[str, Any]], offset: int) -> list[Part]:
    """The files the rows go to: the cached ones and the rows appended since (:func:`_parts_after`); all in
    one when a cached row was replaced (a step recorded again)."""
    if len(rows) == len(cached) and all(a is b for a, b in zip(cached, rows)):
        return parts
    if not all(a is b for a, b in zip(cached, rows)):
        return [Part(f"rows-{offset}.parquet", len(rows), rows)] if rows else []
    return _parts_after(parts, rows[len(cached):], offset, lambda part: cached[len(cached) - part.rows:],
                        SMALL_PART_ROWS)


def _parts_after(parts: list[Part], new: list[dict[str, Any]], offset: int,
                 rows_of: Callable[[Part], list[dict[str, Any]]], small_rows: int) -> list[Part]:
    """The cached files and a new one of the rows ``new``, which only follow the cached ones: the last file
    rewritten with them while it holds under ``small_rows`` (``rows_of`` gives its rows), so that writing
    costs what was appended and a run analyzed often is still a few files. Every file but the last holds
    at least ``small_rows`` rows: opening one costs a few percent of reading 1,000."""
    if not new:
        return parts
    if parts and parts[-1].rows < small_rows:
        new, parts = rows_of(parts[-1]) + new, parts[:-1]
    return parts + [Part(f"rows-{offset}.parquet", len(new), new)]  # a new name: a state never names a file half written


def _add_lines(found: StepFile, by_step: dict[int, dict[str, Any]], lines: Iterable[str], after: int,
               rank: int) -> int:
    """Lines numbered from ``after + 1`` through add_step; the number of the last (``after`` if none)."""
    number = after
    for number, line in enumerate(lines, after + 1):
        add_step(found, by_step, number, line, rank)
    return number


def _lines(f: io.BufferedReader, start: int, end: int) -> Iterator[str]:
    """The lines of bytes ``start`` to ``end``, split and decoded as read_lines does (``start`` follows a
    newline, so a reader starting there splits the rest exactly as one starting at the file's start)."""
    f.seek(start)
    text = io.TextIOWrapper(io.BufferedReader(_Window(f, end - start)), encoding="utf-8", errors="replace",
                            newline=None)
    while line := text.readline(MAX_LINE_CHARS):
        yield line.rstrip("\n")


class _Window(io.RawIOBase):
    """The next ``size`` bytes of ``f``, as a file: what the text reader reads, and no further."""

    def __init__(self, f: io.BufferedReader, size: int) -> None:
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.f.read(min(len(buffer), self.left))
        buffer[:len(data)] = data
        self.left -= len(data)
        return len(data)


def _last_line_start(f: io.BufferedReader, start: int, size: int) -> int:
    """Where the file's last line begins (lines end with a newline; a last one may not), not before ``start``."""
    end = size - 1 if size > start and _byte_at(f, size - 1) == b"\n" else size  # a complete last line is held back too
    while end > start:
        at = max(start, end - BLOCK_BYTES)
        f.seek(at)
        newline = f.read(end - at).rfind(b"\n")
        if newline >= 0:
            return at + newline + 1
        end = at
    return start


def _byte_at(f: io.BufferedReader, at: int) -> bytes:
    f.seek(at)
    return f.read(1)


def _fingerprint(f: io.BufferedReader, st: os.stat_result, offset: int) -> dict[str, Any]:
    """The prefix of ``offset`` bytes, cheaply: the file's identity and a hash of its two ends."""
    f.seek(0)
    head = f.read(min(offset, FINGERPRINT_BYTES))
    f.seek(max(0, offset - FINGERPRINT_BYTES))
    tail = f.read(min(offset, FINGERPRINT_BYTES))
    return {"device": st.st_dev, "inode": st.st_ino, "offset": offset,
            "head": hashlib.sha256(head).hexdigest(), "tail": hashlib.sha256(tail).hexdigest()}


@dataclass
class State:
    """What a cache's state file says: the records' counts and problems, the prefix, the files of rows."""

    found: StepFile
    prefix: Prefix
    parts: list[Part]
    last_step: int | None  # the highest step cached (None: no row, or a cache made before it was kept)


def _state(cache: Path, f: io.BufferedReader, st: os.stat_result, path: Path, rank: int) -> State | None:
    """The cache's state, if it was made from the start of this very file; else None."""
    try:
        state = json.loads((cache / STATE_FILE).read_text())
        prefix = Prefix(state["offset"], state["number"], state["fingerprint"])
        if (state.get("version") != CACHE_VERSION or state.get("file") != display(path.absolute())
                or state.get("rank") != rank or st.st_size < prefix.offset
                or _fingerprint(f, st, prefix.offset) != prefix.fingerprint):
            return None
        found = StepFile(phases=list(state["phases"]), bad_lines=list(state["bad_lines"]), lines=state["lines"],
                         impossible=list(state["impossible"]), repeated=state["repeated"],
                         bad_lines_dropped=state["bad_lines_dropped"], impossible_dropped=state["impossible_dropped"],
                         p2p={int(step): p2p_from_json(calls) for step, calls in state["p2p"]},
                         device={k: list(v) for k, v in state["device"].items()})
        return State(found, prefix, [Part(p["file"], p["rows"]) for p in state["parts"]], state.get("last_step"))
    except Exception:  # noqa: BLE001 - absent, damaged or of another version: the file is read whole
        return None


def _with_rows(cache: Path, state: State) -> tuple[StepFile, dict[int, dict[str, Any]], Prefix, list[Part]] | None:
    """The cached records, their rows read back; None if a file of rows cannot be read (the file is read whole)."""
    try:
        rows = [row for part in state.parts for row in _rows(cache / part.file, part.rows)]
    except Exception:  # noqa: BLE001 - a damaged or missing file of rows
        return None
    return state.found, {row["step"]: row for row in rows}, state.prefix, state.parts


def _write(cache: Path, found: StepFile, parts: list[Part], prefix: Prefix, path: Path, rank: int,
           last_step: int | None) -> None:
    """The new rows' file, then the state that names every file; never fails the analysis."""
    try:
        old = {p["file"] for p in json.loads((cache / STATE_FILE).read_text()).get("parts", [])}
    except Exception:  # noqa: BLE001 - no cache yet, or a damaged one
        old = set()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for part in parts:
            if part.new is not None:
                _write_rows(cache / part.file, part.new)
        write_json_atomic(cache / STATE_FILE, {
            "version": CACHE_VERSION, "file": display(path.absolute()), "rank": rank, "offset": prefix.offset,
            "number": prefix.number, "fingerprint": prefix.fingerprint,
            "parts": [{"file": p.file, "rows": p.rows} for p in parts], "last_step": last_step,
            "lines": found.lines, "phases": found.phases, "repeated": found.repeated,
            "bad_lines": found.bad_lines[:SHOWN_PROBLEMS], "impossible": found.impossible[:SHOWN_PROBLEMS],
            "bad_lines_dropped": found.bad_count - len(found.bad_lines[:SHOWN_PROBLEMS]),
            "impossible_dropped": found.impossible_count - len(found.impossible[:SHOWN_PROBLEMS]),
            "p2p": [[step, p2p_to_json(calls)] for step, calls in found.p2p.items()],
            "device": found.device})  # the end-of-run device line's timings: a few steps' worth
    except Exception:  # noqa: BLE001 - a read-only place, a full disk, a value Parquet cannot hold: no cache
        return
    for name in old - {p.file for p in parts}:
        remove_quietly(cache / name)


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` with the rows as a table, with per row the columns it lacked: a missing key and a
    None value make different columns in the steps table (NaN where a phase is absent, None where a
    counter is unknown). Straight to Arrow: through a pandas frame it cost twice as much."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis' import, as in util/parquet.py
    import pyarrow.parquet as pq  # noqa: PLC0415

    names = _names(rows)
    width = len(names)
    missing = ["" if len(row) == width else ",".join(str(i) for i, name in enumerate(names) if name not in row)
               for row in rows]
    if all(tuple(row) == names for row in rows):  # the usual run: every record has the same fields, in order
        columns = list(zip(*(row.values() for row in rows)))
    else:
        columns = [[row.get(name) for row in rows] for name in names]
    table = pa.table({**{name: pa.array(column) for name, column in zip(names, columns)}, MISSING: missing})
    with replacing(path) as tmp:
        pq.write_table(table, tmp)


def _names(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """Every row's keys, in the order first seen (the steps table's column order, as pandas makes it);
    a row is looked into only when its keys differ from the row before's."""
    names: dict[str, None] = {}
    before: Any = None
    for row in rows:
        if row.keys() != before:
            names.update(dict.fromkeys(row))
            before = row.keys()
    return tuple(names)


def _rows(path: Path, count: int) -> list[dict[str, Any]]:
    """The rows :func:`_write_rows` was given: the keys each had, None where a value was None. Built column by
    column from Arrow (pandas' ``to_dict`` boxes each value on its own: 10x slower)."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - the analysis' import, as in util/parquet.py

    columns = pq.read_table(path).to_pydict()
    missing = columns.pop(MISSING)
    if len(missing) != count:
        raise ValueError(f"{len(missing)} rows where the state says {count}")
    names = list(columns)
    rows = [dict(zip(names, row)) for row in zip(*columns.values())]
    for row, lacked in zip(rows, missing):
        if lacked:
            for i in lacked.split(","):
                del row[names[int(i)]]
    return rows


class CacheFeeder:
    """Puts ranks' new step records in the final analysis' cache while the job runs, a rank once ``min_lines``
    wait, in turns, until a CPU budget is spent: the final analysis then parses only the lines after. Whoever
    reads a rank's records live feeds its cache (the judging wrapper for the ranks it reads directly, each
    host's wrapper for its own: host_summary.py)."""

    def __init__(self, cache_root: Path) -> None:
        self.cache_root = cache_root
        self.cached: dict[int, int] = {}  # rank -> lines of its steps.jsonl in the cache
        self._next = 0  # the rank whose turn it is

    def feed(self, files: dict[int, tuple[Path, int]], min_lines: int, cpu_s: float) -> int:
        """``files``: rank -> (its steps.jsonl, the lines read of it so far). The lines parsed."""
        started, parsed = time.thread_time(), 0
        ranks = sorted(files)
        for rank in ranks[self._next:] + ranks[:self._next]:
            path, lines = files[rank]
            if lines - self.cached.get(rank, 0) < min_lines:
                continue
            if time.thread_time() - started >= cpu_s:
                break
            try:
                # Files of at least min_lines rows, none read back and written again: the wrapper's CPU is the job's.
                parsed += extend_cache(path, rank, cache_dir(self.cache_root, rank), min_lines)
            except (InputError, OSError):
                pass  # not readable now: the final analysis reads it, and says why
            self.cached[rank] = lines - 1  # a file's last line stays out of its cache
            self._next = (ranks.index(rank) + 1) % len(ranks)
        return parsed
