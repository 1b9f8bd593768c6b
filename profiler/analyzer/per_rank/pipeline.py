"""One rank, start to end: its traces read, its steps, breakdown, collectives, point-to-point calls and
work segments computed, its spans and results written to its cache (:func:`load_rank`).

The same work wherever it runs: here, in a local worker process, or as a task on a Dask cluster
(whose tasks are named after :func:`load_rank`). Memory is released after each stage, so a worker's
peak is one stage's, not the sum of them.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.per_rank import breakdown as bd
from diagtrain.profiler.analyzer.per_rank import cache as rank_cache
from diagtrain.profiler.analyzer.per_rank.collectives import COLUMNS as COLLECTIVE_COLUMNS
from diagtrain.profiler.analyzer.per_rank.collectives import rank_collectives
from diagtrain.profiler.analyzer.per_rank.p2p import summarize as summarize_p2p
from diagtrain.profiler.analyzer.per_rank.reading import in_force
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.per_rank.steps import step_breakdown
from diagtrain.profiler.analyzer.per_rank.work_segments import COLUMNS as SEGMENT_COLUMNS
from diagtrain.profiler.analyzer.per_rank.work_segments import rank_segments
from diagtrain.profiler.analyzer.read.dialects import COMM, COMPUTE, STREAMLESS_LANE, kind_in
from diagtrain.profiler.analyzer.read.discover import RankInput
from diagtrain.profiler.analyzer.read.event_checks import MAX_EVENT_US, usable_times  # noqa: F401 - MAX_EVENT_US re-exported
from diagtrain.profiler.analyzer.read.flight_records import read_dump
from diagtrain.profiler.analyzer.read.flops import matmul_flops
from diagtrain.profiler.analyzer.read.inputs import Skipped, rank_number, reason
from diagtrain.profiler.analyzer.read.trace_file import TraceError, TraceFile, device_time_known, read_trace
from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.util import settings
from diagtrain.profiler.util.bounded_read import display
from diagtrain.profiler.util.frames import with_columns
from diagtrain.profiler.util.heap import arrow_on_the_c_heap, release_freed_memory


class UnreadableRank(Exception):
    """None of a rank's trace files could be used; ``skipped`` says why for each."""

    def __init__(self, skipped: list[Skipped]) -> None:
        super().__init__("; ".join(f"{s.path}: {s.reason}" for s in skipped))
        self.skipped = skipped

    def __reduce__(self) -> tuple:  # sent back from a worker: rebuilt from the list, not the message
        return UnreadableRank, (self.skipped,)


def load_rank(item: RankInput, cache_root: Path, reading: dict[str, Any] | None = None) -> RankResult:
    """Read one rank's traces (or its cache) and compute its steps, breakdown and collectives, with the reading
    settings ``reading`` (reading.in_force() of the analysis that asks; default: those in force here)."""
    if reading is None:
        return _load_rank(item, cache_root)
    with settings.overriding({"reading": reading}):  # a worker process does not see the analysis' overrides
        return _load_rank(item, cache_root)


def _load_rank(item: RankInput, cache_root: Path) -> RankResult:
    arrow_on_the_c_heap()  # in whichever process loads it: a pool's worker, a Dask worker, the analysis
    cache = cache_root / item.key
    signature = rank_cache.signature(item, in_force())
    cached = rank_cache.read_cache(cache, signature)
    if cached is not None:
        return cached
    traces, impossible, skipped = _read_traces(item)
    first = traces[0]
    rank, source, notes = _rank_of(first, item)
    events, base_us = _rank_events(traces)
    fr = _flight_recorder(item)
    on_gpu = any(t.on_gpu for t in traces)
    # A cut trace whose lost device work may lie anywhere in its window has no known device time.
    timed = device_time_known(events) and not any(t.device_time_unknown for t in traces)
    comm = [t.comm_events() for t in traces]
    collectives = pd.concat([rank_collectives(c, rank, t.epoch_offset_us, t.pg_config, fr,
                                              host=t.events) for t, c in zip(traces, comm)],
                            ignore_index=True) if traces else pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    p2p = summarize_p2p(events, pd.concat([_moved(c, t.epoch_offset_us - base_us) for t, c in zip(traces, comm)],
                                          ignore_index=True))
    del comm  # the communication events and their arguments: not held through the stages below
    release_freed_memory()  # each stage's temporaries, before the next stage's: the worker's peak is one stage's
    if on_gpu:  # a GPU job's host ops are not its compute: without timed device work, its breakdown is unknown
        whole = asdict(bd.gpu_breakdown(first.events)) if timed else {}
    else:
        whole = asdict(bd.cpu_breakdown(events, (events["ts"].min(), events["end"].max())))
    work = _released(_matmul_work(traces, base_us))
    steps = _released(_moved(step_breakdown(events, rank, on_gpu, timed, work), base_us, _STEP_TIMES))
    health = _released(_health(events, impossible))
    segments = _released(_moved(_segments(events, rank, on_gpu, timed), base_us, _STEP_TIMES))
    result = RankResult(
        key=item.key, rank=rank, rank_source=source, files=[display(t.path) for t in traces],
        backend=first.backend, world_size=first.world_size, on_gpu=on_gpu,
        record_shapes=all(t.record_shapes for t in traces), profile_memory=all(t.profile_memory for t in traces),
        pg_config=first.pg_config, host_name=first.host_name, breakdown=whole, steps=steps,
        collectives=collectives, health=health, warnings=notes,
        notes=[n for t in traces for n in t.notes], skipped=skipped, segments=segments, p2p=p2p,
    )
    del events
    release_freed_memory()
    written = rank_cache.write_spans(cache, traces, on_gpu)
    del traces, first  # the events: only the rank's results are written
    release_freed_memory()
    if written:
        rank_cache.write_cache(cache, signature, result)
    return result


def skipped_by(item: RankInput, error: BaseException) -> list[Skipped]:
    """What a failed :func:`load_rank` of ``item`` leaves: the files it could not use, and why."""
    if isinstance(error, UnreadableRank):
        return error.skipped
    return [Skipped(display(item.files[0]), reason(error, item.files[0]))]


def _released(value: object) -> object:
    """A stage's result, once the stage's freed temporaries went back to the operating system."""
    release_freed_memory()
    return value


def _segments(events: pd.DataFrame, rank: int, on_gpu: bool, timed: bool) -> pd.DataFrame:
    """The rank's work segments; none when its events defeat them (the critical path is extra: the
    rank's other results stand)."""
    try:
        return rank_segments(events, rank, on_gpu, timed)
    except Exception:  # noqa: BLE001 - the guard: the report says the critical path is unavailable
        return pd.DataFrame(columns=SEGMENT_COLUMNS)


_STEP_COLUMNS = ["name", "cat", "ts", "dur", "end", "stream", "kind"]  # what the step and rank breakdowns read


def _rank_events(traces: list[TraceFile]) -> tuple[pd.DataFrame, int]:
    """The columns the breakdowns read, of every trace of the rank, on one clock: µs after the first
    trace's epoch offset (returned). One window, most ranks, is then its own columns, uncopied: an
    epoch copy of the times would be 16 bytes an event held through every stage."""
    base_us = traces[0].epoch_offset_us
    return _joined([_moved(t.events[_STEP_COLUMNS], t.epoch_offset_us - base_us) for t in traces]), base_us


def _joined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One table of the rank's windows: the only one as it is (most ranks have one)."""
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


_EVENT_TIMES, _STEP_TIMES = ("ts", "end"), ("start_us", "end_us")  # the time columns of events, of per-step tables


def _moved(frame: pd.DataFrame, by_us: int, columns: tuple[str, str] = _EVENT_TIMES) -> pd.DataFrame:
    """``frame`` with its time ``columns`` ``by_us`` later (exact: offsets are whole µs); ``frame`` itself
    when by nothing. The rank's clock to the Unix one, or one window's onto another's."""
    if not by_us or frame.empty:
        return frame
    return with_columns(frame, **{c: frame[c].to_numpy() + by_us for c in columns})


def _matmul_work(traces: list[TraceFile], base_us: int) -> pd.DataFrame | None:
    """The rank's matrix multiplies with recorded shapes: start (µs after ``base_us``) and FLOPs; None
    when no trace recorded any (the work is then unknown)."""
    frames = []
    for t in traces:
        shaped = t.shaped_events()
        flops = matmul_flops(shaped)
        counted = flops > 0
        frames.append(pd.DataFrame({"ts": shaped["ts"].to_numpy()[counted] + (t.epoch_offset_us - base_us),
                                    "flops": flops[counted]}))
    work = pd.concat(frames, ignore_index=True) if frames else None
    return work if work is not None and len(work) else None


def _rank_of(trace: TraceFile, item: RankInput) -> tuple[int, str, list[str]]:
    if rank_number(trace.world_size) is None:
        trace.world_size = None  # 0, negative or beyond any job: unknown
    if trace.rank is not None and rank_number(trace.rank) is None:
        trace.rank = None  # impossible: the folder or file name says which rank this is
    if trace.rank is not None:
        return trace.rank, "distributedInfo", []
    if item.rank_hint is not None:
        where = "folder" if item.key.startswith("rank-") else "file name"
        why = item.rank_why or f"its {where}"
        return item.rank_hint, where, [f"{item.files[0]}: no distributedInfo; rank {item.rank_hint} taken from {why}"]
    why = item.rank_why or "its name holds no rank"
    return -1, "assigned", [f"{item.files[0]}: no distributedInfo, and {why}"]


def _read_traces(item: RankInput) -> tuple[list[TraceFile], int, list[Skipped]]:
    """The rank's readable traces, how many impossible events they lost, and the files skipped."""
    traces, impossible, skipped = [], 0, []
    for f in item.files:
        try:
            trace = read_trace(f)
            impossible += _drop_impossible(trace)
            _clip_to_complete(trace)
        except Exception as e:  # noqa: BLE001 - the guard: a bad window leaves the rank's other windows
            skipped.append(Skipped(display(f), reason(e, f)))
            continue
        if trace.cut and trace.complete_until_us is not None:  # used, in part: listed with what is missing
            skipped.append(Skipped(display(f), f"the file {trace.cut}: only the events before the cut are used"))
        trace.pg_config = _clean_pg_config(trace.pg_config)
        traces.append(trace)
    if not traces:
        raise UnreadableRank(skipped)
    return traces, impossible, skipped


def _drop_impossible(trace: TraceFile) -> int:
    """Leave out events whose time is impossible (negative, longer than a week, not finite, out of range); how many."""
    ok = usable_times(trace.events["ts"].to_numpy(), trace.events["dur"].to_numpy())
    if ok.all():
        return 0
    if not ok.any():
        raise TraceError(f"{display(trace.path)}: every event has an impossible time (negative, longer than a "
                         "week, or not a number)")
    trace.keep(ok)
    return int((~ok).sum())


def _clip_to_complete(trace: TraceFile) -> None:
    """A trace cut short ends where its evidence does (``complete_until_us``): host spans that end later
    and device work that starts later are left out, and device work running across the end is cut at
    it, so that what the cut lost (kernels of steps whose annotations were written) is no idle time."""
    until = trace.complete_until_us
    if until is None:
        return
    events = trace.events
    device = events["stream"].to_numpy() >= 0
    # Device work that started before the end was launched before it: all of it was written.
    trace.keep(np.where(device, events["ts"].to_numpy() < until, events["end"].to_numpy() <= until))
    end = np.minimum(trace.events["end"].to_numpy(), until)
    trace.events = with_columns(trace.events, end=end, dur=end - trace.events["ts"].to_numpy())


def _clean_pg_config(groups: list) -> list[dict]:
    """distributedInfo's process groups, each an object whose ``ranks`` are integers (else unknown)."""
    clean = []
    for g in groups:
        if isinstance(g, dict):
            ranks = g.get("ranks")
            ok = isinstance(ranks, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
            clean.append({**g, "ranks": ranks if ok else []})
    return clean


def _flight_recorder(item: RankInput) -> dict | None:
    """The rank's dump for naming its gloo collectives; a bad one is reported once, by the tables."""
    if item.flight_recorder is None:
        return None
    try:
        return read_dump(item.flight_recorder)
    except Exception:  # noqa: BLE001 - tables.build reads the same file behind the guard and skips it
        return None


def _health(events: pd.DataFrame, impossible: int) -> list[str]:
    notes = []
    if impossible:
        notes.append(f"{impossible} events with impossible times (negative, longer than a week, out of range or not a "
                     "number) were left out")
    overlapping = _overlapping_kernels(events)
    if overlapping:
        notes.append(f"{overlapping} kernels start before the previous kernel on their stream ends")
    return notes


def _overlapping_kernels(events: pd.DataFrame) -> int:
    """How many kernels start before the kernel before them on their stream ends, a piece of the
    trace at a time. Kernels on one stream run one after the other; copies need not (MTIA streams
    have several DMA engines)."""
    stream, ts, end = events["stream"].to_numpy(), events["ts"].to_numpy(), events["end"].to_numpy()
    kernels = (stream >= 0) & (stream != STREAMLESS_LANE) & kind_in(events, COMPUTE, COMM)
    last_end: dict[int, float] = {}  # of each stream's last kernel in the pieces before
    overlapping = 0
    for rows in iv.pieces(ts, kernels):
        if not len(rows):
            continue
        lanes = stream[rows]
        by_lane = np.argsort(lanes, kind="stable")  # a stream's kernels together, still in time order
        lanes, starts, ends = lanes[by_lane], ts[rows][by_lane], end[rows][by_lane]
        firsts = np.flatnonzero(np.concatenate([[True], lanes[1:] != lanes[:-1]]))
        previous = np.concatenate([[np.nan], ends[:-1]])
        previous[firsts] = [last_end.get(lane, -np.inf) for lane in lanes[firsts].tolist()]
        overlapping += int((starts < previous - 1e-3).sum())
        lasts = np.concatenate([firsts[1:], [len(lanes)]]) - 1
        last_end.update(zip(lanes[firsts].tolist(), ends[lasts].tolist()))
    return overlapping
