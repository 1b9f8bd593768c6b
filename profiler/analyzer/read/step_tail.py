"""Reading a run directory's append-only records while the job still writes them: only the bytes
added since the last read, and only whole lines (the line being written is read next time).

Live judgement (:mod:`diagtrain.profiler.analyzer.judge.live_judge`) and the dashboard of a running job
(run/so_far.py) read every rank's steps.jsonl and every host's telemetry.jsonl this way every few
seconds, so a read costs what was appended, not the run.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.read.run_files import SHOWN_PROBLEMS, StepFile, add_step
# The tails live with the segments (no pandas there: the wrapper follows step records before the analyzer loads).
from diagtrain.profiler.step_files import JsonlTail, StepFilesTail, json_value

__all__ = ["JsonlTail", "RankSteps", "StepFilesTail", "StepTail", "json_value"]



class RankSteps:
    """One rank's recent step rows as they come, checked (run_files' rows): from its steps.jsonl
    (:class:`StepTail`) or from its host's summary (host_summary.py). Only the last ``keep`` steps are held
    (live judgement looks at recent steps); ``keep=None`` holds every step (the dashboard shows the whole run)."""

    def __init__(self, rank: int, keep: int | None) -> None:
        self.rank, self.keep = rank, keep
        self.found = StepFile()  # its phases, point-to-point calls, end-of-run device line, what was refused
        # step -> its table row (a dict, or a row_groups.Row as its host's summary carried it), the last ``keep`` steps
        self.rows: dict[int, Mapping[str, Any]] = {}
        self.added: dict[int, Mapping[str, Any]] = {}  # step -> its row, as the last read added (or replaced) it
        self._last: int | None = None  # the largest step held (only the oldest are let go)
        self._held: list[int] = []  # the steps held, as a heap: the oldest let go without a pass over them

    def take(self, added: dict[int, Mapping[str, Any]]) -> None:
        """Hold the rows a read added (``self.found`` already has their phases and point-to-point calls). Called for
        every rank at every read (8,192 at 8,192 ranks): no pass over the steps held."""
        self.added = added
        rows, keep = self.rows, self.keep
        if len(added) == 1 and self._last is not None and (step := next(iter(added))) > self._last:
            # A rank's usual read: its next step, later than every step held (so none of them again), the oldest
            # let go in the same heap operation (a fifth less CPU than the general form, 8,192 calls a judgement).
            rows[step] = added[step]
            self._last = step
            if keep is not None and len(rows) > keep:  # one over at most: each take leaves ``keep`` (set once)
                oldest = heapq.heappushpop(self._held, step)
                del rows[oldest]
                self.found.p2p.pop(oldest, None)
            else:
                heapq.heappush(self._held, step)
        else:
            self._hold(added)
        found = self.found
        if len(found.bad_lines) > SHOWN_PROBLEMS or len(found.impossible) > SHOWN_PROBLEMS:
            found.bound_problems()

    def _hold(self, added: dict[int, Mapping[str, Any]]) -> None:
        """:meth:`take`'s general form: any steps, a step held already counted as repeated, the oldest past ``keep``
        let go."""
        rows, held = self.rows, self._held
        if added:
            for step in added:
                if step in rows:
                    self.found.repeated += 1  # a step recorded again, read later
                else:
                    heapq.heappush(held, step)
            rows.update(added)
            newest = max(added)
            if self._last is None or newest > self._last:
                self._last = newest
        if self.keep is not None:
            while len(rows) > self.keep:  # the oldest few only (one a read, as a rank moves on)
                step = heapq.heappop(held)
                del rows[step]
                self.found.p2p.pop(step, None)

    @property
    def first(self) -> int | None:
        """The earliest step held."""
        return self._held[0] if self._held else None

    @property
    def last_step(self) -> int | None:
        """The latest step this rank finished, as far as its records say."""
        return self._last if self.rows else None  # kept as rows come: a max over every rank's steps was 8 ms a judgement


class StepTail(RankSteps):
    """One rank's step records as they are appended to its steps.jsonl (and its closed segments), read by the analyzer's own reader
    (run_files): the same rows, phases and point-to-point counts as the final analysis, the same records refused."""

    def __init__(self, path: Path, rank: int, keep: int | None) -> None:
        super().__init__(rank, keep)
        self.tail = StepFilesTail(path)

    def read(self) -> int:
        """Read what was appended; the number of new step records."""
        first = self.tail.lines + 1
        before = self.found.lines
        added: dict[int, dict[str, Any]] = {}
        for number, line in enumerate(self.tail.read(), first):
            add_step(self.found, added, number, line, self.rank)
        self.take(added)
        return self.found.lines - before
