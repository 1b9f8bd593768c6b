"""Reading a file anyone may have written: regular files only, never more than a limit.

Run directories are copied from clusters, left by jobs that crashed or filled the disk, or made by
someone else. A name there may be a FIFO (reading it blocks for ever), a device (/dev/zero never
ends), a symlink loop, a sparse file of terabytes, or a gzip bomb (kilobytes that unpack to
gigabytes). Every reader of such files goes through :func:`read_input`, which returns the bytes or
raises :class:`InputError` naming the file and the problem; memory stays bounded by the limit.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import stat
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from diagtrain.profiler.util.units import fmt_bytes

try:  # ISA-L inflates gzip 2-3x faster than zlib, the same stream API; zlib where its wheel is missing
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - a platform without an isal wheel
    _inflate = zlib

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 31  # zlib's window bits for the gzip container
_IN_CHUNK = 1 << 20  # compressed bytes fed to zlib at a time (slices, never copies of the rest)
_OUT_CHUNK = 2 << 20  # unpacked bytes produced at a time: a bomb is stopped within one chunk, and a
# reader decoding as the chunks come holds one at a time
# JSON traces pack 10-15x (the shared HTA traces, our own); a file unpacking 100x past the floor
# is a decompression bomb, refused long before its unpacked size is reached.
MAX_GZIP_RATIO = 100
RATIO_FLOOR = 64 << 20  # below this many unpacked bytes the ratio is not checked: small files pack well
MAX_LINE_CHARS = 1 << 20  # a longer "line" is read in pieces: no log line is a megabyte
MAX_LINES_BYTES = 2 << 30  # a file of lines: steps.jsonl or one of its segments (a million steps is ~0.3 GiB), stderr.log, nccl.log


class InputError(ValueError):
    """A file that cannot be used as input; ``reason`` says why, ``str()`` names the file too."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{display(path)}: {reason}")
        self.path, self.reason = path, reason


class Truncated(InputError):
    """A gzip stream that ends before its end: what it unpacked to until then can still be used."""


def display(path: str | os.PathLike) -> str:
    """``path`` as printable text, even when its name is not valid UTF-8 (bytes shown as ``\\xff``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def read_input(path: str | os.PathLike, limit: int) -> bytes | bytearray:
    """The content of ``path``, unpacked if it is gzip, at most ``limit`` bytes either way."""
    data = _read_regular_file(path, limit)
    if data[:2] == GZIP_MAGIC:
        return gunzip(data, limit, path)
    return data


def read_lines(path: str | os.PathLike, limit: int) -> Iterator[str]:
    """The lines of text file ``path`` (at most ``limit`` bytes), one at a time: never all in memory."""
    fd = _open_regular(path, limit)
    with io.TextIOWrapper(open(fd, "rb", closefd=True), encoding="utf-8", errors="replace", newline=None) as f:
        read = 0
        while line := f.readline(MAX_LINE_CHARS):
            read += len(line)
            if read > limit:  # the file grew past its limit while being read
                raise InputError(path, f"over the {fmt_bytes(limit)} limit for this kind of file")
            yield line.rstrip("\n")


def read_text(path: str | os.PathLike, limit: int) -> str:
    """``path`` as text (undecodable bytes replaced), at most ``limit`` bytes."""
    return bytes(read_input(path, limit)).decode("utf-8", errors="replace")


def read_json(path: str | os.PathLike, limit: int) -> Any:
    """The JSON document in ``path``, at most ``limit`` bytes; :class:`InputError` if it is not JSON."""
    data = read_input(path, limit)
    if not data.strip():
        raise InputError(path, "empty file")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        raise InputError(path, f"not valid JSON ({_short(e)})") from None


def read_blocks(path: str | os.PathLike, limit: int, block_bytes: int) -> Iterator[bytes]:
    """The content of ``path``, unpacked if it is gzip, a block at a time (so memory stays at a
    block, however large the file), at most ``limit`` bytes either way."""
    with open(_open_regular(path, limit), "rb", closefd=True) as f:
        def chunks(size: int) -> Iterator[bytes]:
            try:
                while chunk := f.read(size):
                    yield chunk
            except OSError as e:
                raise InputError(path, f"cannot read ({e.strerror or e})") from None

        first = next(chunks(block_bytes), b"")
        if first[:2] == GZIP_MAGIC:
            yield from _unpack(itertools.chain([first], chunks(_IN_CHUNK)), limit, path)
            return
        read = 0
        for block in itertools.chain([first] if first else [], chunks(block_bytes)):
            read += len(block)
            if read > limit:  # the file grew past its limit while being read
                raise InputError(path, f"over the {fmt_bytes(limit)} limit for this kind of file")
            yield block


def read_written(path: str | os.PathLike, limit: int, block_bytes: int) -> tuple[bytearray, Truncated | None]:
    """What ``path`` holds (unpacked, at most ``limit`` bytes), and for a gzip stream cut short, the
    error saying so: the bytes unpacked before the cut are kept, for readers that can use part of a file."""
    data = bytearray()
    try:
        for block in read_blocks(path, limit, block_bytes):
            data += block
    except Truncated as cut:
        return data, cut
    return data, None


def gunzip(data: bytes | bytearray, limit: int, path: str | os.PathLike = "<data>") -> bytearray:
    """Unpack gzip ``data`` (several members allowed) into at most ``limit`` bytes.

    The result is one bytearray filled in place, so memory is the unpacked size once (not twice,
    as ``gzip.decompress`` takes), and a bomb is stopped after one output chunk past a limit.
    """
    view = memoryview(data)
    out = bytearray()
    for chunk in _unpack((view[o:o + _IN_CHUNK] for o in range(0, len(view), _IN_CHUNK)), limit, path):
        out += chunk
    return out


def _unpack(pieces: Iterable[bytes | memoryview], limit: int, path: str | os.PathLike) -> Iterator[bytes]:
    """The unpacked bytes of a gzip stream given in ``pieces``, a chunk at a time, checked against
    ``limit`` and MAX_GZIP_RATIO as they come."""
    z = _inflate.decompressobj(_GZIP_WBITS)
    size = consumed = 0
    try:
        for piece in pieces:
            consumed += len(piece)
            pending = piece
            while pending:
                if z.eof:  # the previous member ended: padding, or another member
                    if not bytes(pending).strip(b"\0"):
                        break
                    z = _inflate.decompressobj(_GZIP_WBITS)
                chunk = z.decompress(pending, _OUT_CHUNK)
                pending = z.unused_data if z.eof else z.unconsumed_tail
                size += len(chunk)
                _check_unpacked(size, consumed - len(pending), limit, path)
                yield chunk
        while not z.eof:  # output zlib still holds after the last input
            chunk = z.decompress(b"", _OUT_CHUNK)
            if not chunk:
                raise Truncated(path, "the gzip stream ends early (truncated?)")
            size += len(chunk)
            _check_unpacked(size, consumed, limit, path)
            yield chunk
    except _inflate.error as e:
        raise InputError(path, f"not valid gzip ({e})") from None


def _check_unpacked(size: int, consumed: int, limit: int, path: str | os.PathLike) -> None:
    """Refuse past ``limit``, or past MAX_GZIP_RATIO times the packed bytes read so far (a bomb, stopped early)."""
    if size > limit:
        raise InputError(path, f"unpacks to more than {fmt_bytes(limit)}, the limit for this kind of file")
    if size > RATIO_FLOOR and size > MAX_GZIP_RATIO * max(consumed, 1):
        raise InputError(path, f"unpacks to more than {MAX_GZIP_RATIO}x its size: a decompression bomb, not a trace")


def open_regular(path: str | os.PathLike, limit: int) -> int:
    """A descriptor of ``path``, checked as :func:`read_lines` checks it (a regular file within ``limit``)."""
    return _open_regular(path, limit)


def _open_regular(path: str | os.PathLike, limit: int) -> int:
    """A descriptor of ``path``, checked to be a regular file of at most ``limit`` bytes."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it changes nothing for a file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputError(path, f"cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(path, f"not a regular file (a {_kind(st.st_mode)})")
        if st.st_size > limit:
            raise InputError(path, f"{fmt_bytes(st.st_size)}, over the {fmt_bytes(limit)} limit for this kind of file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_regular_file(path: str | os.PathLike, limit: int) -> bytes:
    with open(_open_regular(path, limit), "rb", closefd=True) as f:
        try:
            data = f.read(limit + 1)  # a file still growing stops at the limit too
        except OSError as e:
            raise InputError(path, f"cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        raise InputError(path, f"over the {fmt_bytes(limit)} limit for this kind of file")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _short(e: Exception) -> str:
    return str(e)[:200] or type(e).__name__
