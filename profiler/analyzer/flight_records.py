"""Cross-rank reading of flight-recorder dumps: who entered which collective of which group.

Works on what gloo gives with torch 2.13 (every collective recorded, state always "scheduled",
empty pg_config) as well as on NCCL dumps (states and timings), from diagtrain's JSON dumps or
NCCL's own pickled ``TORCH_FR_DUMP_TEMP_FILE`` files.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_RANK_SUFFIX = re.compile(r"(\d+)(?:\.json)?$")


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


def read_dump(path: Path) -> dict[str, Any]:
    """A dump as a dict: diagtrain's / torch's JSON, or NCCL's pickle."""
    raw = path.read_bytes()
    try:
        return json.loads(raw)
    except ValueError:
        # NCCL's on-timeout dumps are pickles; only load files the user pointed us at.
        return pickle.loads(raw)  # noqa: S301


def rank_of_dump(path: Path, dump: dict[str, Any]) -> int | None:
    """The rank a dump belongs to: its own field if any, else the number ending its file name."""
    if isinstance(dump.get("rank"), int):
        return dump["rank"]
    m = _RANK_SUFFIX.search(path.name)
    return int(m.group(1)) if m else None


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
                           frames=list(e.get("frames") or [])))
    return found


def keyed_by_members(dumps: dict[int, dict[str, Any]], groups_by_rank: dict[int, dict]) -> list[Entry]:
    """Every rank's collectives, each group keyed by its name and member ranks (``name:0,1``).

    Subgroups of one DeviceMesh dimension share a name; their member lists tell them apart.
    """
    found = [e for rank, dump in dumps.items() for e in entries(rank, dump)]
    for e in found:
        group = (groups_by_rank.get(e.rank, {}).get(e.pg) or {})
        if group.get("ranks"):
            e.pg_desc = e.pg_desc or group.get("desc")
            e.pg = f"{e.pg}:{','.join(map(str, group['ranks']))}"
    return found


def members(groups: dict[str, dict], all_entries: list[Entry]) -> dict[str, list[int]]:
    """Ranks of each group: from the process-group map where known, else who recorded it."""
    out = {pg: sorted(info.get("ranks") or []) for pg, info in groups.items()}
    for e in all_entries:
        if not out.get(e.pg):
            out.setdefault(e.pg, [])
        if e.rank not in out[e.pg] and not groups.get(e.pg):
            out[e.pg] = sorted({*out[e.pg], e.rank})
    return out


def blocked(all_entries: list[Entry], groups: dict[str, list[int]], ranks: set[int]) -> list[Blocked]:
    """Collectives missing some members, earliest first (the first one is what everything waits on)."""
    last: dict[tuple[str, int], Entry] = {}
    by_key: dict[tuple[str, int], list[Entry]] = {}
    for e in all_entries:
        if last.get((e.pg, e.rank)) is None or e.seq > last[(e.pg, e.rank)].seq:
            last[(e.pg, e.rank)] = e
        by_key.setdefault((e.pg, e.seq), []).append(e)
    found = []
    for pg, member_ranks in groups.items():
        present = [r for r in member_ranks if r in ranks]  # ranks whose dump we have
        if len(present) < 2:
            continue
        seqs = {r: last[(pg, r)].seq if (pg, r) in last else 0 for r in present}
        missing = [r for r in present if seqs[r] < max(seqs.values())]
        if not missing:
            continue
        seq = min(seqs[r] for r in missing) + 1
        entered = by_key.get((pg, seq), [])
        first = min(entered, key=lambda e: e.created_ns)
        found.append(Blocked(pg=pg, pg_desc=first.pg_desc, seq=seq, op=first.op, since_ns=first.created_ns,
                             waiting=sorted(e.rank for e in entered),
                             missing=sorted(r for r in present if seqs[r] < seq),
                             missing_last={r: last.get((pg, r)) for r in present if seqs[r] < seq}))
    return sorted(found, key=lambda b: b.since_ns)


def mismatches(all_entries: list[Entry]) -> list[Mismatch]:
    """Same group and sequence number, different op, sizes or dtypes."""
    by_key: dict[tuple[str, int], list[Entry]] = {}
    for e in all_entries:
        by_key.setdefault((e.pg, e.seq), []).append(e)
    found = []
    for (pg, seq), group in sorted(by_key.items(), key=lambda kv: min(e.created_ns for e in kv[1])):
        versions = {e.rank: f"{e.op} {e.sizes} {e.dtypes}" for e in group}
        # Rooted ops give inputs on one side only (scatter's non-roots pass none): compare the
        # op everywhere, the sizes among the ranks that gave some.
        with_inputs = {f"{e.op} {e.sizes} {e.dtypes}" for e in group if e.sizes}
        if len({e.op for e in group}) > 1 or len(with_inputs) > 1:
            found.append(Mismatch(pg=pg, pg_desc=group[0].pg_desc, seq=seq, versions=versions))
    return found


def cross_rank(all_entries: list[Entry], tail: int) -> list[dict[str, Any]]:
    """The last ``tail`` collectives of each group, one row each: who entered it, who did not."""
    by_key: dict[tuple[str, int], list[Entry]] = {}
    members_of: dict[str, set[int]] = {}
    for e in all_entries:
        by_key.setdefault((e.pg, e.seq), []).append(e)
        members_of.setdefault(e.pg, set()).add(e.rank)
    for pg, recorded in members_of.items():
        listed = pg.partition(":")[2]  # "name:0,1,2,3" once keyed by members
        if listed:
            members_of[pg] = recorded | {int(r) for r in listed.split(",") if r.isdigit()}
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
