"""What the job is doing, on the terminal: step per rank, steps per second, ranks alive.

A live table on a terminal; on a pipe (CI logs) a plain line now and then, so logs stay short.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from typing import Callable

import psutil
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from diagtrain.profiler.run_dir import RankIndex

LINE_EVERY_S = 30.0  # plain-line mode: one status line this often
RATE_WINDOW_S = 10.0  # steps per second over the last seconds, not since start-up
MAX_ROWS = 16  # beyond this many ranks the table shows the slowest ones
MAX_FINDINGS = 5  # live findings shown above the table: the rest are in live/findings.jsonl
_HOSTNAME = socket.gethostname()


class Progress:
    """Reads heartbeats and exit records; renders them live or as occasional lines."""

    def __init__(self, ranks: RankIndex, console: Console, standing: Callable[[], list[str]] = list) -> None:
        """``standing``: lines naming the live findings that stand now, shown with the table."""
        self.ranks, self.console, self.standing = ranks, console, standing
        self.started = time.monotonic()
        self.history: deque[tuple[float, int]] = deque()
        self.live = Live(console=console, refresh_per_second=4, transient=False) if console.is_terminal else None
        self.last_line = 0.0

    def __enter__(self) -> "Progress":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.update()
            self.live.__exit__(*exc)

    def print(self, line: str) -> None:
        """Show a line of the job's own output above the live table."""
        self.console.print(Text(line.rstrip("\n")), highlight=False, markup=False)

    def update(self) -> None:
        """Refresh from the run directory (called a few times a second)."""
        state = self._state()
        if self.live is not None:
            self.live.update(self._render(state))
        elif time.monotonic() - self.last_line >= LINE_EVERY_S and state["rows"]:
            self.last_line = time.monotonic()
            self.console.print(f"[diagtrain] {self._summary(state)}", highlight=False, markup=False)

    def _state(self) -> dict:
        rows = []
        for rank, info in sorted(self.ranks.refresh().items()):
            beat = self.ranks.heartbeat(rank) or {}
            ended = self.ranks.exit_record(rank)
            alive = ended is None and (info.get("hostname") != _HOSTNAME or psutil.pid_exists(info["pid"]))
            rows.append({"rank": rank, "host": info.get("host"), "step": beat.get("step", 0),
                         "beat_age": time.time() - beat["time"] if "time" in beat else None,
                         "alive": alive, "code": (ended or {}).get("code")})
        now = time.monotonic()
        low = min((r["step"] for r in rows), default=0)
        self.history.append((now, low))
        while self.history and now - self.history[0][0] > RATE_WINDOW_S:
            self.history.popleft()
        t0, s0 = self.history[0]
        rate = (low - s0) / (now - t0) if now > t0 else 0.0
        return {"rows": rows, "rate": rate, "low": low, "high": max((r["step"] for r in rows), default=0)}

    def _summary(self, state: dict) -> str:
        rows = state["rows"]
        alive = sum(r["alive"] for r in rows)
        return (f"{alive}/{len(rows)} ranks alive, step {state['low']}"
                + (f"-{state['high']}" if state["high"] != state["low"] else "")
                + f", {state['rate']:.2f} steps/s, {time.monotonic() - self.started:.0f}s elapsed")

    def _render(self, state: dict) -> Group:
        table = Table(box=None, pad_edge=False)
        for column in ("rank", "host", "step", "last step", "state"):
            table.add_column(column, justify="right" if column in ("rank", "step") else "left")
        shown = sorted(state["rows"], key=lambda r: r["step"])[:MAX_ROWS]
        for r in sorted(shown, key=lambda r: r["rank"]):
            age = "" if r["beat_age"] is None else f"{r['beat_age']:.0f}s ago"
            status = "alive" if r["alive"] else f"exited {r['code']}" if r["code"] is not None else "gone"
            table.add_row(str(r["rank"]), r["host"] or "", str(r["step"]), age, status)
        findings = [Text(f"live: {line}", style="bold red") for line in self.standing()[:MAX_FINDINGS]]
        return Group(Text(self._summary(state), style="bold"), *findings, table)

