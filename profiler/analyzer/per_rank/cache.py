"""A rank's cache, ``analysis/cache/<key>/``: its timeline spans and its results, kept while its inputs
do not change, so that a second analysis of a run reads no trace again."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from diagtrain.profiler.analyzer.per_rank import timeline
from diagtrain.profiler.analyzer.per_rank.p2p import P2PCalls
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.read.discover import RankInput
from diagtrain.profiler.analyzer.read.inputs import Skipped
from diagtrain.profiler.analyzer.read.trace_file import TraceFile
from diagtrain.profiler.run_dir import replacing, write_bytes_atomic
from diagtrain.profiler.util.bounded_read import display
from diagtrain.profiler.util.groups import distinct_rows
from diagtrain.profiler.util.parquet import write_parquet_pieces

CACHE_VERSION = 10  # bump when what the cache holds changes
# The rank's own tables, which only read_cache reads: Arrow's IPC format, written as they are held (Parquet's
# encoding cost 1 ms a table, 7% of a 20k-event rank's load at 1,024 ranks; these are a few hundred rows).
_TABLE_FILE = "{}.arrow"
SPANS_FILE = "spans.parquet"  # the rank's timeline spans on its own clock, which the judge reads back (published: report/outputs.py)


def spans_path(cache_root: Path, result: RankResult) -> Path:
    """Where the worker wrote this rank's timeline spans."""
    return cache_root / result.key / SPANS_FILE


def write_spans(cache: Path, traces: list[TraceFile], on_gpu: bool) -> bool:
    """Write the rank's timeline spans a piece at a time, as they are made (never all of them held);
    False where the cache cannot be written (the analysis then goes on without it)."""
    pieces = (piece for t in traces for piece in timeline.span_pieces(t.events, on_gpu, t.epoch_offset_us))
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_parquet_pieces(cache / SPANS_FILE, pieces)
        return True
    except OSError:
        return False


def signature(item: RankInput, reading: dict[str, Any]) -> str:
    """What the cache of ``item`` was made from: the cache version, the rank its name gave (which the
    other files beside it decide), the reading settings (rank/reading.py) and each input file's size and time."""
    parts = [f"v{CACHE_VERSION}", f"rank {item.rank_hint}: {item.rank_why}", f"reading {sorted(reading.items())}"]
    for f in [*item.files, *([item.flight_recorder] if item.flight_recorder else [])]:
        try:
            st = f.stat()
        except OSError as e:  # a dangling or looping link: its read says so; the signature just differs
            parts.append(f"{display(f)}:{e.errno}")
            continue
        parts.append(f"{display(f)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def read_cache(cache: Path, signature: str) -> RankResult | None:
    """The rank's results from its cache, if the cache was made from these inputs (``signature``)."""
    try:
        meta = json.loads((cache / "summary.json").read_text())
        if meta.get("signature") != signature:
            return None
        steps, collectives, segments = (_read_table(cache, name) for name in ("steps", "collectives", "segments"))
        members = {pg: tuple(int(r) for r in ranks) for pg, ranks in meta.get("groups", {}).items()}
        if "pg" in collectives:
            collectives["group_ranks"] = [members.get(str(pg), ()) for pg in collectives["pg"]]
        fields = {k: v for k, v in meta.items() if k not in ("signature", "skipped", "segments", "p2p", "groups")}
        skipped = [Skipped(**s) for s in meta.get("skipped") or []]
        return RankResult(**fields, steps=steps, collectives=collectives, skipped=skipped, cached=True,
                          segments=segments, p2p=P2PCalls.from_json(meta.get("p2p") or {}))
    except Exception:  # noqa: BLE001 - a cache from another version, or damaged: read the traces again
        return None


_TABLES = ("steps", "collectives", "cached", "segments")  # RankResult's fields not in summary.json


def _summary(result: RankResult) -> dict:
    """summary.json's fields of ``result``: what ``asdict`` gives, less the tables, without copying every
    field first (asdict deep-copies each, the tables and every process group's member list included:
    1.4 ms a rank at 1,024 ranks, as long as all the rest of the summary)."""
    meta = {}
    for f in fields(result):
        if f.name in _TABLES:
            continue
        value = getattr(result, f.name)
        if is_dataclass(value):
            value = asdict(value)
        elif isinstance(value, list):
            value = [asdict(v) if is_dataclass(v) else v for v in value]
        meta[f.name] = value
    return meta


def write_cache(cache: Path, signature: str, result: RankResult) -> None:
    """The rank's results beside its spans, and last the summary that makes them a cache of its traces."""
    try:
        meta = _summary(result)
        # A group's members once, not on each of its rows (a row per collective, a member per rank).
        collectives = result.collectives
        if "group_ranks" in collectives:
            first = collectives.iloc[distinct_rows(collectives["pg"])[1]]
            meta["groups"] = {str(pg): [int(r) for r in ranks] for pg, ranks in zip(first["pg"], first["group_ranks"])}
            collectives = collectives.drop(columns="group_ranks")
        _write_table(cache, "steps", result.steps)
        _write_table(cache, "collectives", collectives)
        _write_table(cache, "segments", result.segments)
        # Compact: indented JSON is written by Python's own encoder, not its C one (0.8 ms a rank at 1,024
        # ranks, where every process group lists 1,024 members a line each); only read_cache reads it.
        write_bytes_atomic(cache / "summary.json", json.dumps({**meta, "signature": signature}, sort_keys=True).encode())
    except OSError:
        pass  # a read-only place: analysis still works, only without a cache


def _write_table(cache: Path, name: str, frame: pd.DataFrame) -> None:
    """One of the rank's tables into its cache (replaced whole, never seen half-written)."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis' import, not its command line's
    from pyarrow import feather  # noqa: PLC0415

    with replacing(cache / _TABLE_FILE.format(name)) as tmp:
        feather.write_feather(pa.Table.from_pandas(frame, preserve_index=False, nthreads=1), tmp, compression="uncompressed")


def _read_table(cache: Path, name: str) -> pd.DataFrame:
    """One of the rank's tables from its cache, as :func:`_write_table` was given it."""
    return pd.read_feather(cache / _TABLE_FILE.format(name))
