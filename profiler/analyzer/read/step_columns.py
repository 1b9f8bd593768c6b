"""Step records read a block at a time into columns: pyarrow's JSON reader parses the block, and the
checks :func:`run_files.step_row` makes of one record are made of whole columns.

A week-long job writes a million records per rank: one Python dict per record cost ~70 us and ~3 KB
a rank-step (issue 62). Here a block costs its parse in C++ and a few numpy passes. Only a block of
plain records is read this way: anything the per-line reader must decide for itself (a line that is
not a record, a record of another rank, an impossible value, a null where a number must be, point-to-
point calls, device timings, a line cut by a carriage return or longer than a line may be) makes this
return None, and the block is read line by line, to the same rows and the same words.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read.inputs import MAX_RANKS
from diagtrain.profiler.analyzer.read.run_files import MAX_MEMORY_BYTES, MAX_STEP_MS, MAX_STEP_NUMBER
from diagtrain.profiler.util.bounded_read import MAX_LINE_CHARS

# Keys whose values the per-line reader checks entry by entry (lists of structs; also every "device_..."), and
# the end-of-run line's.
PER_LINE_KEYS = ("p2p", "kind")
TWO_OBJECTS = re.compile(rb"\}[ \t]*\{")  # on one line (also inside a string: then read line by line, to be safe)
PARSE_BLOCK_BYTES = 1 << 20  # pyarrow's own blocks, parsed on its threads


@dataclass
class ColumnBlock:
    """A block's records as a table (the rows run_files.step_row makes, in file order), the phases they
    recorded in the order first seen, and how many lines the block held (all, and those not blank)."""

    frame: pd.DataFrame
    phases: list[str]
    lines: int
    parsed: int


def read_block(data: bytes, rank: int | None) -> ColumnBlock | None:
    """The records of ``data`` (whole lines, each ending with a newline) as columns; None where a line
    needs the per-line reader (see the module's docstring)."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    lines = len(ends)
    if not lines or b"\r" in data or int(np.diff(ends, prepend=-1).max()) > MAX_LINE_CHARS or TWO_OBJECTS.search(data):
        return None  # two objects on one line parse as two rows: the per-line reader calls it a bad line
    table = _parse(data)
    if table is None or any(name in PER_LINE_KEYS or name.startswith("device_") for name in table.column_names):
        return None
    # At most a row a line now: as many rows as lines, or as many as the lines not blank.
    if table.num_rows != lines and table.num_rows != lines - _blank_lines(data):
        return None
    return _checked(table, rank, data, lines)


def _parse(data: bytes):  # noqa: ANN202 - a pyarrow Table, imported late as the analysis does
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.json as pj  # noqa: PLC0415

    try:
        return pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=True, block_size=PARSE_BLOCK_BYTES))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _blank_lines(data: bytes) -> int:
    return sum(1 for line in data.split(b"\n")[:-1] if not line.strip())


def _checked(table, rank: int | None, data: bytes, lines: int) -> ColumnBlock | None:  # noqa: ANN001
    """The rows of a parsed block, or None where a record is one the per-line reader refuses or leaves out."""
    ids = {key: _ints(table, key) for key in ("rank", "step")}
    if any(v is None for v in ids.values()):
        return None
    if ((ids["rank"] < 0) | (ids["rank"] >= MAX_RANKS)).any() or ((ids["step"] < 0) | (ids["step"] >= MAX_STEP_NUMBER)).any():
        return None
    if rank is not None and (ids["rank"] != rank).any():
        return None
    times = {key: _numbers(table, key) for key in ("start", "end", "duration_ms")}
    if any(v is None for v in times.values()):
        return None
    phases = _struct(table, "phases_ms")
    if phases is None or (any(v.null_count for v in phases.values()) and b"null" in data):
        return None  # a phase recorded as null is a bad line to the per-line reader, an absent one is not
    phase_values = {name: _numbers(table, name, column) for name, column in phases.items()}
    if any(v is None for v in phase_values.values()):
        return None
    start, end = times["start"], times["end"]
    if not (_finite(start) & _finite(end) & (end >= start)).all():
        return None
    for value in [times["duration_ms"], *phase_values.values()]:
        known = ~np.isnan(value.astype(float))
        if not (_finite(value[known]) & (value[known] >= 0) & (value[known] <= MAX_STEP_MS)).all():
            return None
    columns = {"rank": ids["rank"], "step": ids["step"], "start": start, "end": end, "wall_ms": times["duration_ms"],
               "peak_mem_bytes": _bounded(table, "peak_mem_bytes", MAX_MEMORY_BYTES),
               "samples": _bounded(table, "samples", math.inf), "tokens": _bounded(table, "tokens", math.inf),
               **{f"{name}_ms": _values(table, phases[name]) for name in phases}, **_counters(table)}
    waits = _struct(table, "phase_comm_ms") or {}
    waited = {f"{name}_comm_wait_ms": _bounded(table, name, MAX_STEP_MS, column) for name, column in waits.items()}
    if set(waited) & set(columns) or len(columns) != 8 + len(phases) + len(COUNTERS) + 1:
        return None  # a phase named like a counter: the per-line reader's dict decides which wins
    frame = pd.DataFrame({**columns, **waited}, copy=False)
    return ColumnBlock(frame, _first_seen(phases), len(frame), lines)


# The always-on counters: the step record's name, the table's, and the most a value can be.
COUNTERS = (("comm_ms", "comm_wait_ms", MAX_STEP_MS), ("comm_calls", "comm_calls", math.inf),
            ("cpu_ms", "cpu_ms", MAX_STEP_MS), ("runq_ms", "runq_ms", MAX_STEP_MS),
            ("comm_runq_ms", "comm_runq_ms", MAX_STEP_MS), ("page_faults", "page_faults", math.inf),
            *((name, name, MAX_MEMORY_BYTES) for name in ("rss_bytes", "gpu_allocated_bytes", "gpu_reserved_bytes",
                                                          "gpu_peak_bytes")))
PEAK_SINCE = ("step", "start")


def _counters(table) -> dict[str, np.ndarray]:  # noqa: ANN001
    columns = {column: _bounded(table, key, most) for key, column, most in COUNTERS}
    since = table.column("gpu_peak_since") if "gpu_peak_since" in table.column_names else None
    values = np.full(table.num_rows, None, dtype=object)
    if since is not None and _is_string(since.type):
        raw = np.array(since.to_pylist(), dtype=object)
        kept = np.isin(raw, PEAK_SINCE)
        values[kept] = raw[kept]
    return {**columns, "gpu_peak_since": values}


def _ints(table, key: str) -> np.ndarray | None:  # noqa: ANN001
    """An integer column with a value in every row, else None."""
    import pyarrow as pa  # noqa: PLC0415

    if key not in table.column_names:
        return None
    column = table.column(key)
    if not pa.types.is_int64(column.type) or column.null_count:
        return None
    return column.to_numpy()


def _numbers(table, key: str, column=None) -> np.ndarray | None:  # noqa: ANN001
    """A column of numbers with a value in every row (``column``: a struct's field, where nulls are absent
    keys), else None. Integers stay integers, as JSON's do in Python."""
    import pyarrow as pa  # noqa: PLC0415

    if column is None:
        if key not in table.column_names:
            return None
        column = table.column(key)
        if column.null_count:
            return None
    if pa.types.is_null(column.type):
        return np.full(len(column), np.nan)
    if not (pa.types.is_int64(column.type) or pa.types.is_floating(column.type)):
        return None
    return _values(table, column)


def _values(table, column) -> np.ndarray:  # noqa: ANN001
    """A numeric column as numpy: NaN where a row lacks it (float then, as pandas makes a column with gaps)."""
    import pyarrow as pa  # noqa: PLC0415

    if pa.types.is_null(column.type):
        return np.full(len(column), np.nan)
    if column.null_count:
        return column.cast(pa.float64()).to_numpy(zero_copy_only=False)
    return column.to_numpy()


def _struct(table, key: str) -> dict[str, object] | None:  # noqa: ANN001
    """An object column's fields (absent or null in a row: no fields); None if it holds something else."""
    import pyarrow as pa  # noqa: PLC0415

    if key not in table.column_names:
        return {}
    column = table.column(key)
    if pa.types.is_null(column.type):
        return {}
    if not pa.types.is_struct(column.type):
        return None
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    # flatten, not field(): a row whose object is null has no fields either
    return {column.type.field(i).name: child for i, child in enumerate(column.flatten())}


def _bounded(table, key: str, most: float, column=None) -> np.ndarray:  # noqa: ANN001
    """A count or size: kept where it is a number in [0, most], else unknown (None where no row has one, as
    pandas keeps a column of Nones)."""
    import pyarrow as pa  # noqa: PLC0415

    if column is None:
        column = table.column(key) if key in table.column_names else None
    n = table.num_rows
    if column is None or not (pa.types.is_int64(column.type) or pa.types.is_floating(column.type)):
        return np.full(n, None, dtype=object)
    value = _values(table, column)
    as_float = value.astype(float)
    ok = _finite(as_float) & (as_float >= 0) & (as_float <= most)
    if ok.all():
        return value
    if not ok.any():
        return np.full(n, None, dtype=object)
    return np.where(ok, as_float, np.nan)


def _finite(value: np.ndarray) -> np.ndarray:
    """As run_files' check: finite, and within what an integer of 64 bits holds."""
    as_float = value.astype(float)
    return np.isfinite(as_float) & (np.abs(as_float) < 2.0**63)


def _is_string(kind) -> bool:  # noqa: ANN001
    import pyarrow as pa  # noqa: PLC0415

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _first_seen(fields: dict[str, object]) -> list[str]:
    """The fields in the order the rows first have them, as the per-line reader lists them (fields first seen in
    one row in the order pyarrow's blocks met them: the row's own order within a block)."""
    first = {name: _first_row(column) for name, column in fields.items()}
    return sorted(fields, key=lambda name: first[name])  # stable: fields first seen in one row keep its order


def _first_row(column) -> int:  # noqa: ANN001
    valid = np.asarray(column.is_valid())
    hit = np.flatnonzero(valid)
    return int(hit[0]) if len(hit) else len(valid)
