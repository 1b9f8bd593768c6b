"""`--profile-steps auto`: profile when it matters, the same steps on every rank.

The wrapper follows the step times the ranks append to their steps.jsonl and decides, once per
window, which steps every rank profiles: one short window after warm-up (as soon as step times
settle), and another when step time rises well above its recent median (a slowdown worth a
trace). The traces of at most ``records.max_profiled_windows`` windows are kept: past that, a slowdown worse than
the least anomalous kept window (the warm-up one first) is profiled in its place, and once a rank's trace of the new
window is written its trace of the replaced one is removed (never before: a rank always keeps one of the two).
A window starts far enough ahead for every rank to read the request
at a step boundary before reaching it (see rank/profile_requests.py): two steps when every rank
runs on this host (the file is there as soon as it is written), half a second of steps when some
read it over a shared filesystem. With several hosts only the wrapper of rank 0's host decides.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from diagtrain.profiler.step_files import StepFilesTail
from diagtrain.profiler.run_dir import (PROFILE_WINDOWS_FILE, SCHEMA_VERSION, STEPS_FILE, RankIndex, Records,
                                        remove_quietly, write_json_atomic)

WINDOW_STEPS = 3  # the straggler and late-rank statistics need 3 profiled steps to see variation
MIN_WARMUP_STEPS = 3  # step 1 carries start-up; look at steps 2.. before calling the job warm
SETTLED_STEPS = 3  # warm: this many consecutive step times ...
SETTLED_SPREAD = 0.25  # ... within this share of their median
MAX_WARMUP_STEPS = 20  # a job whose step time never settles is profiled after this many steps
LEAD_S = 0.5  # a window starts this far ahead where ranks on other hosts read it over a shared filesystem
# ... and this far where every rank is on this host: the wrapper's write and a rank's stat take milliseconds.
LOCAL_LEAD_S = 0.05
# A rank reads the request as each step begins. The step in flight when the wrapper read the records may end
# before the request is written (a busy host, the wrapper's live judgement beside it: tens of ms seen, and
# a rank missed a 2-step lead), so the first safe step is the one after the next.
MIN_LEAD_STEPS = 3
HISTORY_STEPS = 20  # "recent median": the last unprofiled steps
MIN_HISTORY_STEPS = 5  # a median of fewer steps is not a baseline
SLOWDOWN_FACTOR = 1.5  # a step this much slower than the recent median ...
MIN_SLOWDOWN_MS = 10.0  # ... and by this much (scheduling noise on a busy host stays below it)
SLOW_STEPS = 2  # ... twice in a row: one slow step (a checkpoint, a hiccup) is over before a trace
REMOVE_EVERY_S = 5.0  # replaced traces are looked for this often (a listing of every rank's folder)
COOLDOWN_STEPS = 10  # no new window this soon after the previous one ended


@dataclass
class Window:
    """One requested window: steps ``first`` to ``last`` and why."""

    first: int
    last: int
    reason: str
    decided_at: float
    seen_step: int  # the furthest step any rank had finished when it was decided
    severity: float = 0.0  # a slowdown's step time over the recent median; 0 for the warm-up window
    replaces: int | None = None  # the first step of the kept window whose traces this one's replace
    traces_removed: bool = False  # replaced, and every rank's trace of it removed

    def trace_name(self, rank: int) -> str:
        """The rank's trace of this window (rank/instrument.py names it so)."""
        return f"trace-rank{rank}-steps{self.first}-{self.last}.json.gz"


@dataclass
class AutoProfiler:
    """Decides the windows of one run from its ranks' step records (call :meth:`update` often)."""

    run_dir: Path
    ranks: RankIndex
    host: str
    say: Callable[[str], None] = lambda _: None
    windows: list[Window] = field(default_factory=list)
    durations: dict[int, float] = field(default_factory=dict)  # step -> ms (the slowest rank's)
    _tails: dict[int, StepFilesTail] = field(default_factory=dict)  # rank -> its step records, as read so far
    bounds: Records = field(default_factory=Records.active)  # how many windows' traces are kept
    _removed_at: float = -math.inf

    def update(self) -> None:
        """Read new step records; request a window if one is due."""
        ranks = self.ranks.on_host(self.host)
        if 0 not in ranks:
            return  # one decider per run: the wrapper that started rank 0
        for rank in ranks:  # step time is the job's (ranks meet at every collective): this host's will do
            self._read_new_steps(rank)
        window = self.decide()
        if window is not None:
            self.windows.append(window)
            self._write()
            old = self._window_at(window.replaces)
            instead = f"; its traces replace those of steps {old.first}-{old.last}" if old is not None else ""
            self.say(f"profiling steps {window.first}-{window.last} on every rank ({window.reason}){instead}")
        if time.monotonic() - self._removed_at >= REMOVE_EVERY_S:
            self.remove_replaced()

    def remove_replaced(self) -> None:
        """Remove each rank's trace of a replaced window where its trace of the window replacing it is written (the
        wrapper calls this once more when the job ended)."""
        self._removed_at = time.monotonic()
        changed = False
        for window in self.windows:
            old = self._window_at(window.replaces)
            if old is None or old.traces_removed:
                continue
            left = False
            for rank in self.ranks.refresh():
                folder = self.ranks.ranks_dir / str(rank)
                if (folder / old.trace_name(rank)).exists():
                    if (folder / window.trace_name(rank)).exists():
                        remove_quietly(folder / old.trace_name(rank))
                    else:
                        left = True  # not written yet (or never: a full disk), so the old one stays
            if not left:
                old.traces_removed = changed = True
        if changed:
            self._write()

    def _write(self) -> None:
        write_json_atomic(self.run_dir / PROFILE_WINDOWS_FILE, {
            "schema_version": SCHEMA_VERSION, "mode": "auto", "windows": [asdict(w) for w in self.windows]})

    def _window_at(self, first: int | None) -> Window | None:
        return next((w for w in self.windows if w.first == first), None) if first is not None else None

    def kept(self) -> list[Window]:
        """The windows whose traces are kept: every one but those replaced."""
        replaced = {w.replaces for w in self.windows}
        return [w for w in self.windows if w.first not in replaced]

    def _read_new_steps(self, rank: int) -> None:
        tail = self._tails.setdefault(rank, StepFilesTail(self.ranks.ranks_dir / str(rank) / STEPS_FILE))
        for record in tail.read_json():  # whole lines: one being written is read next time
            try:
                step, ms = int(record["step"]), float(record["duration_ms"])
            except (KeyError, TypeError, ValueError):
                continue
            self.durations[step] = max(ms, self.durations.get(step, 0.0))

    def decide(self) -> Window | None:
        """The window to request now, if any (from :attr:`durations` and :attr:`windows`)."""
        if not self.durations:
            return None
        seen = max(self.durations)
        if not self.windows:
            if seen < MIN_WARMUP_STEPS + 1:
                return None
            recent = [self.durations[s] for s in range(seen - SETTLED_STEPS + 1, seen + 1) if s in self.durations]
            settled = len(recent) == SETTLED_STEPS and _spread(recent) <= SETTLED_SPREAD
            if settled or seen >= MAX_WARMUP_STEPS:
                return self._window(seen, "after warm-up" if settled else f"after {seen} steps (step time not settled)")
            return None
        last = self.windows[-1]
        if seen < last.last + COOLDOWN_STEPS:
            return None
        history = [ms for s, ms in sorted(self.durations.items()) if s > 1 and not self._profiled(s)]
        baseline, latest = history[-HISTORY_STEPS - SLOW_STEPS:-SLOW_STEPS], history[-SLOW_STEPS:]
        if len(baseline) < MIN_HISTORY_STEPS or len(latest) < SLOW_STEPS:
            return None
        median = statistics.median(baseline)
        if not all(ms >= SLOWDOWN_FACTOR * median and ms - median >= MIN_SLOWDOWN_MS for ms in latest):
            return None
        severity = latest[-1] / median
        kept = self.kept()
        replaced = min(kept, key=lambda w: (w.severity, w.first)) if len(kept) >= self.bounds.max_profiled_windows else None
        if replaced is not None and severity < self.bounds.replace_margin * replaced.severity:
            return None  # enough traces, each of a slowdown as bad
        window = self._window(seen, f"step {seen} took {latest[-1]:.0f} ms, {severity:.1f}x "
                                    f"the median {median:.0f} ms of the {len(baseline)} steps before")
        window.severity = round(severity, 3)
        window.replaces = replaced.first if replaced is not None else None
        return window

    def _window(self, seen: int, reason: str) -> Window:
        step_s = statistics.median([self.durations[s] for s in sorted(self.durations)[-SETTLED_STEPS:]]) / 1e3
        lead_s = LOCAL_LEAD_S if self._whole_job_here() else LEAD_S
        lead = max(MIN_LEAD_STEPS, math.ceil(lead_s / step_s) if step_s > 0 else MIN_LEAD_STEPS)
        first = seen + lead
        return Window(first, first + WINDOW_STEPS - 1, reason, time.time(), seen)

    def _whole_job_here(self) -> bool:
        """Every rank of the job runs on this host (False while that is not known)."""
        here = self.ranks.on_host(self.host)
        worlds = {info.get("world_size") for info in here.values()}
        return len(worlds) == 1 and len(here) == next(iter(worlds))

    def _profiled(self, step: int) -> bool:
        return any(w.first <= step <= w.last for w in self.windows)


def _spread(values: list[float]) -> float:
    """Largest distance from the median, as a share of it."""
    median = statistics.median(values)
    return max(abs(v - median) for v in values) / median if median > 0 else math.inf
