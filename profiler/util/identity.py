"""A function's results kept per argument object, by identity: the process groups' member tuples, which every
rank's groups share (read_process_groups gives equal members one tuple), are worked on once a pass, not once a
rank. Hashing a tuple of the world's ranks per rank and group was the world squared per judgement at 8,192 ranks."""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class ByIdentity(Generic[T]):
    """``fn(value)``, computed once for each object passed (held, so that its identity stays its own)."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.found: dict[int, tuple[Any, T]] = {}

    def __call__(self, value: Any) -> T:
        """``fn(value)``: computed the first time this object is given."""
        hit = self.found.get(id(value))
        if hit is None:
            hit = self.found[id(value)] = (value, self.fn(value))
        return hit[1]
