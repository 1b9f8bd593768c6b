"""The wrapped command's process tree: start it, signal all of it, and leave nothing behind.

torchrun starts each worker in a session of its own, so a process-group signal does not reach
them. The wrapper instead walks its descendants with psutil, and marks itself a child subreaper
(Linux) so that processes orphaned by a dying launcher are re-parented to it and can still be
found and stopped.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from typing import IO

import psutil

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux only); False where the platform does not allow it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start(command: list[str], env: dict[str, str], stdout: int | IO, stderr: int | IO) -> subprocess.Popen:
    """Start ``command`` in its own process group, so the terminal's Ctrl-C reaches only us."""
    return subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def descendants() -> list[psutil.Process]:
    """Every live process below this one (including adopted orphans)."""
    try:
        return psutil.Process().children(recursive=True)
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
