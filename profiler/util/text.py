"""Lists of ranks and steps as sentences print them."""

from __future__ import annotations

from typing import Iterable


# Parts a list of steps or ranks shows in a sentence: beyond them it is summarised, so that a finding of a run of a
# million steps reads as one of a hundred (the first parts, the last ones, and how many between).
MAX_PARTS = 12


def ranges(numbers: Iterable[int], most: int = MAX_PARTS) -> str:
    """[3, 4, 5, 9] → '3-5, 9' (sorted, duplicates dropped); more than ``most`` parts are summarised: evenly
    spaced numbers as '5, 9, ..., 997 (every 4, 249 in all)', others as the first and last parts with the
    count between."""
    numbers = sorted(set(int(n) for n in numbers))
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    if len(parts) <= most:
        return ", ".join(parts)
    gaps = {b - a for a, b in zip(numbers, numbers[1:])}
    if len(gaps) == 1:
        return f"{numbers[0]}, {numbers[1]}, ..., {numbers[-1]} (every {gaps.pop()}, {len(numbers)} in all)"
    shown = most - 2
    return ", ".join(parts[:shown]) + f", ... ({len(parts) - most} more), " + ", ".join(parts[-2:])


def rank_words(ranks: list[int]) -> str:
    """[3] → 'rank 3'; [1, 2] → 'ranks 1, 2' (every rank named, in the order given)."""
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"
