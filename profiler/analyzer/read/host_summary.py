"""One host's step records, reduced where they are made: live judgement reads one file per host.

Every host's wrapper reads its own ranks' steps.jsonl as they are appended, and the segments closed from them (which
it then compresses: run_dir.compress_segments) (run_files' reader: the rows,
phases and point-to-point counts the final analysis takes, the same records refused) and appends what
it read to ``hosts/<host>/steps_summary.jsonl``, one line a read with something new:

    {"groups": [{"columns": ["rank", "step", "start", ...], "rows": [[5, 812, 1790000000.13, ...], ...]}],
     "extra": {"5": {"phases": [<names first seen>], "p2p": {"<step>": <calls>},
                     "device": {<the end-of-run device line's lists>}, "bad": <lines refused>,
                     "impossible": [<records left out>]}}}

(the column names once a line: a line of 8 ranks' steps is smaller than their own records),

and a beat, ``{"beat": <unix s>}``, when it has had nothing to say for ``BEAT_S``: a summary silent longer
than that is a wrapper that stopped reducing, not ranks without steps. The judging wrapper reads each
host's summary from where it stopped (read/step_tail.py's rules: whole lines only, a damaged line left
out), so a judgement opens one file per host, not one per rank, and parses no record twice.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgspec

from diagtrain.profiler.analyzer.read.row_groups import Columns, Group, Row, columns_of, groups_decoded, groups_of
from diagtrain.profiler.analyzer.read.run_files import StepFile, add_step, p2p_from_json, p2p_to_json
from diagtrain.profiler.analyzer.read.step_cache import CacheFeeder
from diagtrain.profiler.analyzer.read.step_tail import JsonlTail, RankSteps, StepFilesTail
from diagtrain.profiler.step_files import Opened, json_value, json_values, open_read
from diagtrain.profiler.run_dir import (ANALYSIS_CACHE, HOST_STEPS_SUMMARY, HOSTS_DIR, STEPS_FILE, JsonlAppender, RankIndex,
                                        compress_segments)

BEAT_S = 10.0  # a reducer with nothing new says it is alive this often: 360 short lines an hour
RELIST_S = 10.0  # a rank that starts late (a restarted one) is found within this
# A summary this big is set aside (``.1``, replacing the one before) and a fresh one begun: a host's summaries
# hold at most twice this. At 8 ranks' steps a second, ~2 KB a second: a fresh file every ~9 hours.
MAX_SUMMARY_BYTES = 64 << 20


def summary_path(run_dir: Path, host: str) -> Path:
    """Where ``host``'s wrapper appends its ranks' step rows."""
    return Path(run_dir) / HOSTS_DIR / host / HOST_STEPS_SUMMARY


def set_aside(path: Path) -> Path:
    """Where a full summary goes when a fresh one begins."""
    return path.with_name(path.name + ".1")


class HostReducer:
    """A wrapper's reduction of its own ranks' step records into its host's summary (call :meth:`reduce` every
    few seconds). Creating it creates the summary: the judge then knows this host's ranks come through it."""

    def __init__(self, run_dir: Path, host: str, index: RankIndex | None = None,
                 max_bytes: int = MAX_SUMMARY_BYTES) -> None:
        """``index``: the run's ranks, where the caller keeps them already (one process playing many hosts)."""
        self.run_dir, self.host, self.max_bytes = Path(run_dir), host, max_bytes
        self.ranks = index or RankIndex(self.run_dir)
        self.listed_at = -float("inf")
        self.mine: list[int] = []  # this host's ranks, as last listed
        self.out = JsonlAppender(summary_path(self.run_dir, host))
        self.tails: dict[int, StepFilesTail] = {}
        self.compressed: dict[int, int] = {}  # rank -> the segments up to this number are compressed
        self.found: dict[int, StepFile] = {}  # rank -> what its file held so far (phases, problems)
        self.said_at = time.time()
        self.cache = CacheFeeder(self.run_dir / ANALYSIS_CACHE)

    def reduce(self, cache_lines: int | None = None, cache_cpu_s: float = 0.0) -> int:
        """Append what this host's ranks recorded since the last call (one line); the step rows appended. With
        ``cache_lines``, their records also go into the final analysis' cache (step_cache.CacheFeeder)."""
        rows: list[dict[str, Any]] = []
        extra: dict[str, dict[str, Any]] = {}
        for rank in self._mine():
            if rank not in self.tails:
                self.tails[rank] = StepFilesTail(self.ranks.ranks_dir / str(rank) / STEPS_FILE)
                self.found[rank] = StepFile()
            added, more = self._read(rank)
            rows += added
            if more:
                extra[str(rank)] = more
        if rows or extra:
            self.out.append({"groups": columns_of(rows), "extra": extra})
            self.said_at = time.time()
            self._bound()
        elif time.time() - self.said_at >= BEAT_S:
            self.out.append({"beat": round(time.time(), 3)})
            self.said_at = time.time()
        if cache_lines is not None:
            self.cache.feed({r: (t.path, t.lines) for r, t in self.tails.items()}, cache_lines, cache_cpu_s)
        self._compress()
        return len(rows)

    def _compress(self) -> None:
        """Compress the segments this host's ranks closed that this reader is past (a reader behind, another
        host's, finishes one in either form): the wrapper's CPU, ~0.2 s a segment, a segment a day per rank."""
        for rank, tail in self.tails.items():
            if tail.done > self.compressed.get(rank, 0):
                try:
                    compress_segments(tail.path, tail.done)
                except OSError:
                    continue  # a full disk: the segment stays plain, and is tried again at the run's end
                self.compressed[rank] = tail.done

    def _bound(self) -> None:
        """Past ``max_bytes``, set the summary aside and begin a fresh one (its reader finishes the old one first)."""
        path = self.out.path
        if path.stat().st_size < self.max_bytes:
            return
        self.out.close()
        os.replace(path, set_aside(path))
        self.out = JsonlAppender(path)

    def _mine(self) -> list[int]:
        """This host's ranks: the run's ranks folder listed again only every RELIST_S once it has some (thousands
        of folders on a shared filesystem, listed by every host)."""
        if not self.mine or time.time() - self.listed_at >= RELIST_S:
            self.ranks.refresh()
            self.listed_at = time.time()
            self.mine = sorted(r for r, info in self.ranks.info.items() if info.get("host") == self.host)
        return self.mine

    def close(self) -> None:
        """Close the summary (what was appended stays)."""
        self.out.close()

    def _read(self, rank: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One rank's new step rows, and what else its new lines said (phases first seen, point-to-point calls, the
        end-of-run device line, problems)."""
        tail, found = self.tails[rank], self.found[rank]
        phases, bad, impossible = len(found.phases), found.bad_count, found.impossible_count
        first = tail.lines + 1
        added: dict[int, dict[str, Any]] = {}
        for number, text in enumerate(tail.read(), first):
            add_step(found, added, number, text, rank)
        fresh = found.impossible_count - impossible
        more = {"phases": found.phases[phases:],
                "p2p": {str(step): p2p_to_json(found.p2p.pop(step)) for step in added if step in found.p2p},
                "device": found.device, "bad": found.bad_count - bad,
                "impossible": found.impossible[len(found.impossible) - fresh:] if fresh else []}
        found.device = {}
        found.bound_problems()
        return list(added.values()), {k: v for k, v in more.items() if v}


class HostSummary:
    """One host's summary as the judge reads it: each rank it carries, its recent rows (``RankSteps``)."""

    def __init__(self, path: Path, keep: int | None) -> None:
        self.path, self.tail, self.keep = path, JsonlTail(path), keep
        self.inode: int | None = None  # the file being read (a fresh one begins past MAX_SUMMARY_BYTES)
        self.ranks: dict[int, RankSteps] = {}  # the ranks read from here, as their rows come
        self.elsewhere: set[int] = set()  # ranks of this host read from their own files: their rows are skipped
        self.heard_at = time.time()  # when its last line came, by this reader's clock
        # Its groups' sets of names, shared by their rows: of the lines decoded as plain JSON (the others' are shared
        # by every host's summary: _named_alike).
        self.columns: dict[tuple[Any, ...], Columns] = {}
        self.new_ranks: list[int] = []  # the ranks the last read saw here first
        self.named = False  # whether the last read found a rank naming a phase it had not named before

    def read(self) -> int:
        """Read what the host appended since; the number of new step records."""
        added: dict[int, dict[int, Row]] = {}
        self.new_ranks, self.named = [], False
        for line in self._lines():
            self.heard_at = time.time()
            if isinstance(line, _Line):
                groups, extra = groups_decoded(line.groups, _named_alike()), line.extra
            elif isinstance(line, dict):  # a line the decoder refused as a _Line
                groups, extra = groups_of(line.get("groups"), self.columns), line.get("extra")
            else:
                continue  # a damaged line
            for columns, values in groups:  # no dict per row
                self._add(columns, values, added)
            for rank, more in (extra or {}).items():
                if rank.isdigit() and int(rank) in self.ranks and isinstance(more, dict):
                    self.named |= _found(self.ranks[int(rank)].found, more)
        for rank, holder in self.ranks.items():
            rows = added.get(rank) or {}  # a fresh dict only for a rank without rows (every rank's is its own)
            holder.found.lines += len(rows)
            holder.take(rows)
        return sum(map(len, added.values()))

    def _add(self, columns: Columns, values: list[tuple[Any, ...]], added: dict[int, dict[int, Row]]) -> None:
        """One group's rows into ``added`` (rank -> step -> row), each by the rank and step at their places in the
        group (a row without them as numbers is left out)."""
        at_rank, at_step = columns.at.get("rank"), columns.at.get("step")
        if at_rank is None or at_step is None:
            return
        ranks, elsewhere = self.ranks, self.elsewhere  # looked up once a group, not once a row
        for cells in values:
            rank, step = cells[at_rank], cells[at_step]
            if isinstance(rank, int) and isinstance(step, int) and rank not in elsewhere:
                if rank not in ranks:  # a rank the reader has not seen yet (made only then: 8,192 a read)
                    ranks[rank] = RankSteps(rank, self.keep)
                    self.new_ranks.append(rank)
                added.setdefault(rank, {})[step] = Row(columns, cells)

    def _lines(self) -> list[Any]:
        """The lines appended since the last read: where the summary was set aside since, the rest of the old file
        first, then the fresh one from its start (at the first read, the whole file set aside last, if any)."""
        opened = open_read(self.path)  # the file whose inode is checked is the one read (one open, no stat besides)
        try:
            return self._lines_of(opened)
        finally:
            if opened is not None:
                os.close(opened.fd)

    def _lines_of(self, opened: Opened | None) -> list[Any]:
        """:meth:`_lines`, the summary opened (None: not openable now, its inode as the path's status says)."""
        try:
            inode = opened.info.st_ino if opened is not None else os.stat(self.path).st_ino
        except OSError:
            return []
        lines = []
        if self.inode is None:  # a reader that comes after a summary was set aside: its lines first
            lines = JsonlTail(set_aside(self.path)).read()
        elif inode != self.inode:
            old = JsonlTail(set_aside(self.path))
            old.offset = self.tail.offset
            try:
                if os.stat(old.path).st_ino == self.inode:
                    lines = old.read()
            except OSError:
                pass  # set aside twice since the last read (hours unread): lost to live judgement, not to the ranks' files
            self.tail = JsonlTail(self.path)
        self.inode = inode
        return json_values(lines + self.tail.read(opened), _line_of)

    def silent_s(self, now: float) -> float:
        """Seconds since its last line (beats included)."""
        return now - self.heard_at


# The columns of every host's summary lines decoded as _Lines (names that are strings), one Columns a set of names:
# the hosts name the same few sets, and a table of every host's rows (row_groups.table_of) then finds one, not one a
# host (a millisecond a judgement at 8,192 ranks). A set's columns never change, so nothing invalidates them; past
# SHARED_COLUMNS sets (names that change without end) they are begun afresh, each row keeping its own.
SHARED_COLUMNS = 1024
_shared_columns: dict[tuple[Any, ...], Columns] = {}


def _named_alike() -> dict[tuple[Any, ...], Columns]:
    """The columns shared by every host's summary lines (row_groups.groups_decoded's ``known``)."""
    if len(_shared_columns) > SHARED_COLUMNS:
        _shared_columns.clear()
    return _shared_columns


class _Line(msgspec.Struct):
    """A summary line as the judge decodes it first: its groups as row_groups.Group (their rows tuples from the
    decoder), its extra as JSON (a beat is one without either). A line that is not one (a group that is none, a name
    that is no string, a NaN) is decoded as plain JSON, and read as before."""

    groups: list[Group] = []
    extra: Any = None


_decode_line = msgspec.json.Decoder(_Line).decode


def _line_of(text: str) -> Any:
    """One summary line: a :class:`_Line` where it is one, else its JSON value (step_files.json_value: ValueError
    where it is not JSON)."""
    try:
        return _decode_line(text)
    except msgspec.DecodeError:  # not a _Line (a ValidationError is one), or not what msgspec reads (NaN): as JSON
        return json_value(text)


def _found(found: StepFile, more: dict[str, Any]) -> bool:
    """What a summary adds to its rank's record of its file besides rows: the phases, point-to-point calls, device
    line and problems its host's reader found. Whether it named a phase first."""
    found.lines += int(more.get("bad") or 0) + len(more.get("impossible") or [])
    named = [p for p in more.get("phases") or [] if isinstance(p, str) and p not in found.phases]
    found.phases += named
    for step, calls in (more.get("p2p") or {}).items():
        if step.isdigit() and isinstance(calls, dict):
            found.p2p[int(step)] = p2p_from_json(calls)
    for name, entries in (more.get("device") or {}).items():
        if isinstance(entries, list):
            found.device.setdefault(name, []).extend(entries)
    found.bad_lines_dropped += int(more.get("bad") or 0)  # counted; the lines themselves are in the rank's file
    found.impossible += [str(x) for x in more.get("impossible") or []]
    return bool(named)
