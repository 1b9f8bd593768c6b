"""Lists of ranks and steps as sentences print them."""

from __future__ import annotations

from typing import Iterable

import numpy as np


# Parts a list of steps or ranks shows in a sentence: beyond them it is summarised, so that a finding of a run of a
# million steps reads as one of a hundred (the first parts, the last ones, and how many between).
MAX_PARTS = 12


def ranges(numbers: Iterable[int], most: int = MAX_PARTS) -> str:
    """[3, 4, 5, 9] → '3-5, 9' (sorted, duplicates dropped); more than ``most`` parts are summarised: evenly
    spaced numbers as '5, 9, ..., 997 (every 4, 249 in all)', others as the first and last parts with the
    count between."""
    # Arrays: a long run's finding names hundreds of thousands of steps, a loop over them cost 0.3 s a sentence.
    from diagtrain.profiler.util.groups import distinct  # noqa: PLC0415 - pandas, which the CLI's start leaves out

    numbers = distinct(np.asarray(numbers if hasattr(numbers, "__array__") else list(numbers)).astype(np.int64))
    starts = np.flatnonzero(np.r_[True, np.diff(numbers) != 1]) if len(numbers) else np.zeros(0, dtype=np.int64)
    ends = np.r_[starts[1:] - 1, len(numbers) - 1].astype(np.int64) if len(numbers) else starts

    def part(i: int) -> str:
        start, end = int(numbers[starts[i]]), int(numbers[ends[i]])
        return str(start) if start == end else f"{start}-{end}"
    if len(starts) <= most:
        return ", ".join(part(i) for i in range(len(starts)))
    gaps = np.unique(np.diff(numbers))
    if len(gaps) == 1:
        return f"{numbers[0]}, {numbers[1]}, ..., {numbers[-1]} (every {gaps[0]}, {len(numbers)} in all)"
    shown = most - 2
    return (", ".join(part(i) for i in range(shown)) + f", ... ({len(starts) - most} more), "
            + ", ".join(part(i) for i in range(len(starts) - 2, len(starts))))


def rank_words(ranks: list[int]) -> str:
    """[3] → 'rank 3'; [1, 2] → 'ranks 1, 2' (every rank named, in the order given)."""
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"
