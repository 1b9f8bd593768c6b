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
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(SAMPLE_S)
        if time.monotonic() - started > timeout:
            proc.kill()
            raise TimeoutError(code[:80])
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.read().decode()[-2000:])
    return wall, peak / 2**20
