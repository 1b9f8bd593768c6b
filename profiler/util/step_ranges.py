"""Step ranges such as ``5-8`` (inclusive, 1-based), as given to ``--profile-steps``."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True, order=True)
class StepRange:
    """Steps ``first`` to ``last``, both included."""

    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def parse_step_range(text: str) -> StepRange:
    """Parse ``A-B`` or ``A`` (steps count from 1); raise ``ValueError`` saying what is wrong."""
    match = _RANGE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a step range: expected A-B or A, e.g. 5-8")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if first < 1:
        raise ValueError(f"{text!r}: steps count from 1")
    if last < first:
        raise ValueError(f"{text!r}: the range ends before it starts")
    return StepRange(first, last)


def parse_step_ranges(texts: list[str] | str | None) -> list[StepRange]:
    """Parse several ranges (a list, or one comma-separated string) and refuse overlaps."""
    if not texts:
        return []
    if isinstance(texts, str):
        texts = texts.split(",")
    ranges = sorted(parse_step_range(t) for t in texts if t.strip())
    for before, after in zip(ranges, ranges[1:]):
        if after.first <= before.last:
            raise ValueError(f"step ranges {before} and {after} overlap")
    return ranges


def format_step_ranges(ranges: list[StepRange]) -> str:
    """The inverse of :func:`parse_step_ranges` for a comma-separated string."""
    return ",".join(str(r) for r in ranges)
