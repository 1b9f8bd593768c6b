"""Keeping Python's cyclic garbage collector off what an analysis holds from one stage to its end.

The collector's full passes walk every container object alive. After the ranks load, the analysis
holds their results (each rank's process groups list every member: thousands of objects a rank at
1,024 ranks) until it ends, and each full pass walked them again: 9 passes in the judgement of
1,024 ranks x 20,000 events took 2.7 s of its 7.8 s (benchmarks/results/scale.md). Frozen
(``gc.freeze``), they are left out of every pass; objects are still freed when their last reference
goes, and only cycles among the frozen wait for the end of the analysis, when they are handed back.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def held_objects_spared() -> Iterator[Callable[[], None]]:
    """Within: calling the yielded function leaves every object alive at that moment out of the
    collector's passes until the block ends. On exit they are collected as usual again, unless some
    were already frozen on entry (a caller's own freeze is left as it was)."""
    frozen_before = gc.get_freeze_count()
    try:
        yield gc.freeze
    finally:
        if not frozen_before:
            gc.unfreeze()
