"""The one guard every input of the analysis is read behind.

A bad file never stops an analysis: whatever goes wrong while one input is read and checked (it is
missing, not a regular file, over its size limit, truncated, not the format, the wrong shape) puts
it under report.json's ``skipped`` with the file and the reason, and the rest is analyzed. The
size limits are per kind of file, generous for real runs and far below what would exhaust memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from diagtrain.profiler.util.bounded_read import InputError, display

T = TypeVar("T")

# Size limits (unpacked bytes), each far above what a real run writes.
MAX_TRACE_BYTES = 4 << 30  # one profiled window; the 1M-event benchmark trace is ~0.4 GiB
MAX_DUMP_BYTES = 1 << 30  # a flight-recorder dump: 20,000 entries with stacks is ~50 MiB
MAX_TABLE_BYTES = 2 << 30  # telemetry.parquet: a month of 1 Hz samples of an 8-GPU host is ~0.2 GiB
MAX_DOC_BYTES = 256 << 20  # small JSON documents: manifest, rank.json, exit.json, parameters.json, ...
MAX_RANKS = 1 << 20  # a million ranks: beyond any job; a larger rank number or world size is corrupt


@dataclass
class Skipped:
    """An input that could not be used, and why."""

    path: str
    reason: str


def rank_number(value: object) -> int | None:
    """``value`` (a folder name, or a number from a file) as a rank, or None if it cannot be one."""
    if isinstance(value, str):
        value = int(value) if value.isdigit() and len(value) <= 7 else None
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_RANKS
    return value if ok else None


def reason(error: BaseException, path: str | os.PathLike) -> str:
    """What went wrong reading ``path``, without repeating its name."""
    if isinstance(error, InputError):
        return error.reason
    text = str(error)
    for prefix in (f"{display(path)}: ", f"{path}: "):
        text = text.removeprefix(prefix)
    if isinstance(error, ValueError) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def expect(value: Any, kind: type | tuple[type, ...], path: str | os.PathLike, what: str = "the file") -> Any:
    """``value`` if it is of ``kind``; else :class:`InputError` saying what it is instead."""
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _as_tuple(kind):
        names = " or ".join(k.__name__ for k in _as_tuple(kind))
        raise InputError(path, f"{what} holds {_describe(value)}, not a {names}")
    return value


@dataclass
class Inputs:
    """Reads inputs behind the guard and keeps the list of those skipped."""

    skipped: list[Skipped] = field(default_factory=list)

    def read(self, path: Path, parse: Callable[[Path], T], default: T | None = None) -> T | None:
        """``parse(path)``; anything it raises skips ``path`` (with the reason) and gives ``default``."""
        try:
            return parse(path)
        except Exception as e:  # noqa: BLE001 - MemoryError and RecursionError included: one file, never the run
            self.skip(path, reason(e, path))
            return default

    def read_checked(self, path: Path, parse: Callable[[Path], tuple[T, list[str]]]) -> T | None:
        """Like :meth:`read` for a ``parse`` giving ``(value, problems)``: the value, each problem listed."""
        found = self.read(path, parse)
        if found is None:
            return None
        value, problems = found
        for problem in problems:
            self.skip(path, problem)
        return value

    def skip(self, path: str | os.PathLike, why: str) -> None:
        """Record ``path`` as skipped because of ``why``."""
        self.skipped.append(Skipped(display(path), why))


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    name = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value))
    return name or f"a {type(value).__name__}"
