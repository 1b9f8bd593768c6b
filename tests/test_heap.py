"""The analysis' memory handling: Arrow allocates from the C heap that malloc_trim returns."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from diagtrain.profiler.util import heap

PROBE = """
from diagtrain.profiler.util.heap import arrow_on_the_c_heap
{before}
{call}
import pyarrow as pa
print(pa.default_memory_pool().backend_name)
"""


def _pool(before: str = "", call: str = "arrow_on_the_c_heap()", **env: str) -> str:
    """The default pool's backend in a fresh process that ran ``before``, then ``call``."""
    environment = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | env
    proc = subprocess.run([sys.executable, "-c", PROBE.format(before=before, call=call)], capture_output=True, text=True,
                          env=environment, check=True)
    return proc.stdout.strip()


@pytest.mark.jobs
def test_arrow_uses_malloc_whether_imported_before_or_after() -> None:
    # In a fresh process: an analysis run earlier in this one (by another test) changed its pool.
    default = _pool(call="")
    assert default != "system", "this pyarrow defaults to malloc already: the test would prove nothing"
    assert _pool() == "system"  # before pyarrow's import: through the environment
    assert _pool(before="import pyarrow") == "system"  # after it: the Python default pool replaced


@pytest.mark.jobs
def test_a_pool_chosen_in_the_environment_is_kept() -> None:
    assert _pool(ARROW_DEFAULT_MEMORY_POOL="mimalloc") == "mimalloc"
    assert _pool(before="import pyarrow", ARROW_DEFAULT_MEMORY_POOL="mimalloc") == "mimalloc"


@pytest.mark.skipif(heap._INFO is None or heap._TRIM is None, reason="not glibc 2.33+: every call trims, or none does")
def test_the_heap_is_trimmed_only_once_enough_of_it_is_free(monkeypatch) -> None:
    trims, real_trim = [], heap._TRIM  # counted, and still done
    monkeypatch.setattr(heap, "_TRIM", lambda pad: trims.append(pad) or real_trim(pad))
    # Whatever this process freed before (other tests' analyses), 16 MiB more is not enough.
    monkeypatch.setattr(heap, "TRIM_ABOVE_BYTES", heap._INFO().fordblks + (16 << 20))
    heap.release_freed_memory()
    assert trims == []
    # 96 MiB in blocks under malloc's mmap threshold, all freed but the last (which holds the heap's top).
    blocks = [bytearray(64 << 10) for _ in range(1536)]
    del blocks[:-1]
    freed_rss = psutil.Process().memory_info().rss
    heap.release_freed_memory()
    assert trims == [0] and psutil.Process().memory_info().rss < freed_rss - (48 << 20)
