"""Collectives: one row per collective a rank ran, then matched across the ranks of its group.

On GPU traces the NCCL kernels (or ``record_param_comms``) carry the op, size, dtype and process
group. On CPU (gloo) traces the host ops carry only the op and the input shapes; the group and the
sequence number come from the flight-recorder dump, matched to each op by name and start time.
Matching across ranks is by (group, sequence within the group), so DP, TP and PP groups of a 3D
run are told apart. Bandwidth uses the nccl-tests factors.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.per_rank import host_calls
from diagtrain.profiler.analyzer.read.dialects import COMM
from diagtrain.profiler.analyzer.per_rank.reading import Reading
from diagtrain.profiler.model.collectives import WHOLE_BUFFER_OPS, bus_factor
from diagtrain.profiler.run_dir import group_key
from diagtrain.profiler.util.frames import set_column
from diagtrain.profiler.util.groups import distinct_rows, nth_in_group

DTYPE_BYTES = {"float": 4, "float32": 4, "c10::half": 2, "half": 2, "float16": 2, "c10::bfloat16": 2,
               "bfloat16": 2, "double": 8, "float64": 8, "int": 4, "int32": 4, "long int": 8, "int64": 8,
               "long": 8, "unsigned char": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1, "signed char": 1}
_OP_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "all_gather_into_tensor": "all_gather", "_allgather_base": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_all_single": "all_to_all", "alltoall_base": "all_to_all",
               "sendrecv": "send_recv"}
# gloo runs some calls as other work: a reduce-scatter as an all-reduce of the whole buffer.
_RUNS_AS = {"all_reduce": ("reduce_scatter",)}
_KERNEL_OP = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
# Point-to-point ops: one peer each, never matched across a group. (NCCL's SendRecv kernels are
# not among them: NCCL runs all_to_all as grouped send/recv, and their ends line up clocks.)
P2P_OPS = frozenset({"send", "recv", "recv_any_source"})
UNKNOWN_GROUP = "?"  # pg of a call whose group no trace argument or flight-recorder entry names
P2P_GROUP_DESC = "point-to-point"  # pg_desc of a send or receive whose group is not named
COLUMNS = ["rank", "pg", "pg_desc", "group_ranks", "op", "seq", "ts", "dur", "bytes", "issued_ts", "issue_gap_us", "is_p2p"]


def normalize_op(name: str) -> str:
    """``gloo:all_reduce``, ``allreduce``, ``ncclDevKernel_AllReduce_...`` → ``all_reduce``."""
    m = _KERNEL_OP.match(name)
    if m:
        name = re.sub(r"(?<!^)([A-Z])", r"_\1", m.group(1)).lower()
    name = name.split("::", 1)[-1].split(":", 1)[-1].rstrip("_").lower()  # c10d::allreduce_, gloo:all_reduce
    name = name.split(" ")[0]
    return _OP_ALIASES.get(name, name)


# Which ops a call and a flight-recorder entry can both be (gloo runs a reduce-scatter as an all-reduce); ops not
# listed (barrier, the coalesced calls) may be any entry's.
_KINDS = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 1, "broadcast": 2, "send": 3, "recv": 4,
          "recv_any_source": 4, "all_to_all": 5}


def op_kind(name: str) -> int:
    """The kind of op ``name`` is, as a number (-1: any), for pairing a call with its flight-recorder entry."""
    return _KINDS.get(normalize_op(name), -1)


_PAUSE_COLUMNS = ["tid", "ts", "end", "name"]  # what the pause before a gloo call reads of the host ops


def rank_collectives(events: pd.DataFrame, rank: int, epoch_offset_us: int, pg_config: list[dict],
                     flight_recorder: dict | None, host: pd.DataFrame) -> pd.DataFrame:
    """This rank's collectives, one row each, with epoch-µs start times, from one trace's
    communication events with their arguments (TraceFile.comm_events); ``host``: all of that trace's
    events (tid, ts, end, name, stream), for the pause on a thread before each gloo call."""
    gpu = events[(events["kind"] == COMM) & (events["stream"] >= 0)]
    if len(gpu):
        table = _from_kernels(gpu)
    else:
        table = _from_host_ops(events[events["stream"] < 0], host, flight_recorder, epoch_offset_us)
    if table.empty:
        return pd.DataFrame(columns=COLUMNS)
    table["ts"] = table["ts"] + epoch_offset_us
    table["rank"] = rank
    groups = {str(g.get("pg_name")): g for g in pg_config}
    # One tuple per group, shared by its rows: a row's own copy of a 1,024-rank group costs 8 KB.
    members = {pg: tuple(g.get("ranks") or ()) for pg, g in groups.items()}
    table["group_ranks"] = [members.get(pg, ()) for pg in table["pg"]]
    table["pg_desc"] = [groups.get(pg, {}).get("pg_desc") or desc for pg, desc in zip(table["pg"], table["pg_desc"])]
    if not len(gpu):  # host ops give the local input; nccl-tests sizes some ops by the whole buffer
        size = table["group_ranks"].map(len).to_numpy()
        whole = table["op"].isin(WHOLE_BUFFER_OPS).to_numpy() & (size > 0)
        table["bytes"] = np.where(whole, table["bytes"].astype(float) * size, table["bytes"].astype(float))
    missing = table["seq"].isna()
    if missing.any():  # no sequence numbers: order within (group, op) on this rank
        unnumbered = table[missing]
        table.loc[missing, "seq"] = nth_in_group(unnumbered["pg"], unnumbered["op"]) + 1
    table["seq"] = table["seq"].astype(int)
    table["is_p2p"] = table["op"].isin(P2P_OPS)
    table.loc[table["is_p2p"] & table["pg_desc"].isna(), "pg_desc"] = P2P_GROUP_DESC
    return table[COLUMNS]


def _from_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    sizes = np.array([DTYPE_BYTES.get(str(d).lower(), np.nan) for d in kernels["dtype"]])
    ops = [normalize_op(c) if c else normalize_op(str(n)) for c, n in zip(kernels["collective"], kernels["name"])]
    group = kernels["group_size"].to_numpy()
    nbytes = kernels["in_nelems"].to_numpy() * sizes
    whole = np.array([op in WHOLE_BUFFER_OPS for op in ops])
    nbytes = np.where(whole & (group > 0), nbytes * group, nbytes)
    return pd.DataFrame({"pg": [p or UNKNOWN_GROUP for p in kernels["pg_name"]], "pg_desc": list(kernels["pg_desc"]),
                         "op": ops, "seq": np.nan, "ts": kernels["ts"].to_numpy(), "dur": kernels["dur"].to_numpy(),
                         "bytes": nbytes, "issued_ts": np.nan, "issue_gap_us": np.nan})


def _from_host_ops(comm: pd.DataFrame, host: pd.DataFrame, flight_recorder: dict | None,
                   epoch_offset_us: int) -> pd.DataFrame:
    """gloo's work spans (among host communication ops ``comm``), each named by the call that issued
    it and its flight-recorder entry; ``host``: the trace's events, for the pause before each call."""
    comm = comm[(comm["kind"] == COMM).to_numpy()]
    names = comm["name"].astype(str)
    work = comm[names.str.startswith("gloo:") | names.str.startswith("nccl:")]
    calls = comm[names.str.startswith(host_calls.CALL_PREFIX)]
    if work.empty:  # no work spans (another tracer): the calls are all there is
        work, calls = calls, calls.iloc[:0]
    entries = _entries(flight_recorder, epoch_offset_us)
    table = pd.DataFrame({
        "op": [normalize_op(n) for n in work["name"].astype(str)], "ts": work["ts"].to_numpy(),
        "dur": work["dur"].to_numpy(),
        "bytes": [_bytes_from_shapes(d, t) for d, t in zip(work["input_dims"], work["input_type"])],
        "pg": UNKNOWN_GROUP, "pg_desc": None, "seq": np.nan, "issued_ts": np.nan, "issue_gap_us": np.nan,
    })
    if calls.empty:  # nothing to go by but the work's start: the entry created nearest it
        if not entries.empty:
            _fill_from_entries(table, _nearest_entries(work["ts"].to_numpy(), work["name"].astype(str).to_numpy(),
                                                       entries), entries)
        return table
    by_call = host_calls.flight_recorder_entries(
        calls, entries, np.array([op_kind(n) for n in calls["name"].astype(str)], dtype=np.int64),
        np.array([op_kind(str(n)) for n in entries.get("profiling_name", [None] * len(entries))], dtype=np.int64))
    call_keys = [str(entries["profiling_name"].iat[j]) if j >= 0 else f"op:{normalize_op(n)}"
                 for j, n in zip(by_call, calls["name"].astype(str))]
    work_keys = [[name, f"op:{op}", *([f"op:{alias}" for alias in _RUNS_AS.get(op, ())])]
                 for name, op in zip(work["name"].astype(str), table["op"])]
    issuer = host_calls.issuing_calls(work, work_keys, calls, call_keys)
    paired = np.flatnonzero(issuer >= 0)
    table.loc[paired, "issued_ts"] = calls["ts"].to_numpy()[issuer[paired]] + epoch_offset_us
    gaps = host_calls.gaps_before(calls, host.loc[(host["stream"] < 0).to_numpy(), _PAUSE_COLUMNS])
    table.loc[paired, "issue_gap_us"] = gaps[issuer[paired]]
    fr_row = np.full(len(table), -1, dtype=np.int64)
    fr_row[paired] = by_call[issuer[paired]]
    _fill_unpaired(fr_row, work, entries)
    _fill_from_entries(table, fr_row, entries)
    return table


def _fill_unpaired(fr_row: np.ndarray, work: pd.DataFrame, entries: pd.DataFrame) -> None:
    """Work spans no issuing call named (a call the tracer missed, a hook's own collective): the
    unused entry of the same name created nearest their start, as when there are no calls at all."""
    unpaired = np.flatnonzero(fr_row < 0)
    if not len(unpaired) or entries.empty:
        return
    free = np.setdiff1d(np.arange(len(entries)), fr_row[fr_row >= 0])
    found = _nearest_entries(work["ts"].to_numpy()[unpaired], work["name"].astype(str).to_numpy()[unpaired],
                             entries.iloc[free].reset_index(drop=True))
    hit = found >= 0
    fr_row[unpaired[hit]] = free[found[hit]]


def _entries(dump: dict | None, epoch_offset_us: int) -> pd.DataFrame:
    """The dump's entries with creation times on the trace's clock (µs, before the epoch offset)."""
    entries = pd.DataFrame((dump or {}).get("entries") or [])
    if entries.empty:
        return entries
    return entries.assign(created_us=entries["time_created_ns"] / 1e3 - epoch_offset_us)


def _nearest_entries(starts: np.ndarray, names: np.ndarray, entries: pd.DataFrame) -> np.ndarray:
    """Per span, the entry of the same name created nearest its start (within tolerance), or -1."""
    found = np.full(len(starts), -1, dtype=np.int64)
    for name in set(names):
        cands = np.flatnonzero((entries["profiling_name"] == name).to_numpy())
        if not len(cands):
            continue
        cands = cands[np.argsort(entries["created_us"].to_numpy()[cands])]
        created = entries["created_us"].to_numpy()[cands]
        rows = np.flatnonzero(names == name)
        pos = np.clip(np.searchsorted(created, starts[rows]), 1, len(created)) - 1
        nxt = np.clip(pos + 1, 0, len(created) - 1)
        best = np.where(np.abs(created[nxt] - starts[rows]) < np.abs(created[pos] - starts[rows]), nxt, pos)
        ok = np.abs(created[best] - starts[rows]) <= Reading.active().fr_match_tolerance_us
        found[rows[ok]] = cands[best[ok]]
    return found


def _fill_from_entries(table: pd.DataFrame, rows: np.ndarray, entries: pd.DataFrame) -> None:
    """Group, description, sequence number and (where shapes were off) size from the entries."""
    hit = np.flatnonzero(rows >= 0)
    if not len(hit):
        return
    chosen = entries.iloc[rows[hit]]
    table.loc[hit, "pg"] = [pg[0] for pg in chosen["process_group"]]
    table.loc[hit, "pg_desc"] = [pg[1] for pg in chosen["process_group"]]
    table.loc[hit, "seq"] = chosen["collective_seq_id"].to_numpy()
    sizes = np.array([_bytes_from_shapes(s, d) for s, d in zip(chosen["input_sizes"], chosen["input_dtypes"])])
    known = table.loc[hit, "bytes"].astype(float).to_numpy()
    table.loc[hit, "bytes"] = np.where(np.isnan(known), sizes, known)


def _bytes_from_shapes(dims, types) -> float:
    if not dims:
        return np.nan
    total = 0.0
    for shape, dtype in zip(dims, types or []):
        # A 0-dim tensor (shape []) is one element; an empty list beside no dtype is no tensor.
        if isinstance(shape, list) and all(isinstance(x, int) for x in shape) and (shape or dtype):
            total += float(np.prod(shape)) * DTYPE_BYTES.get(str(dtype).lower(), 4)
    return total or np.nan


def match(collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, collective) with the group's transfer time, each rank's wait, bandwidth.

    A collective is matched across its group by (group, op, sequence number). Its transfer time
    is the time it took once the last rank had arrived: the shortest duration in the group (the
    last rank waits for nobody). That is known only when every member was seen: with a member
    missing, the shortest duration seen may still include waiting for it, so transfer time,
    waits and bandwidth are left unknown (NaN). Point-to-point ops are never matched.
    """
    if collectives.empty:
        return collectives.assign(group=[], arrived_ts=[], transfer_us=[], wait_us=[], last_rank=[], ranks_seen=[],
                                  algbw_gbps=[], busbw_gbps=[])
    table = collectives.copy()
    keys, members = shared_groups(table["pg"], table["group_ranks"])
    set_column(table, "group", keys)  # object: pandas' str dtype would copy each key's bytes per row
    set_column(table, "group_ranks", members)
    p2p = table["is_p2p"].fillna(False).astype(bool) if "is_p2p" in table else pd.Series(False, index=table.index)
    # A rank arrives when it calls the collective; the work may start later on gloo's thread.
    table["arrived_ts"] = table["issued_ts"].fillna(table["ts"]) if "issued_ts" in table else table["ts"]
    key = ["group", "op", "seq"]
    by = table[~p2p].groupby(key, sort=False)
    table["ranks_seen"] = by["rank"].transform("nunique")
    table.loc[p2p, "ranks_seen"] = 1
    size = pd.Series(np.fromiter(map(len, members), np.int64, len(members)), index=table.index)
    complete = ~p2p & (size > 1) & (table["ranks_seen"] >= size)
    table["transfer_us"] = by["dur"].transform("min").where(complete)
    table["wait_us"] = table["dur"] - table["transfer_us"]
    table["last_rank"] = last_to_arrive(table, table["ranks_seen"] > 1)
    table["algbw_gbps"] = table["bytes"] / (table["transfer_us"] * 1e3)  # bytes/µs/1e3 = GB/s
    # Per distinct (op, group size), not per row: a row per collective and rank.
    kinds, firsts = distinct_rows(table["op"], size)
    factor = np.array([bus_factor(op, n) if n > 0 else 1.0
                       for op, n in zip(table["op"].iloc[firsts], size.iloc[firsts])])[kinds]
    table["busbw_gbps"] = table["algbw_gbps"] * factor
    return table


def shared_groups(pgs: pd.Series, members: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its group key and members (object arrays), one object per distinct group for all rows.

    Rows of one rank share a members tuple (rank_collectives), so the key is built once per rank and
    group, not per row: at 1,024 ranks a key per row would hold gigabytes of identical strings. The rows
    are told apart by (group, members object) in C: a lookup per row in Python cost 0.3 s at 1,024 ranks.
    """
    by_value: dict[tuple[Any, tuple[int, ...]], tuple[str, tuple[int, ...]]] = {}
    found = []
    codes, firsts = distinct_rows(pgs, np.fromiter(map(id, members), np.int64, len(members)))
    for pg, ranks in zip(pgs.iloc[firsts], members.iloc[firsts]):  # once per rank and group
        # Looked up as given first (each rank has its own equal tuple): hashing it runs in C, where
        # converting every member ran in Python, ranks x members times (0.1 s at 1,024 ranks).
        given = ranks if isinstance(ranks, tuple) else tuple(ranks) if ranks is not None else ()
        shared = by_value.get((pg, given))
        if shared is None:
            ranks_tuple = tuple(int(r) for r in given)
            shared = by_value.get((pg, ranks_tuple))
            if shared is None:  # the key once per distinct group, not per rank that is in it
                shared = by_value[(pg, ranks_tuple)] = (group_key(pg, ranks_tuple), ranks_tuple)
            by_value[(pg, given)] = shared
        found.append(shared)
    # fromiter: each tuple one element (np.array would make rows of a 2-D array of them)
    keys = np.fromiter((k for k, _ in found), dtype=object, count=len(found))
    shared_members = np.fromiter((m for _, m in found), dtype=object, count=len(found))
    return keys[codes], shared_members[codes]


def last_to_arrive(table: pd.DataFrame, shared: pd.Series) -> pd.Series:
    """Per row, the rank of its collective that arrived last (NaN for rows not ``shared`` by several
    ranks, or without a group key). Works on group codes: a frame of the rows' key strings would copy
    each key (all of a group's members) per row."""
    out = np.full(len(table), np.nan)
    rows = np.flatnonzero(shared.to_numpy(dtype=bool) & table["group"].notna().to_numpy()
                          & table["arrived_ts"].notna().to_numpy())
    subset = table.iloc[rows]
    codes = subset.groupby(["group", "op", "seq"], sort=False).ngroup().to_numpy(dtype=float)
    keyed = ~np.isnan(codes)  # no sequence number: no match
    rows, codes = rows[keyed], codes[keyed].astype(np.int64)
    if len(rows):
        order = np.lexsort((subset["arrived_ts"].to_numpy()[keyed], codes))  # by collective, then arrival
        ends = np.flatnonzero(np.r_[codes[order][1:] != codes[order][:-1], True])  # each one's last arrival
        last = np.empty(codes.max() + 1)
        last[codes[order][ends]] = subset["rank"].to_numpy()[keyed][order][ends]
        out[rows] = last[codes]
    return pd.Series(out, index=table.index)
