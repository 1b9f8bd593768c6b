"""Run a piece of Python in a fresh process and record its wall time and the peak memory of its
whole process tree (workers included), sampled with psutil."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

SAMPLE_S = 0.02  # fine enough to catch the peak of a parse that lasts a fraction of a second


def run_measured(code: str, timeout: float = 600) -> tuple[float, float]:
    """(wall seconds, peak MiB of the process and its children) for ``python -c code``."""
    wall, tree, _, _ = run_measured_detail(code, timeout)
    return wall, tree


class OverMemory(RuntimeError):
    """The measured process tree held more than it was allowed, and was stopped."""


def run_measured_detail(code: str, timeout: float = 600, max_mib: float | None = None) -> tuple[float, float, float, float]:
    """(wall seconds, peak MiB of the whole tree, peak MiB of its largest single process, peak MiB of
    the whole tree counted by PSS). Summed RSS counts every page a forked worker shares with its
    parent (imports, the parent's data) once per process; PSS splits each shared page between the
    processes that map it, so the tree's PSS is the memory it really holds. A tree whose PSS passes
    ``max_mib`` is killed (:class:`OverMemory`) before it can take the machine down."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    peak = single = pss = 0
    while proc.poll() is None:
        try:
            infos = [p.memory_full_info() for p in [root, *root.children(recursive=True)] if p.is_running()]
            sizes = [i.rss for i in infos]
            peak, single = max(peak, sum(sizes)), max(single, max(sizes, default=0))
            pss = max(pss, sum(getattr(i, "pss", i.rss) for i in infos))  # no PSS off Linux: RSS
        except psutil.Error:
            pass
        time.sleep(SAMPLE_S)
        if max_mib is not None and pss / 2**20 > max_mib:
            _kill_tree(root)
            raise OverMemory(f"over {max_mib:.0f} MiB after {time.monotonic() - started:.0f} s")
        if time.monotonic() - started > timeout:
            _kill_tree(root)
            raise TimeoutError(f"over {timeout:.0f} s")
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.read().decode()[-2000:])
    return wall, peak / 2**20, single / 2**20, pss / 2**20


def _kill_tree(root: psutil.Process) -> None:
    """Kill ``root`` and its children (a pool's workers would otherwise go on holding memory)."""
    for p in [*root.children(recursive=True), root]:
        try:
            p.kill()
        except psutil.Error:
            pass
    root.wait()
