"""A rank's step records (its closed segments in order, then its steps.jsonl: step_segments.py) read a block at a
time (as columns where the block allows: step_columns.py), and read once: its parsed records kept in ``analysis/cache/@steps/<rank>/``, so that the next analysis of a run that
grew reads only the bytes appended since.

The cache holds what a read found in a prefix of the file (the rows as Parquet, in file order, a step
recorded again included; their device timings as lists of structs; the problem counts, phases, point-to-
point calls and the end-of-run device line as JSON) and a fingerprint of that prefix. A read goes on from
the prefix's end in the same way, so its result is the full read's: the rows are made one per step only
when the read is done (a step recorded again replaces its row and counts as repeated), line numbers go on. The prefix
always stops before the file's last line: a full read treats that line alone differently (ignored
unless it is JSON: the line a killed job was writing), and once more is appended it is an ordinary line.

Closed segments never change: the cache names those it read whole by number and unpacked size, and its prefix is of
the file after them. A steps.jsonl closed into a segment since keeps its bytes, so the prefix is found again there
(its identity is not compared then: a compressed segment is another file).

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
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from diagtrain.profiler.analyzer.read import step_columns
from diagtrain.profiler.step_files import open_step_files
from diagtrain.profiler.analyzer.read.run_files import (SHOWN_PROBLEMS, StepFile, add_last_step, p2p_from_json,
                                                         p2p_to_json, rows_frame, step_row)
from diagtrain.profiler.run_dir import remove_quietly, replacing, write_json_atomic
from diagtrain.profiler.util.bounded_read import MAX_LINE_CHARS, InputError, display

CACHE_VERSION = 6  # bump when what the cache holds, or how a record is read, changes
STEPS_CACHE = "@steps"  # under analysis/cache: a trace's cache key never holds "@" (discover._key)
STATE_FILE = "state.json"
FINGERPRINT_BYTES = 4096
BLOCK_BYTES = 1 << 16
SMALL_PART_ROWS = 4096  # a last file of fewer rows takes the new rows in (reading a file costs ~3 ms)
READ_BYTES = 8 << 20  # a block parsed at once: ~20,000 records, a few MB of columns


def cache_dir(cache_root: Path, rank: int) -> Path:
    """Where rank ``rank``'s step records are cached."""
    return cache_root / STEPS_CACHE / str(rank)


@dataclass
class Prefix:
    """The part of a rank's records a cache holds: the closed segments read whole, then a prefix of the next file
    (the next segment, or steps.jsonl): its length, the lines so far and its fingerprint."""

    offset: int  # bytes of the next file: up to the start of steps.jsonl's last line
    number: int  # lines so far (blank ones too), for the next line's number
    fingerprint: dict[str, Any]
    segments: list[list[int]] = field(default_factory=list)  # [number, unpacked bytes] of each segment read whole

    @property
    def consumed(self) -> int:
        """Bytes of the records read, segments and all: grows with every read that adds any."""
        return sum(size for _, size in self.segments) + self.offset


@dataclass
class Source:
    """One file of a rank's records, open to read: a closed segment (its bytes unpacked) or steps.jsonl."""

    f: io.BufferedIOBase
    size: int
    identity: dict[str, int]  # steps.jsonl's device and inode; none for a segment (compressing it makes a new file)


class StepFiles:
    """A rank's closed segments and its steps.jsonl, listed together (step_segments.open_step_files); a segment's
    bytes are unpacked once, whether a cache's fingerprint or the read needs them first."""

    def __init__(self, path: Path) -> None:
        self.segments, fd = open_step_files(path)
        self.live: Source | None = None
        if fd is not None:
            f = open(fd, "rb", closefd=True)  # noqa: SIM115 - closed by close()
            st = os.fstat(f.fileno())
            self.live = Source(f, st.st_size, {"device": st.st_dev, "inode": st.st_ino})
        self._loaded: dict[int, Source] = {}

    def source(self, index: int) -> Source | None:
        """File ``index`` in reading order: the segments, then steps.jsonl (None where it is not there)."""
        if index >= len(self.segments):
            return self.live
        if index not in self._loaded:
            data = self.segments[index].data()
            self._loaded = {index: Source(io.BytesIO(data), len(data), {})}  # one segment's bytes held at a time
        return self._loaded[index]

    def close(self) -> None:
        """Close steps.jsonl."""
        if self.live is not None:
            self.live.f.close()


def read_steps(path: Path, rank: int | None) -> StepFile:
    """A rank's steps.jsonl: one row per step record; the cut last line of a killed run is ignored."""
    return read_steps_cached(path, rank, None)


def read_steps_cached(path: Path, rank: int | None, cache: Path | None) -> StepFile:
    """A rank's step records: its closed segments in order, then its steps.jsonl (``path``), reading only what was
    added since ``cache`` was written (everything if the cache does not hold their start, or there is none), then
    bringing the cache up to date. steps.jsonl's last line is read on its own: a line cut short by a kill is left
    out, not a bad line."""
    with closing(StepFiles(path)) as files:
        state = _resume(cache, files, path, rank) if cache is not None else None
        restored = _with_frames(cache, state) if cache is not None and state is not None else None
        found, start, parts = restored or (StepFile(), Prefix(0, 0, {}), [])
        cached = len(found.frames)
        at = _read_on(files, start, found, rank)
        if cache is not None and (restored is None or at.consumed > start.consumed):
            new = _parts_after(parts, found.frames[cached:], at.consumed, lambda part: [found.frames[cached - 1]],
                               SMALL_PART_ROWS)
            _write(cache, found, new, at, path, rank)
        live = files.live  # its held-back last line (pieces of it, if over MAX_LINE_CHARS)
        last = list(_lines(live.f, at.offset, live.size)) if live is not None else []
    number = at.number
    rows = [row for number, line in enumerate(last[:-1], number + 1) if (row := step_row(found, number, line, rank))]
    if last:
        by_step: dict[int, dict[str, Any]] = {}
        add_last_step(found, by_step, number + len(last), last[-1], rank)
        rows += by_step.values()
    found.frames.append(rows_frame(rows))
    found.finish()
    return found


def extend_cache(path: Path, rank: int, cache: Path, small_rows: int | None = None) -> int:
    """Add the lines added since ``cache`` was written to it, reading back none of its rows but those of a last
    file under ``small_rows`` (default ``SMALL_PART_ROWS``), which takes the new ones in: the wrapper does this while
    the job runs, so that the final analysis parses only the lines after. The lines parsed. Without a cache of
    these records, they are read whole as :func:`read_steps_cached` reads them."""
    with closing(StepFiles(path)) as files:
        state = _resume(cache, files, path, rank)
        if state is not None:
            at = _read_on(files, state.prefix, state.found, rank)
            try:
                parts = _parts_after(state.parts, state.found.frames, at.consumed, lambda part: _frames(cache, [part]),
                                     SMALL_PART_ROWS if small_rows is None else small_rows)
            except Exception:  # noqa: BLE001 - a damaged or missing file of rows: the records are read whole
                parts = None
            if parts is not None:
                if at.consumed > state.prefix.consumed:
                    _write(cache, state.found, parts, at, path, rank)
                return state.found.parsed
    return read_steps_cached(path, rank, cache).parsed


def _read_on(files: StepFiles, at: Prefix, found: StepFile, rank: int | None) -> Prefix:
    """Read into ``found`` what follows ``at``: the closed segments after those it holds, whole (the first from its
    offset), then steps.jsonl up to the start of its last line. Where the records now end."""
    number, offset, done = at.number, at.offset, list(at.segments)
    for index in range(len(done), len(files.segments)):
        segment = files.source(index)
        number = read_range(segment.f, offset, segment.size, found, number, rank)
        done.append([files.segments[index].number, segment.size])
        offset = 0
    live = files.live
    if live is None:
        return Prefix(0, number, {}, done)
    end = _last_line_start(live.f, offset, live.size)
    number = read_range(live.f, offset, end, found, number, rank)
    return Prefix(end, number, _fingerprint(live, end), done)


def read_range(f: io.BufferedReader, start: int, end: int, found: StepFile, number: int, rank: int) -> int:
    """Bytes ``start`` to ``end`` of a steps.jsonl (whole lines) into ``found``, a block at a time: as columns
    where the block allows (step_columns), else line by line. Lines are numbered from ``number + 1``; the
    number of the last is returned."""
    f.seek(start)
    left, carry = end - start, b""
    while left > 0:
        chunk = f.read(min(READ_BYTES, left))
        if not chunk:
            break  # the file shrank while read: what was read is what there is
        left -= len(chunk)
        data = carry + chunk
        cut = data.rfind(b"\n") + 1 if left > 0 else len(data)
        block, carry = data[:cut], data[cut:]
        number = _read_block(found, block, number, rank) if block else number
    return _read_block(found, carry, number, rank) if carry else number


def _read_block(found: StepFile, block: bytes, number: int, rank: int) -> int:
    columns = step_columns.read_block(block, rank)
    if columns is not None:
        found.frames.append(columns.frame)
        found.lines += columns.lines
        found.parsed += columns.parsed
        found.phases += [name for name in columns.phases if name not in found.phases]
        return number + columns.parsed
    rows = []
    for number, line in enumerate(_text_lines(block), number + 1):  # noqa: B007 - the last number is returned
        if (row := step_row(found, number, line, rank)) is not None:
            rows.append(row)
    found.frames.append(rows_frame(rows))
    return number


@dataclass
class Part:
    """One Parquet file of cached rows: its name, its rows, and the table to write (None: already written)."""

    file: str
    rows: int
    new: pd.DataFrame | None = None


def _parts_after(parts: list[Part], new: list[pd.DataFrame], offset: int,
                 frames_of: Callable[[Part], list[pd.DataFrame]], small_rows: int) -> list[Part]:
    """The cached files and a new one of the rows ``new``, which follow the cached ones: the last file
    rewritten with them while it holds under ``small_rows`` (``frames_of`` gives its rows), so that writing
    costs what was appended and a run analyzed often is still a few files. Every file but the last holds
    at least ``small_rows`` rows: opening one costs a few percent of reading 1,000."""
    new = [frame for frame in new if len(frame)]
    if not new:
        return parts
    if parts and parts[-1].rows < small_rows:
        new, parts = frames_of(parts[-1]) + new, parts[:-1]
    table = pd.concat(new, ignore_index=True) if len(new) > 1 else new[0]
    return parts + [Part(f"rows-{offset}.parquet", len(table), table)]  # a new name: a state never names a file half written


def _text_lines(block: bytes) -> Iterator[str]:
    """The lines of ``block``, split and decoded as read_lines does."""
    text = io.TextIOWrapper(io.BytesIO(block), encoding="utf-8", errors="replace", newline=None)
    while line := text.readline(MAX_LINE_CHARS):
        yield line.rstrip("\n")


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


def _fingerprint(source: Source, offset: int) -> dict[str, Any]:
    """The prefix of ``offset`` bytes, cheaply: the file's identity (steps.jsonl's) and a hash of its two ends."""
    source.f.seek(0)
    head = source.f.read(min(offset, FINGERPRINT_BYTES))
    source.f.seek(max(0, offset - FINGERPRINT_BYTES))
    tail = source.f.read(min(offset, FINGERPRINT_BYTES))
    return {**source.identity, "offset": offset,
            "head": hashlib.sha256(head).hexdigest(), "tail": hashlib.sha256(tail).hexdigest()}


def _same_prefix(source: Source, fingerprint: dict[str, Any]) -> bool:
    """Whether ``source`` begins with the prefix ``fingerprint`` was taken of. The identities are compared where both
    have one: steps.jsonl closed into a segment since is the same bytes under another name, and once compressed
    another file."""
    offset = fingerprint.get("offset")
    if offset == 0:
        return True  # nothing of it was read
    if not isinstance(offset, int) or source.size < offset:
        return False
    now = _fingerprint(source, offset)
    return all(now[k] == fingerprint.get(k) for k in now if k in ("offset", "head", "tail") or k in fingerprint)


@dataclass
class State:
    """What a cache's state file says: the records' counts and problems, the prefix, the files of rows."""

    found: StepFile
    prefix: Prefix
    parts: list[Part]


def _resume(cache: Path, files: StepFiles, path: Path, rank: int | None) -> State | None:
    """The cache's state, if it was made from the start of these very records: the segments it read whole are
    there under the same numbers and sizes (closed segments never change), and the file after them begins with the
    prefix it read; else None."""
    state = _state(cache, path, rank)
    if state is None:
        return None
    held = state.prefix.segments
    try:
        if len(held) > len(files.segments) or any(
                segment.number != number or segment.size() != size for segment, (number, size) in zip(files.segments, held)):
            return None
        following = files.source(len(held))
    except (InputError, OSError):
        return None  # a segment that cannot be read now: the records are read whole, and its error said there
    if following is None:
        return state if state.prefix.offset == 0 else None
    return state if _same_prefix(following, state.prefix.fingerprint) else None


def _state(cache: Path, path: Path, rank: int | None) -> State | None:
    """The cache's state, if it is of this version, file and rank; else None."""
    try:
        state = json.loads((cache / STATE_FILE).read_text())
        prefix = Prefix(state["offset"], state["number"], state["fingerprint"],
                        [[int(n), int(size)] for n, size in state["segments"]])
        if state.get("version") != CACHE_VERSION or state.get("file") != display(path.absolute()) or state.get("rank") != rank:
            return None
        found = StepFile(phases=list(state["phases"]), bad_lines=list(state["bad_lines"]), lines=state["lines"],
                         impossible=list(state["impossible"]),
                         bad_lines_dropped=state["bad_lines_dropped"], impossible_dropped=state["impossible_dropped"],
                         p2p={int(step): p2p_from_json(calls) for step, calls in state["p2p"]},
                         device={k: list(v) for k, v in state["device"].items()})
        return State(found, prefix, [Part(p["file"], p["rows"]) for p in state["parts"]])
    except Exception:  # noqa: BLE001 - absent, damaged or of another version: the file is read whole
        return None


def _with_frames(cache: Path, state: State) -> tuple[StepFile, Prefix, list[Part]] | None:
    """The cached records, their rows read back; None if a file of rows cannot be read (the file is read whole)."""
    try:
        state.found.frames = _frames(cache, state.parts)
    except Exception:  # noqa: BLE001 - a damaged or missing file of rows
        return None
    return state.found, state.prefix, state.parts


def _write(cache: Path, found: StepFile, parts: list[Part], prefix: Prefix, path: Path, rank: int | None) -> None:
    """The new rows' file, then the state that names every file; never fails the analysis."""
    try:
        old = {p["file"] for p in json.loads((cache / STATE_FILE).read_text()).get("parts", [])}
    except Exception:  # noqa: BLE001 - no cache yet, or a damaged one
        old = set()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for part in parts:
            if part.new is not None:
                _write_frame(cache / part.file, part.new)
        write_json_atomic(cache / STATE_FILE, {
            "version": CACHE_VERSION, "file": display(path.absolute()), "rank": rank, "offset": prefix.offset,
            "number": prefix.number, "fingerprint": prefix.fingerprint, "segments": prefix.segments,
            "parts": [{"file": p.file, "rows": p.rows} for p in parts],
            "lines": found.lines, "phases": found.phases,
            "bad_lines": found.bad_lines[:SHOWN_PROBLEMS], "impossible": found.impossible[:SHOWN_PROBLEMS],
            "bad_lines_dropped": found.bad_count - len(found.bad_lines[:SHOWN_PROBLEMS]),
            "impossible_dropped": found.impossible_count - len(found.impossible[:SHOWN_PROBLEMS]),
            "p2p": [[step, p2p_to_json(calls)] for step, calls in found.p2p.items()],
            "device": found.device})  # the end-of-run device line's timings: a few steps' worth
    except Exception:  # noqa: BLE001 - a read-only place, a full disk, a value Parquet cannot hold: no cache
        return
    for name in old - {p.file for p in parts}:
        remove_quietly(cache / name)


def _write_frame(path: Path, frame: pd.DataFrame) -> None:
    """Replace ``path`` with the rows as Parquet (a step recorded again keeps its rows: the read decides)."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis' import, as in util/parquet.py
    import pyarrow.parquet as pq  # noqa: PLC0415

    with replacing(path) as tmp:
        # zstd: 13% smaller than Parquet's snappy on step rows, and read back twice as fast
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp, compression="zstd")


def _frames(cache: Path, parts: list[Part]) -> list[pd.DataFrame]:
    """The tables :func:`_write_frame` wrote; lists (the device timings) as Python lists, as a read makes them
    (NaN where a row had none: a row carries them only when it has some)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    frames = []
    for part in parts:
        table = pq.read_table(cache / part.file)
        if table.num_rows != part.rows:
            raise ValueError(f"{table.num_rows} rows where the state says {part.rows}")
        lists = [name for name, kind in zip(table.column_names, table.schema.types) if pa.types.is_list(kind)]
        frame = table.drop(lists).to_pandas()
        for name in lists:
            frame[name] = pd.Series([math.nan if v is None else v for v in table.column(name).to_pylist()], dtype=object)
        frames.append(frame[table.column_names])
    return frames


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
