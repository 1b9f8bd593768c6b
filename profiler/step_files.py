"""A rank's step records as its files hold them: the closed segments in order (``steps.<n>.jsonl``, or once the
wrapper compressed them ``steps.<n>.jsonl.gz``), then ``steps.jsonl``, which the rank appends to.

The rank closes its steps.jsonl into the next segment with a rename (run_dir.JsonlAppender) and the wrapper
compresses closed segments (run_dir.compress_segments): a reader lists the segments and opens the file being
appended together (:func:`open_step_files`), so that a close between the two is seen and the listing taken again,
and reads a segment in whichever form it is there now (:func:`segment_bytes`).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from diagtrain.profiler.run_dir import closed_segments, segment_path
from diagtrain.profiler.util.bounded_read import MAX_LINES_BYTES, InputError, open_regular, read_input

LIST_ATTEMPTS = 5  # a rank closes a segment a day: a second close while one listing is taken is already rare


@dataclass
class Segment:
    """One closed segment of a rank's step records: its number and the file it was found as."""

    number: int
    path: Path

    def data(self) -> bytes:
        """Its records, unpacked (at most MAX_LINES_BYTES)."""
        return segment_bytes(self.path)

    def size(self) -> int:
        """Its records' bytes unpacked, cheaply: the file's size, or a gzip file's own record of it (ISIZE)."""
        try:
            return _unpacked_size(self.path)
        except FileNotFoundError:  # compressed since it was listed
            return _unpacked_size(segment_path(_live_of(self.path), self.number, compressed=True))


def segment_bytes(path: Path) -> bytes:
    """The unpacked records of the closed segment at ``path``; where the plain file was compressed since it was
    listed, its ``.gz``. InputError names the file that cannot be read."""
    try:
        return bytes(read_input(path, MAX_LINES_BYTES))
    except InputError:
        packed = path.with_name(path.name + ".gz")
        if path.name.endswith(".gz") or os.path.lexists(path) or not os.path.lexists(packed):
            raise
        return bytes(read_input(packed, MAX_LINES_BYTES))


def open_step_files(path: Path) -> tuple[list[Segment], int | None]:
    """The closed segments of the records file ``path`` (steps.jsonl) and a descriptor of ``path`` (None where it is
    not there), taken together: the segments are listed before and after the open, and again where a segment was
    closed in between (its records would otherwise be in neither). The descriptor is checked as every reader's."""
    for _ in range(LIST_ATTEMPTS):
        before = closed_segments(path)
        fd = open_if_there(path)
        after = closed_segments(path)
        if [n for n, _ in before] == [n for n, _ in after]:
            return [Segment(n, p) for n, p in after], fd
        if fd is not None:
            os.close(fd)
    raise InputError(path, f"segments were closed beside it faster than it could be opened ({LIST_ATTEMPTS} tries)")


def open_if_there(path: Path) -> int | None:
    """A checked descriptor of ``path``, or None where it is not there (a rank between a close and its fresh file)."""
    try:
        return open_regular(path, MAX_LINES_BYTES)
    except InputError:
        if os.path.lexists(path):
            raise
        return None


def _unpacked_size(path: Path) -> int:
    """``path``'s size, or for a gzip file the size its last four bytes record (segments are far below 4 GiB)."""
    if not path.name.endswith(".gz"):
        return os.stat(path).st_size
    with open(path, "rb") as f:
        if f.seek(0, 2) < 18:  # a gzip header and trailer
            raise InputError(path, "too short for a gzip file")
        f.seek(-4, 2)
        return struct.unpack("<I", f.read(4))[0]


def _live_of(segment: Path) -> Path:
    """The records file a segment was closed from: ``steps.3.jsonl`` -> ``steps.jsonl``."""
    stem = segment.name.split(".", 1)[0]
    return segment.with_name(f"{stem}.jsonl")


class JsonlTail:
    """The complete lines appended to one file since the last :meth:`read`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes consumed: up to the last newline read
        self.lines = 0  # lines consumed

    def read(self, opened: Opened | None = None) -> list[str]:
        """New whole lines (none while the file is absent); a file that shrank (replaced) is read anew. ``opened``:
        the file as its caller opened it (:func:`open_read`, the caller's to close), else it is opened here."""
        try:
            if opened is None:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    data = self._appended(fd, os.fstat(fd))
                finally:
                    os.close(fd)
            else:
                data = self._appended(*opened)
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = _split(complete)
        self.lines += len(lines)
        return lines

    def _appended(self, fd: int, info: os.stat_result) -> bytes:
        """The bytes of ``fd`` (``info``: its status) past ``offset``, from the start of a file shorter than that. A
        regular file by its descriptor alone: less than half the system calls of a buffered file object (a judgement
        of 8,192 ranks reads 1,024 host summaries); what is appended while it is read is read next time."""
        if not stat.S_ISREG(info.st_mode):  # a folder, a FIFO, a device: as a file object of it reads it
            with open(fd, "rb", closefd=False) as f:
                if f.seek(0, 2) < self.offset:
                    self.offset = self.lines = 0
                f.seek(self.offset)
                return f.read()
        if info.st_size < self.offset:
            self.offset = self.lines = 0
        return _read_at(fd, self.offset, info.st_size - self.offset)

    def read_json(self) -> list[Any]:
        """New lines as JSON values; a line that is not JSON is left out."""
        return json_values(self.read())


class Opened(NamedTuple):
    """A file its caller opened for reading (and closes), and its status as opened (``os.fstat``)."""

    fd: int
    info: os.stat_result


def open_read(path: Path) -> Opened | None:
    """``path`` opened for reading, with its status; None where it cannot be opened (absent, not permitted)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return Opened(fd, os.fstat(fd))
    except OSError:
        os.close(fd)
        return None


def _read_at(fd: int, offset: int, size: int) -> bytes:
    """``size`` bytes of ``fd`` from ``offset``, fewer where it ends before (cut short while it was read)."""
    parts = []
    while size > 0:
        part = os.pread(fd, size, offset)
        if not part:
            break
        parts.append(part)
        offset, size = offset + len(part), size - len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


_decode = msgspec.json.Decoder().decode


def json_values(lines: list[str], decode: Callable[[str], Any] | None = None) -> list[Any]:
    """``lines`` as JSON values, by ``decode`` (:func:`json_value` unless given); a line that is not JSON (that it
    raises ValueError for) is left out."""
    decode = decode or json_value
    found = []
    for line in lines:
        try:
            found.append(decode(line))
        except ValueError:
            continue
    return found


def json_value(line: str) -> Any:
    """``json.loads(line)``, by msgspec's decoder where it takes the line (six times faster: a judgement of 8,192
    ranks parses 1,024 host summaries' lines); what it refuses (NaN, integers past 64 bits, a damaged line) is
    json's to read or refuse."""
    try:
        return _decode(line)
    except msgspec.DecodeError:
        return json.loads(line)


class StepFilesTail(JsonlTail):
    """The complete lines added to a rank's step records since the last read, across its files: the closed segments
    in order, then ``path`` (steps.jsonl) as it is appended. A steps.jsonl closed into a segment since the last read
    (run_dir.JsonlAppender) is finished from where the read stopped, in whichever form the segment is now, before the
    segments after it and the fresh file: no line is lost or read twice.

    Why this holds: the file adopted as steps.jsonl (opened together with the listing of the segments before it,
    :func:`open_step_files`) is the one the rank closes next, and a close numbers the segment after the last one
    there, so it becomes segment ``done + 1``: that segment's name appearing, not an inode (which a compressed
    segment's removal frees for the next steps.jsonl), says it was closed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.done = 0  # every closed segment up to this number has been read
        self.live: tuple[int, int] | None = None  # (device, inode) of the steps.jsonl adopted; None: none yet

    def read(self) -> list[str]:
        """New whole lines, in the order written (none while there are no records)."""
        lines: list[str] = []
        try:
            if self.live is not None and self._closed():
                lines += self._finish_closed()
            if self.live is None:
                segments, fd = open_step_files(self.path)
                lines += self._read_segments(segments)
                lines += self._read_live(fd, adopting=True)
            else:
                lines += self._read_live(open_if_there(self.path), adopting=False)
        except (InputError, OSError):
            pass  # not readable now (a FIFO, a vanished folder): read again next time
        self.lines += len(lines)
        return lines

    def _closed(self) -> bool:
        """Whether the adopted steps.jsonl was closed since: segment ``done + 1`` is there, in either form."""
        return any(os.path.lexists(segment_path(self.path, self.done + 1, packed)) for packed in (False, True))

    def _finish_closed(self) -> list[str]:
        """The rest of the adopted file, now segment ``done + 1``, from where the last read stopped."""
        try:
            lines = _split(segment_bytes(segment_path(self.path, self.done + 1))[self.offset:])
        except InputError:
            lines = []  # a damaged segment: lost to this live view, not to the final analysis (which names it)
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

    def _read_live(self, fd: int | None, adopting: bool) -> list[str]:
        """What was appended to steps.jsonl (``fd``, just opened) since the last read: whole lines. ``adopting``:
        opened with the listing of the segments before it, else by its name alone: then a close between the check
        above and the open may have made it the fresh file, and the old one is finished from its segment next time."""
        if fd is None:
            return []
        with open(fd, "rb", closefd=True) as f:
            st = os.fstat(f.fileno())
            if not adopting and self._closed():
                return []
            if (st.st_dev, st.st_ino) != self.live or st.st_size < self.offset:
                self.offset = 0  # adopted now, or replaced or cut short in place (rewritten): read from its start
            self.live = (st.st_dev, st.st_ino)
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return _split(complete)


def _split(data: bytes) -> list[str]:
    """Whole lines as text (bytes that are not UTF-8 replaced)."""
    return data.decode(errors="replace").splitlines()

