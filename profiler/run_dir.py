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
import json
import os
import re
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
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


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


class JsonlAppender:
    """Append one JSON record per line, flushed at once, so a crash loses at most the current line."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one line."""
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

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


class RankIndex:
    """The ranks of a run directory, re-scanned cheaply: each rank.json is parsed once."""

    def __init__(self, run_dir: Path) -> None:
        self.ranks_dir = Path(run_dir) / "ranks"
        self.info: dict[int, dict[str, Any]] = {}

    def refresh(self) -> dict[int, dict[str, Any]]:
        """Every rank that has written rank.json so far, by rank."""
        try:
            # Names only, a path made for a new rank alone: 8,192 folders were 8,192 paths at every refresh (25 ms).
            names = [entry.name for entry in os.scandir(self.ranks_dir)]
        except OSError:  # no ranks folder yet (or not a folder)
            return self.info
        for name in names:
            if name.isdigit() and int(name) not in self.info:
                info = read_json(self.ranks_dir / name / "rank.json")
                if isinstance(info, dict):  # anything else is not a rank record (a damaged file)
                    self.info[int(name)] = info
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


def telemetry_rows(run_dir: Path, lines: Callable[[Path], Iterable[str]] = lambda p: p.read_text().splitlines()) -> list[dict]:
    """Every host's telemetry.jsonl rows, in host order (a line cut by a kill is left out); ``lines`` reads a file's
    lines (the analysis reads them bounded)."""
    rows = []
    for path in sorted(Path(run_dir).glob("hosts/*/telemetry.jsonl")):
        for line in lines(path):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: everything before it is intact
            if isinstance(row, dict):
                rows.append(row)
    return rows


def telemetry_table(rows: list[dict]) -> Any:
    """The rows as telemetry.parquet holds them: ``time`` a UTC timestamp, ids as nullable integers."""
    import pandas as pd

    out = pd.DataFrame(rows)
    out["time"] = pd.to_datetime(pd.to_numeric(out["time"], errors="coerce"), unit="s", utc=True)
    for column in ("rank", "pid", "threads", "device"):
        if column in out:
            out[column] = pd.to_numeric(out[column], errors="coerce").astype("Int64")
    return out
