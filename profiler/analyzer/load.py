"""Load every rank's traces in parallel, one rank per worker; only summaries come back.

Input is a diagtrain run directory (``ranks/<r>/trace-*.json.gz``, several windows per rank, and
the flight-recorder dumps) or any folder of PyTorch Profiler traces, one file per rank, as
Holistic Trace Analysis takes them. Each worker reads one rank, writes its event table to
``analysis/cache/<key>/events.parquet`` and its timeline spans to ``spans.parquet`` there, and
returns the per-step breakdown and the collectives.
A rank whose inputs did not change is taken from that cache without reading its traces again.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from diagtrain.profiler.analyzer import breakdown as bd
from diagtrain.profiler.analyzer import timeline
from diagtrain.profiler.analyzer.collectives import COLUMNS as COLLECTIVE_COLUMNS
from diagtrain.profiler.analyzer.collectives import rank_collectives
from diagtrain.profiler.analyzer.trace_file import STEP_ANNOTATION, TraceError, TraceFile, name_matches, read_trace
from diagtrain.profiler.run_dir import write_bytes_atomic, write_json_atomic

TRACE_PATTERNS = ("*.json", "*.json.gz")
OWN_FILES = {"report.json", "manifest.json", "trainer.json", "injected.json"}  # diagtrain's, not traces
CACHE_VERSION = 3  # bump when what the cache holds changes
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.pt)?\.trace|(\d+)$")
# Columns that are Python objects (shapes); the cached event table leaves them out.
_OBJECT_COLUMNS = ("input_dims", "input_type", "collective", "dtype", "pg_name", "pg_desc")


@dataclass
class Skipped:
    """An input that could not be used, and why."""

    path: str
    reason: str


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
    cached: bool = False


def discover(path: Path) -> tuple[list[RankInput], list[Skipped]]:
    """The rank inputs under ``path``: a run directory's ranks, else the trace files in it."""
    ranks_dir = path / "ranks"
    if ranks_dir.is_dir():
        inputs = []
        for folder in sorted((p for p in ranks_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
            files = sorted(f for pattern in TRACE_PATTERNS for f in folder.glob("trace-" + pattern))
            fr = folder / "flight_recorder.json"
            if files:
                inputs.append(RankInput(f"rank-{folder.name}", files, int(folder.name), fr if fr.exists() else None))
        return inputs, []
    files = sorted(f for pattern in TRACE_PATTERNS for f in path.glob(pattern) if f.name not in OWN_FILES)
    return [RankInput(_key(f), [f], _rank_from_name(f.name)) for f in files], []


def load(inputs: list[RankInput], cache_root: Path, workers: int,
         progress: Callable[[str], None] = lambda _: None) -> tuple[list[RankResult], list[Skipped]]:
    """Analyze each rank input in a process pool; conflicting or unreadable inputs are skipped."""
    results, skipped = [], []
    if len(inputs) <= 1 or workers <= 1:  # a pool's start-up would cost more than it saves
        for done, item in enumerate(inputs, 1):
            try:
                results.append(load_rank(item, cache_root))
            except TraceError as e:
                skipped.append(Skipped(str(item.files[0]), str(e)))
            progress(f"loaded {done}/{len(inputs)} ranks")
        return _resolve_duplicates(sorted(results, key=lambda r: (r.rank, r.key)), skipped)
    with ProcessPoolExecutor(max_workers=min(workers, len(inputs))) as pool:
        futures = {pool.submit(load_rank, item, cache_root): item for item in inputs}
        for done, future in enumerate(as_completed(futures), 1):
            item = futures[future]
            try:
                results.append(future.result())
            except TraceError as e:
                skipped.append(Skipped(str(item.files[0]), str(e)))
            progress(f"loaded {done}/{len(inputs)} ranks")
    return _resolve_duplicates(sorted(results, key=lambda r: (r.rank, r.key)), skipped)


def _resolve_duplicates(results: list[RankResult], skipped: list[Skipped]) -> tuple[list[RankResult], list[Skipped]]:
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
        kept[result.rank] = result
    return sorted(kept.values(), key=lambda r: r.rank), skipped


def load_rank(item: RankInput, cache_root: Path) -> RankResult:
    """Read one rank's traces (or its cache) and compute its steps, breakdown and collectives."""
    cache = cache_root / item.key
    signature = _signature(item)
    cached = _read_cache(cache, signature)
    if cached is not None:
        return cached
    traces = [read_trace(f) for f in item.files]
    first = traces[0]
    rank, source, notes = _rank_of(first, item)
    events = pd.concat([t.events.assign(ts=t.events["ts"] + t.epoch_offset_us, end=t.events["end"] + t.epoch_offset_us)
                        for t in traces], ignore_index=True)  # epoch µs (exact: offsets are whole µs)
    fr = json.loads(item.flight_recorder.read_text()) if item.flight_recorder else None
    on_gpu = bool((events["stream"] >= 0).any())
    collectives = pd.concat([rank_collectives(t.events, rank, t.epoch_offset_us, t.pg_config, fr) for t in traces],
                            ignore_index=True) if traces else pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    whole = bd.gpu_breakdown(first.events) if on_gpu else bd.cpu_breakdown(events, (events["ts"].min(), events["end"].max()))
    result = RankResult(
        key=item.key, rank=rank, rank_source=source, files=[str(f) for f in item.files],
        backend=first.backend, world_size=first.world_size, on_gpu=on_gpu,
        record_shapes=all(t.record_shapes for t in traces), profile_memory=all(t.profile_memory for t in traces),
        pg_config=first.pg_config, host_name=first.host_name, breakdown=asdict(whole), steps=step_breakdown(events, rank, on_gpu),
        collectives=collectives, health=_health(events, item), warnings=notes,
    )
    spans = pd.concat([timeline.spans(t.events, on_gpu).pipe(_shift, t.epoch_offset_us) for t in traces],
                      ignore_index=True)
    _write_cache(cache, signature, result, events, spans)
    return result


def spans_path(cache_root: Path, result: RankResult) -> Path:
    """Where the worker wrote this rank's timeline spans."""
    return cache_root / result.key / "spans.parquet"


def _shift(spans: pd.DataFrame, offset_us: int) -> pd.DataFrame:
    return spans.assign(start_us=spans["start_us"] + offset_us, end_us=spans["end_us"] + offset_us)


def step_breakdown(events: pd.DataFrame, rank: int, on_gpu: bool) -> pd.DataFrame:
    """Per ProfilerStep#N: wall time and compute / communication / idle within it (µs)."""
    annotations = events[(events["stream"] < 0).to_numpy() & name_matches(events["name"], STEP_ANNOTATION)]
    rows = []
    for name, start, end in zip(annotations["name"].astype(str), annotations["ts"], annotations["end"]):
        step = int(STEP_ANNOTATION.match(name).group(1))
        inside = events[(events["ts"] < end) & (events["end"] > start)]
        b = bd.gpu_breakdown_in(inside, (start, end)) if on_gpu else bd.cpu_breakdown(inside, (start, end))
        rows.append({"rank": rank, "step": step, "start_us": start, "end_us": end, **_step_fields(b)})
    return pd.DataFrame(rows, columns=["rank", "step", "start_us", "end_us", "wall_us", "compute_us", "comm_us",
                                       "exposed_comm_us", "overlapped_comm_us", "idle_us"])


def _step_fields(b: bd.Breakdown) -> dict:
    return {"wall_us": b.total_us, "compute_us": b.compute_us, "comm_us": b.comm_us,
            "exposed_comm_us": b.exposed_comm_us, "overlapped_comm_us": b.overlapped_comm_us, "idle_us": b.idle_us}


def _rank_of(trace: TraceFile, item: RankInput) -> tuple[int, str, list[str]]:
    if trace.rank is not None:
        return trace.rank, "distributedInfo", []
    if item.rank_hint is not None:
        where = "folder" if item.key.startswith("rank-") else "file name"
        return item.rank_hint, where, [f"{item.files[0]}: no distributedInfo; rank {item.rank_hint} taken from the {where}"]
    return -1, "assigned", [f"{item.files[0]}: no distributedInfo and no rank number in its name"]


def _health(events: pd.DataFrame, item: RankInput) -> list[str]:
    notes = []
    negative = int((events["dur"] < 0).sum())
    if negative:
        notes.append(f"{negative} events with negative duration")
    gpu = events[events["stream"] >= 0].sort_values(["stream", "ts"])
    same_stream = gpu["stream"].to_numpy()[1:] == gpu["stream"].to_numpy()[:-1]
    overlapping = int((same_stream & (gpu["ts"].to_numpy()[1:] < gpu["end"].to_numpy()[:-1] - 1e-3)).sum())
    if overlapping:
        notes.append(f"{overlapping} kernels start before the previous kernel on their stream ends")
    return notes


def _rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    if m:
        return int(m.group(1))
    stem = name.split(".")[0]
    m = re.search(r"(\d+)$", stem)
    return int(m.group(1)) if m else None


def _key(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.name)


def _signature(item: RankInput) -> str:
    parts = [f"v{CACHE_VERSION}"]
    for f in [*item.files, *([item.flight_recorder] if item.flight_recorder else [])]:
        st = f.stat()
        parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _read_cache(cache: Path, signature: str) -> RankResult | None:
    try:
        meta = json.loads((cache / "summary.json").read_text())
        if meta.get("signature") != signature:
            return None
        steps = pd.read_parquet(cache / "steps.parquet")
        collectives = pd.read_parquet(cache / "collectives.parquet")
    except (OSError, ValueError):
        return None
    collectives["group_ranks"] = collectives["group_ranks"].map(lambda r: tuple(int(x) for x in r))
    fields = {k: v for k, v in meta.items() if k != "signature"}
    return RankResult(**fields, steps=steps, collectives=collectives, cached=True)


def _write_cache(cache: Path, signature: str, result: RankResult, events: pd.DataFrame, spans: pd.DataFrame) -> None:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        meta = {k: v for k, v in asdict(result).items() if k not in ("steps", "collectives", "cached")}
        collectives = result.collectives.assign(group_ranks=result.collectives["group_ranks"].map(list))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_bytes_atomic(cache / "events.parquet", events.drop(columns=list(_OBJECT_COLUMNS)).to_parquet(index=False))
            write_bytes_atomic(cache / "spans.parquet", spans.to_parquet(index=False))
            write_bytes_atomic(cache / "steps.parquet", result.steps.to_parquet(index=False))
            write_bytes_atomic(cache / "collectives.parquet", collectives.to_parquet(index=False))
        write_json_atomic(cache / "summary.json", {**meta, "signature": signature})
    except OSError:
        pass  # a read-only place: analysis still works, only without a cache

