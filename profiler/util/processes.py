"""Which process wrote a record, and whether it still runs, told apart from a pid reused later.

A pid alone is not an identity: it is reused, and two machines (or containers) share pid numbers.
The identity adds the process's start time and the kernel boot and pid namespace it lives in, so
a reader elsewhere knows it cannot tell, instead of guessing.
"""

from __future__ import annotations

import os
from typing import Any

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def identity(pid: int | None = None) -> dict[str, Any]:
    """``{pid, start_ticks, boot_id, pid_ns}`` of ``pid`` (this process by default); Linux fields may be None."""
    pid = pid or os.getpid()
    return {"pid": pid, "start_ticks": _start_ticks(pid), "boot_id": _read(_BOOT_ID), "pid_ns": _pid_namespace()}


def alive(ident: dict[str, Any]) -> bool | None:
    """Whether the process ``ident`` names still runs; None when this machine cannot tell."""
    if not ident.get("pid") or ident.get("boot_id") is None or ident.get("start_ticks") is None:
        return None
    if ident["boot_id"] != _read(_BOOT_ID) or ident.get("pid_ns") != _pid_namespace():
        return None  # another machine, or another container's pids
    fields = _stat(ident["pid"])
    # A zombie has ended: only its parent has not collected it yet.
    return fields is not None and fields[0] != "Z" and int(fields[19]) == ident["start_ticks"]


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on."""
    stat = _read(f"/proc/{pid}/stat")
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return None if stat is None else stat.rsplit(")", 1)[1].split()


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
