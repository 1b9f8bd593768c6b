"""A running job's steps and telemetry so far: every step every rank has finished, read as appended.

The dashboard of a running job (dashboard/live.py) calls :meth:`RunSoFar.read` every few seconds.
It reads each rank's steps.jsonl and each host's telemetry.jsonl from where the last call stopped
(live_tables.LiveSteps, read/step_tail.py: the final analysis' own record reader), so a call costs
in proportion to what was appended, and keeps the tables of the whole run so far, in the columns
the final analysis gives (tables.build's step part). :func:`job_state` says whether the job still
runs, is being analyzed, or has ended, from the records its wrappers keep in the run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from diagtrain.profiler.analyzer.read.row_groups import table_of
from diagtrain.profiler.analyzer.read.run_files import DEVICE_LISTS
from diagtrain.profiler.analyzer.run.live_tables import LiveSteps, samples_table
from diagtrain.profiler.analyzer.run.tables import step_table
from diagtrain.profiler.run_dir import ANALYSIS_CLAIM, read_hosts
from diagtrain.profiler.util import processes

RUNNING, ANALYZING, ENDED = "running", "analyzing", "ended"


def job_state(run_dir: Path, hosts: list[dict[str, Any]] | None = None) -> str:
    """``running`` while a wrapper of the job runs; ``analyzing`` once every host ended and the wrapper
    that claimed the analysis still writes it; ``ended`` otherwise (analyzed, or not to be: --no-analyze,
    a failed analysis, a killed wrapper). ``hosts``: the host records, if the caller has read them."""
    run_dir = Path(run_dir)
    hosts = read_hosts(run_dir) if hosts is None else hosts  # a running record whose wrapper is gone reads as abandoned
    if any(h.get("status") == "running" for h in hosts):
        return RUNNING
    if (run_dir / "report.json").exists():
        return ENDED
    try:
        claimed_by = (run_dir / ANALYSIS_CLAIM).read_text().strip()
    except OSError:
        return ENDED
    analyst = next((h for h in hosts if h.get("name") == claimed_by), None)
    # On another machine its process cannot be asked: the analysis is taken to be on its way.
    alive = processes.alive((analyst or {}).get("process") or {})
    return ANALYZING if analyst is not None and alive is not False else ENDED


@dataclass
class SoFar:
    """The run so far: every finished step of every rank, and every telemetry sample."""

    steps: pd.DataFrame  # rank, step, start, end (Unix s), wall_ms, <phase>_ms, counters, profiled
    telemetry: pd.DataFrame  # one row per sample, ``time`` in Unix seconds
    phases: list[str]
    world_size: int | None
    state: str  # job_state's: running, analyzing or ended
    command: list[str] | None = None  # the wrapped command, as the first host's record has it
    rank_hosts: dict[int, str] = field(default_factory=dict)
    step: int | None = None  # the latest step every rank has finished
    new_records: int = 0  # step records and telemetry samples the last read added


class RunSoFar:
    """Every rank's step records and every host's telemetry of one run, read as they are appended."""

    def __init__(self, run_dir: Path) -> None:
        self.live = LiveSteps(Path(run_dir), None)  # keeps every step
        self._steps = pd.DataFrame()
        self._telemetry = pd.DataFrame()
        self._repeated = 0  # steps recorded more than once, so far

    def read(self) -> SoFar:
        """Read what was appended since the last call; the tables of the whole run so far."""
        new = self.live.read()
        added = self.live.added()
        if added:
            # The device timings' raw lists (of earlier steps) are not kept: the final analysis turns them into columns.
            rows = table_of(added).drop(columns=list(DEVICE_LISTS), errors="ignore")
            self._steps = _appended(self._steps, rows)
        repeated = sum(tail.found.repeated for tail in self.live.steps.values())
        if repeated != self._repeated:  # a step recorded again (a restarted job) replaces its row, as in the analysis
            self._steps = self._steps.drop_duplicates(["rank", "step"], keep="last", ignore_index=True)
            self._repeated = repeated
        if self.live.new_samples:
            self._telemetry = _appended(self._telemetry, samples_table(self.live.new_samples))
        steps = step_table(self._steps, profiled=self.live.profiled_steps()) if len(self._steps) else pd.DataFrame()
        hosts = read_hosts(self.live.run_dir)
        command = hosts[0].get("command") if hosts else None
        return SoFar(steps=steps, telemetry=self._telemetry, phases=self.live.phases(),
                     world_size=self.live.world_size(), state=job_state(self.live.run_dir, hosts),
                     command=command if isinstance(command, list) else None, rank_hosts=self.live.rank_hosts(),
                     step=self._common_step(), new_records=new + len(self.live.new_samples))

    def _common_step(self) -> int | None:
        """The latest step that every rank with records has finished."""
        last: list[Any] = [t.last_step for t in self.live.steps.values() if t.rows]
        return min(last) if last else None


def _appended(table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` below ``table`` (pandas deprecates concatenating an empty frame: the first rows are the table)."""
    return pd.concat([table, rows], ignore_index=True) if len(table) else rows.reset_index(drop=True)
