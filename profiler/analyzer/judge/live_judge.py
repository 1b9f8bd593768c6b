"""Live judgement: the verdict while the job runs, with the final report's detectors and settings.

Every few seconds the wrapper (through the CLI, cli/run.py) asks :meth:`LiveJudge.judge` for what
changed. It judges the last steps every rank has finished (run/live_tables.py) with the same
judgement as the final analysis (judgement.judge: its detectors, assessments and verdicts) and the
settings in force, no second set of rules, and adds what only a running job can show: a rank that
has finished no step for many typical steps (before the hang watchdog fires). A finding is followed
from one judgement to the next by its kind and ranks, and each change is an event: ``new``,
``update`` (its severity changed, or the time it cost grew materially) and ``resolved`` (gone from
the recent steps). Only detectors whose evidence is there while the job runs are asked: the hang
detector reads what a stopped job leaves (dumps, exit records), and missing_evidence judges what a
finished run lacks. The profiled windows' traces are loaded once every rank is past them
(run/live_traces.py): the collectives slow_collective judges. After a judgement, the step records
read since go into the final analysis' cache (read/step_cache.py), so that the report at the job's
end parses only the last few.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diagtrain.profiler.analyzer.judge import judgement
from diagtrain.profiler.analyzer.judge.detectors.base import Steady
from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, Candidate, Finding
from diagtrain.profiler.analyzer.judge.verdict import verdict
from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.analyzer.run.live_tables import LiveSteps, Window
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting, values

NO_PROGRESS = "no_progress"  # the live-only kind (written literally at its Finding for the docs test)
ACTIONABLE = SEVERITIES.index("warning")


@section("live")
class Live:
    """How often and over which steps a running job is judged, and when a live finding changes."""

    interval_s: float = setting(2.0, "seconds between judgements at most: a finding within seconds of the steps that "
                                "show it (max_cpu_share spaces them out where a judgement is slow)")
    window_steps: int = setting(20, "the last steps every rank finished are judged: a cause that starts is in 60% of them "
                                "(cost.every_step_share) 12 steps later, one that ends leaves as quickly, and memory "
                                "growth has its warm-up and 5 steps to fit")
    stalled_steps: float = setting(10.0, "no step finished on a rank for this many typical steps is no progress: a "
                                   "checkpoint or an evaluation pauses a few")
    min_stalled_s: float = setting(10.0, "... and for at least this long: a profiled window's trace export takes seconds")
    grown_share: float = setting(0.5, "a live finding is updated (and said again) when the time it cost grew by this "
                                 "share since it was last said: more often is noise in a log")
    max_cpu_share: float = setting(0.02, "the next judgement waits until the CPU the last one took is at most this share "
                                   "of one core over the time since: a large job is judged less often, never at its "
                                   "expense (the first judgement, which imports and reads everything once, and the one "
                                   "after a finding starts below warning, excepted)")
    max_trace_mb: float = setting(1024.0, "the profiled windows' traces (as written, compressed) are loaded while the job "
                                  "runs up to this size: a larger job's wait for the final report rather than take "
                                  "the host's memory from the job")
    summary_silent_s: float = setting(30.0, "a host's step summary silent this long (its wrapper writes a beat every "
                                      "10 s when it has nothing new) is a wrapper that stopped reducing: its "
                                      "ranks' own files are read instead, and the verdict says so")
    cache_lines: int = setting(1000, "a rank's new step records go into the final analysis' cache once this many wait: "
                               "fewer would write many small files, and the final analysis parses no more a rank")
    cache_cpu_s: float = setting(0.05, "CPU a judgement may then spend on that cache (~1,000 records), paced with it by "
                                 "max_cpu_share: it keeps up with the job unless records come faster than that allows")
    resolve_rounds: int = setting(2, "a finding is resolved once absent from this many judgements of new steps in a row: "
                                  "one at the edge of a threshold would come and go every round")
    lasting_share: float = setting(0.5, "... and only once its rank's loss to the job in the steps since it was last found "
                                   "(the ledger's, per step) fell below this share of its price: on a busy host a "
                                   "detector at the edge of its threshold misses a cause that lasts")


# What a live event says on the console (report/wording.py words it): a warning or worse that starts, is said
# again (its severity changed, or the time it cost grew), or ends.
STARTED, AGAIN, ENDED = "started", "again", "ended"


@dataclass
class LiveEvent:
    """One change of a live finding: the JSON record for live/findings.jsonl, whether the console says it (``say``:
    STARTED, AGAIN, ENDED or None) and the time it cost so far; ``line`` is its words (report/wording.worded)."""

    record: dict[str, Any]
    say: str | None = None
    lost_ms: float = 0.0
    line: str | None = None


@dataclass
class LiveVerdict:
    """One judgement: what changed, what stands, and where each rank is."""

    events: list[LiveEvent]
    active: list[dict[str, Any]]  # the findings standing now (JSON records)
    step: int | None  # the latest step every rank has finished
    latest: dict[int, dict[str, Any]]  # rank -> its latest step record's table row
    judged_in_s: float = 0.0  # wall time the judgement took
    next_in_s: float = 0.0  # when to judge again (see Live.max_cpu_share)
    notes: list[str] = field(default_factory=list)  # what it had to do without, each said once
    job_seconds: dict[str, float] = field(default_factory=dict)  # the job's time so far by category (JobSoFar)
    standing: list[str] = field(default_factory=list)  # the warnings and worse standing, a line each (worded())


@dataclass
class Tracked:
    """A finding followed across judgements."""

    record: dict[str, Any]
    since_step: int | None
    severity: str
    lost_by_step: dict[int, float] = field(default_factory=dict)  # step -> ms it cost there
    lost_extra_ms: float = 0.0  # time not tied to a finished step (a stalled rank's wait)
    said_lost_ms: float = 0.0  # the time lost when its last event was made
    said: bool = False  # a console line said it (it reached warning)
    absent: int = 0  # judgements of new steps in a row without it
    last_step: int | None = None  # the latest step judged when it was last found

    @property
    def lost_ms(self) -> float:
        return sum(self.lost_by_step.values()) + self.lost_extra_ms


class JobSoFar:
    """The job's wall time so far by category (run/job_time.py), for counters that only grow: each step the
    windows hold is counted once, when first judged; the start-up is the launch to the first step counted
    (the final report moves the warm-up steps' excess into it as well)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counted: int | None = None  # the last step counted

    def add(self, t: Tables) -> None:
        """Count the job steps of ``t`` (a window's tables) not counted yet."""
        steps = t.job_steps
        if steps.empty:
            return
        new = steps[steps["step"] > self.counted] if self.counted is not None else steps
        if new.empty:
            return
        if self.counted is None:
            launched = t.manifest.get("started_at")
            first = float(new["start"].min())
            self.seconds[job_time.STARTUP] = max(first - launched, 0.0) if isinstance(launched, (int, float)) else 0.0
        for c in job_time.STEP_CATEGORIES:
            self.seconds[c] = self.seconds.get(c, 0.0) + float(new[job_time.column(c)].sum()) / 1e3
        self.counted = int(new["step"].max())


class LiveJudge:
    """Judges a running job's recent steps and follows its findings (call :meth:`judge` every few seconds)."""

    def __init__(self, run_dir: Path) -> None:
        self.settings = Live.active()
        self.steps = LiveSteps(Path(run_dir), self.settings.window_steps, self.settings.max_trace_mb * 2**20,
                               self.settings.summary_silent_s)
        self.tracked: dict[tuple[str, tuple[int, ...]], Tracked] = {}
        self.judged_step: int | None = None
        self._judged: list[Finding] | None = None  # the detectors' findings of the last tables judged
        self._window: Window | None = None  # those tables' window (rebuilt for new steps or a loaded profile)
        self.problems: list[str] = []  # what judgement had to do without (a detector failed, ...), each said once
        self._said = 0  # problems already handed to the caller
        self.job = JobSoFar()
        self._spared = 0  # the ranks read when the objects alive were last left out of the collector's passes

    def judge(self, now: float | None = None) -> LiveVerdict:
        """Read the new step records, judge the recent steps, and return what changed."""
        started, cpu = time.perf_counter(), time.thread_time()
        first = self._judged is None
        now = time.time() if now is None else now
        window = self.steps.window()
        for host in self.steps.silenced:
            self._problem(f"host {host}'s wrapper wrote nothing to its step summary for over "
                          f"{self.settings.summary_silent_s:g} s (hosts/{host}/steps_summary.jsonl): its ranks' own "
                          "step records are read instead")
        steps = window.tables.steps["step"] if window.tables is not None else None
        step = int(steps.max()) if steps is not None and len(steps) else None
        moved = step is not None and step != self.judged_step
        if window.tables is None:
            findings = []
        else:
            if window is not self._window:  # the same tables judged again would give the same findings
                self._judged, self._window = self._detect(window) if _past_warm_up(window) else [], window
            findings = self._judged + [verdict(c, []) for c in self._stalled(window, now)]
            self.job.add(window.tables)
        events = self._follow(findings, window, step, now, moved)
        self.judged_step = step if step is not None else self.judged_step
        active = [self._record(t, "active", now, step) for t in self.tracked.values()]
        self.steps.cache_steps(self.settings.cache_lines, self.settings.cache_cpu_s)  # what the final analysis would parse
        # Paced by the CPU it took, not its wall time: on a crowded host that is mostly waiting for a core.
        # The first judgement's imports and first read are paid once, not at every judgement.
        took_cpu = 0.0 if first else time.thread_time() - cpu
        notes, self._said = self.problems[self._said:], len(self.problems)
        return LiveVerdict(events, active, step, window.latest, time.perf_counter() - started,
                           self._next_in_s(took_cpu, events), notes, dict(self.job.seconds))

    def spare_readers(self) -> None:
        """Leave every object alive now out of the cyclic collector's passes (``gc.freeze``) where ranks were read
        first since the last call: for the wrapper's process, whose judge holds each rank's reader until the job ends
        (~230,000 objects at 8,192 ranks, walked by a full pass of ~90 ms every fourth judgement). Frozen objects are
        still freed when their last reference goes; frozen after every judgement, 60 judgements of 1,024 ranks kept
        the process' memory flat (what a window holds has no cycles to strand)."""
        read = self.held_readers()
        if read > self._spared:
            gc.freeze()
            self._spared = read

    def held_readers(self) -> int:
        """The ranks whose records the judge reads (a reader each, held until the job ends)."""
        return len(self.steps.steps)

    def _next_in_s(self, took_cpu: float, events: list[LiveEvent]) -> float:
        """Paced by the CPU a judgement took, except after a finding started below warning: a cause seen in
        its first steps (a straggler in a few of the judged ones) is told at the next interval, not one or
        two paced ones later (7-8 s each on a 2-core host, 19 s from a straggler's first step to its warning)."""
        suspected = any(e.record["event"] == "new" and SEVERITIES.index(e.record["severity"]) < ACTIONABLE
                        for e in events)
        paced = took_cpu / self.settings.max_cpu_share
        return self.settings.interval_s if suspected else max(self.settings.interval_s, paced)

    def _detect(self, window: Window) -> list[Finding]:
        """The final analysis' judgement of the window's tables: the same function (judgement.judge)."""
        t = window.tables
        traces = self.steps.traces
        if traces is not None and traces.problem:
            self._problem(f"judged without the profiled windows' traces: {traces.problem}")
        return judgement.judge(t, _no_spans, self._problem, live=True).findings

    def _problem(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def _stalled(self, window: Window, now: float) -> list[Candidate]:
        """A rank that has finished no step for ``stalled_steps`` typical steps (and ``min_stalled_s``)."""
        s = self.settings
        typical_ms = _median(window.tables.steps["wall_ms"].to_numpy(dtype=float))
        limit_s = max(s.stalled_steps * typical_ms / 1e3, s.min_stalled_s)
        found = []
        ranks = np.fromiter(window.last_ends.keys(), dtype=np.int64, count=len(window.last_ends))
        ends = np.fromiter(window.last_ends.values(), dtype=float, count=len(window.last_ends))
        idle = now - ends > limit_s  # only the ranks idle past the limit are looked at, not every rank in Python
        for rank, ended in sorted(zip(ranks[idle].tolist(), ends[idle].tolist())):
            idle_s = now - ended
            if self.steps.ranks.exit_record(rank) is not None:
                continue
            last = window.last_steps[rank]
            found.append(Candidate(
                kind="no_progress", ranks=[rank], steps=[last + 1], time_range=(ended, now),
                facts={"idle_s": idle_s, "typical_ms": typical_ms, "last_step": last},
                metrics={"observed_s": round(idle_s, 3), "expected_ms": typical_ms, "threshold_s": limit_s,
                         "last_step": last},
                settings=values(s)))
        return found

    def _follow(self, findings: list[Finding], window: Window, step: int | None, now: float,
                moved: bool) -> list[LiveEvent]:
        """Events for the findings that started, changed or ended since the last judgement."""
        events = []
        seen = set()
        steps_judged = window.tables.steps["step"].nunique() if window.tables is not None else 0
        for f in findings:
            key = (f.kind, tuple(f.ranks))
            seen.add(key)
            tracked = self.tracked.get(key)
            if tracked is None:
                tracked = self.tracked[key] = Tracked(f.to_json(), min(f.steps, default=step), f.severity, last_step=step)
                self._count_lost(tracked, f, steps_judged, now)
                events.append(self._event(tracked, "new", now, step))
                continue
            tracked.record, tracked.absent, tracked.last_step = f.to_json(), 0, step
            if not tracked.said and SEVERITIES.index(f.severity) >= ACTIONABLE:
                # Said for the first time: since where its cause began, not a busy host's earlier blip it was then.
                tracked.since_step = min(f.steps, default=tracked.since_step)
            self._count_lost(tracked, f, steps_judged, now)
            grew = tracked.lost_ms - tracked.said_lost_ms >= self.settings.grown_share * max(tracked.said_lost_ms, 1.0)
            if f.severity != tracked.severity or (grew and tracked.lost_ms > 0):
                tracked.severity = f.severity
                events.append(self._event(tracked, "update", now, step))
        for key in [k for k in self.tracked if k not in seen]:
            tracked = self.tracked[key]
            tracked.absent += moved  # a job that made no progress has not shown that a cause ended
            if tracked.absent >= self.settings.resolve_rounds and not lasting(tracked, window, self.settings):
                del self.tracked[key]
                events.append(self._event(tracked, "resolved", now, step))
        return events

    def _count_lost(self, tracked: Tracked, f: Finding, steps_judged: int, now: float) -> None:
        """What the finding cost the job so far: per step it names, its price over the judged steps."""
        if f.kind == NO_PROGRESS:
            tracked.lost_extra_ms = max(0.0, (now - f.time_range[0]) * 1e3 - f.metrics["expected_ms"])
            return
        lost_s = f.metrics.get("lost_s")
        total_ms = lost_s * 1e3 if lost_s is not None else (f.impact_ms or 0.0) * steps_judged
        if f.steps and total_ms > 0:
            tracked.lost_by_step.update({int(s): total_ms / len(f.steps) for s in f.steps})

    def _event(self, tracked: Tracked, event: str, now: float, step: int | None) -> LiveEvent:
        record = self._record(tracked, event, now, step)
        actionable = SEVERITIES.index(tracked.severity) >= ACTIONABLE
        say = None
        if event == "resolved" and tracked.said:
            say = ENDED
        elif event != "resolved" and actionable:
            say, tracked.said = (AGAIN if tracked.said else STARTED), True
        tracked.said_lost_ms = tracked.lost_ms
        return LiveEvent(record, say, tracked.lost_ms)

    @staticmethod
    def _record(tracked: Tracked, event: str, now: float, step: int | None) -> dict[str, Any]:
        """The report's finding record with the event, when it was detected, the step, and its cost so far."""
        record = {**tracked.record, "event": event, "detected_at": round(now, 3), "step": step,
                  "since_step": tracked.since_step, "lost_s_so_far": round(tracked.lost_ms / 1e3, 3)}
        return json.loads(json.dumps(record, default=_plain))  # numpy numbers as plain ones: any JSON writer takes it


def lasting(tracked: Tracked, window: Window, s: Live) -> bool:
    """Whether a priced finding's rank still costs the job what it did in the steps judged since the finding was
    last found (the ledger's loss per step, its median, against the price per charged step)."""
    record = tracked.record
    charged = (record.get("metrics") or {}).get("charged_ms_per_step")
    ledger = window.tables.ledger if window.tables is not None else None
    if len(record.get("ranks") or []) != 1 or not charged or ledger is None or ledger.empty:
        return False
    since = ledger[(ledger["rank"] == record["ranks"][0]) & (ledger["step"] > (tracked.last_step or 0))]
    return not since.empty and float(since["lost_ms"].median()) >= s.lasting_share * charged


def _no_spans(_: int) -> None:
    """A running job's traced spans are not read: the profiled windows' collectives are (run/live_traces.py)."""
    return None


def _past_warm_up(window: Window) -> bool:
    """Whether the window holds the steps after warm-up that comparing ranks needs. The final analysis
    judges a short run's warm-up steps too, for want of others (detectors.base.steady); a running job
    will have others within steps, and its first steps' start-up costs fall on ranks unevenly."""
    s, steps = Steady.active(), window.tables.steps["step"]
    return steps[steps > s.warmup_steps].nunique() >= s.min_steady_steps


def _median(values: np.ndarray) -> float:
    """``statistics.median`` of the values, by numpy's selection where none is NaN (the same middle, or mean of the two
    middle ones: a sort of 160,000 Python floats at 8,192 ranks took 20 ms); with a NaN, statistics' own answer."""
    if np.isnan(values).any():
        return float(statistics.median(values.tolist()))
    return float(np.median(values))


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)  # a numpy scalar
    return item() if callable(item) else str(value)
