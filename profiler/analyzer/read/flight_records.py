"""Cross-rank reading of flight-recorder dumps: who entered which collective of which group.

Works on what gloo gives with torch 2.13 (every collective recorded, state always "scheduled",
empty pg_config) as well as on NCCL dumps (states and timings), from diagtrain's JSON dumps or
NCCL's own pickled ``TORCH_FR_DUMP_TEMP_FILE`` files.

A pickle is never loaded with :mod:`pickle`'s default unpickler, which runs whatever code the file
names: a run directory is data from elsewhere. NCCL's dumps are plain data (dicts, lists, tuples,
strings, numbers), so they are read by an unpickler that builds only that and refuses every
reference to a class or function.

A JSON dump cut short or holding entries that are not JSON keeps its other entries (:mod:`tolerant`);
a pickle cut short is refused whole, saying so: no part of a pickle can be trusted without its end.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.read.inputs import MAX_DUMP_BYTES, expect, rank_number
from diagtrain.profiler.analyzer.read.run_files import MAX_STEP_MS
from diagtrain.profiler.analyzer.read.tolerant import UNPARSED, Salvage
from diagtrain.profiler.run_dir import GroupKeys, group_key, group_members
from diagtrain.profiler.util.bounded_read import InputError, read_written

_RANK_SUFFIX = re.compile(r"(\d+)(?:\.json)?$")
PLAIN_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))
MAX_PICKLE_DEPTH = 32  # a real dump nests 7 deep (dump, entries, entry, input_sizes, a shape, ...)
# Shared references let a small pickle stand for an enormous tree (the same long string a million
# times); a real dump unfolds to a few values and characters per byte of file.
PICKLE_EXPANSION = 64
PICKLE_EXPANSION_FLOOR = 1 << 20
_BLOCK_BYTES = 1 << 20


@dataclass
class Entry:
    """One collective as one rank recorded it."""

    rank: int
    pg: str
    pg_desc: str | None
    seq: int
    op: str
    sizes: Any
    dtypes: Any
    created_ns: int
    state: str | None
    frames: list[dict] = field(default_factory=list)
    pg_id: str | None = None  # the rank's own id of the group, which its ``pg_status`` is keyed by
    out_sizes: Any = None
    duration_ms: float | None = None  # its time on the device (TORCH_NCCL_ENABLE_TIMING=1), None where not timed


@dataclass
class Progress:
    """How far one rank got on one group: the last collective it entered, and the last that completed."""

    entered: int
    completed: int | None  # None: the dump does not say (gloo records no completion)


@dataclass
class Blocked:
    """A collective some members of its group entered and others never did."""

    pg: str
    pg_desc: str | None
    seq: int
    op: str
    since_ns: int
    waiting: list[int]  # ranks that entered it
    missing: list[int]  # ranks that never did
    missing_last: dict[int, Entry | None]  # each missing rank's last collective on that group


@dataclass
class Mismatch:
    """Ranks disagreeing on what collective #seq of a group is."""

    pg: str
    pg_desc: str | None
    seq: int
    versions: dict[int, str]  # rank -> "op sizes dtypes"


def looks_like_dump(path: Path) -> bool:
    """Whether a file starts as a flight-recorder dump does: a pickle (protocol 2 or later), or a JSON object
    with the dump's keys and no trace events. Only its first bytes are read."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if len(head) > 1 and head[0] == 0x80 and head[1] >= 2:
        return True
    text = head.lstrip()
    return text[:1] == b"{" and b'"traceEvents"' not in text and (b'"entries"' in text or b'"pg_config"' in text)


def read_dump(path: Path) -> dict[str, Any]:
    """A dump as a dict (diagtrain's / torch's JSON, or NCCL's pickle), its entries checked.

    Raises :class:`InputError` naming the file for anything that is not a dump, and for a pickle
    that refers to any class or function.
    """
    raw, truncated = read_written(path, MAX_DUMP_BYTES, _BLOCK_BYTES)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        if raw.lstrip()[:1] == b"{":
            doc = _salvaged(bytes(raw).decode("utf-8", errors="replace"), path)
        elif truncated is not None:
            raise truncated from None
        else:
            doc = unpickle_plain(bytes(raw), path)
    expect(doc, dict, path)
    return with_clean_entries(doc, path)


def _salvaged(text: str, path: Path) -> dict[str, Any]:
    """A JSON dump that does not parse, read entry by entry: the entries that are JSON, its other keys,
    and under ``cut_short`` where it ends early (an entry that is not JSON becomes a malformed one)."""
    salvage = Salvage(text, "entries")
    entries = [None if e.value is UNPARSED else e.value for e in salvage.elements()]
    if not salvage.found and not salvage.members:
        raise InputError(path, f"neither JSON nor a pickle (the JSON {salvage.cut.describe() if salvage.cut else 'is bad'})")
    doc = json.loads(salvage.header())
    if salvage.found:
        doc["entries"] = entries
    if salvage.cut is not None:
        doc["cut_short"] = salvage.cut.describe()
    return doc


class _PlainData(pickle.Unpickler):
    """Builds only what the pickle opcodes themselves build; every global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, and a flight-recorder dump holds only plain "
                                     "data (dicts, lists, strings, numbers); not loaded")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to an object outside the file; not loaded")


def unpickle_plain(raw: bytes, path: str | Path = "<pickle>") -> Any:
    """The plain data in pickle ``raw``; :class:`InputError` for anything else (no code ever runs)."""
    try:
        value = _PlainData(io.BytesIO(raw)).load()
    except (EOFError, pickle.UnpicklingError) as e:
        if str(e).startswith("it refers"):
            raise InputError(path, f"unsafe pickle: {e}") from None
        if _cut_short(raw, e):
            raise InputError(path, f"the pickle ends early (truncated? {len(raw):,} bytes): a pickle cut short cannot "
                             "be read in part safely, so none of this dump is used") from None
        raise InputError(path, f"neither JSON nor a pickle ({e})") from None
    except Exception as e:  # noqa: BLE001 - garbage makes the unpickler raise almost anything
        raise InputError(path, f"neither JSON nor a pickle ({type(e).__name__}: {e})"[:300]) from None
    _check_plain(value, max(PICKLE_EXPANSION * len(raw), PICKLE_EXPANSION_FLOOR), path)
    return value


def _cut_short(raw: bytes, error: BaseException) -> bool:
    """Whether a pickle (protocol 2 or later, by its first bytes) failed because its data ran out."""
    ran_out = isinstance(error, EOFError) or "truncated" in str(error)
    return ran_out and len(raw) > 1 and raw[0] == 0x80 and raw[1] >= 2


def _check_plain(value: Any, budget: int, path: str | Path) -> None:
    """Plain data only, nested at most MAX_PICKLE_DEPTH, unfolding to at most ``budget`` values and characters."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) not in PLAIN_TYPES:
            raise InputError(path, f"the pickle holds a {type(item).__name__}, not plain data")
        if depth > MAX_PICKLE_DEPTH:
            raise InputError(path, f"the pickle nests deeper than {MAX_PICKLE_DEPTH} levels")
        budget -= 1 + (len(item) if isinstance(item, (str, bytes)) else 0)
        if budget < 0:
            raise InputError(path, "the pickle unfolds to far more data than it holds (shared or cyclic references)")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for kv in item.items() for v in kv)
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


def with_clean_entries(dump: dict[str, Any], path: str | Path = "<dump>") -> dict[str, Any]:
    """``dump`` with each entry checked: malformed ones left out and counted in ``malformed_entries``."""
    raw = dump.get("entries")
    raw = expect(raw, list, path, "its 'entries'") if raw is not None else []
    clean = [e for e in map(_clean_entry, raw) if e is not None]
    return {**dump, "entries": clean, "malformed_entries": len(raw) - len(clean)}


def _clean_entry(e: Any) -> dict[str, Any] | None:
    """An entry with the fields the analysis reads in their types, or None if it cannot be one."""
    if not isinstance(e, dict):
        return None
    pg = e.get("process_group")
    if pg is None:
        pg = (str(e.get("pg_id")), None)
    elif isinstance(pg, (list, tuple)) and pg and isinstance(pg[0], (str, int)) and not isinstance(pg[0], bool):
        pg = (str(pg[0]), pg[1] if len(pg) > 1 and isinstance(pg[1], str) else None)
    else:
        return None
    seq, created, name = e.get("collective_seq_id", 0), e.get("time_created_ns", 0), e.get("profiling_name", "?")
    if not _is_int(seq) or not _is_number(created) or not isinstance(name, str):
        return None
    state = e.get("state")
    frames = e.get("frames")
    return {**e, "process_group": pg, "collective_seq_id": seq, "time_created_ns": int(created),
            "profiling_name": name, "state": state if isinstance(state, str) else None,
            "frames": [f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else [],
            "input_sizes": _list_or_none(e.get("input_sizes")), "input_dtypes": _list_or_none(e.get("input_dtypes")),
            "is_p2p": e.get("is_p2p") is True}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and abs(v) < 2**63


def _list_or_none(v: Any) -> list | None:
    return list(v) if isinstance(v, (list, tuple)) else None


def rank_of_dump(path: Path, dump: dict[str, Any]) -> int | None:
    """The rank a dump belongs to: its own field if any, else the number ending its file name."""
    if rank_number(dump.get("rank")) is not None:
        return dump["rank"]
    m = _RANK_SUFFIX.search(path.name)
    return rank_number(m.group(1)) if m else None


def entries(rank: int, dump: dict[str, Any]) -> list[Entry]:
    """The collectives (not point-to-point) of one rank's dump."""
    found = []
    for e in dump.get("entries") or []:
        if e.get("is_p2p"):
            continue
        pg = e.get("process_group") or [str(e.get("pg_id")), None]
        found.append(Entry(rank=rank, pg=str(pg[0]), pg_desc=pg[1] if len(pg) > 1 else None,
                           seq=int(e.get("collective_seq_id", 0)), op=str(e.get("profiling_name", "?")),
                           sizes=e.get("input_sizes"), dtypes=e.get("input_dtypes"),
                           created_ns=int(e.get("time_created_ns", 0)), state=e.get("state"),
                           frames=list(e.get("frames") or []),
                           pg_id=str(e["pg_id"]) if _is_int(e.get("pg_id")) else None,
                           out_sizes=_list_or_none(e.get("output_sizes")), duration_ms=_duration(e.get("duration_ms"))))
    return found


def _duration(value: Any) -> float | None:
    """An entry's device time (ms) if it is a possible one: torch writes -1 or nothing where it did not time it."""
    return float(value) if _is_number(value) and 0 <= value <= MAX_STEP_MS else None  # longer than a step can be: corrupt


KNOWN_VERSIONS = ("2.",)  # torch's dump format is 2.x; its releases have only added fields


def dump_version_problem(dump: dict[str, Any]) -> str | None:
    """What a dump of a format version this reader does not know may lose, or None for a known one."""
    version = dump.get("version")
    if version is None or str(version).startswith(KNOWN_VERSIONS):
        return None
    return (f"dump format version {str(version)[:20]!r}, this reader knows 2.x: read as 2.x, any field it "
            "renamed is missing from the verdict")


def groups_of_dump(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The process groups a dump's ``pg_config`` lists, as process_groups.json has them (NCCL writes each
    group's ranks as a string, ``"[0, 1]"``); a group whose ranks cannot be read is left out."""
    config = dump.get("pg_config")
    groups = {}
    for name, info in (config.items() if isinstance(config, dict) else ()):
        ranks = info.get("ranks") if isinstance(info, dict) else None
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                continue
        if isinstance(ranks, list) and ranks and all(_is_int(r) for r in ranks):
            desc = info.get("desc")
            groups[str(name)] = {"desc": desc if isinstance(desc, str) else None, "ranks": ranks}
    return groups


def wrapped(dump: dict[str, Any]) -> bool:
    """Whether the rank's ring buffer overflowed: its oldest entries are gone, so a group without an entry
    there says nothing about whether the rank took part in it."""
    ids = [e["record_id"] for e in dump.get("entries") or [] if _is_int(e.get("record_id"))]
    return bool(ids) and min(ids) > 0


def progress(dumps: dict[int, dict[str, Any]], all_entries: list[Entry]) -> dict[tuple[str, int], Progress]:
    """Per (group, rank): the last collective entered and completed, from the entries and, where the dump has
    it, its ``pg_status`` (which outlives the ring buffer)."""
    found: dict[tuple[str, int], Progress] = {}
    key_of_id: dict[tuple[int, str], str] = {}
    for e in all_entries:
        mine = found.setdefault((e.pg, e.rank), Progress(entered=e.seq, completed=None))
        mine.entered = max(mine.entered, e.seq)
        if e.state == "completed":
            mine.completed = max(mine.completed or 0, e.seq)
        if e.pg_id is not None:
            key_of_id[(e.rank, e.pg_id)] = e.pg
    paired = _paired_ids(dumps, key_of_id)
    for rank, dump in dumps.items():
        status = dump.get("pg_status")
        for pg_id, record in (status.items() if isinstance(status, dict) else ()):
            pg = key_of_id.get((rank, str(pg_id))) or paired.get((rank, str(pg_id)))
            if pg is None or not isinstance(record, dict):
                continue
            mine = found.setdefault((pg, rank), Progress(entered=0, completed=None))
            if _is_int(enqueued := record.get("last_enqueued_collective")):
                mine.entered = max(mine.entered, enqueued)
            if _is_int(completed := record.get("last_completed_collective")) and completed >= 0:
                mine.completed = max(mine.completed or 0, completed)
    return found


def _paired_ids(dumps: dict[int, dict[str, Any]], tied: dict[tuple[int, str], str]) -> dict[tuple[int, str], str]:
    """(rank, pg_status id) -> group key, for ids no entry of the rank ties to a group (a rank that recorded
    no collective: a hung or GIL-locked process). torch numbers a process's groups (the ids) and names them
    by default (the names) in the order it makes them, so both sorted pair up; trusted only where that
    pairing gives every tie the ranks' entries show (``tied``), and at least one."""
    paired: dict[tuple[int, str], str] = {}
    for rank, dump in dumps.items():
        status, groups = dump.get("pg_status"), groups_of_dump(dump)
        ids = [str(i) for i in status] if isinstance(status, dict) else []
        if not (ids and len(ids) == len(groups) and all(i.isdigit() for i in [*ids, *groups])):
            continue  # a group named by hand, or one without its ranks: no order to pair by
        for pg_id, name in zip(sorted(ids, key=int), sorted(groups, key=int)):
            paired[(rank, pg_id)] = group_key(name, tuple(int(r) for r in groups[name]["ranks"]))
    confirmed = [key for key in tied if key in paired]
    if not confirmed or any(paired[key] != tied[key] for key in confirmed):
        return {}
    return paired


def keyed_by_members(dumps: dict[int, dict[str, Any]], groups_by_rank: dict[int, dict]) -> list[Entry]:
    """Every rank's collectives, each group keyed by its name and member ranks (``run_dir.group_key``).

    Subgroups of one DeviceMesh dimension share a name; their member lists tell them apart.
    """
    found = [e for rank, dump in dumps.items() for e in entries(rank, dump)]
    key = GroupKeys()  # a group's members written once for every entry of every rank that lists them
    for e in found:
        group = (groups_by_rank.get(e.rank, {}).get(e.pg) or {})
        if group.get("ranks"):
            e.pg_desc = e.pg_desc or group.get("desc")
            e.pg = key(e.pg, group["ranks"])
    return found


def members(groups: dict[str, dict], all_entries: list[Entry]) -> dict[str, list[int]]:
    """Ranks of each group: from the process-group map or the group's key where known, else who recorded it."""
    out = {pg: sorted(info.get("ranks") or []) for pg, info in groups.items()}
    for e in all_entries:
        keyed = group_members(e.pg) if ":" in e.pg else ()  # a bare name ("74") is not a key
        if not out.get(e.pg):
            out[e.pg] = sorted(keyed)
        if e.rank not in out[e.pg] and not groups.get(e.pg) and not keyed:
            out[e.pg] = sorted({*out[e.pg], e.rank})
    return out


def blocked(all_entries: list[Entry], groups: dict[str, list[int]], ranks: set[int],
            reached: dict[tuple[str, int], Progress] | None = None, unknown: set[int] = frozenset()) -> list[Blocked]:
    """Collectives missing some members, earliest first (the first one is what everything waits on).

    ``reached``: how far each rank got on each group (default: its entries); a rank in ``unknown`` (its
    ring buffer overflowed) without a record of a group is left out of that group, not called missing.
    """
    reached = reached if reached is not None else progress({}, all_entries)
    last: dict[tuple[str, int], Entry] = {}
    by_key: dict[tuple[str, int], list[Entry]] = {}
    for e in all_entries:
        if last.get((e.pg, e.rank)) is None or e.seq > last[(e.pg, e.rank)].seq:
            last[(e.pg, e.rank)] = e
        by_key.setdefault((e.pg, e.seq), []).append(e)
    found = []
    for pg, member_ranks in groups.items():
        # ranks whose dump we have and that say how far they got
        present = [r for r in member_ranks if r in ranks and ((pg, r) in reached or r not in unknown)]
        if len(present) < 2:
            continue
        seqs = {r: reached[(pg, r)].entered if (pg, r) in reached else 0 for r in present}
        missing = [r for r in present if seqs[r] < max(seqs.values())]
        if not missing:
            continue
        seq = min(seqs[r] for r in missing) + 1
        entered = by_key.get((pg, seq), [])
        if not entered:  # the ranks that went on entered it, but it left their ring buffers
            continue
        first = min(entered, key=lambda e: e.created_ns)
        found.append(Blocked(pg=pg, pg_desc=first.pg_desc, seq=seq, op=first.op, since_ns=first.created_ns,
                             waiting=sorted(e.rank for e in entered),
                             missing=sorted(r for r in present if seqs[r] < seq),
                             missing_last={r: last.get((pg, r)) for r in present if seqs[r] < seq}))
    return sorted(found, key=lambda b: b.since_ns)


# Collectives whose sizes differ per rank by design: all_to_all with splits (token routing), all_gather
# and reduce_scatter of tensor lists (uneven inputs), and rooted ops (scatter's non-roots pass nothing).
SIZES_MAY_DIFFER = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_to_allv",
                              "all_gather", "allgather", "reduce_scatter", "gather", "scatter"})
ALL_TO_ALL = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_to_allv"})


def op_name(profiling_name: str) -> str:
    """``nccl:all_to_all`` -> ``all_to_all``; ``nccl:send 0->1`` -> ``send``."""
    return profiling_name.split(":", 1)[-1].split(" ", 1)[0]


def mismatches(all_entries: list[Entry], groups: dict[str, list[int]] | None = None) -> list[Mismatch]:
    """Same group and sequence number, but a different op, dtype, or sizes that must agree; for an
    all_to_all every member recorded, elements sent in all not equal to elements received (fr_trace's check)."""
    by_key: dict[tuple[str, int], list[Entry]] = {}
    for e in all_entries:
        by_key.setdefault((e.pg, e.seq), []).append(e)
    found = []
    for (pg, seq), group in sorted(by_key.items(), key=lambda kv: min(e.created_ns for e in kv[1])):
        ops = {op_name(e.op) for e in group}
        sized = [e for e in group if e.sizes]  # rooted ops give inputs on one side only
        if len(ops) == 1 and ops <= SIZES_MAY_DIFFER:
            what = {f"{e.op} {e.dtypes}" for e in sized}
            if len(what) <= 1 and not _all_to_all_unbalanced(group, (groups or {}).get(pg)):
                continue
        elif len(ops) == 1 and len({f"{e.sizes} {e.dtypes}" for e in sized}) <= 1:
            continue
        found.append(Mismatch(pg=pg, pg_desc=group[0].pg_desc, seq=seq,
                              versions={e.rank: f"{e.op} {e.sizes} {e.dtypes}" for e in group}))
    return found


def _all_to_all_unbalanced(group: list[Entry], member_ranks: list[int] | None) -> bool:
    """An all_to_all whose every member recorded sizes, sending more or fewer elements than it receives."""
    if op_name(group[0].op) not in ALL_TO_ALL or not member_ranks or {e.rank for e in group} != set(member_ranks):
        return False
    try:
        sent = sum(math.prod(s) for e in group for s in e.sizes)
        received = sum(math.prod(s) for e in group for s in e.out_sizes)
    except TypeError:  # sizes not recorded (None) or not lists of dimensions
        return False
    return sent != received


def cross_rank(all_entries: list[Entry], tail: int) -> list[dict[str, Any]]:
    """The last ``tail`` collectives of each group, one row each: who entered it, who did not."""
    by_key: dict[tuple[str, int], list[Entry]] = {}
    members_of: dict[str, set[int]] = {}
    for e in all_entries:
        by_key.setdefault((e.pg, e.seq), []).append(e)
        members_of.setdefault(e.pg, set()).add(e.rank)
    for pg, recorded in members_of.items():
        members_of[pg] = recorded | set(group_members(pg))  # listed in the key once keyed by members
    rows = []
    for pg in sorted(members_of):
        seqs = sorted(seq for (g, seq) in by_key if g == pg)[-tail:]
        for seq in seqs:
            group = by_key[(pg, seq)]
            entered = {e.rank: e for e in group}
            first = min(group, key=lambda e: e.created_ns)
            rows.append({"group": first.pg_desc or pg, "group_key": pg, "seq": seq, "op": first.op,
                         "created_ns": first.created_ns, "entered": sorted(entered),
                         "missing": sorted(members_of[pg] - set(entered)),
                         "states": {str(r): e.state for r, e in sorted(entered.items())},
                         "sizes": {str(r): f"{e.sizes} {e.dtypes}" for r, e in sorted(entered.items())}})
    return rows
