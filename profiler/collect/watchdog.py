"""The hang watchdog: no rank on this host has advanced for too long while they are alive."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from diagtrain.profiler.run_dir import DUMP_SIGNAL, RankIndex

DEFAULT_HANG_TIMEOUT_S = 300.0  # longer than any sane step, checkpoint save or first-step compile
DUMP_WAIT_S = 15.0  # time the ranks get to write their stacks and flight recorder
# Before any rank has finished a step, a stall is judged after at least this long: importing torch
# and joining the process group take tens of seconds on a busy host, and that is not a hang.
STARTUP_GRACE_S = 60.0


@dataclass
class Stall:
    """A detected hang: how long nothing advanced, and the last step each rank finished."""

    seconds: float
    last_steps: dict[int, int]


class Watchdog:
    """Watches the heartbeats of the ranks this wrapper started."""

    def __init__(self, ranks: RankIndex, host: str, timeout_s: float) -> None:
        self.ranks, self.host, self.timeout_s = ranks, host, timeout_s

    def _alive(self) -> dict[int, dict]:
        return {r: i for r, i in self.ranks.on_host(self.host).items()
                if self.ranks.exit_record(r) is None and psutil.pid_exists(i["pid"])}

    def check(self) -> Stall | None:
        """A Stall when every live rank has been without progress for the timeout."""
        alive = self._alive()
        if not alive:
            return None
        progress, steps = [], {}
        for rank, info in alive.items():
            beat = self.ranks.heartbeat(rank) or {}
            steps[rank] = beat.get("step", 0)
            progress.append(beat.get("time", info.get("started_at", time.time())))
        idle = time.time() - max(progress)
        limit = self.timeout_s if any(steps.values()) else max(self.timeout_s, STARTUP_GRACE_S)
        return Stall(idle, steps) if idle >= limit else None

    def request_dumps(self, wait_s: float = DUMP_WAIT_S) -> list[int]:
        """Ask every live rank for its state; return the ranks that answered within ``wait_s``."""
        alive = self._alive()
        asked = time.time()
        for info in alive.values():
            try:
                os.kill(info["pid"], DUMP_SIGNAL)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        answered: set[int] = set()
        while time.monotonic() < deadline and len(answered) < len(alive):
            for rank in alive:
                stacks = self.ranks.ranks_dir / str(rank) / "stacks.json"
                if stacks.exists() and stacks.stat().st_mtime >= asked - 1:
                    answered.add(rank)
            time.sleep(0.2)
        return sorted(answered)


