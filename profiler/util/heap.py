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


# Free heap below this stays with the process: a trim costs a fraction of a millisecond whatever it frees, and the
# pages it hands back are faulted in again by the next allocations (15 trims a rank were ~10% of a 20k-event
# rank's load, 4.7 ms of system time), while a rank of gigabytes frees hundreds of MiB at each.
TRIM_ABOVE_BYTES = 32 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc_function(name: str) -> Callable | None:
    """A glibc function; None on other C libraries (musl, macOS) or an older glibc, where nothing is done."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or None), name)
    except (OSError, AttributeError, TypeError):
        return None


_TRIM = _libc_function("malloc_trim")
_INFO = _libc_function("mallinfo2")  # glibc 2.33 on: without it, every call trims
if _INFO is not None:
    _INFO.restype = _MallInfo2


def release_freed_memory() -> None:
    """Return the free pages of the C heap to the operating system, once there are more than TRIM_ABOVE_BYTES
    of them (a no-op where malloc cannot)."""
    if _TRIM is not None and (_INFO is None or _INFO().fordblks >= TRIM_ABOVE_BYTES):
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
