"""Which rank a trace file's name gives, if any: a known exporter's pattern, or numbers that fit the
run, never an arbitrary number (an experiment id, a process id, a timestamp).

A name that says ``rank<N>``, ``rank-N`` or ``rank_N`` gives N (most exporters' handlers, and the
names in Holistic Trace Analysis's test data); a local rank does not count, it repeats on every host.
torch's ``tensorboard_trace_handler`` writes ``<worker>.<time>.pt.trace.json``, its default worker
``<host>_<pid>``: the time is never a rank, and the pid no more than any other trailing number. The
names' trailing numbers are ranks only when, with those the patterns gave, they are exactly 0..N-1
for the N files; otherwise none is, and the reader assigns ranks (a single trace is rank 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagtrain.profiler.analyzer.read.inputs import rank_number

# "rank" as a word of its own (not "frank2", not "local_rank3"), then the number.
RANK_PATTERN = re.compile(r"(?<![A-Za-z])(?<!local[_-])rank[_-]?(\d+)", re.IGNORECASE)
# What follows the name's own part: torch's handler's ".<time>.pt.trace.json", or a plain ".json".
_SUFFIX = re.compile(r"(\.\d+\.pt\.trace|\.pt\.trace)?\.json(\.gz)?$", re.IGNORECASE)
_TRAILING = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class NameRank:
    """The rank a file's name gives (None: none), and in words how it gave it or why it gave none."""

    rank: int | None
    why: str


def ranks_from_names(names: list[str]) -> list[NameRank]:
    """The rank each of ``names`` (one run's trace files, one rank each) gives, in the same order."""
    by_pattern = [_pattern_rank(n) for n in names]
    trailing = [None if found else _trailing_number(n) for n, found in zip(names, by_pattern)]
    fits = _fit_the_run([f[0] if f else None for f in by_pattern], trailing)
    return [_name_rank(found, number, fits, len(names)) for found, number in zip(by_pattern, trailing)]


def _pattern_rank(name: str) -> tuple[int, str] | None:
    """(rank, the words that say it) where the name says ``rank<N>`` once, with a number a rank can be."""
    found = list(RANK_PATTERN.finditer(name))
    if len(found) != 1:
        return None  # none, or several (tp_rank1_pp_rank0: a rank in each group; which is the job's?)
    rank = rank_number(found[0].group(1))
    return None if rank is None else (rank, found[0].group(0))


def _trailing_number(name: str) -> str | None:
    """The digits that end the name's own part (torch's handler's time and the .json left off)."""
    m = _TRAILING.search(_SUFFIX.sub("", name))
    return m.group(1) if m else None


def _fit_the_run(patterns: list[int | None], trailing: list[str | None]) -> bool:
    """Whether the trailing numbers, with the patterns' ranks, are each of 0..N-1 exactly once."""
    if not any(trailing):
        return False
    ranks = [p if p is not None else rank_number(t) for p, t in zip(patterns, trailing)]
    return sorted(r for r in ranks if r is not None) == list(range(len(ranks)))


def _name_rank(pattern: tuple[int, str] | None, number: str | None, fits: bool, files: int) -> NameRank:
    if pattern is not None:
        return NameRank(pattern[0], f"its name's {pattern[1]!r}")
    if number is None:
        return NameRank(None, "its name holds no rank")
    if fits:
        run = "the only rank of a single file" if files == 1 else f"the {files} names' numbers being 0..{files - 1}"
        return NameRank(rank_number(number), f"its name's trailing {number}, {run}")
    run = "nor 0, the only rank of a single file" if files == 1 else \
        f"nor are the {files} names' trailing numbers 0..{files - 1}"
    return NameRank(None, f"its name gives no rank: the trailing {number} is no rank pattern, {run}")
