"""Lists of ranks and steps as sentences print them."""

from __future__ import annotations

from typing import Iterable


def ranges(numbers: Iterable[int]) -> str:
    """[3, 4, 5, 9] → '3-5, 9' (sorted, duplicates dropped)."""
    numbers = sorted(set(int(n) for n in numbers))
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def rank_words(ranks: list[int]) -> str:
    """[3] → 'rank 3'; [1, 2] → 'ranks 1, 2' (every rank named, in the order given)."""
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"
