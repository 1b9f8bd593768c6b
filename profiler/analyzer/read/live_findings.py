"""The live findings standing in a running job: live/findings.jsonl replayed as it is appended.

Live judgement (judge/live_judge.py) appends one event per line: a finding record (the report's schema)
with ``event`` ``new``, ``update`` or ``resolved``, ``detected_at`` and ``step``. A finding is
followed by its kind and ranks, as the judge follows it: ``new`` and ``update`` set its latest
record, ``resolved`` removes it. Only the lines appended since the last read are parsed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.read.step_tail import JsonlTail
from diagtrain.profiler.run_dir import LIVE_DIR, LIVE_FINDINGS_FILE

RESOLVED = "resolved"


class LiveFindings:
    """The findings standing after the events live judgement wrote so far."""

    def __init__(self, run_dir: Path) -> None:
        self.tail = JsonlTail(Path(run_dir) / LIVE_DIR / LIVE_FINDINGS_FILE)
        self.standing: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        self.events = 0  # events replayed so far

    def read(self) -> list[dict[str, Any]]:
        """Replay the events appended since the last call; the findings standing, in the order they began."""
        for event in self.tail.read_json():
            if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
                continue  # not an event of ours: live judgement writes only finding records
            ranks = event.get("ranks") if isinstance(event.get("ranks"), list) else []
            key = (event["kind"], tuple(r for r in ranks if isinstance(r, int)))
            self.events += 1
            if event.get("event") == RESOLVED:
                self.standing.pop(key, None)
            else:
                self.standing[key] = event
        return list(self.standing.values())
