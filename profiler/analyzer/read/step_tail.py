"""Reading a run directory's append-only records while the job still writes them: only the bytes
added since the last read, and only whole lines (the line being written is read next time).

Live judgement (:mod:`diagtrain.profiler.analyzer.judge.live`) and the dashboard of a running job
(run/so_far.py) read every rank's steps.jsonl and every host's telemetry.jsonl this way every few
seconds, so a read costs what was appended, not the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.read.run_files import StepFile, add_step
from diagtrain.profiler.analyzer.read.step_segments import Segment, open_if_there, open_step_files, segment_bytes
from diagtrain.profiler.run_dir import closed_segments
from diagtrain.profiler.util.bounded_read import InputError


class JsonlTail:
    """The complete lines appended to one file since the last :meth:`read`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes consumed: up to the last newline read
        self.lines = 0  # lines consumed

    def read(self) -> list[str]:
        """New whole lines (none while the file is absent); a file that shrank (replaced) is read anew."""
        try:
            with open(self.path, "rb") as f:
                if f.seek(0, 2) < self.offset:
                    self.offset = self.lines = 0
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = _split(complete)
        self.lines += len(lines)
        return lines

    def read_json(self) -> list[Any]:
        """New lines as JSON values; a line that is not JSON is left out."""
        found = []
        for line in self.read():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found


class StepFilesTail(JsonlTail):
    """The complete lines added to a rank's step records since the last read, across its files: the closed segments
    in order, then ``path`` (steps.jsonl) as it is appended. A steps.jsonl closed into a segment since the last read
    (run_dir.JsonlAppender) is finished from where the read stopped, in whichever form the segment is now, before the
    segments after it and the fresh file: no line is lost or read twice.

    Why this holds: the file adopted as steps.jsonl (opened together with the listing of the segments before it,
    step_segments.open_step_files) is the one the rank closes next, and a close numbers the segment after the last
    one there, so it becomes segment ``done + 1``."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.done = 0  # every closed segment up to this number has been read
        self.live: tuple[int, int] | None = None  # (device, inode) of the steps.jsonl being read; None: none adopted

    def read(self) -> list[str]:
        """New whole lines, in the order written (none while there are no records)."""
        lines = self._finish_closed() if self.live is not None else []
        try:
            if self.live is None:
                segments, fd = open_step_files(self.path)
                lines += self._read_segments(segments)
            else:
                fd = open_if_there(self.path)
            lines += self._read_live(fd)
        except (InputError, OSError):
            pass  # not readable now (a FIFO, a vanished folder): read again next time
        self.lines += len(lines)
        return lines

    def _finish_closed(self) -> list[str]:
        """The rest of the adopted file where steps.jsonl is another file now: it was closed into segment
        ``done + 1``; where no segment follows, it was replaced (a rewritten file) and is read anew from its start."""
        if _identity(self.path) == self.live:
            return []
        following = [(n, p) for n, p in closed_segments(self.path) if n > self.done]
        lines: list[str] = []
        if following and following[0][0] == self.done + 1:
            try:
                lines = _split(segment_bytes(following[0][1])[self.offset:])
            except InputError:
                pass  # a damaged segment: lost to this live view, not to the final analysis (which says so)
            self.done += 1
        self.live, self.offset = None, 0
        return lines

    def _read_segments(self, segments: list[Segment]) -> list[str]:
        """The whole of every segment after ``done`` (a damaged one left out: the final analysis names it)."""
        lines: list[str] = []
        for segment in segments:
            if segment.number > self.done:
                try:
                    lines += _split(segment.data())
                except InputError:
                    pass
                self.done = segment.number
        return lines

    def _read_live(self, fd: int | None) -> list[str]:
        """What was appended to the adopted steps.jsonl (``fd``, just opened) since the last read: whole lines."""
        if fd is None:
            return []
        with open(fd, "rb", closefd=True) as f:
            st = os.fstat(f.fileno())
            if self.live is None:
                self.live = (st.st_dev, st.st_ino)
            elif (st.st_dev, st.st_ino) != self.live:
                return []  # closed into a segment since this read began: finished at the next read
            if st.st_size < self.offset:
                self.offset = 0  # cut short in place (rewritten): read anew, as JsonlTail does
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return _split(complete)


def _split(data: bytes) -> list[str]:
    """Whole lines as text (bytes that are not UTF-8 replaced)."""
    return data.decode(errors="replace").splitlines()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class RankSteps:
    """One rank's recent step rows as they come, checked (run_files' rows): from its steps.jsonl
    (:class:`StepTail`) or from its host's summary (host_summary.py). Only the last ``keep`` steps are held
    (live judgement looks at recent steps); ``keep=None`` holds every step (the dashboard shows the whole run)."""

    def __init__(self, rank: int, keep: int | None) -> None:
        self.rank, self.keep = rank, keep
        self.found = StepFile()  # its phases, point-to-point calls, end-of-run device line, what was refused
        self.rows: dict[int, dict[str, Any]] = {}  # step -> its table row, the last ``keep`` steps
        self.added: dict[int, dict[str, Any]] = {}  # step -> its row, as the last read added (or replaced) it

    def take(self, added: dict[int, dict[str, Any]]) -> None:
        """Hold the rows a read added (``self.found`` already has their phases and point-to-point calls)."""
        self.added = added
        self.found.repeated += sum(step in self.rows for step in added)  # a step recorded again, read later
        self.rows.update(added)
        if self.keep is not None and len(self.rows) > self.keep:
            for step in sorted(self.rows)[:len(self.rows) - self.keep]:
                del self.rows[step]
                self.found.p2p.pop(step, None)
        self.found.bound_problems()

    @property
    def last_step(self) -> int | None:
        """The latest step this rank finished, as far as its records say."""
        return max(self.rows) if self.rows else None


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
