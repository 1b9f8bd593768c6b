"""A rank's step records as its files hold them: the closed segments in order (``steps.<n>.jsonl``, or once the
wrapper compressed them ``steps.<n>.jsonl.gz``), then ``steps.jsonl``, which the rank appends to.

The rank closes its steps.jsonl into the next segment with a rename (run_dir.JsonlAppender) and the wrapper
compresses closed segments (run_dir.compress_segments): a reader lists the segments and opens the file being
appended together (:func:`open_step_files`), so that a close between the two is seen and the listing taken again,
and reads a segment in whichever form it is there now (:func:`segment_bytes`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from diagtrain.profiler.analyzer.read.inputs import MAX_LINES_BYTES
from diagtrain.profiler.run_dir import closed_segments, segment_path
from diagtrain.profiler.util.bounded_read import InputError, open_regular, read_input

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
