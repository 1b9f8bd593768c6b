"""The run directory: the contract between the stages (collect, rank, analyze, compare, present).

Every stage imports this module and no other stage's code to find its way around a run: the names
of the folders and files, the environment variables the wrapper hands to the ranks, the statuses a
run can end in, how a file is written without leaving it torn, and how the ranks' own records are
read from outside. It imports only the standard library: the in-rank code loads it inside the
user's job.

Every file is either replaced atomically (temp file in the same folder, then rename) or appended
one line at a time, so a killed run leaves only readable data behind.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import secrets
import signal
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from diagtrain.profiler.util import processes
from diagtrain.profiler.util.identity import ByIdentity
from diagtrain.profiler.util.settings import section, setting

SCHEMA_VERSION = 1

# What `diagtrain run` tells every process of the job through its environment.
RUN_DIR_ENV = "DIAGTRAIN_RUN_DIR"  # the run directory; a process without it is not under diagtrain
WRAPPER_PID_ENV = "DIAGTRAIN_WRAPPER_PID"  # the wrapper's pid: its direct child is rank 0 without a launcher
HOST_ENV = "DIAGTRAIN_HOST"  # the wrapper's host folder name; two agents on one machine differ
PROFILE_STEPS_ENV = "DIAGTRAIN_PROFILE_STEPS"  # the step ranges every rank profiles, e.g. "5-8", or "auto"
# $DIAGTRAIN_PROFILE_STEPS=auto: the wrapper decides the windows while the job runs and writes them to
# this file in the run directory; every rank reads it at its step boundaries (see rank/profile_requests.py).
PROFILE_AUTO = "auto"
PROFILE_NONE = "none"
PROFILE_WINDOWS_FILE = "profile_windows.json"  # {"windows": [{"first", "last", "reason", ...}]}

# PyTorch's variables `diagtrain run` puts in every rank's environment before the rank starts, each only where the
# user set none: a process group reads them when it starts, which may be before the rank knows it is one (a
# process that becomes a rank at its own init_process_group).
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"  # "1": NCCL times each collective (one more CUDA event pair each)
# The flight recorder's size under its two names, as PyTorch reads them: the first one set wins, so a user's
# value under either is kept by setting neither.
FR_BUFFER_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_BUFFER_ENTRIES = 20_000  # entries kept per process: several steps of a 3D run's collectives
FR_DEFAULT_ENTRIES = 2_000  # PyTorch's own size, where neither name is set


def device_env(env: Mapping[str, str]) -> dict[str, str]:
    """What `diagtrain run` adds to an environment for its ranks: NCCL's collective timing and the flight
    recorder's size, each where ``env`` holds no value of the user's (under either of the recorder's names)."""
    added = {} if NCCL_TIMING_ENV in env else {NCCL_TIMING_ENV: "1"}
    if not any(name in env for name in FR_BUFFER_ENVS):
        added[FR_BUFFER_ENVS[0]] = str(FR_BUFFER_ENTRIES)
    return added


def recorder_entries(env: Mapping[str, str]) -> int:
    """The flight recorder's ring size as PyTorch reads it from ``env``: the first of its names set."""
    value = next((env[name] for name in FR_BUFFER_ENVS if name in env), None)
    try:
        return int(value) if value is not None else FR_DEFAULT_ENTRIES
    except ValueError:
        return FR_DEFAULT_ENTRIES


# diagtrain's own trouble inside a rank (a profiled window dropped on a full disk, ...), one JSON
# line each; the wrapper puts them in the manifest's ``warnings``.
WARNINGS_FILE = "warnings.jsonl"
WARNING_PREFIX = "diagtrain: warning: "  # how a rank says them on stderr: "<prefix>rank 3: <message>"
RANK_WARNING = re.compile(r"diagtrain: warning: rank (\d+): (.+)$")

# The signal the wrapper's watchdog sends a rank for its stacks and flight recorder (see rank/state_dump.py).
DUMP_SIGNAL = signal.SIGUSR2

# A run's status, most telling first: one interrupted host makes the run interrupted. A host whose
# wrapper vanished without ending its record (SIGKILL, a lost machine) is "abandoned".
STATUS_ORDER = ("running", "abandoned", "interrupted", "hung", "failed", "ok")
# Statuses of a run that did not finish its work: the hang verdict and view apply to these.
STOPPED = ("hung", "failed", "interrupted", "abandoned")

# Each wrapper's own folder, hosts/<name>/: its record, its heartbeat, its clock measurements.
HOSTS_DIR = "hosts"
HOST_RECORD = "host.json"
HOST_HEARTBEAT = "heartbeat"
CLOCK_RECORD = "clock.json"
# Its ranks' step records, checked and appended by its wrapper as they come: live judgement reads one file per host.
HOST_STEPS_SUMMARY = "steps_summary.jsonl"
HOST_BEAT_S = 1.0  # a running wrapper rewrites its heartbeat this often
# A heartbeat this old, by the reader's clock, means its wrapper is gone: far above a stalled
# filesystem or a busy host's delays, and above any clock skew NTP leaves between hosts.
HOST_LOST_AFTER_S = 60.0


# What a run puts in its directory: what `diagtrain run --replace` removes first, and nothing else
# (an --out that is also a project folder keeps the project's own files).
RUN_ENTRIES = ("manifest.json", "hosts", "ranks", "analysis", "telemetry.parquet", "report.md", "report.json",
               "report.html", "injected.json", "trainer.json", "checkpoints", "live")
LIVE_DIR = "live"  # what live judgement wrote while the job ran
LIVE_FINDINGS_FILE = "findings.jsonl"  # ... one event per line: a finding record, event, detected_at, step
# The wrapper that analyzes a run writes its host folder's name here first (one analysis per run).
ANALYSIS_CLAIM = "analysis/claimed-by"
ANALYSIS_CACHE = "analysis/cache"  # what an analysis keeps for the next one (parsed traces, step records)


def holds_run(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` already holds (part of) a run: its records or its ranks' files."""
    run_dir = Path(run_dir)
    return any(os.path.lexists(run_dir / name) for name in ("manifest.json", "ranks")) or any(
        run_dir.glob("hosts/*/host.json"))


def clear_run(run_dir: str | os.PathLike) -> None:
    """Remove what a run wrote in ``run_dir`` (RUN_ENTRIES); anything else there stays."""
    import shutil

    for name in RUN_ENTRIES:
        path = Path(run_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()


def rank_dir(run_dir: str | os.PathLike, rank: int) -> Path:
    """The folder that holds one rank's files: ``<run>/ranks/<rank>``."""
    return Path(run_dir) / "ranks" / str(rank)


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a diagtrain run directory (it has the per-rank folders or a manifest)."""
    path = Path(path)
    return (path / "ranks").is_dir() or (path / "manifest.json").is_file()


def default_run_dir(label: str, root: str | os.PathLike = "runs") -> Path:
    """``runs/<UTC timestamp>-<label>``, the run directory used when none is given."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{stamp}-{label}"


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see the old file or the new one, never half."""
    write_bytes_atomic(path, (json_text(obj, sort_keys=True) + "\n").encode())


INLINE_NUMBERS = 8  # a longer list of plain numbers is written on one line: a long run's steps, not one a line


def json_text(obj: Any, sort_keys: bool = False, default: Any = None) -> str:
    """``obj`` as indented JSON, with each list of more than INLINE_NUMBERS plain numbers on one line: a finding of
    a long run names hundreds of thousands of steps, one a line was megabytes, and Python's indenting encoder
    wrote them a second a million."""
    inline: list[list[Any]] = []
    token = secrets.token_hex(8)  # each list's stand-in: a string no document holds

    def swapped(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: swapped(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            if len(x) > INLINE_NUMBERS and all(type(v) in (int, float) for v in x):
                inline.append(list(x))
                return f"{token}:{len(inline) - 1}"
            return [swapped(v) for v in x]
        return x

    text = json.dumps(swapped(obj), indent=2, sort_keys=sort_keys, default=default)
    stand_in = re.compile(f'"{token}:(\\d+)"')
    return stand_in.sub(lambda m: json.dumps(inline[int(m.group(1))], separators=(", ", ": ")), text) if inline else text


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` through a temp file and a rename in the same folder."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temp file's path beside ``path`` to write; it replaces ``path`` when the block ends without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)  # a full disk must not leave half-written temp files behind
        raise


def remove_quietly(path: str | os.PathLike) -> None:
    """Remove ``path`` if it is there; never raise (used while already handling a failure)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def check_writable(path: str | os.PathLike) -> Path:
    """Create ``path`` as a folder and prove it writable; raise ``OSError`` naming it if not."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
    return path


# -- a rank's step records: closed segments, then the file being appended --

STEPS_FILE = "steps.jsonl"
TELEMETRY_FILE = "telemetry.jsonl"  # under hosts/<host>/, closed and coarsened as Records says
# Where a test or a user sets the size at which a rank's steps.jsonl is closed into a segment (bytes).
STEP_SEGMENT_BYTES_ENV = "DIAGTRAIN_STEP_SEGMENT_BYTES"
SEGMENT_GZIP_LEVEL = 3  # ISA-L's best: 4.5x on step records against 4.3x at 1, still 200 MB/s
_SEGMENT = re.compile(r"^(?P<stem>.+)\.(?P<number>[1-9][0-9]{0,8})\.jsonl(?P<gz>\.gz)?$")


@section("records")
class Records:
    """How big what a run records may grow before it is closed, compressed or thinned."""

    step_segment_bytes: int = setting(32 << 20, "a rank's steps.jsonl past this is closed into a segment that the "
                                      "wrapper compresses (4-5x): ~64,000 CPU records, 18 h at 1 step/s; the file "
                                      "left uncompressed is at most this, and a segment is parsed whole in ~1 s "
                                      "(a run sets it with $DIAGTRAIN_STEP_SEGMENT_BYTES)")
    telemetry_horizon_s: float = setting(3600.0, "a host's telemetry is closed into a segment this often, and segments "
                                         "older than one horizon thinned: the last hour or two stay at the sampling "
                                         "interval, where live judgement and a hang's diagnosis look")
    max_profiled_windows: int = setting(3, "--profile-steps auto keeps the traces of at most this many windows: a "
                                        "window's traces are tens of MB a rank; past it a slowdown's window replaces "
                                        "the least anomalous kept one (the warm-up's first)")
    replace_margin: float = setting(1.25, "... only where its slowdown (step time over the recent median) is this many "
                                    "times the replaced one's: a trace costs every rank seconds, not for a tie")
    telemetry_coarse_s: float = setting(60.0, "... to one sample this often: a day of 1 Hz samples of an 8-GPU host "
                                        "shrinks 60x (before compression), and the analysis' hour-scale views "
                                        "(contention, throttling over a run) keep dozens of samples an hour")


def step_segment_bytes(env: Mapping[str, str] = os.environ) -> int:
    """The size at which a rank closes its steps.jsonl into a segment: ``$DIAGTRAIN_STEP_SEGMENT_BYTES`` where set
    (a positive number of bytes), else the ``records.step_segment_bytes`` setting."""
    raw = env.get(STEP_SEGMENT_BYTES_ENV)
    if raw is None:
        return Records.active().step_segment_bytes
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"${STEP_SEGMENT_BYTES_ENV}={raw!r}: not a positive number of bytes")
    return value


def segment_path(path: str | os.PathLike, number: int, compressed: bool = False) -> Path:
    """Closed segment ``number`` of the records file ``path``: ``steps.jsonl`` -> ``steps.<number>.jsonl[.gz]``."""
    path = Path(path)
    stem = path.name.removesuffix(".jsonl")
    return path.with_name(f"{stem}.{number}.jsonl" + (".gz" if compressed else ""))


def closed_segments(path: str | os.PathLike) -> list[tuple[int, Path]]:
    """The closed segments of the records file ``path``, oldest first, as (number, file): ``steps.<n>.jsonl``, or
    once compressed ``steps.<n>.jsonl.gz``. Where both are there (the compressor between its rename and its
    removal) the plain one is named: it is complete, and a reader that opened it can finish it."""
    path = Path(path)
    stem = path.name.removesuffix(".jsonl")
    found: dict[int, Path] = {}
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    for name in names:
        m = _SEGMENT.match(name)
        if m and m["stem"] == stem:
            number = int(m["number"])
            if not m["gz"] or number not in found:
                found[number] = path.with_name(name)
    return sorted(found.items())


def has_step_records(path: str | os.PathLike) -> bool:
    """Whether a rank recorded steps at ``path`` (its steps.jsonl) or in segments closed beside it."""
    return os.path.lexists(path) or bool(closed_segments(path))


def compress_segments(path: str | os.PathLike, up_to: int | None = None,
                      thin: Callable[[bytes], bytes] | None = None) -> int:
    """Compress the closed segments of the records file ``path`` numbered up to ``up_to`` (every one where None) that
    are still plain, each into ``<stem>.<n>.jsonl.gz`` (with ``thin``, what it keeps of the segment's bytes): written
    whole under a temp name and renamed (a reader finds it complete or not at all), only then the plain one removed,
    so a crash at any point leaves every record readable (a segment found in both forms is compressed again). The
    wrapper's work, never the rank's. The segments done."""
    done = 0
    for number, segment in closed_segments(path):
        if segment.name.endswith(".gz") or (up_to is not None and number > up_to):
            continue
        with replacing(segment_path(path, number, compressed=True)) as tmp:
            _gzip_file(segment, tmp, thin)
        os.unlink(segment)
        done += 1
    return done


def _gzip_file(source: Path, target: Path, thin: Callable[[bytes], bytes] | None) -> None:
    """``source`` (``thin(its bytes)`` where given) gzip-compressed into ``target``, on disk before it returns (it
    replaces the plain file next)."""
    try:  # ISA-L: ~4x smaller at ~200 MB/s, 5x the speed of zlib's level 6 for 15% less
        from isal import igzip as gzip_module
        level = SEGMENT_GZIP_LEVEL
    except ImportError:  # pragma: no cover - a platform without an isal wheel
        import gzip as gzip_module
        level = 1
    import shutil

    with open(source, "rb") as src, open(target, "wb") as raw:
        with gzip_module.GzipFile(fileobj=raw, mode="wb", compresslevel=level, mtime=0) as out:
            if thin is None:
                shutil.copyfileobj(src, out, 1 << 20)
            else:
                out.write(thin(src.read()))  # a telemetry segment: an hour of samples, megabytes
        raw.flush()
        os.fsync(raw.fileno())


class JsonlAppender:
    """Append one JSON record per line, flushed at once, so a crash loses at most the current line.

    With ``max_bytes``, a file that grew past it is closed into the next numbered segment beside it
    (:func:`segment_path`, a rename: the appender's process pays nothing more) and a fresh file begun, so a reader
    finds the records in :func:`closed_segments` then in ``path``. The rename comes after a whole line: every
    segment ends at a record's end, and a crash leaves every record either in a segment or in ``path``.
    """

    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self._file: io.TextIOWrapper | None = open(self.path, "a", buffering=1, encoding="utf-8")
        self._size = self._file.tell()  # a restarted rank appends to what its last process wrote

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one line (then close the file into a segment if it passed ``max_bytes``)."""
        if self._file is None:
            self._open()  # the fresh file after a segment could not be opened then: again now
        line = json.dumps(record, separators=(",", ":")) + "\n"
        self._file.write(line)
        self._size += len(line)  # json.dumps escapes every non-ASCII character: characters are bytes
        if self.max_bytes is not None and self._size >= self.max_bytes:
            self.close_segment()

    def close_segment(self) -> None:
        """Rename the file to the segment after the last one there, and begin a fresh one. A rename that fails
        leaves the records where they are, appended to as before."""
        self._file.close()
        self._file = None
        segments = closed_segments(self.path)
        try:
            os.replace(self.path, segment_path(self.path, segments[-1][0] + 1 if segments else 1))
        except OSError:
            pass  # a folder that refuses renames: one growing file, as before segments
        self._open()

    def close(self) -> None:
        """Close the file; further appends fail."""
        self._file.close()


class Heartbeat:
    """A small JSON record rewritten in place every step, for the watchdog and the progress view.

    A rename per step costs about a millisecond on overlay filesystems, 1-2% of a short step. One
    ``pwrite`` of a fixed-size record at offset 0 costs microseconds, and a single write of under
    a page is never seen half-done by a reader on Linux; the padding keeps the file's length
    constant so no stale tail survives a shorter record.
    """

    SIZE = 128

    def __init__(self, path: str | os.PathLike) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Replace the record."""
        data = json.dumps(record, separators=(",", ":")).encode()
        if len(data) >= self.SIZE:
            raise ValueError(f"heartbeat record over {self.SIZE} bytes: {data!r}")
        os.pwrite(self._fd, data.ljust(self.SIZE - 1) + b"\n", 0)

    def close(self) -> None:
        os.close(self._fd)


# -- reading what ranks wrote about themselves (rank.json, heartbeat, exit.json), from outside --


MAX_RECORD_BYTES = 64 << 20  # a record (host.json, rank.json, a heartbeat) is kilobytes: more is not one


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON in ``path``, or None when it is missing, not a regular file (a FIFO would block the
    reader for ever), over MAX_RECORD_BYTES, or not (yet) valid."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with open(fd, "rb", closefd=True) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read(MAX_RECORD_BYTES + 1)
        return json.loads(data) if len(data) <= MAX_RECORD_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None


class FolderWatch:
    """Whether a file was created, renamed or removed in the run directory's top or in a host's folder since the last
    look (:meth:`changed`): by each folder's modification time, which an append or a heartbeat's rewrite in place
    leaves as it is. A reader of the hosts' records every few seconds lists 1,024 folders' times instead of globbing
    them for each kind of record (30 ms at 8,192 ranks)."""

    RACY_S = 2.0  # a folder changed this recently may change again within its time's resolution: looked at again

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self._seen: tuple | None = None

    def changed(self) -> bool:
        """Whether anything was created, renamed or removed there since the last call (True at the first)."""
        stamp = self._stamp()
        changed = stamp != self._seen
        recent = max((t for _, t in stamp), default=0) > time.time_ns() - self.RACY_S * 1e9
        self._seen = None if recent else stamp
        return changed

    def _stamp(self) -> tuple[tuple[str, int], ...]:
        found = []
        for folder in (self.run_dir, self.run_dir / HOSTS_DIR):
            try:
                found.append((folder.name, os.stat(folder).st_mtime_ns))
            except OSError:
                found.append((folder.name, -1))
        try:
            with os.scandir(self.run_dir / HOSTS_DIR) as entries:
                found += [(e.name, e.stat().st_mtime_ns) for e in entries if e.is_dir()]
        except OSError:
            pass  # no hosts folder yet
        return tuple(found)


class RankIndex:
    """The ranks of a run directory, re-scanned cheaply: each rank.json is parsed once, and the ranks folder listed
    again only when a folder was created in it (its modification time) or a rank's record is still to come."""

    def __init__(self, run_dir: Path) -> None:
        self.ranks_dir = Path(run_dir) / "ranks"
        self.info: dict[int, dict[str, Any]] = {}
        self._listed: int | None = None  # the ranks folder's modification time when it was last listed
        self._pending: set[str] = set()  # rank folders listed without a readable rank.json yet
        self.version = 0  # bumped when a rank's record is read: what a reader made of ``info`` before is out of date

    def refresh(self) -> dict[int, dict[str, Any]]:
        """Every rank that has written rank.json so far, by rank."""
        try:
            stamp = os.stat(self.ranks_dir).st_mtime_ns
        except OSError:  # no ranks folder yet (or not a folder)
            return self.info
        if stamp != self._listed:
            try:
                # Names only, a path made for a new rank alone: 8,192 folders were 8,192 paths at every refresh (25 ms).
                with os.scandir(self.ranks_dir) as entries:
                    self._pending |= {e.name for e in entries if e.name.isdigit() and int(e.name) not in self.info}
            except OSError:
                return self.info
            # A folder changed this recently may change again within its time's resolution: listed again next time.
            self._listed = None if stamp > time.time_ns() - FolderWatch.RACY_S * 1e9 else stamp
        for name in sorted(self._pending, key=int):
            info = read_json(self.ranks_dir / name / "rank.json")
            if isinstance(info, dict):  # anything else is not a rank record (a damaged file): asked again next time
                self.info[int(name)] = info
                self._pending.discard(name)
                self.version += 1
        return self.info

    def on_host(self, host: str) -> dict[int, dict[str, Any]]:
        """The ranks started by the wrapper whose host folder is ``host``."""
        return {r: i for r, i in self.refresh().items() if i.get("host") == host}

    def heartbeat(self, rank: int) -> dict[str, Any] | None:
        """The rank's last heartbeat record, or None before its first step."""
        return read_json(self.ranks_dir / str(rank) / "heartbeat")

    def exit_record(self, rank: int) -> dict[str, Any] | None:
        """The rank's exit.json, or None while it runs (or if it died without one)."""
        record = read_json(self.ranks_dir / str(rank) / "exit.json")
        return record if isinstance(record, dict) else None

    def warnings(self, rank: int) -> list[dict[str, Any]]:
        """What went wrong with diagtrain inside the rank (warnings.jsonl, and its exit record's copy)."""
        found = []
        try:
            lines = (self.ranks_dir / str(rank) / WARNINGS_FILE).read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill or a full disk
        found += (self.exit_record(rank) or {}).get("warnings") or []
        found = [w for w in found if isinstance(w, dict)]
        unique = {str(w.get("message")): w for w in found}
        return list(unique.values())


# -- hosts: one record per wrapper, the run's status merged from them --


def host_dir(run_dir: str | os.PathLike, name: str) -> Path:
    """The folder of one wrapper of the run: ``<run>/hosts/<name>``."""
    return Path(run_dir) / HOSTS_DIR / name


def read_hosts(run_dir: str | os.PathLike, now: float | None = None) -> list[dict[str, Any]]:
    """Every host record, oldest folder name first, with ``heartbeat`` (the wrapper's last one).

    A record still ``running`` whose wrapper is gone (see :func:`wrapper_gone`) reads as
    ``abandoned``, with ``last_seen`` the time of its last heartbeat (the host's own clock).
    """
    hosts = []
    for path in sorted(Path(run_dir).glob(f"{HOSTS_DIR}/*/{HOST_RECORD}")):
        record = read_json(path)
        if not isinstance(record, dict):
            continue
        beat = read_json(path.parent / HOST_HEARTBEAT)
        record["heartbeat"] = beat if isinstance(beat, dict) else None
        if record.get("status") == "running" and wrapper_gone(record, record["heartbeat"], now):
            record["status"] = "abandoned"
            record["last_seen"] = (record["heartbeat"] or {}).get("time") or record.get("started_at")
        hosts.append(record)
    return hosts


def wrapper_gone(record: dict[str, Any], heartbeat: dict[str, Any] | None, now: float | None = None) -> bool:
    """Whether the wrapper that wrote a ``running`` host record no longer runs.

    On the machine (and pid namespace) that ran it, its process answers for certain; elsewhere a
    heartbeat older than HOST_LOST_AFTER_S does, by this machine's clock.
    """
    alive = processes.alive(record.get("process") or {})
    if alive is not None:
        return not alive
    last = (heartbeat or {}).get("time") or record.get("started_at")
    return last is not None and (now if now is not None else time.time()) - last > HOST_LOST_AFTER_S


def run_status(host_statuses: list[str], rank_codes: list[int | None]) -> str:
    """The run's status from its hosts' (the most telling one), and the ranks' exit codes."""
    statuses = list(host_statuses)
    if any(code not in (0, None) for code in rank_codes) and "ok" in statuses:
        statuses.append("failed")  # a rank failed though its launcher exited 0
    return min(statuses, key=STATUS_ORDER.index) if statuses else "running"


# -- analysis/collectives.parquet: a collective's group, one key per process group and its members --

MIN_RUN = 3  # evenly spaced members written as a range from this many: "0,1" stays as it is


def group_key(pg: Any, members: tuple[int, ...]) -> str:
    """``"<pg>:<members>"``: the group a collective is matched within (its process group and members, as
    :func:`members_text` writes them): every groupby on the key hashes it whole, row by row, and a key that
    listed 1,024 ranks made the cross-rank stages grow with ranks squared."""
    return f"{pg}:{members_text(members)}"


class GroupKeys:
    """:func:`group_key` for many (group, members) pairs whose members are shared tuples (every rank's groups list
    the world's): each members object is written once, not once a rank."""

    def __init__(self) -> None:
        self._text = ByIdentity(members_text)

    def __call__(self, pg: Any, members: Sequence[int]) -> str:
        """``group_key(pg, members)``."""
        return f"{pg}:{self._text(members)}"


def members_text(members: Sequence[int]) -> str:
    """Member ranks in few characters: evenly spaced ones as a range, ``first-last`` or ``first-last/step``
    (``"0-1023"``, ``"0-1016/8"``), others listed by commas. process_groups.json writes a group's members so:
    a list of the world's ranks in every rank's file is the world squared to write and read."""
    items, i = [], 0
    while i < len(members):
        j = i + 1
        step = members[j] - members[i] if j < len(members) else 0
        while step > 0 and j + 1 < len(members) and members[j + 1] - members[j] == step:
            j += 1
        if step > 0 and j - i + 1 >= MIN_RUN:
            items.append(f"{members[i]}-{members[j]}" + (f"/{step}" if step != 1 else ""))
            i = j + 1
        else:
            items.append(str(members[i]))
            i += 1
    return ",".join(items)


def group_members(key: str) -> tuple[int, ...]:
    """The member ranks a ``group_key`` names (``()`` where the group's members are unknown, or where
    ``key`` is a bare group name that is not a key)."""
    try:
        return members_of_text(str(key).rpartition(":")[2])
    except ValueError:
        return ()


@functools.lru_cache(maxsize=4096)
def members_of_text(text: str) -> tuple[int, ...]:
    """The ranks :func:`members_text` wrote (ValueError if ``text`` is not such a list). One tuple for each text:
    every rank's file names the world's group, which the analysis then holds once, not once a rank."""
    items = [_item_ranks(item) for item in text.split(",")] if text else []
    if sum(map(len, items)) > MAX_MEMBERS:
        raise ValueError(f"over {MAX_MEMBERS:,} ranks")
    return tuple(r for item in items for r in item)


MAX_MEMBERS = 1 << 20  # a group of more ranks than any job has: a damaged text, not a tuple of millions to build


def _item_ranks(item: str) -> range:
    """The ranks of one item of a key: ``7``, ``0-7`` or ``0-56/8``."""
    first, _, rest = item.partition("-")
    if not rest:
        return range(int(first), int(first) + 1)
    last, _, step = rest.partition("/")
    return range(int(first), int(last) + 1, int(step or 1))


def telemetry_rows(run_dir: Path, lines: Callable[[Path], Iterable[str]] | None = None) -> list[dict]:
    """Every host's telemetry rows, in host order, each host's closed segments (coarsened, compressed) then its
    telemetry.jsonl (a line cut by a kill is left out); ``lines`` reads a file's lines, unpacking a ``.gz`` (the
    analysis reads them bounded)."""
    rows = []
    for path in sorted(Path(run_dir).glob(f"{HOSTS_DIR}/*/{TELEMETRY_FILE}")):
        files = [segment for _, segment in closed_segments(path)] + [path]
        for line in (line for file in files if os.path.lexists(file) for line in (lines or _text_lines)(file)):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: everything before it is intact
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _text_lines(path: Path) -> list[str]:
    """The lines of a small record file, unpacked if it is gzip."""
    import gzip

    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode(errors="replace").splitlines()


def telemetry_table(rows: list[dict]) -> Any:
    """The rows as telemetry.parquet holds them: ``time`` a UTC timestamp, ids as nullable integers."""
    import pandas as pd

    out = pd.DataFrame(rows)
    out["time"] = pd.to_datetime(pd.to_numeric(out["time"], errors="coerce"), unit="s", utc=True)
    for column in ("rank", "pid", "threads", "device"):
        if column in out:
            out[column] = pd.to_numeric(out[column], errors="coerce").astype("Int64")
    return out
