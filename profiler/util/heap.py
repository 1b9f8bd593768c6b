"""Giving the memory a stage freed back to the operating system, so that the next stage's peak does
not stack on the last one's leftovers.

glibc's malloc keeps freed memory for reuse. A trace is decoded a block at a time into thousands of
mid-sized arrays that are then joined into whole columns: once joined, the pieces are holes in the
heap that the whole columns (mapped apart, being large) never reuse, and a worker's resident memory
stayed at about twice what it held (measured in benchmarks/worker_memory.py). ``malloc_trim`` hands
those pages back in a few milliseconds; a fixed mmap threshold would too, but cost a quarter of the
decoding time in page faults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
