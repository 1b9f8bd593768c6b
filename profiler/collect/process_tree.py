"""The wrapped command's process tree: start it, signal all of it, and leave nothing behind.

torchrun starts each worker in a session of its own, so a process-group signal does not reach
them. The wrapper instead walks its descendants with psutil, and marks itself a child subreaper
(Linux) so that processes orphaned by a dying launcher are re-parented to it and can still be
found and stopped. The command's process gets a parent-death signal, so that a wrapper killed
outright (SIGKILL) takes it along (see also :mod:`diagtrain.profiler.collect.reaper`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from typing import IO

import psutil

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved now: the forked child must not load anything
except (OSError, AttributeError):
    _prctl = None
# Processes of ours that are not the job's (the reaper): never signalled with the job's processes.
_exempt: set[int] = set()


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux only); False where the platform does not allow it."""
    return _prctl is not None and _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _die_with_parent() -> None:
    """In the forked child, before exec: be killed when the wrapper dies, however it dies."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start(command: list[str], env: dict[str, str], stdout: int | IO, stderr: int | IO) -> subprocess.Popen:
    """Start ``command`` in its own process group (the terminal's Ctrl-C reaches only us), dying with us."""
    return subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_die_with_parent)


def exempt(pid: int) -> None:
    """Leave ``pid`` (a helper of the wrapper, not of the job) out of every descendants() walk."""
    _exempt.add(pid)


def descendants() -> list[psutil.Process]:
    """Every live process below this one (including adopted orphans), but the exempt helpers."""
    try:
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in _exempt]
    except psutil.Error:
        return []


def send(processes: list[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process that still exists."""
    for proc in processes:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def reap_orphans(keep: int) -> None:
    """Collect the exit status of adopted orphans so they do not linger as zombies.

    ``keep`` is the direct child, whose status belongs to ``Popen.wait``.
    """
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        os.waitpid(info.si_pid, 0)


def stop_all(grace_s: float, keep: int, settle_s: float = 0.0) -> list[int]:
    """SIGTERM every descendant, SIGKILL what is left after ``grace_s``; return the pids killed.

    ``settle_s`` first lets processes that are already ending (log tees draining) end by themselves.
    """
    _, procs = psutil.wait_procs(descendants(), timeout=settle_s) if settle_s else ([], descendants())
    send(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    send(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    reap_orphans(keep)
    return [p.pid for p in alive]


def wait_quietly(proc: subprocess.Popen, timeout: float) -> int | None:
    """``proc``'s exit code, or None if it is still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        reap_orphans(proc.pid)
        time.sleep(0.05)
    return proc.poll()
