"""The analysis' memory handling: Arrow allocates from the C heap that malloc_trim returns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

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


def test_arrow_uses_malloc_whether_imported_before_or_after() -> None:
    # In a fresh process: an analysis run earlier in this one (by another test) changed its pool.
    default = _pool(call="")
    assert default != "system", "this pyarrow defaults to malloc already: the test would prove nothing"
    assert _pool() == "system"  # before pyarrow's import: through the environment
    assert _pool(before="import pyarrow") == "system"  # after it: the Python default pool replaced


def test_a_pool_chosen_in_the_environment_is_kept() -> None:
    assert _pool(ARROW_DEFAULT_MEMORY_POOL="mimalloc") == "mimalloc"
    assert _pool(before="import pyarrow", ARROW_DEFAULT_MEMORY_POOL="mimalloc") == "mimalloc"
