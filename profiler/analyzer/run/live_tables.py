"""The analysis tables of a running job's recent steps, from what its ranks have appended so far.

Live judgement (judge/live_judge.py) calls :meth:`LiveSteps.window` every few seconds: each host's step
summary (read/host_summary.py; a rank no summary carries, its own steps.jsonl) and telemetry.jsonl are
read from where the last call stopped (read/step_tail.py), and the tables hold the last steps that every rank has finished, in the same
columns the final analysis gives the detectors, through the same :func:`tables.assemble`: the step
records' phases, always-on counters and device timings (run/device_time.py), the run's structure from
the counted point-to-point calls and trainer.json, and the ranks' telemetry joined to their steps. There are no traces, flight records or logs: what
needs them waits for the final report.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read import run_files as rf
from diagtrain.profiler.analyzer.read.run_files import DEVICE_LISTS, STEP_COLUMNS, device_record
from diagtrain.profiler.analyzer.read.host_summary import HostSummary, summary_path
from diagtrain.profiler.analyzer.read.row_groups import table_of
from diagtrain.profiler.analyzer.read.step_cache import CacheFeeder
from diagtrain.profiler.analyzer.read.step_tail import JsonlTail, RankSteps, StepFilesTail, StepTail
from diagtrain.profiler.analyzer.per_rank.p2p import from_step_records as p2p_from_step_records
from diagtrain.profiler.analyzer.read.run_read import clock_measurements, requested_profile_steps
from diagtrain.profiler.analyzer.run import device_time
from diagtrain.profiler.analyzer.run.live_ledger import LiveLedger
from diagtrain.profiler.analyzer.run.live_traces import LiveTraces
from diagtrain.profiler.analyzer.run.tables import UNKNOWN_DROPPED, Tables, assemble, step_table
from diagtrain.profiler.run_dir import (ANALYSIS_CACHE, HOSTS_DIR, STEPS_FILE, FolderWatch, RankIndex, closed_segments,
                                        read_hosts)
from diagtrain.profiler.util.bounded_read import InputError
from diagtrain.profiler.util.groups import merged_order, stable_order

GROUPS_PATIENCE = 3  # reads of a rank's steps without its process_groups.json before it is taken to have none
TELEMETRY_MARGIN_S = 5.0  # telemetry kept from this long before the window's first step: its first sample


@dataclass
class HostFiles:
    """What the hosts' folders hold that live judgement reads, read again only when one changed (FolderWatch)."""

    telemetry: list[Path]  # the hosts' telemetry.jsonl (appended: their tails read what is new)
    clocks: dict[str, list[dict]]  # the hosts' clock handshakes (run_read.clock_measurements)
    profiled: set[int]  # the steps the ranks were asked to profile (run_read.requested_profile_steps)


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

    def __init__(self, run_dir: Path, window_steps: int | None, max_trace_bytes: float = 0.0,
                 silent_s: float = float("inf")) -> None:
        """``window_steps=None`` keeps every step and gathers no samples (run/so_far.py takes them as read);
        the profiled windows' traces are loaded up to ``max_trace_bytes`` (live_traces.py), never without a window;
        a host summary silent for ``silent_s`` is left for its ranks' own files (:meth:`silenced`)."""
        self.run_dir, self.window_steps, self.silent_s = Path(run_dir), window_steps, silent_s
        self.ranks = RankIndex(run_dir)
        self.steps: dict[int, RankSteps] = {}  # every rank's recent rows, from either source below
        self.summaries: dict[str, HostSummary] = {}  # host -> its wrapper's summary of its ranks (host_summary.py)
        self.direct: dict[int, StepTail] = {}  # rank -> its own steps.jsonl, where no summary carries it
        self.silenced: list[str] = []  # hosts whose summary fell silent at the last read
        self.rows = HeldRows()  # the held step rows as a table, built from what each read added
        self.ledger = LiveLedger()  # the windows' ledgers, each reusing the steps of the one before
        self.telemetry: dict[Path, JsonlTail] = {}
        self.samples: list[dict[str, Any]] = []  # telemetry rows of the ranks and hosts, recent ones
        self.new_samples: list[dict[str, Any]] = []  # the rows the last read added
        self.trainer: dict[str, Any] | None = None
        self._last: Window | None = None
        self.traces = LiveTraces(run_dir, max_trace_bytes) if window_steps is not None and max_trace_bytes > 0 else None
        self.cache = CacheFeeder(self.run_dir / ANALYSIS_CACHE)
        self.groups: dict[int, dict] = {}  # rank -> its process groups (process_groups.json, written at its first step)
        self._groups_missing: dict[int, int] = {}  # rank -> reads of its steps that found no process groups
        self._no_groups: set[int] = set()  # ranks taken to have none
        self._hosts: list[dict[str, Any]] | None = None  # the hosts' records (host.json), once every rank's is read
        self.folders = FolderWatch(run_dir)
        self._files: HostFiles | None = None  # what the hosts' folders held when one last changed
        self._folders_changed = True  # since _files was read
        self._hosts_stale = True  # a folder changed since the hosts' records were read
        self._said: tuple[int, dict[int, str], int | None] | None = None  # RankIndex.version, rank_hosts, world_size
        self._phases: list[str] | None = None  # phases(), until a rank is placed or names a phase first

    def read(self) -> int:
        """Read what every host and rank appended since the last call; the number of new step records."""
        if self.folders.changed():
            self._folders_changed = self._hosts_stale = True
        info = self.ranks.refresh()
        placed = sorted(info.keys() - self.steps.keys())  # a set difference: not a pass over 8,192 ranks
        for rank in placed:
            self._place(rank, info[rank].get("host"))
        new = sum(summary.read() for summary in self.summaries.values())
        for summary in self.summaries.values():  # a rank whose rows came before its rank.json was seen here
            for rank in summary.new_ranks:
                self.steps.setdefault(rank, summary.ranks[rank])
        # After the summaries are read: a judge that reads seldom (paced to its CPU, ~50 s apart at 8,192 ranks) or
        # late (a starved host) hears the beats written meanwhile, and takes no host for silent that is not.
        self._leave_silent(time.time())
        direct = sum(tail.read() for tail in self.direct.values())
        # The phases named so far change only with a rank's reader, or a phase a rank named first.
        if placed or self.silenced or direct or any(s.new_ranks or s.named for s in self.summaries.values()):
            self._phases = None
        new += direct
        if self.window_steps is not None:
            self.rows.add(self.added())
            self.rows.trim(min((held.first for held in self.steps.values() if held.rows), default=0))
        self.new_samples = []
        for path in self.host_files().telemetry:
            tail = self.telemetry.setdefault(path, StepFilesTail(path))  # its closed segments too, as steps.jsonl's
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

    def added(self) -> list[Mapping[str, Any]]:
        """The step rows the last :meth:`read` added (or replaced), rank by rank."""
        return [row for held in self.steps.values() for row in held.added.values()]

    def _place(self, rank: int, host: str | None) -> None:
        """Read ``rank`` through its host's summary where its wrapper writes one, else from its own file: decided
        once, when the rank has records (a summary is created before its wrapper's ranks start)."""
        # Twice the window: a rank ahead of the slowest by up to a window keeps its steps in common.
        keep = None if self.window_steps is None else 2 * self.window_steps
        summary = self.summaries.get(host) if host else None
        if summary is None and host and summary_path(self.run_dir, host).exists():
            summary = self.summaries[host] = HostSummary(summary_path(self.run_dir, host), keep)
            summary.elsewhere = {r for r in self.direct if self.ranks.info.get(r, {}).get("host") == host}
        path = self.ranks.ranks_dir / str(rank) / STEPS_FILE
        if summary is not None:
            self.steps[rank] = summary.ranks.setdefault(rank, RankSteps(rank, keep))
        elif path.exists() and path.stat().st_size or closed_segments(path):  # no summary while it records: none will
            # carry it (records closed into segments are records too)
            self.steps[rank] = self.direct[rank] = StepTail(path, rank, keep)

    def _leave_silent(self, now: float) -> None:
        """A summary silent past ``silent_s`` (its wrapper beats every host_summary.BEAT_S when it has nothing
        new) is a wrapper that stopped reducing: its ranks are read from their own files from now on."""
        self.silenced = [host for host, summary in self.summaries.items() if summary.silent_s(now) > self.silent_s
                         and any(self.ranks.exit_record(r) is None for r in summary.ranks)]  # not a host that finished
        if not self.silenced:
            return
        of_host: dict[str, list[int]] = {}  # grouped once: a pass over every rank per silent host was hosts x ranks
        for rank in self.steps.keys() - self.direct.keys():
            of_host.setdefault(self.ranks.info.get(rank, {}).get("host"), []).append(rank)
        for host in self.silenced:
            keep = self.summaries.pop(host).keep
            for rank in sorted(of_host.get(host, [])):
                self.steps[rank] = self.direct[rank] = StepTail(self.ranks.ranks_dir / str(rank) / STEPS_FILE, rank, keep)

    def cache_steps(self, min_lines: int, cpu_s: float) -> int:
        """Add the new step records of the ranks read directly to the final analysis' cache (step_cache.CacheFeeder;
        each host's wrapper feeds its own ranks' through host_summary.py). The lines parsed."""
        return self.cache.feed({r: (t.tail.path, t.tail.lines) for r, t in self.direct.items()}, min_lines, cpu_s)

    def window(self) -> Window:
        """Read what is new and build the tables of the last ``window_steps`` steps every rank finished
        (the last ones again when no rank finished a step since)."""
        if self.read() == 0 and self._last is not None and not self._new_traces(self._last):
            return self._last
        self._last = self._window()
        return self._last

    def _window(self) -> Window:
        tails: dict[int, RankSteps] = {}
        last_steps: dict[int, int] = {}
        latest: dict[int, Any] = {}
        last_ends: dict[int, float] = {}
        for rank, held in self.steps.items():  # one pass over 8,192 ranks, not four
            step = held.last_step  # None: no rows held
            if step is not None:
                tails[rank], last_steps[rank] = held, int(step)
                latest[rank] = row = held.rows[step]
                last_ends[rank] = float(row["end"])
        if not tails:
            return Window(None, last_steps, last_ends, latest)
        # A rank that has exited (it crashed, or did fewer steps) holds the others' window back no longer; only a
        # rank behind the others can (asking every rank for its exit record is a file a rank each judgement).
        ahead = max(last_steps.values())
        running = [s for r, s in last_steps.items() if s == ahead or self.ranks.exit_record(r) is None]
        common = min(running)
        rows = self.rows.between(common - self.window_steps, common)
        if rows.empty:
            return Window(None, last_steps, last_ends, latest)
        requested = self.profiled_steps()
        if self.traces is not None:
            self.traces.update(common, requested)
        tables = self._tables(rows, tails, requested)
        timed = device_time.latest_timed(tables.steps)  # the metrics endpoint serves them beside the host's
        if timed:  # else the rows as held (read only): a copy of every rank's row cost 45 ms at 8,192 ranks
            latest = {r: {**row, **timed[r]} if r in timed else row for r, row in latest.items()}
        return Window(tables, last_steps, last_ends, latest, common)

    def _new_traces(self, last: Window) -> bool:
        """Whether a profiled window became complete since ``last`` was built (its traces are then loaded)."""
        return self.traces is not None and last.finished is not None and self.traces.update(last.finished, self.profiled_steps())

    def profiled_steps(self) -> set[int]:
        """The steps the ranks were asked to profile (their traces are the final analysis' to read)."""
        return self.host_files().profiled

    def host_files(self) -> HostFiles:
        """What the hosts' folders hold that judgement reads, as of the last :meth:`read`."""
        if self._files is None or self._folders_changed:
            self._files = HostFiles(sorted(self.run_dir.glob(f"{HOSTS_DIR}/*/telemetry.jsonl")),
                                    clock_measurements(self.run_dir), requested_profile_steps(self.run_dir))
            self._folders_changed = False
        return self._files

    def phases(self) -> list[str]:
        """The phases the ranks' step records named, in the order they were first seen (gathered again only when a
        read placed a rank, or found one naming a phase first: a pass over 8,192 ranks otherwise)."""
        if self._phases is None:
            self._phases = self._named()
        return list(self._phases)

    def _named(self) -> list[str]:
        """:meth:`phases`, from every rank's record."""
        phases: list[str] = []
        last: list[str] = []
        for t in self.steps.values():
            if t.found.phases != last:  # most ranks name the same phases as the one before: nothing new there
                last = t.found.phases
                phases += [p for p in last if p not in phases]
        return phases

    def world_size(self) -> int | None:
        """The job's world size, as its ranks' records say."""
        return self._ranks_said()[2]

    def rank_hosts(self) -> dict[int, str]:
        """rank -> the host folder of the wrapper that started it (the caller's to read, not to change: it is kept)."""
        return self._ranks_said()[1]

    def _ranks_said(self) -> tuple[int, dict[int, str], int | None]:
        """What the ranks' records say (rank_hosts, world_size), made again only when a record was read since
        (RankIndex.version): a pass over 8,192 records a judgement otherwise."""
        if self._said is None or self._said[0] != self.ranks.version:
            info = self.ranks.info
            self._said = (self.ranks.version, {r: i.get("host") for r, i in info.items() if i.get("host")},
                          next((i.get("world_size") for i in info.values() if isinstance(i.get("world_size"), int)),
                               None))
        return self._said

    def _tables(self, rows: pd.DataFrame, tails: dict[int, RankSteps], requested: set[int]) -> Tables:
        # A step's device timings come in later records: the held rows from the window's first step on are read,
        # not only the window's (the ones before carry the timings of steps before it).
        device = device_time.records_of(self.rows.since(int(rows["step"].min()))) \
            if self.rows.has_any(DEVICE_LISTS) else []  # none to cut the held rows again for (40 ms at 8,192 ranks)
        of_ranks, p2p = _found_of(tails)
        device += of_ranks
        steps = step_table(rows, profiled=requested)
        hosts = self.hosts()  # once: until every rank's host record is read, each call reads them all
        launched = [h["started_at"] for h in hosts if isinstance(h.get("started_at"), (int, float))]
        tables = Tables(steps=steps, ranks=pd.DataFrame(), phases=self.phases(), trainer=self.trainer or None,
                        # what a manifest written at the job's end would say by now (the job's start-up: job_time.py)
                        manifest={"status": "running", **({"started_at": min(launched)} if launched else {})},
                        # the profiled windows' collectives (live_traces.py), lined up across hosts as the final ones
                        collectives=self.traces.collectives.copy() if self.traces is not None else pd.DataFrame(),
                        world_size=self.world_size(), rank_hosts=self.rank_hosts(), hosts=hosts,
                        on_gpu=self.traces is not None and self.traces.on_gpu, process_groups=self.process_groups(),
                        telemetry=self._recent_telemetry(float(steps["start"].min())))
        return assemble(tables, device, p2p, self.host_files().clocks, ledger_of=self.ledger.build,
                        job_steps_of=self.ledger.job_steps, live=True)

    def hosts(self) -> list[dict[str, Any]]:
        """The hosts' records (their CPUs: a crowded host hides a rank's extra work), read until every rank's is."""
        if self._hosts is None or self._hosts_stale and {h for h in self.rank_hosts().values() if h} \
                - {h.get("name") for h in self._hosts}:
            self._hosts, self._hosts_stale = read_hosts(self.run_dir), False
        return self._hosts

    def process_groups(self) -> dict[int, dict]:
        """rank -> its process groups, read once each (a DeviceMesh's subgroups share a name: members key them).
        A rank writes them at its first step: one without them after GROUPS_PATIENCE reads of its steps has none."""
        for rank in self.steps.keys() - self.groups.keys() - self._no_groups:
            path = self.ranks.ranks_dir / str(rank) / "process_groups.json"
            try:
                found = rf.read_process_groups(path) if path.exists() else None
            except (InputError, OSError):
                found = None  # the final analysis reports it; live judgement goes on without
            if found is not None:
                self.groups[rank] = found
            elif self.steps[rank].rows:
                self._groups_missing[rank] = self._groups_missing.get(rank, 0) + 1
                if self._groups_missing[rank] >= GROUPS_PATIENCE:
                    self._no_groups.add(rank)
        return self.groups

    def _recent_telemetry(self, since: float) -> pd.DataFrame | None:
        """The telemetry samples of the window (older ones are dropped: the window only moves on)."""
        self.samples = [r for r in self.samples if r["time"] >= since - TELEMETRY_MARGIN_S]
        return samples_table(self.samples) if self.samples else None


def _found_of(tails: dict[int, RankSteps]) -> tuple[list, dict[int, Any]]:
    """The ranks' end-of-run device lines (device records) and point-to-point calls by rank: one pass over them."""
    device, p2p = [], {}
    for rank, held in tails.items():
        found = held.found
        if found.device:
            device.append(device_record(rank, found.device))
        if found.p2p:
            p2p[rank] = p2p_from_step_records(found.p2p)
    return device, p2p


class HeldRows:
    """The step rows live judgement holds, as tables made once per read from the rows it added: a window is cut
    from them, not rebuilt from every row's dict at every judgement (20,000 rows at 1,024 ranks)."""

    def __init__(self) -> None:
        self.batches: list[pd.DataFrame] = []
        self.named: list[list[str]] = []  # each batch's columns as its rows named them
        self.spans: list[tuple[int, int]] = []  # each batch's first and last step: a batch wholly in a cut is not masked
        self._last: _Cut | None = None  # the last window cut, while no row of its steps was read again since

    def add(self, rows: list[Mapping[str, Any]]) -> None:
        """The rows one read added (as read from a summary, row_groups.Row, or as dicts), without the counters none of
        them measured (a None each, as objects: most of the cost of cutting a window from them; a window of no row
        that measured one has no such column either)."""
        if rows:
            batch = table_of(rows)
            self.named.append(list(batch.columns))
            self.batches.append(batch.drop(columns=[c for c in batch.columns
                                                    if c in UNKNOWN_DROPPED and batch[c].isna().all()]))
            steps = batch["step"].to_numpy()
            self.spans.append((int(steps.min()), int(steps.max())))
            if self._last is not None and ((steps > self._last.after) & (steps <= self._last.last)).any():
                self._last = None  # a row of its steps recorded again, or read late: the window is cut afresh

    def has_any(self, columns: Iterable[str]) -> bool:
        """Whether a held row has any of ``columns``."""
        return any(c in b.columns for b in self.batches for c in columns)

    def trim(self, oldest: int) -> None:
        """Let go of the tables of steps before ``oldest`` only."""
        kept = [i for i, (_, last) in enumerate(self.spans) if last >= oldest]
        if self._last is not None and any(last > self._last.after for _, last in self.spans if last < oldest):
            self._last = None  # rows it holds are let go: a window of them is no longer one of the held rows
        self.batches, self.named = [self.batches[i] for i in kept], [self.named[i] for i in kept]
        self.spans = [self.spans[i] for i in kept]

    def between(self, after: int, last: int) -> pd.DataFrame:
        """The rows of steps ``after`` < step <= ``last`` by rank, then step, as one table built from all of them at
        once would be, sorted: a step recorded again in its last record, a column only where a row of these steps has
        it (a counter no row has, none: tables.step_table leaves it out)."""
        rows = self._moved(after, last)
        if rows is None:
            rows = self._ordered(after, last)
        self._last = _Cut(after, last, rows) if _reusable(rows) else None
        return rows

    def _ordered(self, after: int, last: int) -> pd.DataFrame:
        """:meth:`between` from the held batches: their rows cut, deduplicated and ordered."""
        rows = self._cut(after + 1, last)
        # The counters none of them has left out first: columns of Nones were most of the cost of ordering the rows.
        return _known(_last_by_rank(_known(rows, UNKNOWN_DROPPED)).infer_objects()) if len(rows) else rows

    def _moved(self, after: int, last: int) -> pd.DataFrame | None:
        """:meth:`between` as the last window's rows of the steps both hold and the rows of the steps after it, merged
        by rank, then step (ordering 20 steps' rows anew was most of a window's cost at 8,192 ranks); None where that
        could differ from the rows cut afresh: a row of its steps read again, a batch naming other columns or in
        another order, the steps after it typed otherwise."""
        before = self._last
        if before is None or not before.after <= after <= before.last <= last:
            return None
        if (after, last) == (before.after, before.last):
            return before.rows  # nothing of its steps read since
        if after == before.last or not self._named_alike(before.after, last):
            return None
        fresh = self._ordered(before.last, last)
        if fresh.empty or list(fresh.columns) != list(before.rows.columns) or not fresh.dtypes.equals(before.rows.dtypes):
            return None
        return _merged(before.rows, fresh, after)

    def _named_alike(self, after: int, last: int) -> bool:
        """Whether every batch with rows of steps ``after`` < step <= ``last`` named the same columns, in one order."""
        return len({tuple(named) for named, (low, high) in zip(self.named, self.spans)
                    if low <= last and high > after}) == 1

    def since(self, first: int) -> pd.DataFrame:
        """The rows of steps from ``first`` on, in the order read, each step once (its last record)."""
        rows = self._cut(first, None)
        return _known(rows.drop_duplicates(["rank", "step"], keep="last", ignore_index=True).infer_objects()) \
            if len(rows) else rows

    def _cut(self, first: int, last: int | None) -> pd.DataFrame:
        """The rows of steps ``first`` to ``last`` (None: every one after) of each batch, as one table, its columns in
        the order their rows named them."""
        top = float("inf") if last is None else last
        cut = []
        for b, named, (low, high) in zip(self.batches, self.named, self.spans):
            if first <= low and high <= top:  # every row of it (a read of one step, in a window): no copy to mask
                cut.append((b, named))
            elif low <= top and high >= first:
                step = b["step"]
                part = b[(step >= first) & (step <= top)]
                if len(part):
                    cut.append((part, named))
        if not cut:
            return pd.DataFrame()
        rows = pd.concat([p for p, _ in cut], ignore_index=True) if len(cut) > 1 else cut[0][0].reset_index(drop=True)
        order = list(dict.fromkeys(c for _, named in cut for c in named if c in rows.columns))
        return rows if list(rows.columns) == order else rows[order]


@dataclass
class _Cut:
    """A window :meth:`HeldRows.between` gave: the rows of steps ``after`` < step <= ``last``."""

    after: int
    last: int
    rows: pd.DataFrame


def _reusable(rows: pd.DataFrame) -> bool:
    """Whether a window's rows can be merged with the next steps' (:meth:`HeldRows._moved`): ranks and steps as
    numbers, no column of objects (one table of every row would infer those from all their values at once)."""
    kinds = {name: d.kind if isinstance(d, np.dtype) else "O" for name, d in rows.dtypes.items()}
    return len(rows) > 0 and kinds.get("rank") in ("i", "u") and kinds.get("step") in ("i", "u") \
        and all(kind in "iufb" for kind in kinds.values())


def _merged(held: pd.DataFrame, fresh: pd.DataFrame, after: int) -> pd.DataFrame:
    """``held``'s rows of steps after ``after`` and ``fresh``'s (each by rank, then step; ``fresh``'s steps all
    later than ``held``'s), as one table by rank, then step: one gather, no sort of them all."""
    step = held["step"].to_numpy()
    kept = np.flatnonzero(step > after)
    low = min(int(held["rank"].min()), int(fresh["rank"].min()))
    span = max(int(step.max()), int(fresh["step"].max())) - after + 1

    def keys(rows: pd.DataFrame, at: np.ndarray | slice) -> np.ndarray:
        return (rows["rank"].to_numpy()[at].astype(np.int64) - low) * span + rows["step"].to_numpy()[at] - after

    # Positions in the kept rows then the fresh ones, as rows of held and fresh together
    order = np.r_[kept, len(held) + np.arange(len(fresh))][merged_order(keys(held, kept), keys(fresh, slice(None)))]
    # A column at a time (numpy's take of each joined column): the frames' concat, then pandas' take of its blocks,
    # copied the window twice (15 ms at 8,192 ranks, this 10).
    return pd.DataFrame({name: np.concatenate([held[name].to_numpy(), fresh[name].to_numpy()]).take(order)
                         for name in held.columns}, columns=held.columns, copy=False)


def _known(rows: pd.DataFrame, unknown: Iterable[str] = ()) -> pd.DataFrame:
    """The rows without the columns none of them has a value in: a phase's or the device timings' (they are no
    column of theirs), and any of ``unknown``."""
    return rows.drop(columns=[c for c in rows.columns if (c not in STEP_COLUMNS or c in unknown) and rows[c].isna().all()])


def _last_by_rank(rows: pd.DataFrame) -> pd.DataFrame:
    """Each (rank, step)'s last row, by rank, then step: ``drop_duplicates(keep="last")`` and a sort in one stable
    order of the pairs (by radix: the two cost 45 ms at 8,192 ranks x 20 steps)."""
    rank, step = rows["rank"].to_numpy(), rows["step"].to_numpy()
    if rank.dtype.kind not in "iu" or step.dtype.kind not in "iu":
        return rows.drop_duplicates(["rank", "step"], keep="last").sort_values(["rank", "step"], ignore_index=True)
    span = int(step.max()) - int(step.min()) + 1
    pair = (rank.astype(np.int64) - int(rank.min())) * span + (step.astype(np.int64) - int(step.min()))
    order = stable_order(pair)
    ordered = pair[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ordered[1:] != ordered[:-1]  # the last of equal pairs in a stable order: the last read
    return rows.take(order[last]).reset_index(drop=True)


def samples_table(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """Telemetry rows as read from telemetry.jsonl (``time`` in Unix seconds), ranks as numbers."""
    table = pd.DataFrame(samples)
    if "rank" in table:
        table["rank"] = pd.to_numeric(table["rank"], errors="coerce")
    return table
