"""Giving the memory a stage freed back to the operating system, so that the next stage's peak does
not stack on the last one's leftovers.

glibc's malloc keeps freed memory for reuse. A trace is decoded a block at a time into thousands of
mid-sized arrays that are then joined into whole columns: once joined, the pieces are holes in the
heap that the whole columns (mapped apart, being large) never reuse, and a worker's resident memory
stayed at about twice what it held (measured in benchmarks/worker_memory.py). ``malloc_trim`` hands
those pages back in a few milliseconds; a fixed mmap threshold would too, but cost a quarter of the
decoding time in page faults.

pyarrow's own default pool (mimalloc) keeps the pages it freed too, out of ``malloc_trim``'s reach:
~12 MiB a worker after each rank of a 1 MiB trace, 35 MiB of the 8-rank analysis' 252 (peak PSS of
its three processes). The analysis has Arrow allocate from malloc instead (:func:`arrow_on_the_c_heap`):
one heap, which the trims return.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None on other C libraries (musl, macOS), where nothing is done."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        return libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Return the free pages of the C heap to the operating system (a no-op where malloc cannot)."""
    if _TRIM is not None:
        _TRIM(0)


ARROW_POOL = "ARROW_DEFAULT_MEMORY_POOL"  # read once, by pyarrow's import: the pool of all of Arrow's C++


def arrow_on_the_c_heap() -> None:
    """Make Arrow allocate from malloc, whose freed pages :func:`release_freed_memory` returns. Called
    before pyarrow's import, all of Arrow's allocations (its C++ defaults too; worker processes started
    later inherit it); after, those made through pyarrow's default pool. A pool chosen in the
    environment is kept."""
    os.environ.setdefault(ARROW_POOL, "system")
    pa = sys.modules.get("pyarrow")
    if pa is not None and os.environ[ARROW_POOL] == "system":
        pa.set_memory_pool(pa.system_memory_pool())
