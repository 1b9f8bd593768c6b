"""Load every rank's traces, in worker processes when they are big (one rank per worker), here or on a
Dask cluster (cluster.py); only summaries come back.

Input is a diagtrain run directory (``ranks/<r>/trace-*.json.gz``, several windows per rank, and
the flight-recorder dumps) or any folder of PyTorch Profiler traces, one file per rank, as
Holistic Trace Analysis takes them. Each worker reads one rank (:func:`load_rank`, the same work
wherever it runs), writes its timeline spans to ``analysis/cache/<key>/spans.parquet`` and its
summary there, and returns the per-step breakdown and the collectives.
A rank whose inputs did not change is taken from that cache without reading its traces again.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import signal
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer import breakdown as bd
from diagtrain.profiler.analyzer import intervals as iv
from diagtrain.profiler.analyzer import jobs
from diagtrain.profiler.analyzer import timeline
from diagtrain.profiler.analyzer.collectives import COLUMNS as COLLECTIVE_COLUMNS
from diagtrain.profiler.analyzer.collectives import rank_collectives
from diagtrain.profiler.analyzer.dialects import (
    COMM, COMPUTE, DATALOADER_SPAN, STEP_ANNOTATION, STREAMLESS_LANE, kind_in, name_matches,
)
from diagtrain.profiler.analyzer.flight_records import read_dump
from diagtrain.profiler.analyzer.flops import matmul_flops
from diagtrain.profiler.analyzer.inputs import Skipped, rank_number, reason
from diagtrain.profiler.analyzer.p2p import P2PCalls
from diagtrain.profiler.analyzer.p2p import summarize as summarize_p2p
from diagtrain.profiler.analyzer.trace_file import TraceError, TraceFile, device_time_known, read_trace
from diagtrain.profiler.analyzer.work_segments import COLUMNS as SEGMENT_COLUMNS
from diagtrain.profiler.analyzer.work_segments import rank_segments
from diagtrain.profiler.run_dir import write_json_atomic
from diagtrain.profiler.util.bounded_read import display
from diagtrain.profiler.util.frames import with_columns
from diagtrain.profiler.util.heap import arrow_on_the_c_heap, release_freed_memory
from diagtrain.profiler.util.parquet import write_parquet, write_parquet_pieces

TRACE_PATTERNS = ("*.json", "*.json.gz")
OWN_FILES = {"report.json", "manifest.json", "trainer.json", "injected.json"}  # diagtrain's, not traces
CACHE_VERSION = 8  # bump when what the cache holds changes
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.pt)?\.trace|(\d+)$")
# No profiled event lasts a week; longer (1e18 µs) or negative durations are corrupt, never used.
MAX_EVENT_US = 7 * 24 * 3600 * 1e6
WORKER_DIED = "the process reading it died (killed, or out of memory)"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PROGRESS_TICK_S = 0.25  # while ranks load in workers, progress is reported at least this often


@dataclass
class RankInput:
    """The files of one rank (a run directory's rank folder, or one trace file)."""

    key: str
    files: list[Path]
    rank_hint: int | None  # from the folder or file name
    flight_recorder: Path | None = None


@dataclass
class RankResult:
    """What a worker sends back for one rank: small tables and facts, never the events."""

    key: str
    rank: int
    rank_source: str  # distributedInfo | folder | file name
    files: list[str]
    backend: str | None
    world_size: int | None
    on_gpu: bool
    record_shapes: bool
    profile_memory: bool
    pg_config: list[dict]
    host_name: str | None
    breakdown: dict
    steps: pd.DataFrame
    collectives: pd.DataFrame
    health: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)  # how the traces' events were read: {check, severity, message}
    skipped: list[Skipped] = field(default_factory=list)  # this rank's trace files that could not be used
    p2p: P2PCalls = field(default_factory=P2PCalls)
    cached: bool = False
    # the work segments of each profiled step, the critical path's nodes (work_segments.py)
    segments: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SEGMENT_COLUMNS))


class UnreadableRank(Exception):
    """None of a rank's trace files could be used; ``skipped`` says why for each."""

    def __init__(self, skipped: list[Skipped]) -> None:
        super().__init__("; ".join(f"{s.path}: {s.reason}" for s in skipped))
        self.skipped = skipped

    def __reduce__(self) -> tuple:  # sent back from a worker: rebuilt from the list, not the message
        return UnreadableRank, (self.skipped,)


def discover(path: Path) -> tuple[list[RankInput], list[Skipped]]:
    """The rank inputs under ``path``: a run directory's ranks, else the trace files in it."""
    ranks_dir = path / "ranks"
    if ranks_dir.is_dir():
        inputs, skipped = [], []
        try:
            folders = [p for p in ranks_dir.iterdir() if rank_number(p.name) is not None and p.is_dir()]
        except OSError as e:
            return [], [Skipped(display(ranks_dir), f"cannot list ({e.strerror or e})")]
        for folder in sorted(folders, key=lambda p: int(p.name)):
            try:
                files = sorted(f for pattern in TRACE_PATTERNS for f in folder.glob("trace-" + pattern))
            except OSError as e:
                skipped.append(Skipped(display(folder), f"cannot list ({e.strerror or e})"))
                continue
            fr = folder / "flight_recorder.json"
            if files:
                inputs.append(RankInput(f"rank-{folder.name}", files, int(folder.name), fr if fr.exists() else None))
        return inputs, skipped
    files = sorted(f for pattern in TRACE_PATTERNS for f in path.glob(pattern) if f.name not in OWN_FILES)
    return [RankInput(_key(f), [f], _rank_from_name(f.name)) for f in files], []


@dataclass
class Cluster:
    """Worker processes of a cluster that load ranks (a Dask cluster's, cluster.py): tasks go to
    ``executor``; an exception of a ``lost`` type means every process that ran the task died."""

    executor: Executor
    lost: tuple[type[BaseException], ...]
    where: str  # for progress: " on the Dask cluster at tcp://..."


def load(inputs: list[RankInput], cache_root: Path, workers: int,
         progress: Callable[[str], None] = lambda _: None,
         cluster: Cluster | None = None) -> tuple[list[RankResult], list[Skipped]]:
    """Analyze each rank input on ``cluster`` when given, else in local worker processes when the traces
    are big enough to pay for them, else here one after the other; unreadable inputs and copies of one
    rank's trace are skipped. Every way runs :func:`load_rank`, so every way gives the same results.
    Inputs of different jobs raise :class:`~diagtrain.profiler.analyzer.jobs.MixedJobs`."""
    results, skipped = [], []
    started = time.monotonic()
    if cluster is not None:
        results, skipped, died = _load_on(cluster.executor, cluster.lost, inputs, cache_root,
                                          lambda done: progress(_loaded(done, len(inputs), started, cluster.where)))
        # the scheduler already gave each of these to other workers (distributed.scheduler.allowed-failures)
        skipped += [Skipped(display(item.files[0]), WORKER_DIED) for item in died]
    elif not _worth_a_pool(inputs, workers):
        for done, item in enumerate(inputs, 1):
            try:
                results.append(load_rank(item, cache_root))
            except Exception as e:  # noqa: BLE001 - the guard: one bad input is skipped, never the run
                skipped += _skipped(item, e)
            progress(_loaded(done, len(inputs), started))
    else:
        with _Pool(min(workers, len(inputs))) as pool:
            results, skipped, died = _load_on(pool, (BrokenProcessPool,), inputs, cache_root,
                                              lambda done: progress(_loaded(done, len(inputs), started)))
        for item in died:  # each alone, so only the input that kills its worker is lost
            result = _load_alone(item, cache_root)
            if isinstance(result, RankResult):
                results.append(result)
            else:
                skipped += result
    jobs.check_one_job(results)
    return _resolve_duplicates(sorted(results, key=lambda r: (r.rank, r.key)), skipped)


def _load_on(executor: Executor, lost: tuple[type[BaseException], ...], inputs: list[RankInput], cache_root: Path,
             progress: Callable[[int], None]) -> tuple[list[RankResult], list[Skipped], list[RankInput]]:
    """:func:`load_rank` of every input as a task on ``executor``: the results, the inputs skipped, and
    those whose worker died (a ``lost`` exception: this input, or another one beside it, killed it)."""
    results, skipped, died = [], [], []
    futures = {executor.submit(load_rank, item, cache_root): item for item in inputs}
    pending = set(futures)
    while pending:
        # A tick even while no rank finishes: the caller's progress is where it may stop (Ctrl-C).
        finished, pending = wait(pending, timeout=PROGRESS_TICK_S, return_when=FIRST_COMPLETED)
        for future in finished:
            item = futures.pop(future)  # its result is no longer held here once taken
            try:
                results.append(future.result())
            except lost:
                died.append(item)
            except Exception as e:  # noqa: BLE001 - the guard: one bad input is skipped, never the run
                skipped += _skipped(item, e)
        progress(len(inputs) - len(pending))
    return results, skipped, died


def _loaded(done: int, total: int, started: float, where: str = "") -> str:
    """The progress line while ranks load: how many, where, and how fast."""
    elapsed = time.monotonic() - started
    rate = f" ({done / elapsed:.1f} ranks/s)" if done and elapsed > 0 else ""
    return f"loaded {done}/{total} ranks{where}{rate}"


POOL_MIN_BYTES = 4 << 20  # compressed traces below this parse in ~0.3 s: starting workers would cost more


def _worth_a_pool(inputs: list[RankInput], workers: int) -> bool:
    """Whether loading ``inputs`` in worker processes beats loading them here, one after the other."""
    if workers <= 1 or len(inputs) <= 1:
        return False
    size = 0
    for item in inputs:
        for f in item.files:
            try:
                size += f.stat().st_size
            except OSError:
                pass  # its loader reports it
    return size >= POOL_MIN_BYTES


class _Pool(ProcessPoolExecutor):
    """Workers that leave Ctrl-C to the analysis, which stops them at once (not after every queued rank)."""

    def __init__(self, workers: int) -> None:
        super().__init__(max_workers=workers, initializer=_worker_start)

    def __exit__(self, exc_type: type | None, *exc: object) -> bool | None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.shutdown(wait=False, cancel_futures=True)
            for process in list((self._processes or {}).values()):  # the running ones: no use finishing them
                process.terminate()
        return super().__exit__(exc_type, *exc)


def _worker_start() -> None:
    """In each worker: Ctrl-C is the analysis' to handle, and the worker ends with it even if it is killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: SIGKILL this worker when its parent dies; elsewhere, a killed analysis may leave it waiting
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _load_alone(item: RankInput, cache_root: Path) -> RankResult | list[Skipped]:
    try:
        with _Pool(1) as pool:
            return pool.submit(load_rank, item, cache_root).result()
    except BrokenProcessPool:
        return [Skipped(display(item.files[0]), WORKER_DIED)]
    except Exception as e:  # noqa: BLE001 - the guard, as in load()
        return _skipped(item, e)


def _skipped(item: RankInput, error: BaseException) -> list[Skipped]:
    if isinstance(error, UnreadableRank):
        return error.skipped
    return [Skipped(display(item.files[0]), reason(error, item.files[0]))]


def _resolve_duplicates(results: list[RankResult], skipped: list[Skipped]) -> tuple[list[RankResult], list[Skipped]]:
    skipped = skipped + [s for r in results for s in r.skipped]  # bad windows of ranks otherwise read
    kept: dict[int, RankResult] = {}
    unranked = [r for r in results if r.rank < 0]
    for result in [r for r in results if r.rank >= 0]:
        if result.rank in kept:
            skipped.append(Skipped(", ".join(result.files),
                                   f"claims rank {result.rank}, which {', '.join(kept[result.rank].files)} already claims"))
        else:
            kept[result.rank] = result
    for result in unranked:  # a lone trace without rank facts: give it the lowest free rank
        result.rank = next(r for r in range(len(results) + 1) if r not in kept)
        result.warnings = [f"{w}; analyzed as rank {result.rank}" for w in result.warnings]
        result.steps["rank"] = result.rank
        result.collectives["rank"] = result.rank
        result.segments["rank"] = result.rank
        kept[result.rank] = result
    return sorted(kept.values(), key=lambda r: r.rank), skipped


def load_rank(item: RankInput, cache_root: Path) -> RankResult:
    """Read one rank's traces (or its cache) and compute its steps, breakdown and collectives."""
    arrow_on_the_c_heap()  # in whichever process loads it: a pool's worker, a Dask worker, the analysis
    cache = cache_root / item.key
    signature = _signature(item)
    cached = _read_cache(cache, signature)
    if cached is not None:
        return cached
    traces, impossible, skipped = _read_traces(item)
    first = traces[0]
    rank, source, notes = _rank_of(first, item)
    events, base_us = _rank_events(traces)
    fr = _flight_recorder(item)
    on_gpu = any(t.on_gpu for t in traces)
    timed = device_time_known(events)
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
    written = _write_spans(cache, traces, on_gpu)
    del traces, first  # the events: only the rank's results are written
    release_freed_memory()
    if written:
        _write_cache(cache, signature, result)
    return result


def _released(value: object) -> object:
    """A stage's result, once the stage's freed temporaries went back to the operating system."""
    release_freed_memory()
    return value


def _write_spans(cache: Path, traces: list[TraceFile], on_gpu: bool) -> bool:
    """Write the rank's timeline spans a piece at a time, as they are made (never all of them held);
    False where the cache cannot be written (the analysis then goes on without it)."""
    pieces = (piece for t in traces for piece in timeline.span_pieces(t.events, on_gpu, t.epoch_offset_us))
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_parquet_pieces(cache / "spans.parquet", pieces)
        return True
    except OSError:
        return False


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


def spans_path(cache_root: Path, result: RankResult) -> Path:
    """Where the worker wrote this rank's timeline spans."""
    return cache_root / result.key / "spans.parquet"


def step_breakdown(events: pd.DataFrame, rank: int, on_gpu: bool, timed: bool = True,
                   work: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ProfilerStep#N: wall time and compute / communication / idle within it (µs), the wait for
    data inside DataLoader spans and the matrix multiplies' GFLOPs (``work``: ts, flops; see
    _matmul_work); only the wall time of the device's part when the device's work is not timed
    (``timed`` false on a GPU trace)."""
    host = (events["stream"] < 0).to_numpy()
    annotations = events[host & name_matches(events["name"], STEP_ANNOTATION)]
    loading = events[host & name_matches(events["name"], DATALOADER_SPAN)]
    waiting_for_data = iv.merge(loading["ts"].to_numpy(), loading["end"].to_numpy())
    starts, flops = (work["ts"].to_numpy(), work["flops"].to_numpy()) if work is not None else (np.empty(0),) * 2
    bounds = list(zip(annotations["ts"], annotations["end"]))
    broken_down = bd.breakdowns(events, on_gpu, bounds) if timed or not on_gpu else None
    rows = []
    for i, (name, (start, end)) in enumerate(zip(annotations["name"].astype(str), bounds)):
        step = int(STEP_ANNOTATION.match(name).group(1))
        if broken_down is None:
            fields = {**dict.fromkeys(_STEP_FIELDS, math.nan), "wall_us": end - start}
        else:
            fields = _step_fields(broken_down[i])
        # A step that never asked a DataLoader for a batch has no data time, not zero.
        data = iv.length(iv.clip(waiting_for_data, start, end)) if len(loading) else np.nan
        # Shapes unrecorded: the work is unknown, not zero.
        gflops = float(flops[(starts >= start) & (starts < end)].sum()) / 1e9 if len(flops) else np.nan
        rows.append({"rank": rank, "step": step, "start_us": start, "end_us": end, **fields, "data_us": data,
                     "gflops": gflops})
    # Typed even without rows (a window cut before its first step ended): an empty table of object
    # columns turned every rank's joined step times into objects.
    return pd.DataFrame(rows, columns=list(_STEP_TABLE)).astype(_STEP_TABLE)


_STEP_TABLE = {"rank": "int64", "step": "int64", **dict.fromkeys(
    ("start_us", "end_us", "wall_us", "compute_us", "comm_us", "exposed_comm_us", "overlapped_comm_us", "idle_us",
     "data_us", "gflops"), "float64")}


_STEP_FIELDS = ("wall_us", "compute_us", "comm_us", "exposed_comm_us", "overlapped_comm_us", "idle_us")


def _step_fields(b: bd.Breakdown) -> dict:
    return {"wall_us": b.total_us, "compute_us": b.compute_us, "comm_us": b.comm_us,
            "exposed_comm_us": b.exposed_comm_us, "overlapped_comm_us": b.overlapped_comm_us, "idle_us": b.idle_us}


def _rank_of(trace: TraceFile, item: RankInput) -> tuple[int, str, list[str]]:
    if rank_number(trace.world_size) is None:
        trace.world_size = None  # 0, negative or beyond any job: unknown
    if trace.rank is not None and rank_number(trace.rank) is None:
        trace.rank = None  # impossible: the folder or file name says which rank this is
    if trace.rank is not None:
        return trace.rank, "distributedInfo", []
    if item.rank_hint is not None:
        where = "folder" if item.key.startswith("rank-") else "file name"
        return item.rank_hint, where, [f"{item.files[0]}: no distributedInfo; rank {item.rank_hint} taken from the {where}"]
    return -1, "assigned", [f"{item.files[0]}: no distributedInfo and no rank number in its name"]


def _read_traces(item: RankInput) -> tuple[list[TraceFile], int, list[Skipped]]:
    """The rank's readable traces, how many impossible events they lost, and the files skipped."""
    traces, impossible, skipped = [], 0, []
    for f in item.files:
        try:
            trace = read_trace(f)
            impossible += _drop_impossible(trace)
        except Exception as e:  # noqa: BLE001 - the guard: a bad window leaves the rank's other windows
            skipped.append(Skipped(display(f), reason(e, f)))
            continue
        trace.pg_config = _clean_pg_config(trace.pg_config)
        traces.append(trace)
    if not traces:
        raise UnreadableRank(skipped)
    return traces, impossible, skipped


def _drop_impossible(trace: TraceFile) -> int:
    """Leave out events whose time is impossible (negative, longer than a week, not finite); how many."""
    ts, dur = trace.events["ts"].to_numpy(), trace.events["dur"].to_numpy()
    ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (dur <= MAX_EVENT_US)
    if ok.all():
        return 0
    if not ok.any():
        raise TraceError(f"{display(trace.path)}: every event has an impossible time (negative, longer than a "
                         "week, or not a number)")
    trace.keep(ok)
    return int((~ok).sum())


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
        notes.append(f"{impossible} events with impossible times (negative, longer than a week, or not a number) "
                     "were left out")
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


def _rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    if m:
        return rank_number(m.group(1))
    stem = name.split(".")[0]
    m = re.search(r"(\d+)$", stem)
    return rank_number(m.group(1)) if m else None


def _key(path: Path) -> str:
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", path.name)
    if key != path.name:  # two names that differ only in replaced characters keep separate caches
        key += "-" + hashlib.sha256(os.fsencode(path.name)).hexdigest()[:8]
    return key


def _signature(item: RankInput) -> str:
    parts = [f"v{CACHE_VERSION}"]
    for f in [*item.files, *([item.flight_recorder] if item.flight_recorder else [])]:
        try:
            st = f.stat()
        except OSError as e:  # a dangling or looping link: its read says so; the signature just differs
            parts.append(f"{display(f)}:{e.errno}")
            continue
        parts.append(f"{display(f)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _read_cache(cache: Path, signature: str) -> RankResult | None:
    try:
        meta = json.loads((cache / "summary.json").read_text())
        if meta.get("signature") != signature:
            return None
        steps = pd.read_parquet(cache / "steps.parquet")
        collectives = pd.read_parquet(cache / "collectives.parquet")
        segments = pd.read_parquet(cache / "segments.parquet")
        members = {pg: tuple(int(r) for r in ranks) for pg, ranks in meta.get("groups", {}).items()}
        if "pg" in collectives:
            collectives["group_ranks"] = [members.get(str(pg), ()) for pg in collectives["pg"]]
        fields = {k: v for k, v in meta.items() if k not in ("signature", "skipped", "segments", "p2p", "groups")}
        skipped = [Skipped(**s) for s in meta.get("skipped") or []]
        return RankResult(**fields, steps=steps, collectives=collectives, skipped=skipped, cached=True,
                          segments=segments, p2p=P2PCalls.from_json(meta.get("p2p") or {}))
    except Exception:  # noqa: BLE001 - a cache from another version, or damaged: read the traces again
        return None


def _write_cache(cache: Path, signature: str, result: RankResult) -> None:
    """The rank's results beside its spans, and last the summary that makes them a cache of its traces."""
    try:
        meta = {k: v for k, v in asdict(result).items() if k not in ("steps", "collectives", "cached", "segments")}
        # A group's members once, not on each of its rows (a row per collective, a member per rank).
        collectives = result.collectives
        if "group_ranks" in collectives:
            first = collectives.drop_duplicates("pg")
            meta["groups"] = {str(pg): [int(r) for r in ranks] for pg, ranks in zip(first["pg"], first["group_ranks"])}
            collectives = collectives.drop(columns="group_ranks")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_parquet(cache / "steps.parquet", result.steps)
            write_parquet(cache / "collectives.parquet", collectives)
            write_parquet(cache / "segments.parquet", result.segments)
        write_json_atomic(cache / "summary.json", {**meta, "signature": signature})
    except OSError:
        pass  # a read-only place: analysis still works, only without a cache

