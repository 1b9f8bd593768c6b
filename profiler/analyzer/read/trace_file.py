"""Reading one PyTorch Profiler (Kineto) trace into columns, keeping only what the analysis needs.

A trace is decompressed and decoded a block at a time: the ``traceEvents`` array is cut at event
boundaries, each piece is decoded by msgspec into small typed structs that skip every field and
argument no table reads (shapes and concrete inputs are kept undecoded until a piece's few events
that need them are known), and its columns go straight into numpy arrays. So memory follows what is
kept (about 50 bytes an event), not the JSON, and no tree of Python objects for the whole trace
ever exists. A document the fast decoder refuses (an unusual layout, a bad event, a file cut short)
is read event by event instead (:mod:`tolerant`): a bad event costs that event, counted by reason
(:mod:`event_checks`), and a file cut short keeps every event complete before the cut, marked partial.

Timestamps stay as the file has them (µs): epoch µs would lose sub-microsecond precision in
float64; ``epoch_offset_us`` puts them on the wall clock.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_not
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read.dialects import (  # noqa: F401 - the event kinds, re-exported for the tables
    COMM, COMM_HOST_OP, COMPUTE, CPU, MARKER, MEMORY, P2P_CALL, STEP_ANNOTATION, STREAMLESS_LANE, SYNC, UNCLASSIFIED,
    classify, format_us, kind_in, name_matches,
)
from diagtrain.profiler.analyzer.read.event_checks import Damage, fits_int64, problem, unfit_count
from diagtrain.profiler.analyzer.read.flops import MATMULS
from diagtrain.profiler.analyzer.read.inputs import MAX_TRACE_BYTES
from diagtrain.profiler.analyzer.read.tolerant import UNPARSED, Cut, Element, Salvage
from diagtrain.profiler.util.bounded_read import InputError, Truncated, display, read_blocks, read_written
from diagtrain.profiler.util.frames import code_dtype, set_column, with_columns
from diagtrain.profiler.util.heap import release_freed_memory

Number = int | float | str | None  # real traces disagree on the types of these fields


# gc=False: a trace is millions of these; the cyclic GC walking them cost 4x the decode itself.
# frozen: one shared instance is the default for events without args.
class _Args(msgspec.Struct, gc=False, frozen=True):
    stream: Number = -1
    correlation: Number = -1
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Number = msgspec.field(default=None, name="In msg nelems")
    group_size: Number = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: Number = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    # Shapes are on every op when record_shapes is on, and read for host collectives and matrix
    # multiplies (their FLOPs) only: kept raw.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    # On most ops too; read for point-to-point calls only (their peer): kept raw.
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")


_NO_ARGS = _Args()


class _Duration(msgspec.Struct, tag_field="ph", tag="X", gc=False, kw_only=True):
    """A duration event, the only kind the tables use, with a numeric start and length."""

    name: str = ""
    cat: str | None = None
    ts: float
    dur: float
    tid: Number = -1
    args: _Args = _NO_ARGS


# Every other phase of the Trace Event Format decodes to an empty struct: its fields are skipped
# unread (metadata, flows, counters and instants are most of some traces' events).
_OTHER_PHASES = [msgspec.defstruct(f"_Phase{ord(ph)}", [], tag_field="ph", tag=ph, gc=False)
                 for ph in "BEiICbnestfPONDMVvRc()"]
_EVENTS = msgspec.json.Decoder(list[Union[(_Duration, *_OTHER_PHASES)]])  # noqa: UP007 - a union built at runtime


class _Trace(msgspec.Struct, gc=False):
    traceEvents: msgspec.Raw = msgspec.Raw()  # decoded apart, a piece or an event at a time
    nodes: msgspec.Raw = msgspec.Raw()  # set in a PyTorch execution trace (operator graph), not a profiler trace
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: msgspec.Raw = msgspec.Raw()  # Kineto lists the job's GPUs here ("[]" on CPU)
    baseTimeNanoseconds: int | None = None
    record_shapes: Number = None
    profile_memory: Number = None
    host_name: str | None = None


_HEADER = msgspec.json.Decoder(_Trace)
# Decompressed bytes decoded at a time: ~1,000 events, whose structs (~300 KiB) fit in the object allocator's
# arenas that the piece before freed. Pieces of 2 MiB made ~4 MiB of structs, whose arenas were handed back to
# the OS after each piece and faulted in again for the next: 2,000 page faults a 20k-event rank, a fifth of its
# load's CPU (benchmarks/results/scale.md); the same speed on 1M events.
BLOCK_BYTES = 128 << 10
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WHITESPACE = frozenset(b" \t\r\n")
_CUT_TRIES = 4  # cuts tried per piece before reading the document event by event (a string holding "}, {" fools one)
_SALVAGE_BATCH = 5000  # events checked one by one, then decoded together


class TraceError(ValueError):
    """A trace file that cannot be analyzed; the message names the file and the problem."""


@dataclass
class Arguments:
    """The per-event arguments few events have (collective op, dtype, sizes, process group, the
    shapes of host collectives and matrix multiplies, the peer of point-to-point calls), for those
    events only: ``rows`` of the events table, sorted."""

    rows: np.ndarray
    columns: dict[str, np.ndarray]


@dataclass
class TraceFile:
    """One trace file's duration events as columns, and the facts its header gives."""

    path: Path
    # name, cat, ts, dur, end (µs), tid (thread; a device event's is its lane), stream (device lane; -1: host),
    # correlation, kind
    events: pd.DataFrame
    rank: int | None
    world_size: int | None
    backend: str | None
    pg_config: list[dict[str, Any]] = field(default_factory=list)
    nccl_version: str | None = None
    base_time_ns: int | None = None
    epoch_offset_us: int = 0  # add to ``ts`` for Unix-epoch microseconds
    record_shapes: bool = False
    profile_memory: bool = False
    host_name: str | None = None
    notes: list[dict[str, str]] = field(default_factory=list)  # {check, severity, message}: how events were read
    device_ranges: int = 0  # CUPTI range-profiler ranges: device work seen, but not timed
    arguments: Arguments | None = None
    left_out: int = 0  # malformed events left out (named in ``notes``)
    cut: str | None = None  # how the file ends early, if it does
    # A file cut inside its events: where its evidence ends (its last complete event, or the first launch
    # whose kernel is missing). Its time after that is missing evidence, not idle time.
    complete_until_us: float | None = None
    # A file cut inside device work that its launches do not vouch for: what the cut lost may lie anywhere
    # in the window, so the rank's device time (busy, idle) is not reported.
    device_time_unknown: bool = False

    @property
    def on_gpu(self) -> bool:
        """The job ran on an accelerator: the trace has device work, timed or not."""
        return self.device_ranges > 0 or self.device_time_unknown or device_time_known(self.events)

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the events where ``mask`` is true; the kept arguments follow their events' new rows."""
        self.events = self.events[mask].reset_index(drop=True)
        if self.arguments is not None and len(self.arguments.rows):
            row_after = np.cumsum(mask) - 1
            kept = mask[self.arguments.rows]
            self.arguments = Arguments(row_after[self.arguments.rows[kept]],
                                       {k: v[kept] for k, v in self.arguments.columns.items()})

    def comm_events(self) -> pd.DataFrame:
        """The communication events (kernels, host collectives and point-to-point calls) with their
        arguments as columns (``collective``, ``dtype``, ``pg_name``, ``pg_desc``, ``input_dims``,
        ``input_type``, ``in_nelems``, ``group_size``, ``peer``; None or NaN where an event has none):
        what collectives read."""
        return self.with_arguments(np.flatnonzero(kind_in(self.events, COMM)))

    def shaped_events(self) -> pd.DataFrame:
        """The events whose shapes were kept (host collectives, matrix multiplies), with their
        arguments as columns: what FLOPs are counted from."""
        kept = self.arguments
        if kept is None or "input_dims" not in kept.columns:
            return self.with_arguments(np.empty(0, np.int64))
        shaped = np.fromiter((d is not None for d in kept.columns["input_dims"]), bool, len(kept.rows))
        return self.with_arguments(kept.rows[shaped])

    def with_arguments(self, rows: np.ndarray) -> pd.DataFrame:
        """The events at ``rows`` (sorted positions) with every argument as a column."""
        kept = self.arguments or Arguments(np.empty(0, np.int64), {})
        at = np.searchsorted(kept.rows, rows)
        found = at < len(kept.rows)
        found[found] = kept.rows[at[found]] == rows[found]
        columns = {}
        for column in ARGUMENT_COLUMNS:
            numeric = column in _NUMERIC_ARGUMENTS
            values = np.full(len(rows), np.nan if numeric else None, dtype=np.float64 if numeric else object)
            if column in kept.columns:
                values[found] = kept.columns[column][at[found]]
            columns[column] = values
        frame = self.events.iloc[rows]
        return with_columns(frame, **columns)


def device_time_known(events: pd.DataFrame) -> bool:
    """Whether ``events`` hold timed device work (kernels, copies, waits on a device lane)."""
    return bool((events["stream"] >= 0).any())


def read_trace(path: Path) -> TraceFile:
    """Decode ``path`` (.json or .json.gz); raise :class:`TraceError` saying what is wrong."""
    gc.disable()  # nothing cyclic is built here; collections would only rescan millions of objects
    salvaged = None
    try:
        try:
            header, columns = _read_in_blocks(path)
        except (msgspec.DecodeError, _NotCut, Truncated, _Unfit):
            header, columns, salvaged = _read_whole(path)
    except InputError as e:  # not a regular file, over its size limit, a gzip bomb (util/bounded_read.py)
        raise TraceError(f"{display(path)}: cannot read: {e.reason}") from None
    except (OSError, EOFError) as e:
        raise TraceError(f"{display(path)}: cannot read: {e}") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{display(path)}: not a PyTorch Profiler trace: {e}") from None
    finally:
        gc.enable()
    events, notes, device_ranges, arguments = columns.frame()
    if events.empty and len(header.nodes):
        raise TraceError(f"{display(path)}: a PyTorch execution trace (operator graph, no timed events), not a profiler trace")
    if events.empty:
        cut = f"; the file {salvaged.cut}" if salvaged and salvaged.cut else ""
        raise TraceError(f"{display(path)}: the trace has no duration events{cut}")
    info = header.distributedInfo or {}
    base = header.baseTimeNanoseconds
    # Kineto writes timestamps relative to baseTimeNanoseconds; older traces write epoch µs.
    relative = bool(base) and events["ts"].iloc[0] < base / 1e3 / 2
    return TraceFile(
        path=path, events=events,
        rank=_int(info.get("rank")), world_size=_int(info.get("world_size")), backend=info.get("backend"),
        pg_config=list(info.get("pg_config") or []), nccl_version=info.get("nccl_version"),
        base_time_ns=base, epoch_offset_us=base // 1000 if relative else 0, record_shapes=bool(header.record_shapes),
        profile_memory=bool(header.profile_memory), host_name=header.host_name, device_ranges=device_ranges,
        arguments=arguments, notes=(salvaged.notes(path, events) if salvaged else []) + notes,
        left_out=salvaged.damage.total if salvaged else 0, cut=salvaged.cut if salvaged else None,
        complete_until_us=_evidence_until(events, salvaged.complete_until_us) if salvaged else None,
        device_time_unknown=bool(salvaged and salvaged.device_unvouched),
    )


class _NotCut(Exception):
    """The document's events cannot be cut into pieces here: decode it whole."""


def _blocks(path: Path) -> Iterator[bytes]:
    """The file's decompressed bytes, a block at a time."""
    # Regular files only, size-limited, unpacked with bounds (gzip by its magic, not its name).
    yield from read_blocks(path, MAX_TRACE_BYTES, BLOCK_BYTES)


def _read_in_blocks(path: Path) -> tuple[_Trace, _Columns]:
    """Decode the ``traceEvents`` array piece by piece as the blocks arrive, and the rest as the header.

    A piece ends at a ``}`` followed by ``,`` and ``{`` (whitespace allowed), and must decode as a
    JSON array of events on its own: a cut inside a string or a nested object cannot (the piece
    would end in an open string or object), so every piece that decodes is whole events, in order.
    """
    blocks = _blocks(path)
    head, start = b"", None
    for block in blocks:  # the header before the events: usually a few hundred bytes, in the first block
        head = head + block if head else block
        start = _EVENTS_KEY.search(head)
        if start:
            break
    if start is None:
        raise _NotCut
    prefix = head[:start.start()] + b'"traceEvents":[]'
    # The events not decoded yet, after a "[" (so that a piece decodes in place, uncopied).
    buffer = bytearray(memoryview(head)[start.end() - 1:])
    del head
    columns = _Columns()
    for block in blocks:
        # An unpacked block can be many times BLOCK_BYTES (gzip's output of one input chunk), and a
        # piece's structs take ~3x its JSON while it is decoded: pieces of at most a block.
        for at in range(0, len(block), BLOCK_BYTES):
            buffer += memoryview(block)[at:at + BLOCK_BYTES]
            buffer = _add_whole_events(buffer, columns)
    buffer = _add_whole_events(buffer, columns)
    # The rest: the last event, the array's "]", and the header's keys after it.
    end = buffer.find(b"]", 1)
    while end >= 0:
        try:
            last = _EVENTS.decode(memoryview(buffer)[:end + 1])
        except msgspec.DecodeError:  # that "]" was inside the last event
            end = buffer.find(b"]", end + 1)
            continue
        columns.add(_durations(last))
        return _HEADER.decode(prefix + buffer[end + 1:]), columns
    raise _NotCut


def _add_whole_events(buffer: bytearray, columns: _Columns) -> bytearray:
    """Decode the whole events after the "[" that starts ``buffer``; return "[" and the bytes after them.

    A cut that turns out to lie inside a string or a nested object (the piece does not decode) is
    given up for the one before it, a few times; then the document is decoded whole."""
    limit = len(buffer)
    for _ in range(_CUT_TRIES):
        cut = _last_boundary(buffer, limit)
        if cut is None:
            return buffer
        end, following = cut
        separator, buffer[end] = buffer[end], ord("]")  # a separator's byte: the piece becomes an array in place
        try:
            events = _EVENTS.decode(memoryview(buffer)[:end + 1])
        except msgspec.DecodeError:
            buffer[end], limit = separator, end - 1
            continue
        columns.add(_durations(events))
        rest = bytearray(b"[")
        rest += memoryview(buffer)[following:]
        return rest
    raise _NotCut


def _last_boundary(buffer: bytearray, limit: int) -> tuple[int, int] | None:
    """(end of the last whole event, start of the next) at the last ``}``-``,``-``{`` before ``limit``."""
    comma = buffer.rfind(b",", 0, limit)
    while comma > 0:
        before, after = comma - 1, comma + 1
        while before > 0 and buffer[before] in _WHITESPACE:
            before -= 1
        while after < len(buffer) and buffer[after] in _WHITESPACE:
            after += 1
        if buffer[before] == ord("}") and after < len(buffer) and buffer[after] == ord("{"):
            return before + 1, after
        comma = buffer.rfind(b",", 0, comma)
    return None


@dataclass
class _Salvaged:
    """What reading a trace event by event found: the events left out, and where a file cut short ends."""

    damage: Damage
    cut: str | None = None  # the file's end, in words, when it ends early
    complete_until_us: float | None = None  # set when the cut falls inside the events
    kept: int = 0  # duration events read
    device_unvouched: bool = False  # cut inside device work whose launches were not written before it

    def notes(self, path: Path, events: pd.DataFrame) -> list[dict[str, str]]:
        """The health notes: the malformed events by reason, and a cut file's partial window."""
        notes = []
        if self.damage.total:
            notes.append({"check": "malformed_events", "severity": "warning",
                          "message": f"{display(path)}: {self.damage.total:,} malformed events left out: "
                                     f"{self.damage.describe()}"})
        if self.cut and self.complete_until_us is not None:
            into = format_us(self.complete_until_us - float(events["ts"].min()))
            notes.append({"check": "partial_trace", "severity": "warning",
                          "message": f"{display(path)}: the file {self.cut}: the trace is partial; its {self.kept:,} "
                                     f"duration events complete before the cut are kept, and the rank's window ends "
                                     f"{into} in, where its evidence does: what came after is missing, not idle"})
            if self.device_unvouched:
                notes.append({"check": "partial_trace", "severity": "warning",
                              "message": f"{display(path)}: its device work is written with its launches, in "
                                         "buffers that need not come in time order, so what the cut lost may lie "
                                         "anywhere in the kept window: the rank's device time (busy and idle) is "
                                         "not reported"})
        elif self.cut:
            notes.append({"check": "partial_trace", "severity": "info",
                          "message": f"{display(path)}: the file {self.cut}: every event was read, only keys "
                                     "written after the events (such as its base time) may be missing"})
        return notes


def _read_whole(path: Path) -> tuple[_Trace, _Columns, _Salvaged]:
    """The document read event by event (:mod:`tolerant`): the usable duration events kept, the others
    counted by reason; a file cut short read up to its last complete event."""
    data, truncated = read_written(path, MAX_TRACE_BYTES, BLOCK_BYTES)
    text = data.decode("utf-8", errors="replace")
    del data
    salvage, columns, found = Salvage(text, "traceEvents"), _Columns(), _Salvaged(Damage())
    batch: list[Element] = []
    for element in salvage.elements():
        reason = "not valid JSON" if element.value is UNPARSED else problem(element.value)
        if reason:
            found.damage.add(reason, _place(element))
        elif element.value["ph"] == "X":
            batch.append(element)
            if len(batch) >= _SALVAGE_BATCH:
                found.complete_until_us = _add_checked(batch, columns, found.damage) or found.complete_until_us
                batch = []
    found.complete_until_us = _add_checked(batch, columns, found.damage) or found.complete_until_us
    del text
    header = _header(salvage.members)
    if not salvage.found and not len(header.nodes):
        where = f" (the file {salvage.cut.describe()})" if salvage.cut else ""
        raise TraceError(f"{display(path)}: not a PyTorch Profiler trace: no traceEvents array{where}")
    found.kept = columns.rows
    found.cut = _cut(salvage.cut, truncated)
    if salvage.cut is None or salvage.found and salvage.cut.where.startswith("after"):
        found.complete_until_us = None  # every event was read: nothing of the window is missing
    # Where the cut's device loss can lie. A writer that puts every launch before the device work (ROCm's
    # traces) announces all of it: a launch left unanswered shows where the loss begins (_evidence_until).
    # One that writes each kernel with its launch, as Kineto writes CUPTI's buffers (in the order of their
    # addresses, not their times: HTA's 2-rank trace writes its last buffer first, the sampled 128-rank
    # one restarts its device passes twice), loses launch and kernel together, from passes that may start
    # anywhere in the window; nothing kept bounds them (before any restart is seen, the file looks ordered).
    # The device time of such a window is unknown: the rank reports none rather than idle made of holes.
    # A cut before any device event of a GPU job's trace (it launched work, lists its GPUs, or its process
    # group is NCCL's) has lost all its device work: unknown too, not a CPU job's trace.
    gpu_job = (columns.launched() or len(bytes(header.deviceProperties).strip(b" \t\r\n[]")) > 0
               or (header.distributedInfo or {}).get("backend") in GPU_BACKENDS)
    found.device_unvouched = found.complete_until_us is not None and (
        not columns.launches_written_first() or (gpu_job and not columns.has_device_events()))
    return header, columns, found


# Host calls that put work on the device: a kept one whose device event is missing was answered after the cut.
_LAUNCH = re.compile(r"Launch|Memcpy|Memset")
GPU_BACKENDS = ("nccl", "rccl")  # process-group backends of jobs whose work runs on a device


def _evidence_until(events: pd.DataFrame, last_end: float | None) -> float | None:
    """Where a cut trace's evidence ends: at its last complete event, or earlier where its device work
    may be missing: a trace writes each stream's work in order, but the streams (and their launches) in
    turns, so every stream is complete only up to the stream written least far; and a kept launch whose
    device event is missing was answered after the cut."""
    if last_end is None:
        return None
    device = events["stream"].to_numpy() >= 0
    if not device.any():
        return last_end
    ts, stream = events["ts"].to_numpy(), events["stream"].to_numpy()
    streams_reach = pd.Series(ts[device]).groupby(stream[device]).max().min()
    correlation = events["correlation"].to_numpy()
    launch_codes = np.flatnonzero([_LAUNCH.search(n) is not None for n in events["name"].cat.categories])
    launches = ~device & (correlation >= 0) & np.isin(events["name"].cat.codes.to_numpy(), launch_codes)
    unanswered = ts[launches & ~np.isin(correlation, correlation[device])]
    return float(min(last_end, streams_reach, unanswered.min() if len(unanswered) else np.inf))


def _place(element: Element) -> str:
    return f"$.traceEvents[{element.index}]"


def _add_checked(elements: list[Element], columns: _Columns, damage: Damage) -> float | None:
    """Decode checked duration events with the fast structs (one by one if some still do not fit, each
    counted); the end of the last one kept."""
    try:
        events = _EVENTS.decode(("[" + ",".join(e.text for e in elements) + "]").encode())
    except msgspec.DecodeError:
        events = []
        for element in elements:
            try:
                events += _EVENTS.decode(f"[{element.text}]".encode())
            except msgspec.DecodeError as e:
                damage.add(f"does not fit the trace format ({str(e).replace('`$[0].', '`')[:80]})", _place(element))
    columns.add(durations := _durations(events))
    return durations[-1].ts + durations[-1].dur if durations else None


def _header(members: list[str]) -> _Trace:
    """The trace's keys besides its events; a key whose value does not fit is left out, not the trace."""
    try:
        return _HEADER.decode(("{" + ",".join(members) + "}").encode())
    except msgspec.DecodeError:
        kept = [m for m in members if _fits("{" + m + "}")]
        return _HEADER.decode(("{" + ",".join(kept) + "}").encode())


def _fits(member: str) -> bool:
    try:
        _HEADER.decode(member.encode())
    except msgspec.DecodeError:
        return False
    return True


def _cut(cut: Cut | None, truncated: InputError | None) -> str | None:
    """Where the file ends early, in words: the JSON document's cut, and the gzip stream's."""
    if cut is None:
        return f"is cut short ({truncated.reason}), after its whole document" if truncated else None
    return f"{cut.describe()}{f'; {truncated.reason}' if truncated else ''}"


def _durations(events: list) -> list[_Duration]:
    """The duration events among the fast decoder's structs (the others are empty)."""
    return list(compress(events, map(isinstance, events, repeat(_Duration))))


class _Columns:
    """Duration events gathered piece by piece into arrays: the numbers, and codes for the strings."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {"ts": [], "dur": [], "tid": [], "correlation": [], "stream": [],
                                                   "name": [], "cat": []}
        self.names, self.categories = _Dictionary(), _Dictionary()
        # Per name code: _HOST_COLLECTIVE (shapes and types read: its bytes), _MATMUL (shapes read: its
        # FLOPs) or 0; and whether it is a point-to-point call (the only ops whose concrete inputs are read).
        self.shaped: list[int] = []
        self.p2p: list[bool] = []
        self.sparse: list[tuple] = []  # (row, then one value per ARGUMENT_COLUMNS) of the events that have them
        self.strings: dict[str | None, str | None] = {}  # the arguments' strings, one object each
        self.rows = 0

    def add(self, events: list[_Duration]) -> None:
        """Append duration events (numeric ``ts`` and ``dur``)."""
        n = len(events)
        if not n:
            return
        args = list(map(attrgetter("args"), events))
        for column in ("ts", "dur"):
            self.parts[column].append(np.fromiter(map(attrgetter(column), events), np.float64, n))
        self.parts["tid"].append(_narrow(_integers(events, attrgetter("tid"))))
        for column in ("correlation", "stream"):
            self.parts[column].append(_narrow(_integers(args, attrgetter(column))))
        for column in ("in_nelems", "group_size"):  # on any event, as the event-by-event read checks them
            given = [v for v in map(attrgetter(column), args) if v is not None]  # most events have none
            if given and any(map(unfit_count, given)):
                raise _Unfit
        names = self.names.encode(list(map(attrgetter("name"), events)))
        self.parts["name"].append(names)
        self.parts["cat"].append(self.categories.encode(list(map(attrgetter("cat"), events))))
        new = self.names.values[len(self.shaped):]
        self.shaped += [_HOST_COLLECTIVE if COMM_HOST_OP.match(name) else _MATMUL if name in MATMULS else 0
                        for name in new]
        self.p2p += [P2P_CALL.match(name) is not None for name in new]
        self._add_sparse(args, names)
        self.rows += n

    def _add_sparse(self, args: list[_Args], names: np.ndarray) -> None:
        """Keep the collective and group arguments (rare), the shapes of host collectives and matrix
        multiplies, and the peers of point-to-point calls, decoded."""
        rows = np.zeros(len(args), dtype=bool)
        for column in ("collective", "pg_name"):
            values = list(map(attrgetter(column), args))
            if values.count(None) != len(values):
                rows |= np.fromiter(map(is_not, values, repeat(None)), bool, len(values))
        shaped = np.array(self.shaped, dtype=np.int8)[names]
        for i in np.flatnonzero(shaped):
            rows[i] |= len(args[i].input_dims) > 0
        peers = {}
        for i in np.flatnonzero(np.array(self.p2p, dtype=bool)[names]):
            peer = _peer(args[i].concrete_inputs)
            if not np.isnan(peer):
                peers[i] = peer
                rows[i] = True
        # One object per distinct string: decoded, each collective's four names were its own objects
        # (55 bytes each, 14 MiB at 4M events), held as long as the trace.
        def shared(value: Any) -> Any:
            return self.strings.setdefault(value, value)
        for i in np.flatnonzero(rows):
            a, shapes = args[i], shaped[i]
            self.sparse.append((self.rows + int(i), shared(a.collective), shared(a.dtype),
                                None if a.pg_name is None else shared(str(a.pg_name)),
                                shared(a.pg_desc), _raw(a.input_dims) if shapes else None,
                                _raw(a.input_type) if shapes == _HOST_COLLECTIVE else None, _float(a.in_nelems),
                                _float(a.group_size), peers.get(i, np.nan)))

    def frame(self) -> tuple[pd.DataFrame, list[dict[str, str]], int, Arguments]:
        """The events sorted by start, classified (see dialects.classify), how they were read, and
        the arguments of the few events that have them."""
        ts = self._take("ts")
        order = _narrow(np.argsort(ts, kind="stable"))  # int32 below 2**31 events: held long, 4 bytes less
        sort = lambda column: self._take(column)[order]  # noqa: E731 - one column at a time: peak memory
        ts = ts[order]
        dur = sort("dur")
        frame = pd.DataFrame({
            "name": pd.Categorical.from_codes(sort("name"), categories=self.names.values),
            "cat": pd.Categorical.from_codes(sort("cat"), categories=self.categories.values),
            "ts": ts, "dur": dur, "tid": _narrow(sort("tid")), "correlation": sort("correlation"),
        }, copy=False)
        stream, arguments = sort("stream"), self._arguments(order)
        del order
        notes, device_ranges = classify(frame, stream)
        del stream
        set_column(frame, "end", ts + dur)
        release_freed_memory()  # classify's temporaries, before the tables' own
        return frame, notes, device_ranges, arguments

    def _arguments(self, order: np.ndarray) -> Arguments:
        """The kept arguments, keyed by each event's row in the sorted table."""
        if not self.sparse:
            return Arguments(np.empty(0, np.int64), {})
        # Where the few events with arguments went, without inverting the whole order (two int64
        # arrays of every event): mark them, and read the marks in sorted order.
        read_at = np.array([s[0] for s in self.sparse], dtype=np.int64)  # increasing: added in file order
        marked = np.zeros(len(order), dtype=bool)
        marked[read_at] = True
        rows = np.flatnonzero(marked[order])
        del marked
        by_row = np.searchsorted(read_at, order[rows])  # each sorted row's entry in self.sparse
        columns = {}
        for i, column in enumerate(ARGUMENT_COLUMNS, 1):
            # fromiter: shapes are nested lists, which np.array would turn into more dimensions.
            values = np.fromiter((s[i] for s in self.sparse), count=len(self.sparse),
                                 dtype=np.float64 if column in _NUMERIC_ARGUMENTS else object)
            columns[column] = values[by_row]
        return Arguments(rows, columns)

    def has_device_events(self) -> bool:
        """Whether any device event was read."""
        return bool(self.parts["stream"]) and bool((np.concatenate(self.parts["stream"]) >= 0).any())

    def launched(self) -> bool:
        """Whether any host call that puts work on a device was read."""
        return bool(self.parts["name"]) and bool(np.isin(np.concatenate(self.parts["name"]), self._launch_codes()).any())

    def _launch_codes(self) -> list[int]:
        return [code for code, name in enumerate(self.names.values) if _LAUNCH.search(name)]

    def launches_written_first(self) -> bool:
        """Whether every device event read so far (in file order) had its launch written before the first
        device event: then the launches announce all the device work, and one left unanswered shows where
        the cut's loss begins. Without device events there is nothing to vouch for."""
        if not self.parts["ts"]:
            return True
        stream, correlation = np.concatenate(self.parts["stream"]), np.concatenate(self.parts["correlation"])
        device = stream >= 0
        if not device.any():
            return True
        first = int(np.argmax(device))
        announced = np.isin(np.concatenate(self.parts["name"])[:first], self._launch_codes()) & (correlation[:first] >= 0)
        return bool(np.isin(correlation[device], correlation[:first][announced]).all())

    def _take(self, column: str) -> np.ndarray:
        """One column's pieces as one array; the pieces are let go."""
        parts = self.parts[column]
        self.parts[column] = []
        if len(parts) > 1:
            whole = np.concatenate(parts)
            del parts[:]
            release_freed_memory()  # the pieces are holes the whole column, mapped apart, never reuses
            return whole
        return parts[0] if parts else np.empty(0, np.float64 if column in ("ts", "dur") else np.int64)


_HOST_COLLECTIVE, _MATMUL = 1, 2  # what of an op's shapes is read
ARGUMENT_COLUMNS = ("collective", "dtype", "pg_name", "pg_desc", "input_dims", "input_type", "in_nelems", "group_size",
                    "peer")
_NUMERIC_ARGUMENTS = ("in_nelems", "group_size", "peer")


class _Dictionary:
    """Strings as small integer codes into one list for the whole trace (None: the empty string)."""

    def __init__(self) -> None:
        self.codes: dict[str | None, int] = {}
        self.values: list[str] = []

    def encode(self, strings: list[str | None]) -> np.ndarray:
        """The codes of ``strings``, new ones added to the list."""
        for value in dict.fromkeys(strings):  # the distinct ones, few
            if value not in self.codes:
                text = value if isinstance(value, str) else ""
                if text not in self.codes:
                    self.codes[text] = len(self.values)
                    self.values.append(text)
                self.codes[value] = self.codes[text]
        # As narrow as the strings so far: a piece's codes are held until the whole trace is read.
        return np.fromiter(map(self.codes.__getitem__, strings), code_dtype(len(self.values)), len(strings))


class _Unfit(Exception):
    """A number that does not fit its field: the file is read again event by event, and that event left out."""


def _integers(items: list[Any], field: Callable[[Any], Any]) -> np.ndarray:
    """Stream or correlation ids (``field`` of each of ``items``) as int64, -1 where there is none or it
    is not a number. Read straight into the array; the list of values is made only when one does not fit."""
    try:
        return np.fromiter(map(field, items), np.int64, len(items))
    except (TypeError, ValueError, OverflowError):  # a null, or a string that is not a number
        values = list(map(field, items))
        if any(type(v) in (int, float) and not fits_int64(v) for v in values):
            raise _Unfit from None
        return np.array([_int(v, -1) for v in values], dtype=np.int64)


def _narrow(values: np.ndarray) -> np.ndarray:
    """int64 ids as int32 when they fit (thread ids, lanes and correlations nearly always do): 4 bytes
    an event less."""
    if values.dtype == np.int64 and len(values) and np.iinfo(np.int32).min <= values.min() <= values.max() <= np.iinfo(np.int32).max:
        return values.astype(np.int32)
    return values


def _raw(value: msgspec.Raw) -> Any:
    return msgspec.json.decode(value) if len(value) else None


def _peer(concrete_inputs: msgspec.Raw) -> float:
    """The peer (rank within the call's group) a point-to-point call names; NaN when it names none."""
    if not len(concrete_inputs):
        return np.nan
    try:
        return float(int(msgspec.json.decode(concrete_inputs)[2]))
    except (msgspec.DecodeError, IndexError, KeyError, TypeError, ValueError, OverflowError):
        return np.nan  # a tracer that wrote no peer: the call still counts, without one


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        found = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return found if fits_int64(found) else default


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return np.nan



