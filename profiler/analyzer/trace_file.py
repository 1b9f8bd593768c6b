"""Reading one PyTorch Profiler (Kineto) trace into columns, keeping only what the analysis needs.

msgspec decodes straight into typed structs and skips every field not declared here, so a
trace is never held as a tree of Python dicts (that and row-by-row pandas are where Holistic
Trace Analysis spends its time). Timestamps stay as the file has them (µs): epoch µs would lose
sub-microsecond precision in float64; ``epoch_offset_us`` puts them on the wall clock.
"""

from __future__ import annotations

import gc
import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

Number = int | float | str | None  # real traces disagree on the types of these fields


# gc=False: a trace is millions of these; the cyclic GC walking them cost 4x the decode itself.
class _Args(msgspec.Struct, gc=False):
    stream: Number = None
    correlation: Number = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Number = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Number = msgspec.field(default=None, name="Out msg nelems")
    group_size: Number = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: Number = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: Number = None
    dur: Number = None
    pid: Number = None
    tid: Number = None
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] = []
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    record_shapes: Number = None
    profile_memory: Number = None
    host_name: str | None = None


GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Communication on every backend: NCCL/RCCL kernels, and the host-side ops of c10d and gloo.
COMM_KERNEL = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
COMM_HOST_OP = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms$)")
MEMORY_KERNEL = re.compile(r"^(Memcpy|Memset|dma)")  # HTA's memory-kernel rule
STEP_ANNOTATION = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
COMPUTE, COMM, MEMORY, CPU = "compute", "comm", "memory", "cpu"


class TraceError(ValueError):
    """A trace file that cannot be analyzed; the message names the file and the problem."""


@dataclass
class TraceFile:
    """One trace file's duration events as columns, and the facts its header gives."""

    path: Path
    events: pd.DataFrame  # name, cat, ts, dur, end (µs), tid, stream, correlation, kind, collective args
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

    @property
    def on_gpu(self) -> bool:
        return bool((self.events["stream"] >= 0).any())


def read_trace(path: Path) -> TraceFile:
    """Decode ``path`` (.json or .json.gz); raise :class:`TraceError` saying what is wrong."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceError(f"{path}: cannot read: {e}") from None
    gc.disable()  # nothing cyclic is built here; collections would only rescan millions of objects
    try:
        doc = msgspec.json.decode(raw, type=_Trace)
        del raw
        events = _columns(doc)
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not a PyTorch Profiler trace: {e}") from None
    finally:
        gc.enable()
    if events.empty:
        raise TraceError(f"{path}: the trace has no duration events")
    info = doc.distributedInfo or {}
    base = doc.baseTimeNanoseconds
    # Kineto writes timestamps relative to baseTimeNanoseconds; older traces write epoch µs.
    relative = bool(base) and events["ts"].iloc[0] < base / 1e3 / 2
    return TraceFile(
        path=path, events=events,
        rank=_int(info.get("rank")), world_size=_int(info.get("world_size")), backend=info.get("backend"),
        pg_config=list(info.get("pg_config") or []), nccl_version=info.get("nccl_version"),
        base_time_ns=base, epoch_offset_us=base // 1000 if relative else 0, record_shapes=bool(doc.record_shapes), profile_memory=bool(doc.profile_memory),
        host_name=doc.host_name,
    )


def _columns(doc: _Trace) -> pd.DataFrame:
    """Duration events ('X') with a start and a length, as typed columns."""
    evs = [e for e in doc.traceEvents if e.ph == "X" and type(e.ts) in _NUMBERS and type(e.dur) in _NUMBERS]
    args = [e.args or _NO_ARGS for e in evs]
    n = len(evs)
    frame = pd.DataFrame({
        "name": pd.Categorical([e.name for e in evs]),
        "cat": pd.Categorical([e.cat or "" for e in evs]),
        "ts": np.fromiter((e.ts for e in evs), dtype=np.float64, count=n),
        "dur": np.fromiter((e.dur for e in evs), dtype=np.float64, count=n),
        "stream": np.array([_int_or_minus_one(a.stream) for a in args], dtype=np.int64),
        "correlation": np.array([_int_or_minus_one(a.correlation) for a in args], dtype=np.int64),
    })
    _collective_columns(frame, args)
    frame["end"] = frame["ts"] + frame["dur"]
    frame["kind"] = _kinds(frame)
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def _collective_columns(frame: pd.DataFrame, args: list[_Args]) -> None:
    """Collective and shape arguments: present on few events, so filled only where they are."""
    rows = [i for i, a in enumerate(args) if a.collective is not None or a.pg_name is not None or a.input_dims is not None]
    for column, get, kind in (("collective", lambda a: a.collective, object), ("dtype", lambda a: a.dtype, object),
                              ("pg_name", lambda a: None if a.pg_name is None else str(a.pg_name), object),
                              ("pg_desc", lambda a: a.pg_desc, object), ("input_dims", lambda a: a.input_dims, object),
                              ("input_type", lambda a: a.input_type, object),
                              ("in_nelems", lambda a: _float(a.in_nelems), np.float64),
                              ("group_size", lambda a: _float(a.group_size), np.float64)):
        values = np.full(len(frame), np.nan if kind is np.float64 else None, dtype=kind)
        if rows:
            values[rows] = [get(args[i]) for i in rows]
        # dtype=object kept as is: letting pandas infer a string dtype costs more than the parse.
        frame[column] = pd.Series(values, dtype=kind, copy=False)


_NUMBERS = (int, float)
_NO_ARGS = _Args()


def _kinds(frame: pd.DataFrame) -> np.ndarray:
    """compute | comm | memory for GPU events, comm | cpu for host events (by name, vectorized)."""
    comm_kernel = name_matches(frame["name"], COMM_KERNEL)
    comm_host = name_matches(frame["name"], COMM_HOST_OP)
    memory = name_matches(frame["name"], MEMORY_KERNEL)
    gpu = frame["cat"].isin(GPU_CATEGORIES).to_numpy() & (frame["stream"] >= 0).to_numpy()
    codes = np.select([gpu & comm_kernel, gpu & memory, gpu, comm_host], [0, 1, 2, 0], default=3)
    return pd.Categorical.from_codes(codes, categories=[COMM, MEMORY, COMPUTE, CPU])


def name_matches(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Which events' (categorical) names match ``pattern``: each distinct name is matched once."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        return names.astype(str).str.match(pattern).to_numpy(dtype=bool)
    hits = names.cat.categories.to_series().str.match(pattern).to_numpy(dtype=bool)
    codes = names.cat.codes.to_numpy()
    return np.where(codes >= 0, hits[codes], False) if len(hits) else np.zeros(len(names), dtype=bool)


def _int_or_minus_one(value: Any) -> int:
    if type(value) is int:
        return value
    return -1 if value is None else _int(value, -1)


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return np.nan
