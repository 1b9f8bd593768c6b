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


def run_measured_detail(code: str, timeout: float = 600) -> tuple[float, float, float, float]:
    """(wall seconds, peak MiB of the whole tree, peak MiB of its largest single process, peak MiB of
    the whole tree counted by PSS). Summed RSS counts every page a forked worker shares with its
    parent (imports, the parent's data) once per process; PSS splits each shared page between the
    processes that map it, so the tree's PSS is the memory it really holds."""
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
        if time.monotonic() - started > timeout:
            proc.kill()
            raise TimeoutError(code[:80])
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.read().decode()[-2000:])
    return wall, peak / 2**20, single / 2**20, pss / 2**20
