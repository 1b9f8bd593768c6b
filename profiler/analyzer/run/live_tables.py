"""The analysis tables of a running job's recent steps, from what its ranks have appended so far.

Live judgement (judge/live.py) calls :meth:`LiveSteps.tables` every few seconds: each rank's
steps.jsonl and each host's telemetry.jsonl are read from where the last call stopped
(read/step_tail.py), and the tables hold the last steps that every rank has finished, in the same
columns the final analysis gives the detectors, through the same :func:`tables.assemble`: the step
records' phases, always-on counters and device timings (run/device_time.py), the run's structure from
the counted point-to-point calls and trainer.json, and the ranks' telemetry joined to their steps. There are no traces, flight records or logs: what
needs them waits for the final report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from diagtrain.profiler.analyzer.read import run_files as rf
from diagtrain.profiler.analyzer.read.step_cache import cache_dir, extend_cache
from diagtrain.profiler.analyzer.read.step_tail import JsonlTail, StepTail
from diagtrain.profiler.analyzer.rank.p2p import from_step_records as p2p_from_step_records
from diagtrain.profiler.analyzer.read.run_read import clock_measurements, requested_profile_steps
from diagtrain.profiler.analyzer.run import device_time
from diagtrain.profiler.analyzer.run.live_traces import LiveTraces
from diagtrain.profiler.analyzer.run.tables import Tables, assemble, step_table
from diagtrain.profiler.run_dir import ANALYSIS_CACHE, HOSTS_DIR, RankIndex, read_hosts
from diagtrain.profiler.util.bounded_read import InputError

TELEMETRY_MARGIN_S = 5.0  # telemetry kept from this long before the window's first step: its first sample


@dataclass
class Window:
    """The recent steps judged: the tables, and where the ranks stand."""

    tables: Tables | None  # None until every rank with records has finished a step in common
    last_steps: dict[int, int]  # rank -> the latest step it finished
    last_ends: dict[int, float]  # rank -> when that step ended (Unix s, the rank's clock)
    latest: dict[int, dict[str, Any]]  # rank -> its latest step's table row
    finished: int | None = None  # the latest step every running rank has finished


class LiveSteps:
    """Every rank's step records and every host's telemetry, read as they are appended."""

    def __init__(self, run_dir: Path, window_steps: int | None, max_trace_bytes: float = 0.0) -> None:
        """``window_steps=None`` keeps every step and gathers no samples (run/so_far.py takes them as read);
        the profiled windows' traces are loaded up to ``max_trace_bytes`` (live_traces.py), never without a window."""
        self.run_dir, self.window_steps = Path(run_dir), window_steps
        self.ranks = RankIndex(run_dir)
        self.steps: dict[int, StepTail] = {}
        self.telemetry: dict[Path, JsonlTail] = {}
        self.samples: list[dict[str, Any]] = []  # telemetry rows of the ranks and hosts, recent ones
        self.new_samples: list[dict[str, Any]] = []  # the rows the last read added
        self.trainer: dict[str, Any] | None = None
        self._last: Window | None = None
        self.traces = LiveTraces(run_dir, max_trace_bytes) if window_steps is not None and max_trace_bytes > 0 else None
        self.cached: dict[int, int] = {}  # rank -> lines of its steps.jsonl in the final analysis' cache
        self._next_cached = 0  # the rank whose turn it is to be cached
        self.groups: dict[int, dict] = {}  # rank -> its process groups (process_groups.json, written at its first step)
        self._hosts: list[dict[str, Any]] | None = None  # the hosts' records (host.json), once every rank's is read

    def read(self) -> int:
        """Read what every rank and host appended since the last call; the number of new step records."""
        infos = self.ranks.refresh()
        new = 0
        # Twice the window: a rank ahead of the slowest by up to a window keeps its steps in common.
        keep = None if self.window_steps is None else 2 * self.window_steps
        for rank in infos:
            if rank not in self.steps:
                self.steps[rank] = StepTail(self.ranks.ranks_dir / str(rank) / "steps.jsonl", rank, keep)
            new += self.steps[rank].read()
        self.new_samples = []
        for path in self.run_dir.glob(f"{HOSTS_DIR}/*/telemetry.jsonl"):
            tail = self.telemetry.setdefault(path, JsonlTail(path))
            self.new_samples += [r for r in tail.read_json()
                                 if isinstance(r, dict) and isinstance(r.get("time"), (int, float))]
        if self.window_steps is not None:
            self.samples += self.new_samples
        if self.trainer is None and (self.run_dir / "trainer.json").exists():
            try:
                self.trainer = rf.read_trainer(self.run_dir / "trainer.json")[0]
            except (InputError, OSError):
                self.trainer = {}  # not readable: the structure comes from the step records alone
        return new

    def cache_steps(self, min_lines: int, cpu_s: float) -> int:
        """Add the ranks' new step records to the final analysis' cache (analysis/cache, step_cache.py),
        a rank once ``min_lines`` wait, in turns, until ``cpu_s`` of this thread's CPU is spent: the final
        analysis then parses only the lines after. The lines parsed."""
        started, parsed = time.thread_time(), 0
        ranks = sorted(self.steps)
        for rank in ranks[self._next_cached:] + ranks[:self._next_cached]:
            tail = self.steps[rank].tail
            if tail.lines - self.cached.get(rank, 0) < min_lines:
                continue
            if time.thread_time() - started >= cpu_s:
                break
            try:
                # Files of at least min_lines rows, none read back and written again: the wrapper's CPU is the job's.
                parsed += extend_cache(tail.path, rank, cache_dir(self.run_dir / ANALYSIS_CACHE, rank), min_lines)
            except (InputError, OSError):
                pass  # not readable now: the final analysis reads it, and says why
            self.cached[rank] = tail.lines - 1  # a file's last line stays out of its cache
            self._next_cached = (ranks.index(rank) + 1) % len(ranks)
        return parsed

    def window(self) -> Window:
        """Read what is new and build the tables of the last ``window_steps`` steps every rank finished
        (the last ones again when no rank finished a step since)."""
        if self.read() == 0 and self._last is not None and not self._new_traces(self._last):
            return self._last
        self._last = self._window()
        return self._last

    def _window(self) -> Window:
        tails = {r: t for r, t in self.steps.items() if t.rows}
        last_steps = {r: int(t.last_step) for r, t in tails.items()}
        latest = {r: t.rows[last_steps[r]] for r, t in tails.items()}
        last_ends = {r: float(row["end"]) for r, row in latest.items()}
        if not tails:
            return Window(None, last_steps, last_ends, latest)
        # A rank that has exited (it crashed, or did fewer steps) holds the others' window back no longer.
        running = [s for r, s in last_steps.items() if self.ranks.exit_record(r) is None]
        common = min(running or last_steps.values())
        rows = [row for t in tails.values() for s, row in t.rows.items() if common - self.window_steps < s <= common]
        if not rows:
            return Window(None, last_steps, last_ends, latest)
        if self.traces is not None:
            self.traces.update(common)
        tables = self._tables(rows, tails)
        timed = device_time.latest_timed(tables.steps)  # the metrics endpoint serves them beside the host's
        latest = {r: {**row, **timed.get(r, {})} for r, row in latest.items()}
        return Window(tables, last_steps, last_ends, latest, common)

    def _new_traces(self, last: Window) -> bool:
        """Whether a profiled window became complete since ``last`` was built (its traces are then loaded)."""
        return self.traces is not None and last.finished is not None and self.traces.update(last.finished)

    def profiled_steps(self) -> set[int]:
        """The steps the ranks were asked to profile (their traces are the final analysis' to read)."""
        return requested_profile_steps(self.run_dir)

    def phases(self) -> list[str]:
        """The phases the ranks' step records named, in the order they were first seen."""
        phases: list[str] = []
        for t in self.steps.values():
            phases += [p for p in t.found.phases if p not in phases]
        return phases

    def world_size(self) -> int | None:
        """The job's world size, as its ranks' records say."""
        return next((i.get("world_size") for i in self.ranks.info.values() if isinstance(i.get("world_size"), int)), None)

    def rank_hosts(self) -> dict[int, str]:
        """rank -> the host folder of the wrapper that started it."""
        return {r: i.get("host") for r, i in self.ranks.info.items() if i.get("host")}

    def _tables(self, rows: list[dict[str, Any]], tails: dict[int, StepTail]) -> Tables:
        # A step's device timings come in later records: the held rows from the window's first step on are read,
        # not only the window's (the ones before carry the timings of steps before it).
        first = min(row["step"] for row in rows)
        device = [d for r, t in tails.items()
                  for d in device_time.records_of_rows(r, (row for s, row in t.rows.items() if s >= first), t.found.device)]
        p2p = {r: p2p_from_step_records(t.found.p2p) for r, t in tails.items() if t.found.p2p}
        steps = step_table(pd.DataFrame(rows), profiled=self.profiled_steps())
        tables = Tables(steps=steps, ranks=pd.DataFrame(), phases=self.phases(), trainer=self.trainer or None,
                        # the profiled windows' collectives (live_traces.py), lined up across hosts as the final ones
                        collectives=self.traces.collectives.copy() if self.traces is not None else pd.DataFrame(),
                        world_size=self.world_size(), rank_hosts=self.rank_hosts(), hosts=self.hosts(),
                        on_gpu=self.traces is not None and self.traces.on_gpu, process_groups=self.process_groups(),
                        telemetry=self._recent_telemetry(float(steps["start"].min())))
        return assemble(tables, device, p2p, clock_measurements(self.run_dir))

    def hosts(self) -> list[dict[str, Any]]:
        """The hosts' records (their CPUs: a crowded host hides a rank's extra work), read until every rank's is."""
        if self._hosts is None or {h for h in self.rank_hosts().values() if h} - {h.get("name") for h in self._hosts}:
            self._hosts = read_hosts(self.run_dir)
        return self._hosts

    def process_groups(self) -> dict[int, dict]:
        """rank -> its process groups, read once each (a DeviceMesh's subgroups share a name: members key them)."""
        for rank in self.steps.keys() - self.groups.keys():
            path = self.ranks.ranks_dir / str(rank) / "process_groups.json"
            try:
                self.groups[rank] = rf.read_process_groups(path) if path.exists() else None
            except (InputError, OSError):
                self.groups[rank] = None  # the final analysis reports it; live judgement goes on without
            if self.groups[rank] is None:
                del self.groups[rank]  # not written yet: read again next time
        return self.groups

    def _recent_telemetry(self, since: float) -> pd.DataFrame | None:
        """The telemetry samples of the window (older ones are dropped: the window only moves on)."""
        self.samples = [r for r in self.samples if r["time"] >= since - TELEMETRY_MARGIN_S]
        return samples_table(self.samples) if self.samples else None


def samples_table(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """Telemetry rows as read from telemetry.jsonl (``time`` in Unix seconds), ranks as numbers."""
    table = pd.DataFrame(samples)
    if "rank" in table:
        table["rank"] = pd.to_numeric(table["rank"], errors="coerce")
    return table
