"""Live diagnosis beside the job: the wrapper's thread that asks for a live judgement every few
seconds and says what changed.

The judgement itself is the analyzer's (judge/live_judge.py), handed in by the CLI: this module only
runs it, appends each event to ``live/findings.jsonl`` (one JSON object a line, append-only),
puts a line on the console when a warning or worse starts, grows or ends, and gives the metrics
endpoint (:mod:`.metrics`) its snapshot. On several hosts only the wrapper of rank 0's host judges
(it reads the others' records through the shared run directory). Nothing here may stop or slow
the job: it runs in a daemon thread, and a failure is said once and the next round tries again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from diagtrain.profiler.run_dir import LIVE_DIR, LIVE_FINDINGS_FILE, JsonlAppender, RankIndex



class Event(Protocol):
    record: dict[str, Any]
    line: str | None


class Verdict(Protocol):
    events: list[Event]
    active: list[dict[str, Any]]
    latest: dict[int, dict[str, Any]]
    step: int | None  # the latest step every rank had finished
    next_in_s: float  # when the judge asks to be called again
    notes: list[str]  # what the judgement had to do without, each said once


class Metrics(Protocol):
    def update(self, latest: dict[int, dict[str, Any]], active: list[dict[str, Any]]) -> None: ...
    def close(self) -> None: ...


@dataclass
class LiveWork:
    """What the analyzer hands the wrapper's live thread (the CLI makes it)."""

    judge: Callable[[], Verdict]  # one judgement, on the wrapper that leads
    interval_s: float  # seconds between rounds
    reduce: Callable[[], int] | None = None  # every wrapper's share: its own ranks' records into its host's summary


class LiveDiagnosis:
    """Judges the job every few seconds in a daemon thread while it runs. ``make`` gives the judge, the
    seconds between judgements and this host's reduction; it is called in the thread (the analyzer takes a
    second to import)."""

    def __init__(self, run_dir: Path, host: str, make: Callable[[], LiveWork], metrics: Metrics | None = None) -> None:
        self.run_dir, self.host, self.make, self.metrics = Path(run_dir), host, make, metrics
        self.judge: Callable[[], Verdict] | None = None
        self.reduce: Callable[[], int] | None = None
        self.interval_s = 1.0
        self.ranks = RankIndex(run_dir)  # its own: the wrapper's is refreshed by the main thread
        self.events: JsonlAppender | None = None
        self.failed: str | None = None  # the first failure, said once
        self.rounds = 0
        self.cpu_s = 0.0
        self.step: int | None = None  # the latest step judged
        self._standing: list[str] = []  # the warnings and worse standing after the last judgement, in words
        self._say: Callable[[str], None] = lambda _: None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="diagtrain-live", daemon=True)

    def start(self, say: Callable[[str], None]) -> None:
        """Start judging; ``say`` puts a line on the console (above the live table on a terminal)."""
        self._say = say
        self._thread.start()

    def stop(self) -> None:
        """Stop judging (the final report follows) and stop serving metrics."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
        if self.events is not None:
            try:
                self.events.close()
            except OSError:
                pass  # its last line could not be flushed: what was written stays readable
        if self.metrics is not None:
            self.metrics.close()

    def _loop(self) -> None:
        try:
            work = self.make()
            self.judge, self.interval_s, self.reduce = work.judge, work.interval_s, work.reduce
        except Exception as e:  # noqa: BLE001 - as below: the job goes on without live judgement
            self._fail(f"{type(e).__name__}: {e}")
            return
        wait = self.interval_s
        while not self._stop.wait(wait):
            try:
                wait = max(self.interval_s, self.round())
            except Exception as e:  # noqa: BLE001 - live diagnosis must never take the wrapper or the job down
                self._fail(f"{type(e).__name__}: {e}")
            self.cpu_s = time.thread_time()  # this thread's CPU so far: what live judgement cost the host

    def summary(self) -> dict[str, Any]:
        """What the host record keeps of it: judgements made, the last step judged, the wrapper CPU they
        took, a failure."""
        return {"judgements": self.rounds, "last_step": self.step, "cpu_s": round(self.cpu_s, 3), "failed": self.failed}

    def round(self) -> float:
        """One judgement: its events to live/findings.jsonl and the console, its snapshot to the metrics;
        the seconds until the next. Every wrapper first reduces its own ranks' records (a failure there is said
        once: the judge then reads those ranks' own files)."""
        if self.reduce is not None:
            try:
                self.reduce()
            except Exception as e:  # noqa: BLE001 - as in _loop: the judgement and the job go on
                self._fail(f"reducing this host's step records: {type(e).__name__}: {e}")
        if not self._leads():
            return self.interval_s
        verdict = self.judge()
        self.rounds += 1
        self.step = verdict.step if verdict.step is not None else self.step
        for event in verdict.events:
            if self.events is None:
                (self.run_dir / LIVE_DIR).mkdir(exist_ok=True)
                self.events = JsonlAppender(self.run_dir / LIVE_DIR / LIVE_FINDINGS_FILE)
            self.events.append(event.record)
            if event.line:
                self._say(event.line)
        for note in verdict.notes:
            self._say(f"live: {note}")
        self._standing = verdict.standing
        if self.metrics is not None:
            self.metrics.update(verdict.latest, verdict.active, verdict.job_seconds)
        return verdict.next_in_s

    def standing(self) -> list[str]:
        """The warnings and worse standing after the last judgement, a line each, worst first (its words: the
        analyzer's, report/wording.standing_lines)."""
        return list(self._standing)

    def _leads(self) -> bool:
        """Whether this wrapper judges: the one that started rank 0 (any, until rank 0 is known)."""
        ranks = self.ranks.refresh()
        return 0 not in ranks or ranks[0].get("host") == self.host

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            self._say(f"live diagnosis failed ({why}); the job goes on, and the final report is unaffected")
