"""A running job in the dashboard: its steps, telemetry and live findings so far, refreshed in place.

The tables come from the analyzer, never from rules of the dashboard's own: the steps and telemetry
from run/so_far.py (the final analysis' step reader, fed only what was appended since the last
refresh), the findings from live/findings.jsonl as live judgement wrote them (read/live_findings.py).
What needs traces or the final analysis (operator spans, collectives, the model, peaks per rank,
hangs) waits for the job to end: once `diagtrain run` has analyzed it, the app loads the final run
instead (:meth:`LiveRun.final`).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

from diagtrain.dashboard.data import LiveMark, RunData, lanes, load, missing_analysis, since
from diagtrain.profiler.analyzer.read.live_findings import LiveFindings
from diagtrain.profiler.analyzer.run.so_far import ANALYZING, ENDED, RUNNING, RunSoFar, SoFar, job_state

# How often the page asks for what is new: live judgement writes at most every 2 s (live.interval_s)
# and a step record comes every step; every 3 s shows each judgement soon without keeping the server busy.
REFRESH_MS: int = 3000
PENDING = "available when the job ends and is analyzed"


WORDS = {RUNNING: "running", ANALYZING: "ended, being analyzed", ENDED: "ended, not analyzed"}


def pending(what: str) -> str:
    """The line a running job's view shows for ``what`` needs the traces or the final analysis."""
    return f"{what}: {PENDING}."


def follows(run: Path) -> bool:
    """Whether ``run`` is a job still running or being analyzed, with no analysis to show yet."""
    return bool(missing_analysis(run)) and job_state(run) in (RUNNING, ANALYZING)


class LiveRun:
    """One running job's view, rebuilt from what was appended at each :meth:`refresh`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.so_far = RunSoFar(self.path)
        self.findings = LiveFindings(self.path)
        self.t0: float | None = None  # the first step's start: x = 0, fixed for the run
        self.version = 0  # how many times the view changed
        self.data: RunData | None = None
        self._lock = threading.Lock()  # each tab's interval asks: one reader of the files at a time

    def refresh(self) -> RunData:
        """Read what the job appended and rebuild the view when anything changed (``version`` counts)."""
        with self._lock:
            before = self.findings.events
            so_far = self.so_far.read()
            standing = self.findings.read()
            now = time.time()
            if (self.data is None or so_far.new_records or self.findings.events != before
                    or so_far.state != self.data.live.state):
                self.data = self._view(so_far, standing, now)
                self.version += 1
            else:
                self.data.live.updated_at = now
            return self.data

    def final(self) -> RunData | None:
        """The final run once the job ended and its analysis is written (None until then)."""
        if self.data is None or self.data.live.state != ENDED or missing_analysis(self.path):
            return None
        return load(self.path)

    def _view(self, so_far: SoFar, standing: list[dict], now: float) -> RunData:
        steps = so_far.steps
        if self.t0 is None and len(steps):
            self.t0 = float(steps["start"].min())
        t0 = self.t0 or 0.0
        steps, telemetry = since(steps, so_far.telemetry, t0) if len(steps) else (steps, pd.DataFrame())
        hosts = sorted(set(so_far.rank_hosts.values()))
        report = {"findings": standing, "settings": {"overridden": {}},
                  "run": {"status": WORDS[so_far.state], "phases": so_far.phases, "hosts": hosts,
                          "world_size": so_far.world_size, "steps": so_far.step or 0, "command": so_far.command}}
        timeline = {"ranks": {str(r): {"host": h} for r, h in so_far.rank_hosts.items()}}  # hosts only: no spans yet
        data = RunData(path=self.path, report=report, steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(),
                       telemetry=telemetry, nccl={}, hang={}, timeline=timeline, t0=t0,
                       live=LiveMark(so_far.state, so_far.step, now))
        data.lanes = lanes(report, steps, timeline) if len(steps) else []
        return data


def marker(run: RunData) -> str:
    """The live badge's text: ``live: step 12, updated 14:03:07`` (empty for a finished run)."""
    mark = run.live
    if mark is None:
        return ""
    updated = datetime.fromtimestamp(mark.updated_at).strftime("%H:%M:%S")
    step = f"step {mark.step}" if mark.step is not None else "no step finished yet"
    if mark.state == RUNNING:
        return f"live: {step}, updated {updated}"
    if mark.state == ANALYZING:
        return f"job ended at {step}: analyzing, the report follows (updated {updated})"
    return f"job ended at {step}, not analyzed: run `diagtrain analyze {run.path}` (checked {updated})"
